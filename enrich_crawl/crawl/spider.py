"""The enrichment spider: Scrapy's entry point into the crawl, wiring its rooms. It feeds records
lazily (feed.py), gets each page once from cache, store or network (sources.py), extracts with the
mappings and follows only useful links (extraction.py), renders the pages that need a browser
(rendering.py), ends records and writes their lines (outcomes.py) and reports (report.py).

The spider keeps Scrapy's callbacks: `start`, `parse` (a page fetched: extracted for every record
waiting on it, remembered, the next pages asked for), `on_error` (a request failed: its records
get the reason, or the static page when a render failed), the idle and close signals.
Records whose missing fields all have fresh values in the results collection are not crawled.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import scrapy
from scrapy import signals
from scrapy.http import Response

from enrich_crawl.contracts import CRAWL_STATS_FILE
from enrich_crawl.crawl.collect import PageCollector
from enrich_crawl.crawl.context import CrawlContext
from enrich_crawl.crawl.errors import reason_for_exception
from enrich_crawl.crawl.extraction import Extractor
from enrich_crawl.crawl.feed import RecordFeed
from enrich_crawl.crawl.frontier import FetchOrder, Frontier
from enrich_crawl.crawl.outcomes import Outcomes, OutputFiles
from enrich_crawl.crawl.pagecache import PageCache
from enrich_crawl.crawl.params import WorkerParams
from enrich_crawl.crawl.render import FETCHED, RENDER, RENDERED_FLAG, needs_browser
from enrich_crawl.crawl.rendering import RenderCoordinator
from enrich_crawl.crawl.report import CrawlReport, write_json_atomic
from enrich_crawl.crawl.sources import PageSources, is_text, open_state
from enrich_crawl.crawl.tally import Tally
from enrich_crawl.extract.mapping import MappingSet
from enrich_crawl.extract.page import Page
from enrich_crawl.urls import page_key

logger = logging.getLogger(__name__)


class EnrichSpider(scrapy.Spider):
    name = "enrich"

    def __init__(
        self,
        params: WorkerParams,
        mappings: MappingSet,
        progress: Callable[[dict[str, Any]], None] | None = None,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.params = params
        self.config = config = params.crawl_config
        self.progress = progress
        self.tally = Tally()
        self.out = OutputFiles(Path(params.out_dir))
        self.outcomes = Outcomes(self.out, self.tally)
        self.frontier = Frontier(
            max_depth=config.depth,
            on_record_done=self.outcomes.record_done,
            stop_at_goal=config.strategy != "bfs",
            max_pages_per_record=config.max_pages_per_record,
        )
        self.outcomes.attach(self.frontier)
        self.pages = PageCache(max_bytes=int(config.page_cache_mb * 1024 * 1024))
        # learning and evaluating mappings: every page a record reaches is kept (collect.py)
        self.collector = PageCollector.for_params(params)
        self.extraction = Extractor(
            config=config,
            mappings=mappings,
            field_types=dict(params.field_types),
            frontier=self.frontier,
            allow_private=params.allow_private,
            out=self.out,
            tally=self.tally,
            collector=self.collector,
        )
        # JavaScript rendering (only when some mapping asks for it)
        self.rendering = RenderCoordinator(
            enabled=needs_browser(mappings),
            extractor=self.extraction,
            frontier=self.frontier,
            pages=self.pages,
            tally=self.tally,
            callback=self.parse,
            errback=self.on_error,
        )
        self.sources = PageSources(
            params=params,
            config=config,
            frontier=self.frontier,
            pages=self.pages,
            extractor=self.extraction,
            rendering=self.rendering,
            outcomes=self.outcomes,
            tally=self.tally,
            callback=self.parse,
            errback=self.on_error,
        )
        self.feed = RecordFeed(
            params=params,
            frontier=self.frontier,
            sources=self.sources,
            outcomes=self.outcomes,
            tally=self.tally,
        )
        self.report = CrawlReport(
            params=params,
            tally=self.tally,
            frontier=self.frontier,
            pages=self.pages,
            rendering=self.rendering,
        )
        self.progress_task: asyncio.Future | None = None
        self.stats_written = False
        self.final_stats: dict[str, Any] = {}

    @classmethod
    def from_crawler(cls, crawler, *args: Any, **kwargs: Any) -> EnrichSpider:
        spider = super().from_crawler(crawler, *args, **kwargs)
        # what the other components ask of the crawl, they find in its context
        context = CrawlContext.of(crawler)
        context.pages = spider.pages
        context.unwanted = spider.feed.unwanted
        context.discard = spider.feed.discard_request
        context.claims = spider.extraction.claims
        crawler.signals.connect(spider._closed, signal=signals.spider_closed)
        crawler.signals.connect(spider._idle, signal=signals.spider_idle)
        return spider

    async def start(self):
        self.sources.state = await open_state(self.params, self.config, self.crawler)
        self.progress_task = asyncio.ensure_future(
            self.report.progress_loop(self.crawler, self.progress)
        )
        async for request in self.feed.requests():
            yield request

    async def parse(self, response: Response, **kwargs: Any):
        key = response.meta["page_key"]
        render_mode = response.meta.get(RENDER)
        counts = self.tally.counts
        # a render answers every page key that waited for it (redirects to the same URL)
        keys = self.rendering.finished(key) if render_mode else [key]
        if response.status == 304 and response.meta.get("conditional"):
            for request in await self.sources.not_modified(key, response):
                yield request
            return
        if not render_mode or response.meta.get(FETCHED):  # a render from the static body
            counts["pages"] += 1  # fetched nothing new
            counts["bytes"] += len(response.body)
        ctype = response.headers.get(b"Content-Type", b"").decode("latin-1")
        if not is_text(ctype):
            self.sources.fail(keys, "not_text", ctype[:100], response.url)
            return
        page = Page(response.url, response.body, content_type=ctype or None, status=response.status)
        page.fetched_at = dt.datetime.now(dt.timezone.utc).isoformat()
        page.content_hash = hashlib.sha1(response.body).hexdigest()
        page.rendered = RENDERED_FLAG in response.flags
        page.render_tried = bool(render_mode)
        if page.rendered:
            self.tally.render["rendered"] += 1
            self.tally.render[f"rendered_{render_mode}"] += 1
        final_key = page_key(response.url)
        if final_key not in keys:  # redirected: records waiting for the target get it now
            keys.append(final_key)
        orders: list[FetchOrder] = []
        useful = False
        for k in keys:
            more, also_useful = self.extraction.process(k, page)
            orders.extend(more)
            useful = useful or also_useful
        stored = False
        if key not in self.rendering.target:  # not waiting for its rendered version
            stored = self.sources.persist(key, page, response, useful)
        for k in keys:
            self.rendering.cache(k, page, stored=stored and k == key)
        for request in await self.sources.dispatch(orders):
            yield request

    def on_error(self, failure):
        request = failure.request
        render = bool(request.meta.get(RENDER))
        if render:
            keys = self.rendering.request_keys(request)
        else:
            keys = [request.meta.get("page_key", request.url)]
        reason = reason_for_exception(failure.value, request)
        if reason == "goal_reached":
            for key in keys:
                self.frontier.drop(key)
            self.tally.counts["dropped"] += 1
            return None
        if not render:
            self.sources.fail(keys, reason, str(failure.value)[:300], request.url)
            return None
        detail = str(getattr(failure.value, "detail", "") or failure.value)[:300]
        page = self.rendering.fallback(request, keys, reason, detail)
        if page is None:  # nothing fetched: as a static fetch that failed
            self.sources.fail(keys, reason, detail, request.url)
            return None
        return self._serve_fallback(keys, page)

    async def _serve_fallback(self, keys: list[str], page: Page):
        orders: list[FetchOrder] = []
        for key in keys:
            orders.extend(self.extraction.process(key, page)[0])
            self.rendering.cache(key, page)
        for request in await self.sources.dispatch(orders):
            yield request

    def _idle(self, spider=None) -> None:
        self.feed.resend_lost(self.crawler.engine)

    async def _closed(self, spider, reason: str) -> None:
        if self.progress_task is not None:
            self.progress_task.cancel()
        # records still active (time budget, termination): finish them with the reason
        self.outcomes.finish_active(reason)
        try:
            self.feed.finish_unfed(reason)
        except Exception:  # the statistics must still be written
            logger.exception("records never fed to the crawl could not be written")
        limiter = CrawlContext.of(self.crawler).limiter  # hand back the hosts still held
        if limiter is not None:
            await limiter.close()
        snapshot = self.report.snapshot(self.crawler)
        snapshot["finish_reason"] = reason
        if self.collector is not None:
            snapshot["collected"] = self.collector.close()
        self.out.close()
        self.pages.close()
        state = self.sources.state
        if state is not None:
            await state.close()
            snapshot["state"] = dict(state.stats)
        write_json_atomic(Path(self.params.out_dir) / CRAWL_STATS_FILE, snapshot)
        self.final_stats = snapshot
        self.stats_written = True
