"""Learning and evaluating mappings from the dataset's own known values (SPEC 3b): the fetching
side and the orchestration, in plain code (no Dagster, no Scrapy).

    sample_for_learning   a bounded sample of records with known values, per site template
    sample_for_mappings   a bounded sample of such records per mapping (evaluate, mapping_agreement)
    collect_pages         those records' pages, fetched by the ordinary crawl worker (its own
                          process, same politeness, crawled-URL store) in collecting mode
    learn_dataset         sample -> collect -> enrich_crawl.extract.learn.learn -> mapping files
    evaluate_dataset      sample -> collect -> enrich_crawl.extract.learn.evaluate
    with_learned          given mappings plus learned ones, the given ones taking precedence

`enrich-crawl mapping learn|evaluate`, the `learned_mappings` asset and the `mapping_agreement`
check call these; the learner itself lives in enrich_crawl.extract.learn.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from enrich_crawl.staging import read_json, write_json

REPORT_FILE = "learn-report.json"
# seed shard key of a collecting crawl (one process for the whole sample)
COLLECT_PARTITION = "collect"


class LearningError(ValueError):
    """Learning or evaluating cannot start (bad input); the message says what and where."""


# -- which records -------------------------------------------------------------------------------


def known_values(record: dict[str, Any], fields: Iterable[str]) -> dict[str, Any]:
    """The spec fields of a seed record that hold a value after the dataset's cleaning."""
    data = record.get("_data") or {}
    return {name: data[name] for name in fields if data.get(name) not in (None, "", [])}


def template_key(url: str) -> tuple[str, tuple[str, ...], int]:
    """A guess at a URL's site template before fetching: its host and the shape of its path
    (segments holding digits, and the last one, are wildcards): /3.11/library/os.html and
    /3.11/library/re.html share one."""
    parts = urlsplit(url)
    segments = [s for s in parts.path.split("/") if s]
    shape = tuple("*" if any(c.isdigit() for c in s) else s for s in segments[:-1])
    return (parts.hostname or "", shape, len(segments))


def _domain(url: str) -> str:
    from enrich_crawl.dataset.shard import registrable_domain

    return registrable_domain((urlsplit(url).hostname or "").lower())


@dataclass
class Sampled:
    """A sampled record: its id, seed URLs and known values."""

    id: str
    urls: list[str]
    known: dict[str, Any]
    record: dict[str, Any] = field(repr=False, default_factory=dict)


def sample_for_learning(
    records: Iterable[dict[str, Any]],
    fields: Iterable[str],
    *,
    per_template: int = 40,
    per_domain: int = 120,
    max_records: int = 2000,
    yes_no: Iterable[str] = (),
) -> list[Sampled]:
    """Records with known values, in file order, taken while one of their known fields has fewer
    than `per_template` examples in the record's site template (template_key of its first URL),
    at most `per_domain` records of one registrable domain and `max_records` in all. The
    `yes_no` (boolean) fields count each answer apart, up to half of `per_template` each: the
    rare answer (a deprecated module among hundreds) is what teaches where the answer shows, so
    a record bringing an answer still short of examples is taken beyond `per_domain` too."""
    fields = list(fields)
    yes_no = set(yes_no)
    half = max(1, per_template // 2)
    per_field: Counter[tuple[Any, ...]] = Counter()
    per_site: Counter[str] = Counter()
    out: list[Sampled] = []
    for record in records:
        urls = list(record.get("_urls") or [])
        known = known_values(record, fields)
        if not urls or not known:
            continue
        template = template_key(urls[0])
        domain = _domain(urls[0])
        keys = [
            (template, name, str(value).lower()) if name in yes_no else (template, name)
            for name, value in known.items()
        ]
        wanted = [k for k in keys if per_field[k] < (half if len(k) == 3 else per_template)]
        if not wanted:
            continue
        # a yes/no answer still short of examples passes the domain's cap: on a one-domain
        # dataset the rare answer (4 deprecated modules, late in the file) comes after it
        if per_site[domain] >= per_domain and not any(len(k) == 3 for k in wanted):
            continue
        per_field.update(keys)
        per_site[domain] += 1
        out.append(Sampled(str(record["_id"]), urls, known, record))
        if len(out) >= max_records:
            break
    return out


def sample_for_mappings(
    records: Iterable[dict[str, Any]],
    fields: Iterable[str],
    mappings: Any,
    *,
    per_mapping: int = 10,
    max_records: int = 500,
) -> list[Sampled]:
    """Records with known values whose seed URLs one of `mappings` matches, while that mapping
    has fewer than `per_mapping` records sampled for one of its fields that the record knows.
    Records that also miss a field come first: a run has just fetched their pages (the
    crawled-URL store serves them again), so checking them costs no request."""
    fields = list(fields)
    crawled: list[Sampled] = []
    complete: list[Sampled] = []
    for record in records:
        urls = list(record.get("_urls") or [])
        known = known_values(record, fields)
        if not urls or not known:
            continue
        (complete if len(known) == len(fields) else crawled).append(
            Sampled(str(record["_id"]), urls, known, record)
        )
        if len(crawled) >= max_records * 20:  # enough to choose from
            break
    taken: Counter[tuple[str, str]] = Counter()
    out: list[Sampled] = []
    for sampled in crawled + complete:
        pairs = {
            (mapping.name, name)
            for url in sampled.urls
            for mapping in mappings.matching(url)
            for name in mapping.field_set & set(sampled.known)
        }
        if any(taken[pair] < per_mapping for pair in pairs):
            taken.update(pairs)
            out.append(sampled)
            if len(out) >= max_records:
                break
    return out


def read_seed_records(paths: Iterable[Path]) -> Iterator[dict[str, Any]]:
    from enrich_crawl.dataset.seedfile import read_seed_shard

    for path in paths:
        yield from read_seed_shard(Path(path))


def write_sample_shard(sample: list[Sampled], path: Path) -> None:
    """A seed shard of the sampled records in which the known fields are the ones to find: the
    crawl then fetches their pages as it would for records missing them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from enrich_crawl.dataset.load import SEED_SCHEMA

    rows = []
    for s in sample:
        r = s.record
        rows.append(
            {
                "_id": s.id,
                "_row": r.get("_row"),
                "_urls": s.urls,
                "_url_errors": json.dumps(r.get("_url_errors") or []),
                "_missing": sorted(s.known),
                "_data": json.dumps(r.get("_data") or {}, ensure_ascii=False, default=str),
                "_raw": json.dumps(r.get("_raw") or {}, ensure_ascii=False, default=str),
                "_line": r.get("_line"),
                "_cell_errors": json.dumps(r.get("_cell_errors") or []),
            }
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=SEED_SCHEMA), path)


PROBES_PER_TEMPLATE = 2  # records per template that follow same-host links (depth >= 1)
MAX_PROBES = 50
PROBE_LINKS = 10  # same-host links followed per page by a probe


# why_nothing of the learner when a deeper page might hold what the record's own page does not
_DEEPER_HINTS = ("not found", "no rule reached", "no candidate")
LOW_RECALL = 0.8


def fields_wanting_depth(report: dict[str, Any]) -> set[str]:
    """Fields that the records' own pages did not teach (values not found there, no rule good
    enough) or taught only for a few records (recall below LOW_RECALL): deeper pages may hold
    them. Fields covered by given mappings, without known values, or yes/no fields short of
    examples of one answer are not among them (a deeper page would not help)."""
    out = set()
    for name, entry in (report.get("fields") or {}).items():
        if not entry.get("examples"):
            continue
        kept = [
            (m.get("kept") or {}) for m in (entry.get("mappings") or {}).values() if m.get("kept")
        ]
        why = str(entry.get("why_nothing") or "")
        not_here = not kept and any(hint in why for hint in _DEEPER_HINTS)
        rarely = bool(kept) and max(float(k.get("recall") or 0.0) for k in kept) < LOW_RECALL
        if not_here or rarely:
            out.add(name)
    return out


def _add_pages(
    pages: dict[str, list[dict[str, Any]]], more: dict[str, list[dict[str, Any]]]
) -> None:
    """Add the pages of a later crawl to those each record has (a page once per record)."""
    for record, rows in more.items():
        have = pages.setdefault(record, [])
        seen = {(r["url"], r.get("fragment") or "") for r in have}
        for row in rows:
            if (row["url"], row.get("fragment") or "") not in seen:
                have.append(row)
                seen.add((row["url"], row.get("fragment") or ""))


def split_probes(sample: list[Sampled]) -> tuple[list[Sampled], list[Sampled]]:
    """(probes, others): the first PROBES_PER_TEMPLATE records of each template, at most
    MAX_PROBES, and the rest."""
    per_template: Counter[Any] = Counter()
    probes: list[Sampled] = []
    others: list[Sampled] = []
    for s in sample:
        key = template_key(s.urls[0])
        if per_template[key] < PROBES_PER_TEMPLATE and len(probes) < MAX_PROBES:
            per_template[key] += 1
            probes.append(s)
        else:
            others.append(s)
    return probes, others


# -- fetching ------------------------------------------------------------------------------------


@dataclass
class FetchContext:
    """Where and as whom a collecting crawl runs (the same identity and store as `run`)."""

    work_dir: Path  # the sample shard, the worker's output, the request log
    mongo_uri: str | None  # the crawled-URL store and limiter of `run`; None: no persistence
    mongo_db: str = "enrich_crawl"
    user_agent: str = ""
    proxy: str | None = None
    allow_private: bool = False
    run_id: str = ""
    timeout: float | None = None  # seconds; the crawl stops cleanly (time budget) after it
    log: Any = None  # callable(str) for progress lines

    @classmethod
    def from_environment(cls, work_dir: Path, mongo_uri: str | None, mongo_db: str, **kw: Any):
        from enrich_crawl.config import Environment

        env = Environment()
        return cls(
            work_dir=Path(work_dir),
            mongo_uri=mongo_uri,
            mongo_db=mongo_db,
            user_agent=env.user_agent,
            proxy=env.http_proxy,
            allow_private=env.allow_private,
            **kw,
        )


@dataclass
class Collected:
    """The pages of a collecting crawl, and its statistics."""

    pages: dict[str, list[dict[str, Any]]]  # record id -> pages.jsonl lines, bodies read back
    stats: dict[str, Any]
    request_log: Path | None  # the virtual web's request log, when the dataset brings its web


def collect_pages(
    spec: Any,
    sample: list[Sampled],
    mappings_dir: Path | None,
    ctx: FetchContext,
    *,
    learned_dir: Path | None = None,
    links_per_page: int = 0,
    phase: str = "crawl",
    depth: int | None = None,
    sought: Iterable[str] = (),
) -> Collected:
    """Fetch the pages the sampled records' URLs lead to (within the dataset's crawl depth) with
    the crawl worker in collecting mode; the pages are kept in the crawled-URL store too.
    Links followed: the mappings' url_parsers, plus `links_per_page` same-host links of each
    page (a probe of sites whose links no mapping knows yet). `phase` names the files of this
    crawl in the work folder (`<phase>/`, `<phase>.parquet`, the request log). `sought`: the
    fields the links are followed for (links naming them come first)."""
    from enrich_crawl.crawl.collect import CollectConfig, field_words, read_collected
    from enrich_crawl.crawl.params import WorkerParams

    ctx.work_dir.mkdir(parents=True, exist_ok=True)
    out_dir = ctx.work_dir / phase
    if out_dir.exists():
        import shutil

        shutil.rmtree(out_dir)
    seed_path = ctx.work_dir / f"{phase}.parquet"
    write_sample_shard(sample, seed_path)
    empty = None
    if mappings_dir is None:
        empty = Path(tempfile.mkdtemp(prefix="no-mappings-", dir=ctx.work_dir))
    crawl = spec.crawl.to_dict()
    if depth is not None:
        crawl["depth"] = min(depth, spec.crawl.depth)
    if ctx.timeout:
        crawl["time_budget_seconds"] = float(ctx.timeout)
    params = WorkerParams(
        dataset=spec.name,
        partition=COLLECT_PARTITION,
        seed_path=str(seed_path),
        out_dir=str(out_dir),
        mappings_dir=str(mappings_dir or empty),
        field_types=spec.field_types(),
        crawl=crawl,
        run_id=ctx.run_id or f"collect-{uuid.uuid4().hex[:12]}",
        user_agent=ctx.user_agent,
        proxy=ctx.proxy,
        allow_private=ctx.allow_private,
        mongo_uri=ctx.mongo_uri,
        mongo_db=ctx.mongo_db,
        collect=CollectConfig(
            links_per_page=links_per_page, field_words=field_words(sought)
        ).to_dict(),
        learned_mappings_dir=str(learned_dir) if has_mappings(learned_dir) else None,
        log_level="WARNING",
    )
    log_path = None
    with contextlib.ExitStack() as stack:
        if spec.virtual_web is not None:
            # the dataset brings its own web (demo, offline tests): served for this crawl, as
            # crawl_results serves it, its request log the evidence of politeness
            from enrich_crawl.virtualweb import running_web

            suffix = "" if phase == "crawl" else f"-{phase}"
            log_path = ctx.work_dir / f"web-requests{suffix}.jsonl"
            web = stack.enter_context(running_web(spec.virtual_web, log_path=log_path))
            params.proxy = web.proxy_url
        stats = run_worker(params, ctx.work_dir, log=ctx.log, name=phase)
    if empty is not None:
        with contextlib.suppress(OSError):
            empty.rmdir()
    pages: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in read_collected(out_dir):
        pages[row["record"]].append(row)
    return Collected(dict(pages), stats, log_path)


def examples_of(sample: list[Sampled], collected: Collected) -> list[Any]:
    """The learner's examples: each sampled record's known values and collected pages."""
    from enrich_crawl.extract.learn import Example, ExamplePage

    return [
        Example(
            s.id,
            s.known,
            [
                ExamplePage(
                    row["url"],
                    row["body"],
                    content_type=row.get("content_type"),
                    fragment=row.get("fragment") or "",
                    depth=int(row.get("depth") or 0),
                    status=int(row.get("status") or 200),
                )
                for row in collected.pages.get(s.id, [])
            ],
        )
        for s in sample
    ]


def run_worker(
    params: Any, work_dir: Path, *, log: Any = None, name: str = "worker"
) -> dict[str, Any]:
    """Run `python -m enrich_crawl.crawl.worker --params FILE` to its end in its own session
    (its whole process tree is stopped if this is interrupted); returns its statistics."""
    params_file = work_dir / f"{name}-params.json"
    write_json(params_file, params.to_dict())
    stderr_path = work_dir / f"{name}.log"
    env = dict(os.environ)
    if params.mongo_uri:
        env["MONGODB_URI"] = params.mongo_uri
    cmd = [sys.executable, "-m", "enrich_crawl.crawl.worker", "--params", str(params_file)]
    with open(stderr_path, "wb") as stderr:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=stderr, env=env, start_new_session=True
        )
        try:
            progress = Path(params.out_dir) / "progress.json"
            last = 0.0
            while proc.poll() is None:
                time.sleep(0.5)
                if log is not None and time.monotonic() - last > 10 and progress.exists():
                    last = time.monotonic()
                    with contextlib.suppress(OSError, ValueError, KeyError):
                        snap = read_json(progress)
                        log(
                            f"collecting pages: records {snap['records_done']}/"
                            f"{snap['records_fed']}, pages {snap['pages']}"
                        )
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
            raise
    stats_path = Path(params.out_dir) / "stats.json"
    if proc.returncode != 0 or not stats_path.exists():
        tail = stderr_path.read_text("utf-8", errors="replace").strip().splitlines()[-5:]
        raise RuntimeError(
            f"the crawl worker collecting pages failed (exit {proc.returncode}; log "
            f"{stderr_path}): " + " | ".join(tail)
        )
    return read_json(stats_path)


def fetch_summary(
    stats: dict[str, Any] | list[dict[str, Any]], sample: list[Sampled], probes: int = 0
) -> dict[str, Any]:
    """What the collecting crawl(s) cost, for the learn report and the asset metadata."""
    crawls = stats if isinstance(stats, list) else [stats]

    def total(key: str, within: str | None = None) -> int:
        return sum(int(((c.get(within) or {}) if within else c).get(key) or 0) for c in crawls)

    errors: Counter[str] = Counter()
    for c in crawls:
        errors.update(c.get("errors_by_kind") or {})
    pages = total("pages")
    return {
        "records_sampled": len(sample),
        "probe_records": probes,
        "templates": len({template_key(s.urls[0]) for s in sample}),
        "pages_fetched": pages,
        "pages_from_store": total("pages_from_store"),
        "pages_reused": total("pages_reused"),
        "pages_collected": total("pages", "collected"),
        "pages_fetched_per_record": round(pages / len(sample), 3) if sample else 0.0,
        "robots_fetched": total("robots_fetched"),
        "robots_refusals": total("robots_refusals"),
        "requests": total("requests"),
        "errors_by_kind": dict(errors),
        "seconds": round(sum(float(c.get("seconds") or 0) for c in crawls), 3),
    }


# -- mappings ------------------------------------------------------------------------------------


def with_learned(given: Any, learned: Any) -> Any:
    """The given mappings plus the learned ones, the given ones taking precedence: a learned
    mapping named like a given one is left out, and the learned ones rank below every given one
    (their priorities shifted down together, so their own order holds)."""
    from enrich_crawl.extract.mapping import MappingSet

    names = {m.name for m in given}
    kept = [m for m in learned if m.name not in names]
    if len(given) and kept:
        shift = min(0, min(m.priority for m in given) - 1 - max(m.priority for m in kept))
        for mapping in kept:
            mapping.priority += shift
    combined = MappingSet([*given, *kept])
    combined.errors = [*given.errors, *learned.errors]
    return combined


def has_mappings(directory: Path | None) -> bool:
    from enrich_crawl.extract.mapping import mapping_files

    return directory is not None and Path(directory).is_dir() and bool(mapping_files(directory))


def clear_learned(out_dir: Path) -> None:
    """Remove what an earlier `learn` wrote in `out_dir` (its report and the mapping files with
    a `learned` object); hand-written mappings there are left alone."""
    if not out_dir.is_dir():
        return
    (out_dir / REPORT_FILE).unlink(missing_ok=True)
    for path in out_dir.glob("*.json"):
        try:
            raw = json.loads(path.read_text("utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(raw, dict) and isinstance(raw.get("learned"), dict):
            path.unlink(missing_ok=True)


# -- learn and evaluate --------------------------------------------------------------------------


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
        _add_pages(pages, probed.pages)
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
            _add_pages(pages, rest.pages)
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


# -- summaries (CLI, asset metadata, checks) -----------------------------------------------------


def _learned_numbers(learned: dict[str, Any], name: str) -> dict[str, Any]:
    """examples / precision / recall of field `name` in a mapping's `learned` object, whether it
    keeps them per field (`fields: {name: {...}}`) or per measure (`precision: {name: p}`)."""
    out: dict[str, Any] = {}
    per_field = (learned.get("fields") or {}).get(name)
    if isinstance(per_field, dict):
        out.update({k: per_field.get(k) for k in ("examples", "precision", "recall")})
    for key in ("examples", "precision", "recall", "held_out"):
        value = learned.get(key)
        if isinstance(value, dict) and name in value:
            out[key] = value[name]
        elif key not in out and isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = value
    return out


def learned_fields(mappings: Iterable[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Per field, the learned rules: mapping name, examples, held-out precision and recall, and
    the rule (the field's processors), best precision first."""
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for mapping in mappings:
        learned = mapping.get("learned") or {}
        for rule in mapping.get("fields") or []:
            name = rule.get("name")
            numbers = _learned_numbers(learned, name)
            out[name].append(
                {
                    "mapping": mapping.get("name"),
                    "examples": numbers.get("examples"),
                    "precision": numbers.get("precision"),
                    "recall": numbers.get("recall"),
                    "held_out": numbers.get("held_out"),
                    "rule": rule.get("processors"),
                }
            )
    for rules in out.values():
        rules.sort(key=lambda r: -(r["precision"] or 0.0))
    return dict(out)


def read_learned(out_dir: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The learned mapping documents of a folder and its learn report (empty when absent)."""
    mappings = []
    for path in sorted(Path(out_dir).glob("*.json")):
        if path.name == REPORT_FILE:
            continue
        try:
            raw = json.loads(path.read_text("utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(raw, dict) and isinstance(raw.get("learned"), dict):
            mappings.append(raw)
    report_path = Path(out_dir) / REPORT_FILE
    report = read_json(report_path) if report_path.exists() else {}
    return mappings, report


def evaluation_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (mapping, field) of an evaluation: examples, agreement, yield, disagreements."""
    rows = []
    for mapping, entry in sorted((result.get("mappings") or {}).items()):
        for name, numbers in sorted((entry or {}).items()):
            if not isinstance(numbers, dict):
                continue
            rows.append(
                {
                    "mapping": mapping,
                    "field": name,
                    "examples": int(numbers.get("examples") or 0),
                    "yielded": int(numbers.get("yielded") or 0),
                    "agreed": int(numbers.get("agreed") or 0),
                    "agreement": numbers.get("agreement", numbers.get("precision")),
                    "yield": numbers.get("yield", numbers.get("recall")),
                    "disagreements": list(numbers.get("disagreements") or []),
                }
            )
    return rows


def agreement_problems(
    result: dict[str, Any],
    *,
    min_agreement: float,
    min_disagreements: int = 2,
    min_examples: int = 3,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(disagreeing, silent) rows of an evaluation: mappings whose values disagree with the known
    ones (agreement below `min_agreement`, on at least `min_disagreements` records: one odd
    known value is not a broken mapping), and mappings that yield nothing at all on at least
    `min_examples` records that hold the field (a layout change often looks like that too)."""
    disagreeing, silent = [], []
    for row in evaluation_rows(result):
        agreement = row["agreement"]
        wrong = row["yielded"] - int(row.get("agreed") or 0)
        if agreement is not None and agreement < min_agreement and wrong >= min_disagreements:
            disagreeing.append(row)
        elif row["examples"] >= min_examples and not row["yield"]:
            silent.append(row)
    return disagreeing, silent
