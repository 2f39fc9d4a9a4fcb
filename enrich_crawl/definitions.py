"""The one Definitions object of enrich_crawl (workspace.yaml loads this module).

No Twisted or Scrapy import happens here: every crawl runs in its own process.
"""

from __future__ import annotations

import dagster as dg

from enrich_crawl import config
from enrich_crawl.defs.assets import ASSETS
from enrich_crawl.defs.checks import CHECKS
from enrich_crawl.defs.datasets import dataset_spec
from enrich_crawl.defs.export import enriched_export
from enrich_crawl.defs.jobs import enrich_job, register_datasets_job
from enrich_crawl.defs.pipes import CrawlProcessClient
from enrich_crawl.defs.resources import (
    CrawlerResource,
    DatasetResource,
    MongoResource,
    QualityResource,
    StagingResource,
    VirtualWebResource,
)
from enrich_crawl.defs.schedules import nightly_enrich
from enrich_crawl.defs.sensors import dataset_specs, dead_runs


def _mongo() -> MongoResource:
    # EnvVar: read at run time and shown by name only in the UI; unset means the embedded server
    if config.mongodb_uri():
        return MongoResource(uri=dg.EnvVar("MONGODB_URI"))
    return MongoResource()


defs = dg.Definitions(
    assets=[*ASSETS, dataset_spec, enriched_export],
    asset_checks=CHECKS,
    jobs=[enrich_job, register_datasets_job],
    schedules=[nightly_enrich],
    sensors=[dataset_specs, dead_runs],
    resources={
        "dataset": DatasetResource(),
        "staging": StagingResource(),
        "crawler": CrawlerResource(),
        "mongo": _mongo(),
        "crawl_process": CrawlProcessClient(),
        "quality": QualityResource(),
        "virtual_web": VirtualWebResource(),
    },
)


def enrich_job_def() -> dg.JobDefinition:
    """The resolved enrich_job, for `dagster.reconstructable` (used by `enrich-crawl run`)."""
    return defs.resolve_job_def("enrich_job")
