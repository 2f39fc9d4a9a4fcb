"""The virtual web moved to enrich_crawl.virtualweb (a runtime feature behind the `virtual_web`
spec key, not a test helper); this name keeps working for tests and `python -m` users."""

import sys

from enrich_crawl.virtualweb import *  # noqa: F403  (the same names, one list of them)
from enrich_crawl.virtualweb import __all__, main  # noqa: F401

if __name__ == "__main__":
    sys.exit(main())
