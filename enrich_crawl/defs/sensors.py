"""`dataset_specs`: registers the datasets of a watched folder of specs and enriches new ones.

Every `minimum_interval_seconds` the sensor scans the folder (DatasetResource.watched_dir(),
ENRICH_DATASETS_DIR). For a spec whose dataset is new it adds the dataset's key to the dynamic
partitions `datasets`, materialises that partition of `dataset_spec` and launches `enrich_job` for
it (run config naming the spec, tag `enrich_crawl/dataset`); a changed spec or table is registered
again (the nightly schedule re-enriches it); a dataset whose spec is gone is unregistered (its
MongoDB collection and run history stay). Run keys make every request happen once. Specs that
cannot be used are logged once per version of the file.

It runs by default when ENRICH_DATASETS_DIR is set when the definitions load, else it is off
(start it in the UI or with `dagster sensor start dataset_specs`).
"""

import json

import dagster as dg

from enrich_crawl import config
from enrich_crawl.defs.datasets import enrich_run_config
from enrich_crawl.defs.jobs import enrich_job, register_datasets_job
from enrich_crawl.defs.partitions import DATASET_TAG, FINGERPRINT_TAG, TRIGGER_TAG, datasets
from enrich_crawl.defs.resources import DatasetResource


def _default_status() -> dg.DefaultSensorStatus:
    if config.datasets_dir() is not None:
        return dg.DefaultSensorStatus.RUNNING
    return dg.DefaultSensorStatus.STOPPED


@dg.sensor(
    name="dataset_specs",
    jobs=[enrich_job, register_datasets_job],
    minimum_interval_seconds=30,
    default_status=_default_status(),
    description="Registers the dataset specs of the watched folder (ENRICH_DATASETS_DIR) as "
    "partitions of `datasets`, and runs enrich_job for every new dataset.",
)
def dataset_specs(
    context: dg.SensorEvaluationContext, dataset: DatasetResource
) -> dg.SensorResult | dg.SkipReason:
    """Register new, changed and removed dataset specs of the watched folder."""
    from enrich_crawl.catalog import scan_specs

    folder = dataset.watched_dir()
    if folder is None:
        return dg.SkipReason("no watched folder: set ENRICH_DATASETS_DIR (or dataset.watch_dir)")
    if not folder.is_dir():
        return dg.SkipReason(f"watched folder {folder} does not exist")
    found, problems = scan_specs(folder)
    cursor = json.loads(context.cursor) if context.cursor else {}
    seen: dict[str, str] = cursor.get("specs", {})
    reported: list[str] = cursor.get("problems", [])
    for problem in problems:
        if problem.key not in reported:
            context.log.warning(f"dataset spec not used: {problem.reason}")
    registered = set(context.instance.get_dynamic_partitions(datasets.name))

    new = [s for s in found if s.name not in registered]
    changed = [s for s in found if s.name in registered and seen.get(s.name) != s.fingerprint]
    gone = sorted(registered - {s.name for s in found})
    run_requests: list[dg.RunRequest] = []
    for spec in new + changed:
        run_requests.append(
            dg.RunRequest(
                job_name=register_datasets_job.name,
                partition_key=spec.name,
                run_key=f"register:{spec.name}:{spec.fingerprint[:16]}",
                tags={DATASET_TAG: spec.name, TRIGGER_TAG: "sensor"},
            )
        )
    for spec in new:
        context.log.info(f"new dataset {spec.name} ({spec.path}): registering and enriching it")
        run_requests.append(
            dg.RunRequest(
                job_name=enrich_job.name,
                run_key=f"enrich:{spec.name}:{spec.fingerprint[:16]}",
                run_config=enrich_run_config(str(spec.path)),
                tags={
                    DATASET_TAG: spec.name,
                    TRIGGER_TAG: "sensor",
                    FINGERPRINT_TAG: spec.fingerprint,
                },
            )
        )
    for name in gone:
        context.log.info(f"dataset {name}: its spec left {folder}; unregistered")
    partition_requests: list[
        dg.AddDynamicPartitionsRequest | dg.DeleteDynamicPartitionsRequest
    ] = []
    if new:
        partition_requests.append(datasets.build_add_request([s.name for s in new]))
    if gone:
        partition_requests.append(datasets.build_delete_request(gone))
    new_cursor = json.dumps(
        {
            "specs": {s.name: s.fingerprint for s in found},
            "problems": sorted(p.key for p in problems),
        },
        sort_keys=True,
    )
    if not run_requests and not partition_requests:
        context.update_cursor(new_cursor)
        return dg.SkipReason(f"{len(found)} dataset(s) in {folder}, nothing new")
    return dg.SensorResult(
        run_requests=run_requests,
        dynamic_partitions_requests=partition_requests,
        cursor=new_cursor,
    )


@dg.sensor(
    name="dead_runs",
    minimum_interval_seconds=60,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Marks failed the runs whose process is gone (killed, crashed, machine lost) and "
    "frees their crawl pool slots, so that queued runs of their dataset can start.",
)
def dead_runs(context: dg.SensorEvaluationContext) -> dg.SkipReason:
    """enrich_crawl.recovery.close_dead_runs where a daemon runs (no run needs to be launched)."""
    from enrich_crawl.recovery import close_dead_runs

    closed = close_dead_runs(context.instance)
    for run in closed:
        context.log.warning(f"closed run {run.run_id}: {run.reason}; {run.slots_freed} slot(s)")
    return dg.SkipReason(f"{len(closed)} dead run(s) closed" if closed else "no dead run")
