"""Learning and evaluating a dataset: sample -> collect -> the learner (or the evaluation) ->
mapping files and report."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from enrich_crawl.learning.fetch import (
    Collected,
    FetchContext,
    add_pages,
    collect_pages,
    examples_of,
    fetch_summary,
)
from enrich_crawl.learning.mappings import REPORT_FILE, clear_learned, has_mappings
from enrich_crawl.learning.sample import (
    PROBE_LINKS,
    Sampled,
    fields_wanting_depth,
    read_seed_records,
    sample_for_learning,
    sample_for_mappings,
    split_probes,
)
from enrich_crawl.staging import write_json


class LearningError(ValueError):
    """Learning or evaluating cannot start (bad input); the message says what and where."""


@dataclass
class LearnOutcome:
    report: dict[str, Any]
    files: list[Path]
    mappings: list[dict[str, Any]]
    fetch: dict[str, Any]


def learn_dataset(
    spec: Any,
    seed_paths: list[Path],
    out_dir: Path,
    ctx: FetchContext,
    *,
    given_dir: Path | None = None,
    min_precision: float = 0.95,
    per_template: int = 40,
    max_records: int = 2000,
    seed: int = 0,
) -> LearnOutcome:
    """Learn mappings for `spec`'s fields from its known values; writes them and the report
    into `out_dir` (earlier learned files there are replaced)."""
    from enrich_crawl.extract.mapping import MappingSet

    if not 0 < min_precision <= 1:
        raise LearningError(f"--min-precision {min_precision}: must be in (0, 1]")
    given = MappingSet.load(given_dir) if given_dir is not None else None
    sample = sample_for_learning(
        read_seed_records(seed_paths),
        spec.fields,
        per_template=per_template,
        per_domain=per_template * 3,
        max_records=max_records,
        yes_no=[name for name, f in spec.fields.items() if f.type == "boolean"],
        seed=seed,
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    clear_learned(out_dir)
    if not sample:
        fetch = fetch_summary({}, sample)
        report = {
            "dataset": spec.name,
            "min_precision": min_precision,
            "examples": 0,
            "pages": 0,
            "mappings": [],
            "fields": {
                name: {
                    "examples": 0,
                    "pages": 0,
                    "mappings": {},
                    "why_nothing": "no record with a usable URL holds a value of this field: "
                    "nothing to learn from",
                }
                for name in spec.fields
            },
            "fetch": fetch,
        }
        write_json(out_dir / REPORT_FILE, report)
        return LearnOutcome(report, [out_dir / REPORT_FILE], [], fetch)
    from enrich_crawl.extract.learn import learn, write_learned

    given_used = given_dir if has_mappings(given_dir) else None
    types = spec.field_types()
    # one run id for every pass: a later pass takes an earlier one's pages from the store as
    # this run's, whatever the recrawl TTL
    ctx.run_id = ctx.run_id or f"learn-{uuid.uuid4().hex[:12]}"

    def learn_on(records: list[Sampled], pages: dict[str, list[dict[str, Any]]]) -> Any:
        examples = examples_of(records, Collected(pages, {}, None))
        return learn(examples, types, existing=given, min_precision=min_precision, seed=seed)

    # 1. every sampled record's own pages (depth 0): most values sit there, and then one page
    # per record is all learning costs
    first = collect_pages(spec, sample, given_used, ctx, depth=0)
    crawls: list[dict[str, Any]] = [first.stats]
    pages: dict[str, list[dict[str, Any]]] = dict(first.pages)
    result = learn_on(sample, pages)
    probes: list[Sampled] = []
    deeper = fields_wanting_depth(result.report) if spec.crawl.depth > 0 else set()
    wanting = [s for s in sample if deeper & set(s.known)]
    if wanting:
        # 2. fields that the records' own pages do not give: nobody knows yet which links lead
        # to them, so a few records per template follow their pages' same-host links; a
        # learning on them gives the url_parsers, and the other records follow those only
        probes, others = split_probes(wanting)
        probed = collect_pages(
            spec,
            probes,
            given_used,
            ctx,
            links_per_page=PROBE_LINKS,
            phase="probe",
            sought=sorted(deeper),
        )
        crawls.append(probed.stats)
        add_pages(pages, probed.pages)
        learned_links = None
        if others:
            learned_links = ctx.work_dir / "probe-mappings"
            if learned_links.exists():
                import shutil

                shutil.rmtree(learned_links)
            write_learned(learn_on(probes, pages), learned_links)
            rest = collect_pages(
                spec, others, given_used, ctx, learned_dir=learned_links, phase="deeper"
            )
            crawls.append(rest.stats)
            add_pages(pages, rest.pages)
        result = learn_on(sample, pages)
    fetch = fetch_summary(crawls, sample, probes=len(probes))
    result.report["fetch"] = fetch
    result.report["fetch"]["fields_probed_deeper"] = sorted(deeper)
    result.report.setdefault("dataset", spec.name)
    files = write_learned(result, out_dir)
    return LearnOutcome(result.report, list(files), list(result.mappings), fetch)


def evaluate_dataset(
    spec: Any,
    seed_paths: list[Path],
    mappings: Any,
    mappings_dir: Path | None,
    ctx: FetchContext,
    *,
    learned_dir: Path | None = None,
    per_mapping: int = 10,
    max_records: int = 500,
    max_disagreements: int = 5,
) -> dict[str, Any]:
    """How well `mappings` agree with the known values of a bounded sample of records (the JSON
    of `mapping evaluate`): per mapping and field, examples, agreement, yield, disagreements."""
    from enrich_crawl.extract.learn import evaluate

    if per_mapping < 1:
        raise LearningError(f"--sample {per_mapping}: must be at least 1")
    sample = sample_for_mappings(
        read_seed_records(seed_paths),
        spec.fields,
        mappings,
        per_mapping=per_mapping,
        max_records=max_records,
    )
    if not sample:
        return {
            "dataset": spec.name,
            "records_sampled": 0,
            "mappings": {},
            "note": "no record with known values has a URL that one of the mappings matches",
        }
    collected = collect_pages(spec, sample, mappings_dir, ctx, learned_dir=learned_dir)
    examples = examples_of(sample, collected)
    result = evaluate(mappings, examples, spec.field_types(), max_disagreements=max_disagreements)
    # SPEC 3b's names beside the learner's: agreement is precision, yield is recall
    for entry in [
        *(e for fields in (result.get("mappings") or {}).values() for e in fields.values()),
        *(result.get("fields") or {}).values(),
    ]:
        entry["agreement"] = entry.get("precision")
        entry["yield"] = entry.get("recall")
    return {
        "dataset": spec.name,
        "records_sampled": len(sample),
        "fetch": fetch_summary(collected.stats, sample),
        **result,
    }
