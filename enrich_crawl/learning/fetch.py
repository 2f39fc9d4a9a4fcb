"""Fetching the sampled records' pages: the ordinary crawl worker (its own process, the same
politeness, user agent, limiter and crawled-URL store as `run`) in collecting mode."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from enrich_crawl.learning.mappings import has_mappings
from enrich_crawl.learning.sample import Sampled, template_key, write_sample_shard
from enrich_crawl.staging import read_json, write_json

# seed shard key of a collecting crawl (one process for the whole sample)
COLLECT_PARTITION = "collect"


def add_pages(
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
