"""One crawl process: `python -m enrich_crawl.crawl.worker`.

Launched by Dagster through Pipes (parameters in the Pipes extras, progress and final statistics
streamed back as log lines and a custom message), or by hand / by benchmarks with
`--params FILE.json` (repeated: several partitions crawled at once in this one process, one Scrapy
crawler each, see `run_crawls`). Twisted's reactor cannot restart, hence one crawl (or one set of
crawls started together) per process.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from enrich_crawl import config
from enrich_crawl.crawl.params import WorkerParams

RUN_LOG_PROGRESS_SECONDS = 60.0  # at most one progress line a minute in the Dagster run's log

# Scrapy's start-up and shutdown boilerplate, the same for every crawl: its versions and the
# reactor (scrapy.utils.log), "Overridden settings" (scrapy.crawler: only that one, its "Received
# SIGINT, shutting down" lines say something), the enabled extensions, middlewares, pipelines and
# add-ons (scrapy.middleware, scrapy.addons), telnet, the closing stats dump (stats.json and the
# step's metadata hold the crawl's figures). Below WARNING these are left out of the terminal and
# of the step's captured log; the loggers' warnings and errors stay.
SCRAPY_BOILERPLATE: dict[str, tuple[str, ...] | None] = {  # logger -> message prefixes (None: all)
    "scrapy.utils.log": None,
    "scrapy.crawler": ("Overridden settings",),
    "scrapy.middleware": None,
    "scrapy.addons": None,
    "scrapy.extensions.telnet": None,
    "scrapy.statscollectors": None,
}


class _Boilerplate(logging.Filter):
    """Drops a logger's records below WARNING whose message starts with one of `prefixes`
    (all of them when None)."""

    def __init__(self, prefixes: tuple[str, ...] | None):
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            return True
        return self.prefixes is not None and not str(record.msg).startswith(self.prefixes)


def quiet_scrapy_boilerplate() -> None:
    """Keep Scrapy's boilerplate INFO lines out of the crawl's log (SCRAPY_BOILERPLATE). A filter
    on each logger, not a level: Scrapy's logging set-up (CrawlerProcess) resets the levels of
    scrapy.* loggers, and logs the versions before a level could be set again."""
    for name, prefixes in SCRAPY_BOILERPLATE.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _Boilerplate) for f in logger.filters):
            logger.addFilter(_Boilerplate(prefixes))


# what every crawl of one process shares (the environment's proxy, the reactor, the resolver's
# refusal of private addresses): its shards must agree on it
PROCESS_WIDE = ("proxy", "allow_private", "mongo_uri")


def run_crawls(
    shards: list[WorkerParams], progress: Callable[[dict[str, Any]], None] | None = None
) -> list[dict[str, Any] | BaseException]:
    """Run the crawls of several partitions in this process, at once, to the end: one Scrapy
    crawler per partition, all on one reactor (Scrapy's "several spiders in one process"). Each
    keeps its own outputs, statistics, downloader slots and records; they share the process's
    start-up and its event loop, and the fleet-wide limiter keeps them polite to each other as it
    does separate processes, and the process's limits (`max_active_records`, the crawl's
    `concurrent_requests` and `page_cache_mb`) are shared out among them. A crawl that fails does
    not stop the others: its place in the result holds the error, the others' their statistics."""
    from scrapy.crawler import Crawler, CrawlerProcess

    from enrich_crawl.crawl.render import needs_browser
    from enrich_crawl.crawl.settings import build_settings
    from enrich_crawl.crawl.spider import EnrichSpider
    from enrich_crawl.extract.mapping import MappingSet

    if not shards:
        return []
    first = shards[0]
    for other in shards[1:]:
        for name in PROCESS_WIDE:
            if getattr(other, name) != getattr(first, name):
                raise ValueError(
                    f"partitions {first.partition} and {other.partition} cannot share a crawl "
                    f"process: their {name} differ"
                )
    if first.proxy:
        # Scrapy's HttpProxyMiddleware reads the proxy from the environment at start-up
        os.environ["http_proxy"] = first.proxy
        os.environ["https_proxy"] = first.proxy
        os.environ.pop("no_proxy", None)
        os.environ.pop("NO_PROXY", None)
    _arrow_returns_memory()
    log = logging.getLogger(__name__)
    failures: dict[int, BaseException] = {}
    # the shards of a run share their mappings: loaded once
    loaded: dict[tuple[str, str | None], MappingSet] = {}
    ready: list[tuple[int, WorkerParams, dict[str, Any], MappingSet]] = []
    for n, params in enumerate(shards):
        # a shard that cannot start (its folder, its settings) fails alone
        try:
            # the process's limits (records and downloads in flight, page cache) shared out
            # among its crawls
            params = params.share_of_process(len(shards))
            key = (params.mappings_dir, params.learned_mappings_dir)
            if key not in loaded:
                loaded[key] = _load_mappings(params)
            Path(params.out_dir).mkdir(parents=True, exist_ok=True)
            # the browser handler only when some mapping renders (js/auto): static crawls never
            # load it
            settings = build_settings(params, render=needs_browser(loaded[key]))
        except Exception as exc:
            failures[n] = exc
            log.error("crawl of partition %s cannot start: %s", params.partition, exc)
            continue
        ready.append((n, params, settings, loaded[key]))
    crawlers: dict[int, Crawler] = {}
    if ready:
        quiet_scrapy_boilerplate()
        # the process's settings (reactor, event loop, logging) are its first crawl's
        process = CrawlerProcess(ready[0][2])
        # a retry that gives up is recorded as the URL's reason; Scrapy's ERROR line adds
        # nothing (set after CrawlerProcess, whose logging set-up resets the levels of scrapy.*
        # loggers)
        logging.getLogger("scrapy.downloadermiddlewares.retry").setLevel(logging.CRITICAL)
        # Scrapy lets every logger through at the root (level NOTSET) and filters in its
        # handler: pymongo would build its DEBUG records of every command (several per database
        # call) only for the handler to drop them
        logging.getLogger("pymongo").setLevel(logging.WARNING)
        for n, params, own, mappings in ready:
            # the first crawler installs the reactor (CrawlerProcess's own); the others take
            # their own settings, the process's as defaults
            crawler = (
                Crawler(EnrichSpider, own) if crawlers else process.create_crawler(EnrichSpider)
            )
            crawlers[n] = crawler
            deferred = process.crawl(crawler, params=params, mappings=mappings, progress=progress)

            def failed(failure: Any, n: int = n) -> None:
                failures[n] = failure.value
                log.error(
                    "crawl of partition %s failed: %s",
                    shards[n].partition,
                    failure.getErrorMessage(),
                )

            deferred.addErrback(failed)
        _collect_less()
        process.start()
    results: list[dict[str, Any] | BaseException] = []
    for n, params in enumerate(shards):
        crawler = crawlers.get(n)
        spider = crawler.spider if crawler is not None else None
        if spider is not None and getattr(spider, "stats_written", False):
            results.append(spider.final_stats)
        else:
            why = f": {failures[n]}" if n in failures else ""
            results.append(
                RuntimeError(f"crawl of partition {params.partition} did not finish cleanly{why}")
            )
    return results


def _load_mappings(params: WorkerParams) -> Any:
    """The crawl's mappings: the given ones, and the learned ones beside them."""
    from enrich_crawl.extract.mapping import MappingSet

    mappings = MappingSet.load(params.mappings_dir, strict=False)
    if params.learned_mappings_dir:
        mappings = mappings.with_learned(MappingSet.load(params.learned_mappings_dir, strict=False))
    for error in mappings.errors:
        logging.getLogger(__name__).error("mapping skipped: %s", error)
    return mappings


def _collect_less() -> None:
    """Python's cyclic garbage collector cost a crawl worker 11-12 % of its CPU (2.7-3.8 s of
    25-30 s on 2,500 records): every full collection walked the ~10^5 objects of the imports
    (Scrapy, Twisted, pymongo, lxml, the mappings) and the records' state, and the young
    generation was collected every 700 allocations of a crawl that allocates thousands per page.
    What is loaded by now lives as long as the process: frozen (gc.freeze, never walked again).
    The young generation is collected every 50,000 allocations instead of 700, so objects that
    die by reference counting (most of a page's) are never walked; cyclic garbage (Twisted's
    failures, say) is still found, a little later. Measured: 0.19 s of collection instead of
    2.71 s on the same crawl (one worker, 2,500 records, no delays); peak RSS in
    docs/performance.md."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 10)


def _arrow_returns_memory() -> None:
    """The crawl process uses Arrow only to read its seed shard, early: Arrow's default pool
    (mimalloc) would keep what that took for the whole crawl (~10 KB per record of the shard,
    25 MB for 2,500 records), the system allocator gives it back."""
    import pyarrow as pa

    pa.set_memory_pool(pa.system_memory_pool())


class LogForwarder(logging.Handler):
    """Forwards the crawl's warnings and errors (Scrapy's and ours) to another logger, the Pipes
    log (the Dagster run's log, seen in the UI), without flooding it: at most `per_message` lines
    of one message template and `max_total` lines in all; `summary()` then gives the counts of
    everything seen, forwarded or not."""

    def __init__(self, target: logging.Logger, *, per_message: int = 5, max_total: int = 100):
        super().__init__(level=logging.WARNING)
        self.target = target
        self.per_message = per_message
        self.max_total = max_total
        self.seen: Counter[str] = Counter()  # level name -> records seen
        self.by_template: Counter[tuple[str, str]] = Counter()  # (logger, template) -> seen
        self.forwarded = 0
        self._inside = False

    def emit(self, record: logging.LogRecord) -> None:
        if self._inside or record.name == self.target.name:
            return  # never our own lines again
        self.seen[record.levelname] += 1
        template = (record.name, str(record.msg)[:200])
        self.by_template[template] += 1
        if self.forwarded >= self.max_total or self.by_template[template] > self.per_message:
            return
        self._inside = True
        try:
            message = record.getMessage()
            if record.exc_info and record.exc_info[1] is not None:
                message += f" ({type(record.exc_info[1]).__name__}: {record.exc_info[1]})"
            self.target.log(record.levelno, f"[{record.name}] {message[:2000]}")
            self.forwarded += 1
        except Exception:  # forwarding must never break the crawl
            self.handleError(record)
        finally:
            self._inside = False

    def summary(self) -> str | None:
        """One line of counts, or None when the crawl logged no warning or error."""
        total = sum(self.seen.values())
        if not total:
            return None
        counts = ", ".join(f"{n} {level.lower()}" for level, n in sorted(self.seen.items()))
        line = f"crawl log: {counts}"
        if total > self.forwarded:
            top = ", ".join(
                f"{name}: {template[:60]!r} x{n}"
                for (name, template), n in self.by_template.most_common(3)
            )
            line += f" ({total - self.forwarded} not forwarded; most frequent: {top})"
        return line


def _format_progress(stats: dict[str, Any]) -> str:
    return (
        f"[{stats['partition']}] records {stats['records_done']}/{stats['records_fed']} done "
        f"({stats['records_active']} active), pages {stats['pages']} "
        f"({stats['pages_per_second']}/s), candidates {stats['candidates']}, "
        f"errors {sum(stats['errors_by_kind'].values())}"
    )


def main(argv: list[str] | None = None) -> int:
    from enrich_crawl.crawl import allocator

    # jemalloc, when the machine has it: re-executes this process once (see allocator.py)
    allocator.ensure(config.crawl_allocator())
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--params",
        action="append",
        help="JSON file of WorkerParams (without Dagster Pipes); repeated: those partitions are "
        "crawled at once in this process, one line of statistics each",
    )
    args = parser.parse_args(argv)

    if args.params:
        shards = []
        for path in args.params:
            params = WorkerParams.from_dict(json.loads(Path(path).read_text("utf-8")))
            if params.mongo_uri is None:
                params.mongo_uri = config.mongodb_uri()
            shards.append(params)
        log = logging.getLogger("enrich_crawl.worker")
        results = run_crawls(shards, progress=lambda s: log.info(_format_progress(s)))
        failed = 0
        for params, result in zip(shards, results, strict=True):
            if isinstance(result, BaseException):
                failed += 1
                print(json.dumps({"partition": params.partition, "error": str(result)}))
            else:
                print(json.dumps(result))
        return 1 if failed else 0

    from dagster_pipes import open_dagster_pipes

    with open_dagster_pipes() as pipes:
        # one shard (`params`), or several crawled at once in this process (`shards`)
        shards = [
            WorkerParams.from_dict(raw)
            for raw in (pipes.extras.get("shards") or [pipes.extras["params"]])
        ]
        for params in shards:
            if params.mongo_uri is None:
                params.mongo_uri = config.mongodb_uri()

        # progress.json follows the crawl every few seconds (what `enrich-crawl run` shows); the
        # run's log gets a line at most every RUN_LOG_PROGRESS_SECONDS: each line is an event
        # that Dagster writes to its event log storage (milliseconds of the step's CPU apiece)
        last_line: dict[str, float] = {p.partition: time.monotonic() for p in shards}

        def progress(stats: dict[str, Any]) -> None:
            now = time.monotonic()
            key = stats.get("partition", "")
            if now - last_line.get(key, 0.0) >= RUN_LOG_PROGRESS_SECONDS:
                last_line[key] = now
                pipes.log.info(_format_progress(stats))

        # the crawl's warnings and errors reach the run's log too (bounded)
        forwarder = LogForwarder(pipes.log)
        logging.getLogger().addHandler(forwarder)
        try:
            results = run_crawls(shards, progress=progress)
        finally:
            logging.getLogger().removeHandler(forwarder)
            summary = forwarder.summary()
            if summary is not None:
                pipes.log.warning(summary)
        failed = 0
        for params, result in zip(shards, results, strict=True):
            if isinstance(result, BaseException):
                failed += 1
                pipes.log.error(f"crawl of shard {params.partition} failed: {result}")
                pipes.report_custom_message(
                    {"kind": "failed", "partition": params.partition, "error": str(result)}
                )
            else:
                pipes.log.info(_format_progress(result))
                pipes.report_custom_message({"kind": "final", "stats": result})
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
