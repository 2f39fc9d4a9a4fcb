from pathlib import Path

from setuptools import find_packages, setup

DAGSTER = "1.13.27"
DAGSTER_LIBS = "0.29.27"

setup(
    name="enrich_crawl",
    version="0.1.0",
    description=(
        "Fill the gaps of a dirty dataset from the web, politely, at scale, "
        "with proof of where every value came from."
    ),
    long_description=Path(__file__).with_name("README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(exclude=["enrich_crawl_tests*", "bench*"]),
    # Data files are listed here only: with include_package_data, setuptools warns that the data
    # folders (enrich_crawl/data, enrich_crawl/demo/web) "would be ignored" as packages.
    include_package_data=False,
    package_data={"enrich_crawl": ["demo/**/*", "demo/*", "data/*"]},
    install_requires=[
        f"dagster=={DAGSTER}",
        f"dagster-webserver=={DAGSTER}",
        f"dagster-pipes=={DAGSTER}",
        f"dagster-postgres=={DAGSTER_LIBS}",
        "scrapy>=2.13,<3",
        "scrapy-playwright>=0.0.44",
        "pymongo>=4.6,<5",
        "pandas>=2.2",
        "pyarrow>=15",
        "pyyaml>=6",
        "lxml>=5",
        "cssselect>=1.2",
        "jsonpath-ng>=1.6",
        "jsonschema>=4.20",
        "regex>=2024.4",
        "tldextract>=5",
        "w3lib>=2.1",
        "ada-url>=4.0",
        "protego>=0.3",
        "charset-normalizer>=3",
        "psutil>=5.9",
        # the crawl's and the virtual web's event loop (libuv): less CPU per event than asyncio's
        'uvloop>=0.19; sys_platform != "win32"',
        # the embedded MongoDB-wire server used when MONGODB_URI is unset
        "nx-27017>=0.8",
    ],
    extras_require={
        # Redis is the broker of the documented several-machines set-up (docs/operations.md)
        "celery": [f"dagster-celery=={DAGSTER_LIBS}", "redis>=5"],
        "dev": [
            "pytest>=8",
            "pytest-timeout>=2.3",
            "ruff>=0.6",
            "requests>=2.31",
            "matplotlib>=3.8",
            # the structured learning corpus reads its truth with a second extractor
            "extruct>=0.16",
            f"dagster-celery=={DAGSTER_LIBS}",
            "redis>=5",
        ],
        "tests": [
            "pytest>=8",
            "extruct>=0.16",
            "pytest-timeout>=2.3",
            "requests>=2.31",
            f"dagster-celery=={DAGSTER_LIBS}",
            "redis>=5",
        ],
    },
    entry_points={"console_scripts": ["enrich-crawl = enrich_crawl.cli:main"]},
)
