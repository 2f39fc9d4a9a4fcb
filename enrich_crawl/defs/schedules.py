"""`nightly_enrich`: every night, one enrich_job run per dataset that has something due.

Cron and timezone: ENRICH_SCHEDULE_CRON (default `0 2 * * *`) and ENRICH_SCHEDULE_TZ (default UTC),
read when the definitions load; ENRICH_SCHEDULE_RUNNING=1 starts it by default (else start it in the
UI or with `dagster schedule start nightly_enrich`).

The datasets are those of the watched folder (ENRICH_DATASETS_DIR, see sensors.py), else the one
configured dataset (ENRICH_DATASET or the bundled demo). What is due, per dataset:

- new records, or a changed spec: the dataset's fingerprint (spec content, table size and mtime)
  differs from the one of its last successful run;
- values that have aged: the last successful run is older than the dataset's recrawl TTL
  (`crawl.recrawl_ttl_hours`), so missing fields may be found now and `refresh` fields are
  re-resolved.

Inside a run, only what is due is fetched again: the crawl skips pages and records whose needed
fields are fresh (crawled-URL store and recrawl TTL, enrich_crawl.crawl.state), and the seed marks
`refresh` and stale fields as missing.
"""

import datetime as dt

import dagster as dg

from enrich_crawl import config
from enrich_crawl.defs.datasets import enrich_run_config
from enrich_crawl.defs.jobs import enrich_job
from enrich_crawl.defs.partitions import DATASET_TAG, FINGERPRINT_TAG, TRIGGER_TAG
from enrich_crawl.defs.resources import DatasetResource

SCHEDULE_CRON = config.schedule_cron()
SCHEDULE_TZ = config.schedule_timezone()


def _default_status() -> dg.DefaultScheduleStatus:
    if config.schedule_running():
        return dg.DefaultScheduleStatus.RUNNING
    return dg.DefaultScheduleStatus.STOPPED


def last_successful_run(instance: dg.DagsterInstance, dataset: str) -> dg.RunRecord | None:
    records = instance.get_run_records(
        filters=dg.RunsFilter(
            job_name=enrich_job.name,
            statuses=[dg.DagsterRunStatus.SUCCESS],
            tags={DATASET_TAG: dataset},
        ),
        limit=1,
    )
    return records[0] if records else None


def due_reason(
    last: dg.RunRecord | None, fingerprint: str, ttl_hours: float, now: dt.datetime
) -> str | None:
    """Why a dataset is due tonight, or None when nothing is."""
    if last is None:
        return "never enriched"
    if last.dagster_run.tags.get(FINGERPRINT_TAG) != fingerprint:
        return "new or changed records (table or spec changed)"
    ended = last.end_time or last.start_time or last.create_timestamp.timestamp()
    age_hours = (now.timestamp() - float(ended)) / 3600
    if age_hours >= ttl_hours:
        return f"last enriched {age_hours:.1f} h ago (recrawl TTL {ttl_hours:g} h)"
    return None


@dg.schedule(
    name="nightly_enrich",
    job=enrich_job,
    cron_schedule=SCHEDULE_CRON,
    execution_timezone=SCHEDULE_TZ,
    default_status=_default_status(),
    description="Nightly: re-crawl what is due (recrawl TTL, refresh fields) and new records, one "
    "enrich_job run per dataset.",
)
def nightly_enrich(context: dg.ScheduleEvaluationContext, dataset: DatasetResource):
    """One enrich_job run per dataset with something due."""
    from enrich_crawl.catalog import WatchedSpec, fingerprint, scan_specs
    from enrich_crawl.dataset.spec import SpecError

    folder = dataset.watched_dir()
    if folder is not None:
        targets, problems = scan_specs(folder) if folder.is_dir() else ([], [])
        for problem in problems:
            context.log.warning(f"dataset spec not used: {problem.reason}")
        mappings = dataset.mappings
    else:
        try:
            spec = dataset.load()
        except SpecError as exc:
            return dg.SkipReason(f"the configured dataset spec is invalid: {exc}")
        targets = [WatchedSpec(spec.name, spec.path, fingerprint(spec), spec)]
        mappings = dataset.mappings
    now = context.scheduled_execution_time or dt.datetime.now(dt.timezone.utc)
    stamp = now.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M")
    requests: list[dg.RunRequest] = []
    skipped: list[str] = []
    for target in targets:
        reason = due_reason(
            last_successful_run(context.instance, target.name),
            target.fingerprint,
            target.spec.crawl.recrawl_ttl_hours,
            now,
        )
        if reason is None:
            skipped.append(target.name)
            continue
        context.log.info(f"{target.name}: due ({reason})")
        requests.append(
            dg.RunRequest(
                run_key=f"nightly:{target.name}:{stamp}",
                run_config=enrich_run_config(str(target.path), mappings),
                tags={
                    DATASET_TAG: target.name,
                    TRIGGER_TAG: "nightly",
                    FINGERPRINT_TAG: target.fingerprint,
                    "enrich_crawl/due": reason,
                },
            )
        )
    if not requests:
        return dg.SkipReason(
            "nothing due: "
            + (", ".join(skipped) if skipped else "no dataset")
            + " enriched within the recrawl TTL, table unchanged"
        )
    return requests
