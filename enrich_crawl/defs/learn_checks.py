"""Asset checks of learning; plain code in enrich_crawl.learning does the work. They are evaluated
with the crawl's checks (checks.py: `crawl_checks`).

learned_mappings  learned_precision   every learned rule kept its held-out precision at or above
                                      QualityResource.min_learned_precision
crawl_results     mapping_agreement   the mappings the crawl used (hand-written and learned) agree
                                      with the known values of a small sample of records, fetched
                                      anew each run (politely; pages younger than the dataset's
                                      recrawl_ttl_hours come from the crawled-URL store): a site
                                      that changed its layout fails it, naming mapping and field
"""

import dagster as dg

from enrich_crawl.defs.check_groups import check_spec
from enrich_crawl.defs.crawl_ops import learned_dir_of
from enrich_crawl.defs.resources import (
    CrawlerResource,
    DatasetResource,
    MongoResource,
    QualityResource,
    StagingResource,
)

SAMPLE = 20


@check_spec(
    "learned_mappings",
    description="Every learned rule's held-out precision is at least min_learned_precision.",
)
def learned_precision(
    dataset: DatasetResource, staging: StagingResource, quality: QualityResource
) -> dg.AssetCheckResult:
    """Every learned rule's held-out precision is at least the bar."""
    from enrich_crawl.learning import learned_fields, read_learned

    spec = dataset.load()
    if not spec.learn:
        return dg.AssetCheckResult(passed=True, description="learning is off for this dataset")
    mappings, _report = read_learned(staging.stage(spec.name).learned_dir)
    bar = quality.min_learned_precision
    below, numbers = [], {}
    for name, rules in learned_fields(mappings).items():
        numbers[f"precision/{name}"] = float(rules[0]["precision"] or 0.0)
        below += [
            f"{r['mapping']}.{name} {r['precision']}"
            for r in rules
            if r["precision"] is None or r["precision"] < bar
        ]
    return dg.AssetCheckResult(
        passed=not below,
        metadata={"min_learned_precision": bar, "rules_below": len(below), **numbers},
        description=f"{len(mappings)} learned mapping(s), every rule at or above {bar}"
        if not below
        else f"below {bar}: " + ", ".join(below[:10]),
    )


@check_spec(
    "crawl_results",
    description="The mappings (hand-written and learned) agree with the known values of a small "
    "sample of records; fails naming the mapping and field that disagree (e.g. a site changed "
    "its layout).",
)
def mapping_agreement(
    context: dg.AssetCheckExecutionContext,
    dataset: DatasetResource,
    staging: StagingResource,
    crawler: CrawlerResource,
    mongo: MongoResource,
    quality: QualityResource,
) -> dg.AssetCheckResult:
    """The mappings agree with the known values of a small sample of records."""
    from enrich_crawl.extract.mapping import MappingSet
    from enrich_crawl.learning import (
        FetchContext,
        agreement_problems,
        evaluate_dataset,
        evaluation_rows,
    )
    from enrich_crawl.staging import read_json

    spec = dataset.load()
    stage = staging.stage(spec.name)
    if quality.agreement_sample < 1:
        return dg.AssetCheckResult(passed=True, description="disabled (agreement_sample is 0)")
    mappings = MappingSet.load(dataset.mappings_dir(), strict=False)
    learned = learned_dir_of(dataset, staging)
    if learned is not None:
        mappings = mappings.with_learned(MappingSet.load(learned, strict=False))
    env = crawler.environment()
    ctx = FetchContext(
        work_dir=stage.agreement_work,
        mongo_uri=mongo.effective_uri(),
        mongo_db=mongo.database_name(),
        user_agent=env["user_agent"],
        proxy=env["proxy"],
        allow_private=env["allow_private"],
        run_id=context.run.run_id,
        timeout=quality.agreement_time_budget_seconds,
    )
    shards = sorted(read_json(stage.seed_manifest).get("shards") or {})
    result = evaluate_dataset(
        spec,
        [stage.seed_shard(key) for key in shards],
        mappings,
        dataset.mappings_dir(),
        ctx,
        learned_dir=learned,
        per_mapping=quality.agreement_sample,
        max_records=quality.agreement_max_records,
        max_disagreements=3,
    )
    bar = quality.min_mapping_agreement
    disagreeing, silent = agreement_problems(
        result, min_agreement=bar, min_disagreements=quality.min_mapping_disagreements
    )
    rows = evaluation_rows(result)
    metadata = {
        "records_sampled": int(result.get("records_sampled") or 0),
        "mappings_evaluated": len({r["mapping"] for r in rows}),
        "min_mapping_agreement": bar,
        "disagreeing": len(disagreeing),
        "yielding_nothing": len(silent),
        **{
            f"agreement/{r['mapping']}/{r['field']}": float(r["agreement"])
            for r in rows
            if r["agreement"] is not None
        },
        "problems": dg.MetadataValue.json(
            [
                {k: r[k] for k in ("mapping", "field", "examples", "agreement", "yield")}
                | {"disagreements": r["disagreements"][:3]}
                for r in (disagreeing + silent)[:SAMPLE]
            ]
        ),
    }
    if disagreeing:
        return dg.AssetCheckResult(
            passed=False,
            metadata=metadata,
            description="mapping disagrees with known values: "
            + "; ".join(
                f"mapping {r['mapping']} field {r['field']}: agreement {r['agreement']:.2f} "
                f"({r['yielded'] - r['agreed']} of {r['yielded']} values wrong)"
                + (f" (e.g. {_first_url(r)})" if _first_url(r) else "")
                for r in disagreeing[:5]
            ),
        )
    if silent:
        return dg.AssetCheckResult(
            passed=False,
            severity=dg.AssetCheckSeverity.WARN,
            metadata=metadata,
            description="mapping yields nothing on records that hold the field: "
            + "; ".join(
                f"mapping {r['mapping']} field {r['field']} ({r['examples']} records)"
                for r in silent[:5]
            ),
        )
    return dg.AssetCheckResult(
        passed=True,
        metadata=metadata,
        description=f"{len(rows)} (mapping, field) pairs agree with the known values"
        if rows
        else result.get("note") or "nothing to evaluate",
    )


def _first_url(row: dict) -> str:
    for item in row["disagreements"]:
        if isinstance(item, dict) and item.get("url"):
            return str(item["url"])
    return ""
