"""Where a page comes from, cheapest first:
1. this run's page cache (memory, spilled to local disk): a page is fetched once per run, however
   many records need it;
2. the crawled-URL store of earlier runs (`_crawl_pages`, enrich_crawl.crawl.state): a page that fed
   a mapping less than `recrawl_ttl_hours` ago is re-extracted from its stored body; a page known to
   feed nothing, or to fail for good, is not fetched again; a stale stored page is revalidated with
   If-None-Match / If-Modified-Since (304: the stored body again);
3. the network, through the polite scheduler and downloader.
A page fetched is remembered in the store (its body only when it fed a mapping)."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import socket
import time
from collections.abc import Callable, Iterable
from typing import Any

import scrapy
from scrapy.crawler import Crawler
from scrapy.http import Response

from enrich_crawl.config import CrawlConfig
from enrich_crawl.crawl.context import CrawlContext
from enrich_crawl.crawl.extraction import Extractor
from enrich_crawl.crawl.frontier import FetchOrder, Frontier
from enrich_crawl.crawl.host_limiter import HostLimiter
from enrich_crawl.crawl.outcomes import Outcomes
from enrich_crawl.crawl.pagecache import PageCache
from enrich_crawl.crawl.params import WorkerParams
from enrich_crawl.crawl.render import RENDER, WAIT_FOR
from enrich_crawl.crawl.rendering import RenderCoordinator
from enrich_crawl.crawl.robots import origin_of
from enrich_crawl.crawl.scheduler import PoliteScheduler
from enrich_crawl.crawl.state import (
    PERMANENT_FAILURES,
    CrawlState,
    decompress,
    spill_dir,
    stored_body,
)
from enrich_crawl.crawl.tally import Tally
from enrich_crawl.extract.page import Page

logger = logging.getLogger(__name__)

TEXT_TYPES = (
    "text/",
    "application/json",
    "application/xml",
    "application/xhtml",
    "application/ld+json",
    "application/rss+xml",
    "application/atom+xml",
)


def is_text(ctype: str) -> bool:
    ctype = ctype.lower().strip()
    return (
        not ctype or ctype.startswith(TEXT_TYPES) or ctype.split(";")[0].endswith(("+json", "+xml"))
    )


def _iso(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.timezone.utc).isoformat()


async def open_state(
    params: WorkerParams, config: CrawlConfig, crawler: Crawler
) -> CrawlState | None:
    """The crawl's MongoDB state (robots cache, crawled-URL store), also in the crawl's context
    with the shared per-host limiter, when the crawl wants them and the database answers."""
    uri = params.mongo_uri
    wants = config.shared_limiter or config.store_pages or config.recrawl_ttl_hours > 0
    if not uri or not wants:
        return None
    # unique per process: limiter tokens of two runs of one partition never collide
    worker = f"{params.partition}@{socket.gethostname()}:{os.getpid()}"
    state = CrawlState(uri, params.mongo_db, worker=worker)
    state.spill_dir = spill_dir(params.out_dir, params.mongo_db)
    try:
        await state.open()
        await asyncio.wait_for(state.db.command("ping"), 15)
    except Exception as exc:
        logger.warning("results database unreachable (%s): crawling without shared state", exc)
        await state.close()
        return None
    context = CrawlContext.of(crawler)
    context.state = state
    # pages an earlier crawl fetched while the database was away: stored first, not refetched
    replayed = await state.replay_spilled_pages()
    if replayed:
        logger.info("%d page(s) kept on disk by an earlier crawl stored", replayed)
    if config.shared_limiter:
        limiter = HostLimiter(state, max_wait=max(config.max_delay * 10, 600.0))
        scheduler = PoliteScheduler.of(crawler)
        if scheduler is not None:
            limiter.has_work = scheduler.has_work
        context.limiter = limiter
    return state


class PageSources:
    """Serves fetch orders from the page cache or the store, and makes requests for the rest."""

    def __init__(
        self,
        *,
        params: WorkerParams,
        config: CrawlConfig,
        frontier: Frontier,
        pages: PageCache,
        extractor: Extractor,
        rendering: RenderCoordinator,
        outcomes: Outcomes,
        tally: Tally,
        callback: Callable[..., Any],
        errback: Callable[..., Any],
    ):
        self.params = params
        self.config = config
        self.frontier = frontier
        self.pages = pages
        self.extractor = extractor
        self.rendering = rendering
        self.outcomes = outcomes
        self.counts = tally.counts
        self.callback = callback  # the spider's parse and on_error, for the requests made here
        self.errback = errback
        self.collector = extractor.collector
        self.goal_directed = extractor.goal_directed
        self.recrawl_ttl = config.recrawl_ttl_hours * 3600.0
        self.state: CrawlState | None = None  # MongoDB state, once the database answered

    async def dispatch(self, orders: Iterable[FetchOrder]) -> list[scrapy.Request]:
        """Serve what this run or the store already has; requests for the rest."""
        queue = list(orders)
        requests: list[scrapy.Request] = []
        while queue:
            batch, queue, unknown = queue, [], []
            for order in batch:
                try:
                    page = self.pages.get(order.key)
                except Exception as exc:  # a broken scratch entry: fetch the page again
                    logger.warning("page cache entry of %s unreadable: %s", order.key, exc)
                    page = None
                if page is not None:
                    self.counts["pages_reused"] += 1
                    queue.extend(self.extractor.process(order.key, page)[0])
                    continue
                failure = self.pages.failure(order.key)
                if failure is not None:
                    self.counts["failures_reused"] += 1
                    self.outcomes.fail(order.key, failure)
                    continue
                unknown.append(order)
            docs: dict[str, dict[str, Any]] = {}
            if unknown and self.state is not None and self.config.store_pages:
                stored = await self.state.origins_with_pages({origin_of(o.key) for o in unknown})
                lookup = [
                    o.key
                    for o in unknown
                    if origin_of(o.key) in stored or self.pages.in_store_only(o.key)
                ]
                if lookup:
                    docs = await self.state.pages_get(lookup)
            for order in unknown:
                if order.key not in self.frontier.tasks:  # handled while we awaited
                    continue
                doc = docs.get(order.key)
                if doc is not None:
                    try:
                        served = self._from_store(order, doc)
                    except Exception as exc:  # a stored copy we cannot use: fetch the page
                        logger.warning("stored copy of %s unusable: %s", order.key, exc)
                        served, doc = None, None
                    if served is not None:
                        queue.extend(served)
                        continue
                requests.append(self.request(order, doc))
        if self.rendering.queue:
            requests.extend(self.rendering.queue)
            self.rendering.queue = []
        return requests

    def request(self, order: FetchOrder, doc: dict[str, Any] | None) -> scrapy.Request:
        meta: dict[str, Any] = {"page_key": order.key, "enrich_depth": order.depth}
        headers: dict[str, str] = {}
        # a collecting crawl wants the body: a 304 for a page stored without one is of no use
        if (
            doc is not None
            and not doc.get("reason")
            and self.config.store_pages
            and (doc.get("body") is not None or self.collector is None)
        ):
            if doc.get("etag"):
                headers["If-None-Match"] = doc["etag"]
            if doc.get("last_modified"):
                headers["If-Modified-Since"] = doc["last_modified"]
            if headers:
                meta["conditional"] = True
                meta["handle_httpstatus_list"] = [304]
                self.counts["conditional_requests"] += 1
        if self.rendering.enabled:
            js, waits = self.rendering.js_before_fetch(order.key)
            if js:  # the URL is a js mapping's: render it directly (the document fetched once)
                meta[RENDER] = "js"
                meta[WAIT_FOR] = waits
                self.rendering.wait(order.key, order.key)
        return scrapy.Request(
            order.fetch_url,  # as found: the key's sorted query is for recognising pages only
            callback=self.callback,
            errback=self.errback,
            priority=order.priority,
            dont_filter=True,
            headers=headers or None,
            meta=meta,
        )

    def _from_store(self, order: FetchOrder, doc: dict[str, Any]) -> list[FetchOrder] | None:
        """Orders that follow from serving `order` from the store, or None to fetch it. A page
        this run stored (its memory copy made room for others) is fresh whatever the TTL."""
        this_run = doc.get("run_id") == self.params.run_id
        fresh = this_run or time.time() - float(doc.get("fetched_at") or 0) < self.recrawl_ttl
        if not fresh:
            return None
        reason = doc.get("reason")
        if reason:
            if reason not in PERMANENT_FAILURES:
                return None
            self.counts["failures_from_store"] += 1
            self.outcomes.fail(order.key, reason, "remembered from an earlier run")
            self.pages.put_failure(order.key, reason)
            return []
        page = self._stored_page(doc)
        if page is None:
            return None
        self.counts["pages_reused" if this_run else "pages_from_store"] += 1
        orders = self.extractor.process(order.key, page)[0]
        self.rendering.cache(order.key, page, stored=page.stored_body is not None)
        return orders

    def _stored_page(self, doc: dict[str, Any], fetched_at: float | None = None) -> Page | None:
        """The page a store document stands for; None when it must be fetched again."""
        body = doc.get("body")
        if body is None:
            # known to feed nothing: still true unless a mapping now claims it for some waiter
            # (a collecting crawl wants the body itself)
            if self.config.follow_all_links or not self.goal_directed or self.collector:
                return None
            for waiter in self.frontier.live_waiters(doc["_id"]):
                url = doc.get("url") or doc["_id"]
                fragment = f"#{waiter.fragment}" if waiter.fragment else ""
                if self.extractor.matching(url + fragment):
                    return None
            data = b""
            known_useless = True
        else:
            known_useless = False
            try:
                data = decompress(body)
            except Exception:
                return None
        page = Page(
            doc.get("url") or doc["_id"],
            data,
            content_type=doc.get("content_type") or None,
            status=int(doc.get("status") or 200),
        )
        page.fetched_at = _iso(fetched_at or float(doc.get("fetched_at") or time.time()))
        page.content_hash = doc.get("content_hash")
        if body is not None:
            page.stored_body = bytes(body)  # compressed already (stored_body)
        page.known_useless = known_useless
        page.rendered = bool(doc.get("rendered"))
        return page

    async def not_modified(self, key: str, response: Response) -> list[scrapy.Request]:
        """A 304 to a conditional request: the stored copy again, fresh from now."""
        self.counts["not_modified"] += 1
        docs = await self.state.pages_get([key]) if self.state is not None else {}
        doc = docs.get(key)
        now = time.time()
        page = self._stored_page(doc, fetched_at=now) if doc is not None else None
        if page is None:  # the stored copy vanished: fetch it whole
            self.counts["not_modified_lost"] += 1
            order = FetchOrder(
                key, response.request.priority, response.meta["enrich_depth"], response.request.url
            )
            return [self.request(order, None)]
        orders = self.extractor.process(key, page)[0]
        doc["fetched_at"] = now
        if self.state is not None:
            self.state.page_put(doc)
        self.rendering.cache(
            key, page, stored=doc.get("body") is not None and self.state is not None
        )
        return await self.dispatch(orders)

    def persist(self, key: str, page: Page, response: Response, useful: bool) -> bool:
        """Remember the page in the crawled-URL store (its body only when it fed a mapping);
        True when the store keeps its body (this run finds it there again)."""
        if self.state is None or not self.config.store_pages:
            return False
        keep_body = (useful or self.config.follow_all_links or self.collector is not None) and len(
            page.body
        ) <= self.config.max_stored_page_bytes
        headers = response.headers
        doc = {
            "_id": key,
            "url": page.url,
            "status": page.status,
            "fetched_at": time.time(),
            "etag": (headers.get(b"ETag") or b"").decode("latin-1") or None,
            "last_modified": (headers.get(b"Last-Modified") or b"").decode("latin-1") or None,
            "content_type": page._header,
            "content_hash": page.content_hash,
            "rendered": page.rendered,
            "useful": useful,
            "body": stored_body(page) if keep_body else None,
            "run_id": self.params.run_id,
        }
        self.state.page_put(doc)
        self.state.mark_origin(origin_of(key))
        return keep_body and self.state.available

    def remember_failure(self, key: str, reason: str, url: str) -> None:
        self.pages.put_failure(key, reason)
        if self.state is not None and self.config.store_pages and reason in PERMANENT_FAILURES:
            self.state.page_put(
                {"_id": key, "url": url, "reason": reason, "fetched_at": time.time(), "body": None}
            )
            self.state.mark_origin(origin_of(key))

    def fail(self, keys: Iterable[str], reason: str, detail: str, url: str) -> None:
        """The pages failed: their records record the reason, this run and the store remember."""
        for key in keys:
            self.outcomes.fail(key, reason, detail)
            self.remember_failure(key, reason, url)
