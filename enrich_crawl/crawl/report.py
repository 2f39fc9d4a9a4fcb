"""What the crawl reports: the statistics snapshot (progress.json every few seconds while the
crawl runs, stats.json at its end), read from the tally, the frontier, the page cache and the
components of the crawl (robots, throttle, scheduler, limiter, state, browser)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import resource
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scrapy.crawler import Crawler

from enrich_crawl.crawl import allocator
from enrich_crawl.crawl.context import CrawlContext
from enrich_crawl.crawl.frontier import Frontier
from enrich_crawl.crawl.middlewares.politeness import RobotsMiddleware, Throttle
from enrich_crawl.crawl.pagecache import PageCache
from enrich_crawl.crawl.params import WorkerParams
from enrich_crawl.crawl.rendering import RenderCoordinator
from enrich_crawl.crawl.scheduler import PoliteScheduler
from enrich_crawl.crawl.tally import Tally

logger = logging.getLogger(__name__)


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str), encoding="utf-8")
    tmp.replace(path)


def peak_rss_mb() -> float:
    """Peak resident memory of this process. Linux: VmHWM, which starts afresh at exec (ru_maxrss
    keeps the high-water mark of the parent that forked the worker)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024, 1)


class CrawlReport:
    def __init__(
        self,
        *,
        params: WorkerParams,
        tally: Tally,
        frontier: Frontier,
        pages: PageCache,
        rendering: RenderCoordinator,
    ):
        self.params = params
        self.tally = tally
        self.frontier = frontier
        self.pages = pages
        self.rendering = rendering
        self.started = time.monotonic()
        self.started_wall = time.time()
        self.allocator = allocator.in_use()  # jemalloc or the system's (allocator.py)

    async def progress_loop(
        self, crawler: Crawler, progress: Callable[[dict[str, Any]], None] | None
    ) -> None:
        progress_file = Path(self.params.out_dir) / "progress.json"
        while True:
            await asyncio.sleep(self.params.progress_interval)
            try:
                snapshot = self.snapshot(crawler)
                write_json_atomic(progress_file, snapshot)
                if progress is not None:
                    progress(snapshot)
            except Exception:  # progress must never break the crawl
                logger.exception("progress reporting failed")

    def _render_snapshot(self, crawler: Crawler | None) -> dict[str, Any]:
        browser = CrawlContext.of(crawler).browser_snapshot if crawler else None
        return self.rendering.snapshot(browser() if browser is not None else None)

    def snapshot(self, crawler: Crawler | None) -> dict[str, Any]:
        counts, render_counts = self.tally.counts, self.tally.render
        stats = crawler.stats.get_stats() if crawler else {}
        elapsed = max(time.monotonic() - self.started, 1e-6)
        resolved = self.tally.outcomes["resolved"]
        robots = RobotsMiddleware.of(crawler) if crawler else None
        throttle = Throttle.of(crawler) if crawler else None
        scheduler = PoliteScheduler.of(crawler) if crawler else None
        context = CrawlContext.of(crawler) if crawler else None
        limiter = context.limiter if context else None
        state = context.state if context else None
        robots_stats = dict(robots.stats) if robots else {}
        limiter_stats: dict[str, Any] = {"shared": bool(limiter and limiter.shared)}
        if limiter is not None:
            taken = limiter.stats["acquired"] + limiter.stats["kept"]
            limiter_stats.update(
                {
                    **dict(limiter.stats),
                    "wait_seconds": round(limiter.wait_seconds, 3),
                    "db_seconds": round(limiter.db_seconds, 3),
                    "mean_db_ms_per_request": round(1000 * limiter.db_seconds / taken, 3)
                    if taken
                    else None,
                }
            )
        return {
            "partition": self.params.partition,
            "started_at": self.started_wall,
            "records_fed": counts["records"],
            "records_done": self.frontier.completed,
            "records_active": self.frontier.active,
            "records_not_started": counts["records_not_started"],
            "resent_at_idle": counts["resent_at_idle"],
            "outcomes": dict(self.tally.outcomes),
            "pages": counts["pages"],
            "pages_reused": counts["pages_reused"],
            "pages_from_store": counts["pages_from_store"],
            "not_modified": counts["not_modified"],
            "conditional_requests": counts["conditional_requests"],
            "fields_fresh": counts["fields_fresh"],
            "bytes": counts["bytes"],
            "candidates": counts["candidates"],
            "pages_rendered": render_counts["rendered"],
            "render_skipped": render_counts["skipped/fields_found"]
            + render_counts["skipped/not_script_built"],
            "render": self._render_snapshot(crawler),
            "dropped_requests": counts["dropped"],
            "errors_by_kind": dict(self.tally.errors_by_kind),
            "status_codes": {
                k.rsplit("/", 1)[-1]: v
                for k, v in stats.items()
                if k.startswith("downloader/response_status_count/")
            },
            "robots_refusals": stats.get("enrich/refused/robots", 0),
            "robots_fetched": robots_stats.get("fetched", 0),
            "robots": robots_stats,
            "refused": {
                k.rsplit("/", 1)[-1]: v for k, v in stats.items() if k.startswith("enrich/refused/")
            },
            "retries": stats.get("retry/count", 0),
            "requests": stats.get("downloader/request_count", 0),
            "delays": {
                "hosts_by_delay": throttle.delays_histogram() if throttle else {},
                "hosts_with_crawl_delay": throttle.crawl_delay_hosts if throttle else 0,
                "autothrottle_raised": throttle.raised if throttle else 0,
                "limiter": limiter_stats,
            },
            "scheduler": scheduler.snapshot() if scheduler else {},
            "state": dict(state.stats) if state else None,
            "pages_spilled": self.pages.spilled,
            "pages_left_to_store": self.pages.dropped,
            "seconds": round(elapsed, 3),
            "pages_per_second": round(counts["pages"] / elapsed, 3),
            "pages_per_resolved_record": round(counts["pages"] / resolved, 3) if resolved else None,
            "peak_rss_mb": peak_rss_mb(),  # of the crawl process (shared by its shards)
            "allocator": self.allocator,
            # the process that crawled the shard (several shards may share one), and this
            # crawl's share of the process's limits (WorkerParams.share_of_process)
            "crawl_process": f"{socket.gethostname()}:{os.getpid()}",
            "limits": {
                "max_active_records": self.params.max_active_records,
                "concurrent_requests": self.params.crawl_config.concurrent_requests,
                "page_cache_mb": self.params.crawl_config.page_cache_mb,
            },
        }
