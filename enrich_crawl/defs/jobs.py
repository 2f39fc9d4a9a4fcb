"""`enrich_job`: the whole chain for the configured dataset, every shard in one run.

The crawl fans out one step per crawl process (a shard, or a group of shards: ENRICH_CRAWL_PROCESSES).
Locally the steps run as parallel processes (multiprocess executor; `max_concurrent` defaults to
ENRICH_MAX_PARALLEL or 8 because a crawl step mostly waits on politeness delays, not on the CPU);
with ENRICH_EXECUTOR=celery they run on dagster-celery workers on any number of machines. The `crawl` concurrency pool (dagster.yaml) bounds crawls across runs.
"""

from __future__ import annotations

import dagster as dg

from enrich_crawl import config
from enrich_crawl.defs.assets import ASSETS
from enrich_crawl.defs.datasets import dataset_spec
from enrich_crawl.defs.partitions import ALL_SHARDS_TAGS

# a spawned step process imports dagster, the definitions, pandas and pyarrow again: seconds of CPU
# per step, on the critical path of every run; a fork from the preloaded server takes milliseconds.
# Each step also opens the instance: its storage modules (SQLite or PostgreSQL, alembic, the
# compute-log manager; 0.6 s of imports a step) are preloaded too.
FORKSERVER = {
    "forkserver": {
        "preload_modules": [
            "enrich_crawl.definitions",
            "pandas",
            "pyarrow.parquet",
            "pymongo",
            "enrich_crawl.defs.instance",  # the storage each step's instance opens
            "dagster._core.storage.sqlite_storage",
            "dagster._core.storage.local_compute_log_manager",
            "dagster_postgres",
            "upath",  # the filesystem IO manager's
            # what the steps import when they run (a crawl step runs once per shard)
            "enrich_crawl.extract.mapping",
            "enrich_crawl.dataset.load",
            "enrich_crawl.resolve",
            "enrich_crawl.store.merge",
            "enrich_crawl.quality",
            # last: what is loaded by now is frozen (the steps do not traverse and copy it)
            "enrich_crawl.defs.forkserver",
        ]
    }
}


# Dagster's multiprocess executor waits on each running step's event queue in turn for up to
# `child_process_executor.TICK` (20 ms): eight crawl steps that mostly wait on politeness delays
# wake the run's process ~50 times a second for the whole crawl, a few percent of a core. A step's
# events (its log lines, its materialisation) can wait a little longer: nothing is lost (the queue
# keeps them), and a round over eight idle steps takes at most 8 x STEP_EVENT_POLL.
# Private: TICK is a module constant of dagster._core.executor.child_process_executor; neither
# the executor's config nor any public API sets it (Dagster 1.13), and the alternative, an
# executor of our own, would reimplement the multiprocess executor on more private machinery.
STEP_EVENT_POLL = 0.25


@dg.configured(
    dg.multiprocess_executor,
    config_schema={
        "max_concurrent": dg.Field(
            int,
            default_value=config.max_parallel(),
            is_required=False,
            description="Steps (crawl processes) at once.",
        ),
        "start_method": dg.Field(
            dg.Permissive(),
            is_required=False,
            description="`{spawn: {}}` or `{forkserver: {preload_modules: [...]}}`; default: a "
            "forkserver preloading the definitions, pandas, pyarrow and pymongo.",
        ),
    },
)
def enrich_multiprocess_executor(config):
    """The multiprocess executor with a crawl-friendly default concurrency, its step processes
    forked from a server that has the definitions and the heavy libraries loaded already."""
    from dagster._core.executor import child_process_executor

    from enrich_crawl.defs.recovering import install_patient_claims

    child_process_executor.TICK = max(child_process_executor.TICK, STEP_EVENT_POLL)
    install_patient_claims()
    return {
        "max_concurrent": config["max_concurrent"],
        "start_method": config.get("start_method") or FORKSERVER,
    }


def _executor():
    """The executor named by ENRICH_EXECUTOR, wrapped to close dead runs before it starts
    (enrich_crawl/recovery.py)."""
    from enrich_crawl.defs.recovering import with_recovery

    return with_recovery(_base_executor())


def _base_executor():
    kind = config.executor_kind()
    if kind == "celery":
        from enrich_crawl.defs.celery_recovery import recovering_celery_executor

        return recovering_celery_executor
    if kind == "in_process":
        return dg.in_process_executor
    return enrich_multiprocess_executor


enrich_job = dg.define_asset_job(
    "enrich_job",
    selection=dg.AssetSelection.assets(*ASSETS),
    tags=ALL_SHARDS_TAGS,
    executor_def=_executor(),
    description="Load, crawl (all shards), resolve and merge the configured dataset.",
)

# the sensor registers new datasets of the watched folder with this job (one partition per dataset)
register_datasets_job = dg.define_asset_job(
    "register_datasets",
    selection=dg.AssetSelection.assets(dataset_spec),
    description="Validate and register a dataset spec of the watched folder (sensor dataset_specs).",
)
