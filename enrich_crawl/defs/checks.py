"""Asset checks: they run in every enrich_job run (and with any materialisation of their asset).

seed_dataset      seed_profile                 usable records exist; rejected rows within bound
seed_dataset      seed_data_quality            invalid URL rate (ERROR above half), usable
                                               records, decoding (the seed's profile)
learned_mappings  learned_precision            learn_checks.py
crawl_results     no_robots_violations         zero requests against robots.txt (enrich_crawl.quality)
crawl_results     mapping_agreement            learn_checks.py
enriched_records  every_shard_crawled          each shard of the run crawled; BLOCKING: a failure
                                               fails the run, once the other shards' records
                                               were resolved and merged
enriched_records  resolution_rate              share of missing values found, per field, at least
                                               the threshold (QualityResource)
enriched_records  documents_match_records      one MongoDB document per usable record, no others
enriched_records  values_have_lineage          no value filled without lineage that explains it

Only every_shard_crawled is blocking (it is on the last asset: it blocks nothing of the run, its
failure is the run's); a failed check never throws away other shards' results; `enrich-crawl run`
lists the failed ones in its summary and exits non-zero when one of severity ERROR failed. The
measures are plain functions of enrich_crawl.quality; here they are fed from the staging area and
MongoDB.
"""

from collections.abc import Iterable, Iterator
from typing import Any

import dagster as dg

from enrich_crawl import config
from enrich_crawl.contracts import CRAWL_FAILURE_FILE, WEB_REQUESTS_FILE
from enrich_crawl.defs.check_groups import check_group, check_spec, specs
from enrich_crawl.defs.learn_checks import learned_precision, mapping_agreement
from enrich_crawl.defs.partitions import shards_of_run
from enrich_crawl.defs.resources import (
    CrawlerResource,
    DatasetResource,
    MongoResource,
    QualityResource,
    StagingResource,
)

SAMPLE = 20


def _read_json(path) -> Any:
    import json

    try:
        return json.loads(path.read_text("utf-8"))
    except (OSError, ValueError):
        return None


class _Counted:
    """An iterable that counts what went through it (the pages a check really audited)."""

    def __init__(self, items: Iterable[Any]):
        self.items = items
        self.count = 0

    def __iter__(self) -> Iterator[Any]:
        for item in self.items:
            self.count += 1
            yield item


def _run_shards(context: dg.AssetCheckExecutionContext) -> list[str]:
    return shards_of_run(context.run.tags)


def _seed_ids(stage, keys: list[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(record id, input data) of the usable records of the given shards."""
    from enrich_crawl.dataset.seedfile import read_seed_shard

    for key in keys:
        for record in read_seed_shard(stage.seed_shard(key), columns=("_id", "_data")):
            yield record["_id"], record["_data"]


@check_spec(
    "seed_dataset",
    description="The seed has usable records, and rejects at most max_rejected_rate of the rows.",
)
def seed_profile(
    dataset: DatasetResource, staging: StagingResource, quality: QualityResource
) -> dg.AssetCheckResult:
    """The seed has usable records, and rejects at most max_rejected_rate of the rows."""
    spec = dataset.load()
    manifest = _read_json(staging.stage(spec.name).seed_manifest)
    if not manifest:
        return dg.AssetCheckResult(
            passed=False, description="no seed manifest: seed_dataset did not complete"
        )
    profile = manifest["profile"]
    rows = int(profile.get("rows") or 0)
    usable = int(profile.get("usable") or 0)
    rejected = int(profile.get("rejected") or 0)
    rate = rejected / rows if rows else 0.0
    metadata = {
        "rows": rows,
        "usable_records": usable,
        "rejected_rows": rejected,
        "rejected_rate": round(rate, 4),
        "max_rejected_rate": quality.max_rejected_rate,
        "records_to_enrich": int(profile.get("records_to_enrich") or 0),
    }
    if usable == 0:
        return dg.AssetCheckResult(
            passed=False, metadata=metadata, description=f"{spec.name}: no usable record"
        )
    return dg.AssetCheckResult(
        passed=rate <= quality.max_rejected_rate,
        severity=dg.AssetCheckSeverity.WARN,
        metadata=metadata,
        description=f"{rejected} of {rows} rows rejected ({rate:.1%})",
    )


# a URL column mostly invalid is most likely the wrong column: the run is not worth its result
MAX_INVALID_URL_RATE_ERROR = 0.5


@check_spec(
    "seed_dataset",
    description="The table is fit to enrich: usable records exist; few URL cells are invalid "
    f"(more than 20% warns, more than {MAX_INVALID_URL_RATE_ERROR:.0%} is an ERROR: the URL "
    "column is probably not one); few rows rejected; every line decodes.",
)
def seed_data_quality(
    dataset: DatasetResource, staging: StagingResource, quality: QualityResource
) -> dg.AssetCheckResult:
    """Usable records, invalid URL rate, rejected rows and decoding, from the seed's profile."""
    from enrich_crawl.dataset.profile import profile_checks

    spec = dataset.load()
    manifest = _read_json(staging.stage(spec.name).seed_manifest)
    if not manifest:
        return dg.AssetCheckResult(
            passed=False, description="no seed manifest: seed_dataset did not complete"
        )
    profile = manifest["profile"]
    cells = int(profile.get("urls", 0)) + int(profile.get("invalid_urls", 0))
    invalid = int(profile.get("invalid_urls", 0))
    invalid_rate = invalid / cells if cells else 0.0
    checks = profile_checks(manifest, max_rejected_rate=quality.max_rejected_rate)
    failed = [c for c in checks if not c["passed"]]
    error = any(c["severity"] == "ERROR" for c in failed) or (
        invalid_rate > MAX_INVALID_URL_RATE_ERROR
    )
    figures = {
        "has_usable_records": f"{profile['usable']} usable records of {profile['rows']} rows",
        "urls_mostly_valid": f"invalid URL rate {invalid_rate:.1%} ({invalid} of {cells} URL "
        "cells)",
        "few_rejected_rows": f"{profile['rejected']} of {profile['rows']} rows rejected",
        "text_decodes": f"{profile.get('reading', {}).get('undecodable_lines', 0)} undecodable "
        "line(s)",
    }
    return dg.AssetCheckResult(
        passed=not failed,
        severity=dg.AssetCheckSeverity.ERROR if error else dg.AssetCheckSeverity.WARN,
        metadata={
            "rows": int(profile["rows"]),
            "usable_records": int(profile["usable"]),
            "url_cells": cells,
            "invalid_urls": invalid,
            "invalid_url_rate": round(invalid_rate, 4),
            "records_with_invalid_urls": int(profile.get("records_with_invalid_urls", 0)),
            "checks": dg.MetadataValue.json(
                {c["name"]: {"passed": c["passed"], "severity": c["severity"]} for c in checks}
            ),
        },
        description="; ".join(figures.get(c["name"], c["description"]) for c in failed)
        or f"{profile['usable']} usable records, invalid URL rate {invalid_rate:.1%}",
    )


@check_spec(
    "enriched_records",
    description="Every shard of the run was crawled. Blocking: a shard whose crawl failed after "
    "its retries fails the run, once the other shards' results were resolved and merged.",
    blocking=True,
)
def every_shard_crawled(
    context: dg.AssetCheckExecutionContext, dataset: DatasetResource, staging: StagingResource
) -> dg.AssetCheckResult:
    """Every shard of the run was crawled."""
    selection = context.run.asset_selection
    if selection and dg.AssetKey("crawl_results") not in selection:
        # a run of the merge alone (the command a failed merge prints): nothing was crawled in it
        # (a run of the checks alone, no asset selected, does judge the staged crawl)
        return dg.AssetCheckResult(passed=True, description="the crawl is not part of this run")
    spec = dataset.load()
    stage = staging.stage(spec.name)
    keys = _run_shards(context)
    failed: dict[str, str] = {}
    for key in keys:
        failure = _read_json(stage.crawl_dir(key) / CRAWL_FAILURE_FILE)
        if failure and failure.get("run_id") == context.run.run_id:
            failed[key] = str(failure.get("error", "failed"))
        elif not stage.crawl_stats(key).exists():
            failed[key] = "no crawl statistics (crawl did not finish)"
    metadata = {
        "shards": len(keys),
        "shards_failed": len(failed),
        "failed": dg.MetadataValue.json(failed),
    }
    if not failed:
        return dg.AssetCheckResult(passed=True, metadata=metadata, description="all shards crawled")
    # severity ERROR on a blocking check: the run fails (the other shards are merged already)
    return dg.AssetCheckResult(
        passed=False,
        metadata=metadata,
        description=f"crawl failed for {', '.join(sorted(failed))} after retries: "
        f"{'; '.join(f'{k}: {v}' for k, v in sorted(failed.items()))}. The other shards were "
        "resolved and merged. Re-run the failed shard(s) with: "
        f"{config.dagster_env_prefix()}dagster asset materialize -m enrich_crawl.definitions "
        f"--select 'crawl_results*' --partition {sorted(failed)[0]}",
    )


@check_spec(
    "crawl_results",
    description="No request of the crawl went against robots.txt (server request log of a "
    "virtual web, and the crawler's record of fetched pages; see enrich_crawl.quality).",
)
def no_robots_violations(
    context: dg.AssetCheckExecutionContext,
    dataset: DatasetResource,
    staging: StagingResource,
    crawler: CrawlerResource,
    mongo: MongoResource,
) -> dg.AssetCheckResult:
    """No request of the crawl went against robots.txt."""
    from enrich_crawl.crawl.robots import product_token
    from enrich_crawl.quality import audit_fetched_pages, audit_request_log
    from enrich_crawl.staging import read_jsonl

    spec = dataset.load()
    stage = staging.stage(spec.name)
    user_agent = crawler.environment()["user_agent"]
    keys = _run_shards(context)
    violations: list[dict[str, Any]] = []
    logs = 0
    for key in keys:
        log = stage.crawl_dir(key) / WEB_REQUESTS_FILE
        if spec.virtual_web is not None and log.exists():
            logs += 1
            violations += audit_request_log(read_jsonl(log), spec.virtual_web, user_agent)
    pages_audited = 0
    store_audit = "no run start time"
    record = context.instance.get_run_record_by_id(context.run.run_id)
    since = float(record.start_time) if record and record.start_time else None
    if since is not None:
        try:
            from enrich_crawl.crawl.state import PAGES, ROBOTS

            client = mongo.client()
            try:
                db = client[mongo.database_name()]
                pages = _Counted(db[PAGES].find({}, {"url": 1, "status": 1, "fetched_at": 1}))
                violations += audit_fetched_pages(pages, db[ROBOTS].find({}), user_agent, since)
                pages_audited = pages.count
                store_audit = "yes"
            finally:
                client.close()
        except Exception as exc:  # the store may be absent (no persistence): say so
            store_audit = f"no ({type(exc).__name__}: {mongo.scrub(str(exc))[:200]})"
    unique = {(v["url"], v["reason"]): v for v in violations}
    total = len(unique)
    metadata = {
        "violations": total,
        "request_logs_audited": logs,
        "crawled_pages_audited": pages_audited,
        "page_store_audited": store_audit,
        "product_token": product_token(user_agent),
        "sample": dg.MetadataValue.json(list(unique.values())[:SAMPLE]),
    }
    if not logs and store_audit != "yes":
        # neither the server's request log nor the crawler's page store could be read: a check
        # that saw nothing must not say "no violation"
        return dg.AssetCheckResult(
            passed=False,
            metadata=metadata,
            description=f"nothing audited: no request log, page store not read ({store_audit})",
        )
    return dg.AssetCheckResult(
        passed=total == 0,
        metadata=metadata,
        description="no request against robots.txt"
        if total == 0
        else f"{total} request(s) against robots.txt",
    )


def _documents(mongo: MongoResource, collection: str, projection: dict[str, int]):
    client = mongo.client()
    try:
        yield from client[mongo.database_name()][collection].find({}, projection)
    finally:
        client.close()


@check_spec(
    "enriched_records",
    description="Per field, the share of records that needed a value and got one is at least the "
    "threshold (QualityResource: min_resolution_rate, field_min_resolution_rate).",
)
def resolution_rate(
    dataset: DatasetResource, mongo: MongoResource, quality: QualityResource
) -> dg.AssetCheckResult:
    """Per field, the share of records that needed a value and got one is above the threshold."""
    from enrich_crawl.quality import resolution_rates

    spec = dataset.load()
    rates = resolution_rates(
        _documents(mongo, spec.name, {"data": 1, "lineage": 1}), list(spec.fields)
    )
    below = {
        name: entry["rate"]
        for name, entry in rates.items()
        if entry["needed"] and entry["rate"] < quality.resolution_threshold(name)
    }
    rows = [
        f"| {name} | {e['needed']} | {e['resolved']} | {e['rate']:.1%} | "
        f"{quality.resolution_threshold(name):.0%} |"
        for name, e in rates.items()
    ]
    table = "\n".join(["| field | needed | resolved | rate | threshold |", "|---|---|---|---|---|"])
    return dg.AssetCheckResult(
        passed=not below,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={
            **{f"rate/{name}": e["rate"] for name, e in rates.items()},
            "fields_below_threshold": len(below),
            "rates": dg.MetadataValue.md(table + "\n" + "\n".join(rows)),
        },
        description="every field at or above its threshold"
        if not below
        else "below threshold: " + ", ".join(f"{k} {v:.1%}" for k, v in sorted(below.items())),
    )


@check_spec(
    "enriched_records",
    description="MongoDB holds one document per usable record of the dataset (for the shards of "
    "the run), and no document that is not a usable record.",
)
def documents_match_records(
    context: dg.AssetCheckExecutionContext,
    dataset: DatasetResource,
    staging: StagingResource,
    mongo: MongoResource,
) -> dg.AssetCheckResult:
    """One MongoDB document per usable record, and no other."""
    from enrich_crawl.quality import document_coverage

    spec = dataset.load()
    stage = staging.stage(spec.name)
    manifest = _read_json(stage.seed_manifest) or {}
    all_keys = sorted(manifest.get("shards") or {})
    run_keys = [k for k in _run_shards(context) if k in all_keys]
    usable = {rid for rid, _ in _seed_ids(stage, all_keys)}
    expected = {rid for rid, _ in _seed_ids(stage, run_keys)}
    present = [d["_id"] for d in _documents(mongo, spec.name, {"_id": 1})]
    coverage = document_coverage(expected, present, usable)
    passed = not coverage["missing"] and not coverage["extra"]
    return dg.AssetCheckResult(
        passed=passed,
        metadata={
            "usable_records": len(usable),
            "documents": len(present),
            "expected_for_run_shards": coverage["expected"],
            "missing": len(coverage["missing"]),
            "extra": len(coverage["extra"]),
            "missing_sample": dg.MetadataValue.json(coverage["missing"][:SAMPLE]),
            "extra_sample": dg.MetadataValue.json(coverage["extra"][:SAMPLE]),
        },
        description=f"{len(present)} documents for {len(usable)} usable records"
        + (
            ""
            if passed
            else f": {len(coverage['missing'])} missing, {len(coverage['extra'])} extra"
        ),
    )


@check_spec(
    "enriched_records",
    description="No record holds a value that enrichment gave it without lineage explaining it "
    "(same value, source URL, mapping, run, partition).",
)
def values_have_lineage(
    dataset: DatasetResource, staging: StagingResource, mongo: MongoResource
) -> dg.AssetCheckResult:
    """No value filled by enrichment without lineage."""
    from enrich_crawl.quality import lineage_problems

    spec = dataset.load()
    stage = staging.stage(spec.name)
    manifest = _read_json(stage.seed_manifest) or {}
    inputs = dict(_seed_ids(stage, sorted(manifest.get("shards") or {})))
    problems = lineage_problems(
        _documents(mongo, spec.name, {"data": 1, "original": 1, "lineage": 1}),
        list(spec.fields),
        inputs,
    )
    kinds: dict[str, int] = {}
    for problem in problems:
        kinds[problem["problem"]] = kinds.get(problem["problem"], 0) + 1
    return dg.AssetCheckResult(
        passed=not problems,
        metadata={
            "problems": len(problems),
            **{f"problems/{kind}": count for kind, count in sorted(kinds.items())},
            "sample": dg.MetadataValue.json(problems[:SAMPLE]),
        },
        description="every enriched value has its lineage"
        if not problems
        else f"{len(problems)} value(s) without matching lineage",
    )


# evaluated in their asset's op (assets.py), after the asset
SEED_CHECKS = [seed_profile, seed_data_quality]
MERGE_CHECKS = [resolution_rate, documents_match_records, values_have_lineage, every_shard_crawled]

crawl_checks = check_group(
    "crawl_checks",
    [learned_precision, no_robots_violations, mapping_agreement],
    "The crawl's checks: learned rules' precision, robots.txt obeyed, mappings agree with the "
    "known values.",
)

CHECKS = [crawl_checks]
# every check of the definitions, wherever it is evaluated
ALL_CHECK_SPECS = [*specs(SEED_CHECKS), *crawl_checks.check_specs, *specs(MERGE_CHECKS)]
