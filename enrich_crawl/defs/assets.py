"""The asset chain: seed_dataset -> learned_mappings -> crawl_results (partitioned) -> resolved_fields
-> enriched_records.

Wiring only: the work is done by enrich_crawl.dataset, .crawl (in subprocesses of one shard or a
group of shards, through Dagster Pipes), .resolve and .store. resolved_fields and enriched_records are materialised by one
op (`resolve_and_merge`), and the seed's and the merge's checks are evaluated in their asset's op:
each step is a process, which costs more than these steps' own work; each asset and check can
still be materialised or run alone (the ops can be subset).
"""

import json
from collections import Counter
from typing import Any

import dagster as dg

from enrich_crawl import config
from enrich_crawl.defs.check_groups import evaluate_checks, resource_keys, specs
from enrich_crawl.defs.checks import MERGE_CHECKS, SEED_CHECKS
from enrich_crawl.defs.crawl_ops import crawl_shard, plan_crawl_shards, summarize_crawl
from enrich_crawl.defs.partitions import SHARD_KEYS, shards
from enrich_crawl.defs.resources import (
    CrawlerResource,
    DatasetResource,
    MongoResource,
    QualityResource,
    StagingResource,
)

GROUP = "enrich"
WEB_RETRY = dg.RetryPolicy(max_retries=2, delay=10, backoff=dg.Backoff.EXPONENTIAL)


def _markdown_table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


SEED = dg.AssetKey("seed_dataset")
RESOLVED = dg.AssetKey("resolved_fields")
ENRICHED = dg.AssetKey("enriched_records")


@dg.multi_asset(
    name="seed_dataset",
    specs=[
        dg.AssetSpec(
            SEED,
            group_name=GROUP,
            kinds={"pandas", "parquet"},
            description="The dirty table loaded, cleaned, profiled and sharded for the crawl.",
        )
    ],
    # evaluated here, after the seed: a step of their own would cost more than they do
    check_specs=specs(SEED_CHECKS),
    can_subset=True,
)
def seed_dataset(
    context: dg.AssetExecutionContext,
    dataset: DatasetResource,
    staging: StagingResource,
    quality: QualityResource,
):
    """The dirty table loaded, cleaned, profiled and sharded for the crawl; then its checks."""
    if SEED in context.selected_asset_keys:
        yield seed_table(context, dataset, staging)
    resources = {"dataset": dataset, "staging": staging, "quality": quality}
    yield from evaluate_checks(context, SEED_CHECKS, resources, raise_errors=False)


def seed_table(
    context: dg.AssetExecutionContext, dataset: DatasetResource, staging: StagingResource
) -> dg.MaterializeResult:
    """seed_dataset's materialisation."""
    from enrich_crawl.dataset.load import prepare_dataset
    from enrich_crawl.dataset.profile import markdown_table, profile_checks, ui_metadata

    spec = dataset.load()
    stage = staging.stage(spec.name)
    # its warnings (a field named almost like a column) in the run's log, as events the UI shows;
    # `enrich-crawl run` printed them before the run (preflight) and keeps the run's log off its
    # terminal without -v (runner.py), so they are not shown twice
    manifest = prepare_dataset(spec, stage, SHARD_KEYS, warn=context.log.warning)
    profile = manifest["profile"]
    context.log.info(
        f"{spec.name}: {profile['rows']} rows, {profile['usable']} usable, "
        f"{profile['rejected']} rejected ({profile.get('quarantined', 0)} malformed), "
        f"{profile['records_to_enrich']} to enrich, in {manifest['seconds']} s"
    )
    ui = ui_metadata(manifest)
    checks = profile_checks(manifest)
    # a failed one is the asset check seed_data_quality (checks.py), shown in the run's summary
    # numbers are plain values (plotted across materialisations), tables markdown, the rest JSON
    metadata: dict[str, Any] = {
        "dataset": spec.name,
        "spec": dg.MetadataValue.path(str(spec.path)),
        "source": dg.MetadataValue.path(str(spec.source)),
        "rejected_file": dg.MetadataValue.path(str(stage.rejected)),
        **ui["numbers"],
        **{key: dg.MetadataValue.md(text) for key, text in ui["markdown"].items()},
        **{key: dg.MetadataValue.json(value) for key, value in ui["json"].items()},
        "quality_checks": dg.MetadataValue.md(
            markdown_table(
                ["check", "passed", "severity", "what"],
                [[c["name"], c["passed"], c["severity"], c["description"]] for c in checks],
            )
        ),
    }
    return dg.MaterializeResult(asset_key=SEED, metadata=metadata)


@dg.asset(
    group_name=GROUP,
    kinds={"python"},
    deps=[seed_dataset],
    retry_policy=WEB_RETRY,
    description="Mappings learned from the dataset's known values (spec key `learn: true`): a "
    "bounded sample of records' pages fetched politely, rules kept above the precision bar.",
)
def learned_mappings(
    context: dg.AssetExecutionContext,
    dataset: DatasetResource,
    staging: StagingResource,
    crawler: CrawlerResource,
    mongo: MongoResource,
) -> dg.MaterializeResult:
    """Mappings learned from the dataset's known values (when the spec says `learn: true`)."""
    from enrich_crawl.extract.mapping import MappingLoadError
    from enrich_crawl.learning import FetchContext, learn_dataset, learned_fields
    from enrich_crawl.staging import read_json

    spec = dataset.load()
    stage = staging.stage(spec.name)
    if not spec.learn:
        return dg.MaterializeResult(
            metadata={"learning": "off (spec key `learn` is false)", "mappings_learned": 0}
        )
    env = crawler.environment()
    ctx = FetchContext(
        work_dir=stage.learn_work,
        mongo_uri=mongo.effective_uri(),
        mongo_db=mongo.database_name(),
        user_agent=env["user_agent"],
        proxy=env["proxy"],
        allow_private=env["allow_private"],
        run_id=context.run_id,
        log=context.log.info,
    )
    shards = sorted(read_json(stage.seed_manifest).get("shards") or {})
    try:
        outcome = learn_dataset(
            spec,
            [stage.seed_shard(key) for key in shards],
            stage.learned_dir,
            ctx,
            given_dir=dataset.mappings_dir(),
        )
    except MappingLoadError as exc:
        raise dg.Failure(description=str(exc), allow_retries=False) from None
    fields = learned_fields(outcome.mappings)
    rows, numbers = [], {}
    for name in spec.fields:
        best = (fields.get(name) or [{}])[0]
        examples = int(((outcome.report.get("fields") or {}).get(name) or {}).get("examples") or 0)
        numbers[f"precision/{name}"] = float(best.get("precision") or 0.0)
        numbers[f"recall/{name}"] = float(best.get("recall") or 0.0)
        numbers[f"examples/{name}"] = examples
        rule = best.get("rule")
        rows.append(
            [
                name,
                examples,
                best.get("precision", "-"),
                best.get("recall", "-"),
                best.get("mapping", "-"),
                f"`{json.dumps(rule)[:200]}`" if rule else _why_not(outcome.report, name),
            ]
        )
    fetch = outcome.fetch
    context.log.info(
        f"learned {len(outcome.mappings)} mapping(s) for {len(fields)} of {len(spec.fields)} "
        f"field(s) from {fetch['records_sampled']} records ({fetch['pages_fetched']} pages fetched)"
    )
    return dg.MaterializeResult(
        metadata={
            "learning": "on",
            "mappings_learned": len(outcome.mappings),
            "fields_learned": len(fields),
            "records_sampled": fetch["records_sampled"],
            "pages_fetched": fetch["pages_fetched"],
            "pages_fetched_per_record": fetch["pages_fetched_per_record"],
            "learned_dir": dg.MetadataValue.path(str(stage.learned_dir)),
            **numbers,
            "fields": dg.MetadataValue.md(
                _markdown_table(
                    ["field", "examples", "precision", "recall", "mapping", "rule"], rows
                )
            ),
        }
    )


def _why_not(report: dict[str, Any], name: str) -> str:
    entry = (report.get("fields") or {}).get(name) or {}
    why = entry.get("why_nothing")
    return f"nothing learned: {why}" if why else "nothing learned"


# -- crawl_results: crawl processes of one shard or a group, fanned out as steps (crawl_ops.py)


@dg.graph_asset(
    group_name=GROUP,
    kinds={"scrapy"},
    partitions_def=shards,
    backfill_policy=dg.BackfillPolicy.single_run(),
    ins={
        "seed_dataset": dg.AssetIn(dagster_type=dg.Nothing),
        "learned_mappings": dg.AssetIn(dagster_type=dg.Nothing),
    },
    description="The depth-limited crawls of the shards and the pages' extracted candidates.",
)
def crawl_results(seed_dataset, learned_mappings):
    """The depth-limited crawls of the shards and the pages' extracted candidates."""
    shards = plan_crawl_shards(seed_dataset=seed_dataset, learned_mappings=learned_mappings)
    return summarize_crawl(shards.map(crawl_shard).collect())


@dg.multi_asset(
    name="resolve_and_merge",
    specs=[
        dg.AssetSpec(
            RESOLVED,
            group_name=GROUP,
            kinds={"python"},
            deps=[crawl_results],
            partitions_def=shards,
            description="The mapping-resolved value of every record's missing fields, with "
            "lineage.",
        ),
        dg.AssetSpec(
            ENRICHED,
            group_name=GROUP,
            kinds={"mongodb"},
            deps=[RESOLVED],
            partitions_def=shards,
            description="The records merged into MongoDB with per-field lineage.",
        ),
    ],
    # evaluated here, after the merge; every_shard_crawled is blocking: its failure fails the run
    check_specs=specs(MERGE_CHECKS),
    can_subset=True,
    partitions_def=shards,
    backfill_policy=dg.BackfillPolicy.single_run(),
    # a merge interrupted by a passing outage is retried (the resolving again: it is idempotent)
    retry_policy=dg.RetryPolicy(max_retries=2, delay=15),
    required_resource_keys={"dataset", "staging", "mongo", *resource_keys(MERGE_CHECKS)},
)
def resolve_and_merge(context: dg.AssetExecutionContext):
    """resolved_fields then enriched_records (one step: each can be materialised alone), then
    their checks. The merge reads only the staged resolved files, so it can be re-run alone."""
    r = context.resources
    if RESOLVED in context.selected_asset_keys:
        yield resolve_fields(context, r.dataset, r.staging)
    if ENRICHED in context.selected_asset_keys:
        yield merge_records(context, r.dataset, r.staging, r.mongo)
    resources = {key: getattr(r, key) for key in resource_keys(MERGE_CHECKS)}
    yield from evaluate_checks(context, MERGE_CHECKS, resources, raise_errors=False)


def resolve_fields(
    context: dg.AssetExecutionContext, dataset: DatasetResource, staging: StagingResource
) -> dg.MaterializeResult:
    """The mapping-resolved value of every record's missing fields, with lineage."""
    from enrich_crawl.resolve import resolve_shard

    spec = dataset.load()
    stage = staging.stage(spec.name)
    per_field: Counter[str] = Counter()
    conflicts: Counter[str] = Counter()
    totals: Counter[str] = Counter()
    for key in context.partition_keys:
        summary = resolve_shard(stage, key)
        per_field.update(summary["per_field"])
        conflicts.update(summary["conflicts_per_field"])
        for name in (
            "records",
            "crawled",
            "fields_resolved",
            "conflicts",
            "fields_with_conflicts",
            "records_with_values",
            "pages",
        ):
            totals[name] += summary[name]
    rows = [[name, per_field.get(name, 0), conflicts.get(name, 0)] for name in spec.fields]
    return dg.MaterializeResult(
        asset_key=RESOLVED,
        metadata={
            # winners found by this crawl, before the merge: the run's counts (fields resolved,
            # pages per resolved record, errors by kind) are enriched_records' (enrich_crawl.counts)
            "records": totals["records"],
            "values_found": totals["fields_resolved"],
            "records_with_values": totals["records_with_values"],
            "conflicts": totals["conflicts"],
            "fields_with_conflicts": totals["fields_with_conflicts"],
            "per_field": dg.MetadataValue.md(
                _markdown_table(["field", "resolved", "losing candidates"], rows)
            ),
            **{f"found/{name}": per_field.get(name, 0) for name in spec.fields},
        },
    )


def merge_records(
    context: dg.AssetExecutionContext,
    dataset: DatasetResource,
    staging: StagingResource,
    mongo: MongoResource,
) -> dg.MaterializeResult:
    """The records merged into MongoDB with per-field lineage."""
    import time

    from pymongo.errors import PyMongoError

    from enrich_crawl.counts import PROJECTION, run_counts
    from enrich_crawl.staging import read_json, read_jsonl
    from enrich_crawl.store.merge import MergeError, Merger, MergeStats, rerun_command
    from enrich_crawl.store.mongo import ensure_indexes

    spec = dataset.load()
    stage = staging.stage(spec.name)
    keys = list(context.partition_keys)
    # the crawl's results are staged durably (resolved/<key>.jsonl, written atomically): the merge
    # reads only them, so it can fail and be re-run alone without re-crawling
    absent = [key for key in keys if not stage.resolved(key).exists()]
    if absent:
        raise dg.Failure(
            description=f"nothing staged to merge for partition(s) {', '.join(absent)} of "
            f"{spec.name} (no {stage.resolved(absent[0])}): materialise resolved_fields first",
            allow_retries=False,
        )
    fields = {name: {"type": f.type, "refresh": f.refresh} for name, f in spec.fields.items()}
    where = f"{mongo.display_uri()} database {mongo.database_name()} collection {spec.name}"
    per_field: Counter[str] = Counter()
    totals: Counter[str] = Counter()
    done: list[str] = []
    started = time.perf_counter()

    def _staged_record_count(path) -> int | None:
        try:
            return int(read_json(path)["records"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def progress(partition: str, stats: MergeStats) -> None:
        if stats.batches % 25 == 0:
            context.log.info(f"{partition}: {stats.records} records merged so far")

    client = mongo.client()
    try:
        collection = client[mongo.database_name()][spec.name]
        merger = Merger(
            collection,
            fields=fields,
            run_id=context.run.run_id,
            batch_size=mongo.batch_size,
            retry=mongo.write_retry(),
            progress=progress,
        )
        for key in keys:
            stats = merger.merge(read_jsonl(stage.resolved(key)), partition=key)
            expected = _staged_record_count(stage.resolved_summary(key))
            if expected is not None and expected != stats.records + stats.duplicate_lines:
                raise dg.Failure(
                    description=f"{stage.resolved(key)} holds {stats.records} records but "
                    f"resolved_fields resolved {expected}: the staged file is damaged; "
                    f"materialise resolved_fields for partition {key} again, then the merge",
                    allow_retries=False,
                )
            done.append(key)
            context.log.info(
                f"{key}: {stats.records} records, {stats.inserted} inserted, {stats.updated} "
                f"updated, {stats.unchanged} unchanged, {stats.retries} retries"
            )
            per_field.update(stats.per_field)
            for name, value in stats.to_dict().items():
                if isinstance(value, int):
                    totals[name] += value
        indexes = ensure_indexes(collection)
        documents = collection.count_documents({})
        counts = run_counts(
            collection.find({}, PROJECTION),
            list(spec.fields),
            [stage.crawl_stats(key) for key in keys],
        )
        preview = list(collection.find({}, {"status": 1, "missing": 1}).limit(5))
    except (MergeError, PyMongoError) as exc:
        todo = [key for key in keys if key not in done]
        reason = mongo.scrub(str(exc))
        raise dg.Failure(
            description=(
                f"merging {spec.name} into MongoDB failed at partition {todo[0]} ({where}): "
                f"{reason}. Nothing is lost: the crawl's results stay staged in "
                f"{stage.resolved(todo[0]).parent}. When MongoDB is back, re-run just the merge "
                f"(no re-crawl; records already written are not duplicated): "
                f"{config.dagster_env_prefix()}{rerun_command(todo)}"
            ),
            metadata={
                "partitions_merged": ", ".join(done) or "-",
                "partitions_left": ", ".join(todo),
                "records_written": totals["written"],
                "staged": dg.MetadataValue.path(str(stage.resolved(todo[0]).parent)),
                "rerun": rerun_command(todo),
            },
            # the merge already retried for half a minute: retrying the step would only make the
            # user wait minutes to learn that the database is down
            allow_retries=False,
        ) from None
    finally:
        client.close()
    seconds = time.perf_counter() - started
    preview_rows = [[d["_id"], d.get("status"), ", ".join(d.get("missing") or [])] for d in preview]
    return dg.MaterializeResult(
        asset_key=ENRICHED,
        metadata={
            "mongodb": mongo.display_uri(),
            "database": mongo.database_name(),
            "collection": spec.name,
            "records_merged": totals["records"],
            "inserted": totals["inserted"],
            "updated": totals["updated"],
            "unchanged": totals["unchanged"],
            "fields_filled": totals["fields_filled"],
            "fields_refreshed": totals["fields_refreshed"],
            "fields_kept": totals["fields_kept"],
            "fields_superseded": totals["fields_superseded"],
            "conflicts": totals["conflicts"],
            "write_retries": totals["retries"],
            "insert_races": totals["races"],
            "duplicate_lines": totals["duplicate_lines"],
            "documents_in_collection": documents,
            "indexes_created": ", ".join(indexes) or "-",
            "seconds": round(seconds, 3),
            "records_per_second": round(totals["records"] / seconds, 1) if seconds else 0.0,
            # the run's counts, defined once in enrich_crawl.counts (the CLI prints the same)
            "fields_resolved": counts["fields_resolved"],
            **{f"fields_resolved/{name}": n for name, n in counts["fields"].items()},
            "pages_fetched": counts["pages"],
            "pages_per_resolved_record": counts["pages_per_resolved_record"]
            if counts["pages_per_resolved_record"] is not None
            else dg.MetadataValue.null(),
            "errors_by_kind": dg.MetadataValue.json(counts["errors"]),
            **{f"errors/{kind}": n for kind, n in counts["errors"].items()},
            "status": dg.MetadataValue.json(counts["status"]),
            **{
                f"status/{name}": counts["status"].get(name, 0)
                for name in ("resolved", "partial", "unresolved")
            },
            **{f"filled/{name}": per_field.get(name, 0) for name in spec.fields},
            "preview": dg.MetadataValue.md(
                _markdown_table(["id", "status", "missing"], preview_rows)
            ),
        },
    )


ASSETS = [seed_dataset, learned_mappings, crawl_results, resolve_and_merge]
