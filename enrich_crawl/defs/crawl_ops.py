"""The ops of the graph asset `crawl_results`: the shards' crawls, fanned out as steps.

plan_crawl_shards -> crawl_shard (one mapped step per crawl process, in the `crawl` pool: a group
of the run's shards, one shard each when there are as many processes as shards, see
CrawlerResource.crawl_processes) -> summarize_crawl (statistics as metadata, per shard partition
and for the run).

- Each crawl runs in `python -m enrich_crawl.crawl.worker` through Dagster Pipes (pipes.py): its
  progress lines reach the run's log while it runs (one a minute at most; `progress.json` in the
  staging area follows it every few seconds), its final statistics come back as a message, one
  per shard (a process crawling several shards runs one Scrapy crawler for each).
- Transient failures (a worker that crashed, was killed, gave no result, or one of its shards'
  crawls that failed) are retried by the RetryPolicy, the step's whole group of shards again (a
  shard that had finished gets its pages back from the page store). A shard that still fails after
  its last retry does not fail its step (that would abandon every step after the fan-in): the step
  outputs its failure beside the other shards' statistics, so their results are still resolved
  and merged in the same run, and the check `every_shard_crawled` then fails the run and names the
  shard (checks.py).
- Time budgets: a shard's crawl stops cleanly (Scrapy CLOSESPIDER_TIMEOUT; what it found is kept)
  after the partition budget (CrawlerResource.time_budget_seconds or the dataset's
  crawl.time_budget_seconds) or when the run's budget (CrawlerResource.run_budget()) is spent,
  whichever comes first.
"""

import contextlib
import os
import socket
import time
from collections import Counter
from typing import Any

import dagster as dg

from enrich_crawl import config
from enrich_crawl.contracts import CRAWL_FAILURE_FILE, CRAWL_RUN_FILES, WEB_REQUESTS_FILE
from enrich_crawl.dataset.shard import crawl_groups, group_key
from enrich_crawl.defs.pipes import CrawlProcessClient, StaleCrawl
from enrich_crawl.defs.resources import (
    CrawlerResource,
    DatasetResource,
    MongoResource,
    StagingResource,
    VirtualWebResource,
)


def _retry_policy() -> dg.RetryPolicy:
    """Retries of a crawl step (ENRICH_CRAWL_RETRIES, default 2; first delay
    ENRICH_CRAWL_RETRY_DELAY seconds, default 10, then doubled), read when the definitions load."""
    return dg.RetryPolicy(
        max_retries=config.crawl_retries(),
        delay=config.crawl_retry_delay(),
        backoff=dg.Backoff.EXPONENTIAL,
    )


CRAWL_RETRY = _retry_policy()
# a crawl always gets at least this long, so that a shard started after the run budget is spent
# still ends with every record and its reason (time budget) rather than not at all
MIN_CRAWL_SECONDS = 1.0


def markdown_table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def node_name() -> str:
    """Which machine and process ran a step (several machines: which Celery worker)."""
    return f"{socket.gethostname()}:{os.getpid()}"


def run_started_at(context: dg.OpExecutionContext) -> float:
    """The run's start (epoch seconds), as the instance recorded it."""
    record = context.instance.get_run_record_by_id(context.run_id)
    started = record.start_time if record is not None else None
    return float(started) if started else time.time()


def crawl_budget(
    partition_budget: float | None, run_budget: float | None, run_started: float, now: float
) -> float | None:
    """Seconds the shard's crawl may take: the tighter of the partition's and the run's budget."""
    budgets = [b for b in (partition_budget,) if b and b > 0]
    if run_budget:
        budgets.append(max(run_budget - (now - run_started), MIN_CRAWL_SECONDS))
    return min(budgets) if budgets else None


@dg.op(
    out=dg.DynamicOut(list),
    ins={"seed_dataset": dg.In(dg.Nothing), "learned_mappings": dg.In(dg.Nothing)},
)
def plan_crawl_shards(
    context: dg.OpExecutionContext,
    dataset: DatasetResource,
    staging: StagingResource,
    crawler: CrawlerResource,
):
    """One dynamic output per crawl process: the run's shards dealt out into
    `CrawlerResource.processes_for` groups (one shard each when there are as many processes as
    shards), once the mappings are known valid.

    An invalid mapping is refused here, before any crawl starts, with its file,
    JSON path and reason, whatever launched the run (UI, schedule, sensor, `dagster job execute`):
    a crawl process would only skip it and log the reason where nobody looks.
    """
    from enrich_crawl.extract.mapping import MappingLoadError, MappingSet

    mappings_dir = dataset.mappings_dir()
    try:
        MappingSet.load(mappings_dir)
        learned = learned_dir_of(dataset, staging)
        if learned is not None:
            MappingSet.load(learned)
    except MappingLoadError as exc:
        raise dg.Failure(
            description=f"{exc}\nNo shard was crawled. Fix the mappings (check them with: "
            f"enrich-crawl mapping check {mappings_dir}), then run again.",
            metadata={
                "mappings": dg.MetadataValue.path(str(mappings_dir)),
                "problems": len(exc.errors),
            },
            allow_retries=False,
        ) from None
    keys = list(context.partition_keys)
    groups = crawl_groups(keys, crawler.processes_for(len(keys)))
    if len(groups) < len(keys):
        context.log.info(
            f"{len(keys)} shards in {len(groups)} crawl processes: "
            + "; ".join(", ".join(group) for group in groups)
        )
    for group in groups:
        yield dg.DynamicOutput(group, mapping_key=group_key(group))


def learned_dir_of(dataset: DatasetResource, staging: StagingResource):
    """The learned mappings the crawl uses beside the given ones (spec key `learn`), or None."""
    from enrich_crawl.learning import has_mappings

    spec = dataset.load()
    learned = staging.stage(spec.name).learned_dir
    return learned if spec.learn and has_mappings(learned) else None


@dg.op(
    retry_policy=CRAWL_RETRY,
    pool="crawl",
    tags={"kind": "scrapy"},
)
def crawl_shard(
    context: dg.OpExecutionContext,
    shards: list,
    dataset: DatasetResource,
    staging: StagingResource,
    crawler: CrawlerResource,
    mongo: MongoResource,
    crawl_process: CrawlProcessClient,
    virtual_web: VirtualWebResource,
):
    """Crawl a group of shards in one process (Scrapy through Dagster Pipes, one crawler per
    shard); outputs one result per shard, its statistics or its failure."""
    from enrich_crawl.crawl.params import WorkerParams
    from enrich_crawl.staging import write_json

    spec = dataset.load()
    stage = staging.stage(spec.name)
    node = node_name()
    out_dirs = {shard: stage.crawl_dir(shard) for shard in shards}
    # nothing of a shard's files is touched before this attempt owns them (staging.claim_shard)
    for out_dir in out_dirs.values():
        claim_crawl_files(context, out_dir, node)
    names = ", ".join(shards)

    def failed(errors: dict[str, str]) -> list[dict]:
        """The failures of these shards, written where the check every_shard_crawled finds them."""
        out = []
        for shard, error in errors.items():
            failure = _failure(context, shard, node, error)
            write_json(out_dirs[shard] / CRAWL_FAILURE_FILE, failure)
            out.append(failure)
        return out

    if context.retry_number > CRAWL_RETRY.max_retries:
        # retried past its policy: its worker was lost on the last attempt (the executor
        # retries a step whose worker died, defs/celery_recovery.py); give up as a crawl
        # failure does, so that every other shard is still resolved and merged
        failures = failed({shard: "the worker running it was lost" for shard in shards})
        context.log.error(f"crawl of shard(s) {names} abandoned: {failures[0]['error']}")
        yield dg.Output(failures, metadata={"node": node, "crawl_failed": len(failures)})
        return

    env = crawler.environment()
    crawl = spec.crawl.to_dict()
    partition_budget = (
        crawler.time_budget_seconds
        if crawler.time_budget_seconds is not None
        else spec.crawl.time_budget_seconds
    )
    run_budget = crawler.run_budget()
    budget = crawl_budget(
        partition_budget,
        run_budget,
        run_started_at(context) if run_budget else 0.0,
        time.time(),
    )
    crawl["time_budget_seconds"] = round(budget, 3) if budget else 0.0
    if budget and run_budget and budget < (partition_budget or float("inf")):
        context.log.info(f"shard(s) {names}: {budget:.0f} s left of the run's {run_budget:.0f} s")
    learned = learned_dir_of(dataset, staging)
    params = [
        WorkerParams(
            dataset=spec.name,
            partition=shard,
            seed_path=str(stage.seed_shard(shard)),
            out_dir=str(out_dirs[shard]),
            mappings_dir=str(dataset.mappings_dir()),
            field_types=spec.field_types(),
            crawl=crawl,
            run_id=context.run_id,
            user_agent=env["user_agent"],
            proxy=env["proxy"],
            allow_private=env["allow_private"],
            chromium=env["chromium"],
            mongo_db=mongo.database_name(),
            max_active_records=crawler.max_active_records,
            log_level=crawler.log_level,
            learned_mappings_dir=str(learned) if learned is not None else None,
        )
        for shard in shards
    ]

    def still_wanted() -> str | None:
        return next((why for d in out_dirs.values() if (why := superseded(d, context))), None)

    last = context.retry_number >= CRAWL_RETRY.max_retries
    try:
        with contextlib.ExitStack() as stack:
            if spec.virtual_web is not None:
                # the dataset brings its own web (demo, offline tests): served for this crawl
                # process, its request log in its first shard's folder (the robots check reads
                # every shard's)
                web = stack.enter_context(
                    virtual_web.serve(spec.virtual_web, out_dirs[shards[0]] / WEB_REQUESTS_FILE)
                )
                for p in params:
                    p.proxy = web.proxy_url
                context.log.info(
                    f"serving the dataset's virtual web {spec.virtual_web} at {web.proxy_url}"
                )
            context.log.info(
                f"crawl of shard(s) {names} on {node} (attempt {context.retry_number})"
            )
            results = crawl_process.run_crawls(
                context=context,
                shards=params,
                env={"MONGODB_URI": mongo.effective_uri()},
                still_wanted=still_wanted,
            )
    except StaleCrawl:
        raise  # another attempt owns the shard's files: write nothing, not even a failure
    except dg.Failure as exc:
        if not last:
            raise
        results = {shard: exc.description or str(exc) for shard in shards}
    errors = {shard: r for shard, r in results.items() if isinstance(r, str)}
    if errors and not last:
        # a retry crawls the group again (its finished shards' pages come from the page store)
        raise dg.Failure(
            description="; ".join(errors.values()),
            metadata={"shards": names, "failed": ", ".join(errors)},
        )
    for shard, error in errors.items():
        context.log.error(
            f"crawl of shard {shard} failed after {context.retry_number + 1} attempts "
            f"({error}); the other shards go on and the check every_shard_crawled "
            f"will fail this run. Re-run it alone with: {config.dagster_env_prefix()}"
            f"dagster asset materialize -m "
            f"enrich_crawl.definitions --select 'crawl_results*' --partition {shard}"
        )
    failures = {f["partition"]: f for f in failed(errors)}
    outputs = [
        failures[shard]
        if shard in failures
        else {**results[shard], "node": node, "time_budget_seconds": budget or 0.0}
        for shard in shards
    ]
    # a Pipes session puts the op in typed-event-stream mode: outputs must be explicit; a shard
    # that failed is an output all the same (summarize_crawl and the check every_shard_crawled
    # read the failure from it)
    metadata: dict[str, Any] = {
        "node": node,
        "shards": names,
        "pages": sum(int(o.get("pages") or 0) for o in outputs),
    }
    if failures:
        metadata["crawl_failed"] = len(failures)
    yield dg.Output(outputs, metadata=metadata)


def _failure(context: dg.OpExecutionContext, shard: str, node: str, error: str) -> dict:
    return {
        "run_id": context.run_id,
        "partition": shard,
        "crawl_failed": 1,
        "attempts": context.retry_number + 1,
        "node": node,
        "error": error,
        "at": time.time(),
    }


def run_is_live(instance: dg.DagsterInstance, run_id: str) -> bool:
    run = instance.get_run_by_id(run_id)
    return run is not None and not run.is_finished and run.status != dg.DagsterRunStatus.CANCELING


def superseded(out_dir: Any, context: dg.OpExecutionContext) -> str | None:
    """Why this attempt no longer owns the shard's files (a worker cut off from the run was
    judged lost and its step retried elsewhere, while its crawl went on), else None."""
    from enrich_crawl.staging import shard_owner

    owner = shard_owner(out_dir) or {}
    if owner.get("run_id") == context.run_id and owner.get("attempt") == context.retry_number:
        return None
    return (
        f"attempt {owner.get('attempt')} of run {owner.get('run_id')} (on {owner.get('node')}) "
        "owns the shard now"
    )


def claim_crawl_files(context: dg.OpExecutionContext, out_dir: Any, node: str) -> None:
    """Own the shard's crawl files for this attempt, then clear what an earlier run left there
    (a crawl that dies early must never leave an older run's results to be merged as this
    run's). A stale attempt (its run ended, or a newer attempt owns the files: a task redelivered
    late) fails here without touching them, and without retries."""
    from enrich_crawl.staging import StaleAttempt, claim_shard

    try:
        claim_shard(
            out_dir,
            context.run_id,
            context.retry_number,
            lambda run_id: run_is_live(context.instance, run_id),
            node=node,
        )
    except StaleAttempt as exc:
        raise StaleCrawl(
            description=f"stale crawl attempt, nothing written: {exc}", allow_retries=False
        ) from None
    for name in CRAWL_RUN_FILES:
        (out_dir / name).unlink(missing_ok=True)


_PER_SHARD_NUMBERS = (
    "records_fed",
    "records_done",
    "pages",
    "pages_reused",
    "bytes",
    "candidates",
    "requests",
    "robots_refusals",
    "robots_fetched",
    "dropped_requests",
    "seconds",
    "pages_per_second",
)


def _numeric(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def shard_metadata(stats: dict[str, Any]) -> dict[str, Any]:
    """The metadata of one shard's crawl_results partition (numeric: the UI plots it)."""
    metadata: dict[str, Any] = {
        key: stats[key] for key in _PER_SHARD_NUMBERS if _numeric(stats.get(key))
    }
    # statistics the crawl engine adds later are shown too
    for key, value in stats.items():
        if key not in metadata and _numeric(value) and key != "started_at":
            metadata[key] = value
    errors = stats.get("errors_by_kind") or {}
    metadata["errors"] = sum(errors.values())
    for kind, count in sorted(errors.items()):
        metadata[f"errors/{kind}"] = count
    for outcome, count in sorted((stats.get("outcomes") or {}).items()):
        metadata[f"records/{outcome}"] = count
    resolved = (stats.get("outcomes") or {}).get("resolved", 0)
    metadata["pages_per_resolved_record"] = (
        round(stats.get("pages", 0) / resolved, 3) if resolved else 0.0
    )
    metadata["finish_reason"] = str(stats.get("finish_reason", ""))
    metadata["node"] = str(stats.get("node", ""))
    metadata["crawl_failed"] = 0
    return metadata


@dg.op(out=dg.Out(dg.Nothing))
def summarize_crawl(context: dg.OpExecutionContext, shard_stats: list[list]) -> None:
    """Crawl statistics as metadata: per shard partition, and the run's totals (`shard_stats`:
    each crawl process's list of its shards' results)."""
    step = context.get_step_execution_context()
    shard_stats = [s for group in shard_stats for s in group]
    failures = {s["partition"]: s for s in shard_stats if s.get("crawl_failed")}
    shard_stats = [s for s in shard_stats if not s.get("crawl_failed")]
    crawled = {s["partition"]: s for s in shard_stats}
    failed = [key for key in context.partition_keys if key not in crawled]
    for key in context.partition_keys:
        if key in crawled:
            step.add_asset_metadata(shard_metadata(crawled[key]), partition_key=key)
        else:
            error = str(failures.get(key, {}).get("error", "no result"))
            step.add_asset_metadata(
                {"crawl_failed": 1, "pages": 0, "records_done": 0, "error": error},
                partition_key=key,
            )
    pages = sum(s.get("pages", 0) for s in shard_stats)
    errors: Counter[str] = Counter()
    outcomes: Counter[str] = Counter()
    for s in shard_stats:
        errors.update(s.get("errors_by_kind", {}))
        outcomes.update(s.get("outcomes", {}))
    resolved = outcomes.get("resolved", 0)
    rows = [
        [
            s["partition"],
            s.get("records_done", 0),
            s.get("pages", 0),
            s.get("pages_per_second", 0),
            sum(s.get("errors_by_kind", {}).values()),
            s.get("finish_reason", ""),
            s.get("seconds", ""),
            s.get("node", ""),
        ]
        for s in sorted(shard_stats, key=lambda s: s["partition"])
    ]
    rows += [[key, "-", "-", "-", "-", "FAILED", "-", "-"] for key in failed]
    if failed:
        context.log.error(f"shards whose crawl failed in this run: {', '.join(failed)}")
    context.add_output_metadata(
        {
            "run_shards": len(context.partition_keys),
            "run_shards_crawled": len(shard_stats),
            "run_shards_failed": len(failed),
            "run_pages_fetched": pages,
            "run_records_crawled": sum(s.get("records_done", 0) for s in shard_stats),
            "run_records_resolved_by_crawl": resolved,
            "run_pages_per_resolved_record": round(pages / resolved, 3) if resolved else 0.0,
            "run_robots_refusals": sum(s.get("robots_refusals", 0) for s in shard_stats),
            "run_errors_by_kind": dg.MetadataValue.json(dict(errors)),
            "per_shard": dg.MetadataValue.md(
                markdown_table(
                    ["shard", "records", "pages", "pages/s", "errors", "finish", "s", "node"], rows
                )
            ),
        }
    )
