"""The enrichment spider: feeds records lazily, fetches each page once, extracts with the mappings,
follows only useful links, and writes candidates and per-record outcomes as it goes.

Where a page comes from, cheapest first:
1. this run's page cache (memory, spilled to local disk): a page is fetched once per run, however
   many records need it;
2. the crawled-URL store of earlier runs (`_crawl_pages`, enrich_crawl.crawl.state): a page that fed
   a mapping less than `recrawl_ttl_hours` ago is re-extracted from its stored body; a page known to
   feed nothing, or to fail for good, is not fetched again; a stale stored page is revalidated with
   If-None-Match / If-Modified-Since (304: the stored body again);
3. the network, through the polite scheduler and downloader.
Records whose missing fields all have fresh values in the results collection are not crawled at all.

JavaScript (enrich_crawl.crawl.render): pages of `js` mappings are requested as render requests;
a static page that an `auto` mapping finds empty and that looks script-built is rendered from its
static body. Records wait for the rendered page (the static one is neither cached nor stored
meanwhile); a failed render falls back on the static page, with the reason on the records.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import json
import logging
import os
import resource
import socket
import sys
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import scrapy
from scrapy import signals
from scrapy.exceptions import DontCloseSpider
from scrapy.http import Response

from enrich_crawl.contracts import (
    CANDIDATES_FILE,
    CRAWL_STATS_FILE,
    RECORD_OUTCOMES_FILE,
    CandidateLine,
    RecordOutcomeLine,
    crawl_outcome,
)
from enrich_crawl.crawl.collect import PageCollector
from enrich_crawl.crawl.context import CrawlContext
from enrich_crawl.crawl.errors import reason_for_exception
from enrich_crawl.crawl.frontier import (
    PRIORITY_GENERIC_LINK,
    PRIORITY_PARSER_LINK,
    FetchOrder,
    Frontier,
    RecordState,
    Waiter,
)
from enrich_crawl.crawl.host_limiter import HostLimiter
from enrich_crawl.crawl.middlewares import ROBOTS_FETCH, RobotsMiddleware, Throttle
from enrich_crawl.crawl.pagecache import PageCache
from enrich_crawl.crawl.params import WorkerParams
from enrich_crawl.crawl.policy import UrlPolicy
from enrich_crawl.crawl.render import (
    ABANDONED,
    DOCUMENT,
    FETCHED,
    RENDER,
    RENDER_REASONS,
    RENDERED_FLAG,
    WAIT_FOR,
    Document,
    looks_script_built,
    needs_browser,
)
from enrich_crawl.crawl.robots import origin_of
from enrich_crawl.crawl.scheduler import PoliteScheduler
from enrich_crawl.crawl.state import (
    PERMANENT_FAILURES,
    CrawlState,
    decompress,
    spill_dir,
    stored_body,
)
from enrich_crawl.dataset.seedfile import read_seed_shard
from enrich_crawl.extract.mapping import Mapping, MappingResult, MappingSet, run_mapping
from enrich_crawl.extract.page import Page
from enrich_crawl.staging import dumps
from enrich_crawl.urls import page_key, resolve_link

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
FEED_CHUNK = 200  # records read, checked for freshness and started together


def _write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str), encoding="utf-8")
    tmp.replace(path)


def _iso(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.timezone.utc).isoformat()


def _is_text(ctype: str) -> bool:
    ctype = ctype.lower().strip()
    return (
        not ctype or ctype.startswith(TEXT_TYPES) or ctype.split(";")[0].endswith(("+json", "+xml"))
    )


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


class OutputFiles:
    """candidates.jsonl and records.jsonl of the partition, appended as the crawl goes."""

    def __init__(self, out_dir: Path):
        out_dir.mkdir(parents=True, exist_ok=True)
        self.candidates = open(out_dir / CANDIDATES_FILE, "w", encoding="utf-8")  # noqa: SIM115
        self.records = open(out_dir / RECORD_OUTCOMES_FILE, "w", encoding="utf-8")  # noqa: SIM115
        self.last_flush = time.monotonic()

    def write_candidate(self, row: CandidateLine) -> None:
        self.candidates.write(dumps(row) + "\n")

    def write_record(self, row: RecordOutcomeLine) -> None:
        self.records.write(dumps(row) + "\n")
        now = time.monotonic()
        if now - self.last_flush > 1.0:
            self.flush()
            self.last_flush = now

    def flush(self) -> None:
        self.candidates.flush()
        self.records.flush()

    def close(self) -> None:
        self.flush()
        self.candidates.close()
        self.records.close()


class _Extraction:
    """One mapping on one page for one (fragment, record id) key, filled on demand."""

    __slots__ = ("links", "tried", "values")

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}  # field -> value (fields that gave one)
        self.tried: set[str] = set()  # fields whose processors ran
        self.links: list[str] | None = None  # the url_parsers' links, once run


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
        self.config = params.crawl_config
        self.mappings = mappings
        self.field_types = dict(params.field_types)
        self.progress = progress
        self.goal_directed = self.config.strategy != "bfs"
        self.out = OutputFiles(Path(params.out_dir))
        self.frontier = Frontier(
            max_depth=self.config.depth,
            on_record_done=self._record_done,
            stop_at_goal=self.goal_directed,
            max_pages_per_record=self.config.max_pages_per_record,
        )
        self.pages = PageCache(max_bytes=int(self.config.page_cache_mb * 1024 * 1024))
        self.policy = UrlPolicy(
            self.config, allow_private=params.allow_private, claimed=self.claims
        )
        self.state: CrawlState | None = None
        self.recrawl_ttl = self.config.recrawl_ttl_hours * 3600.0
        self.extraction_cache: OrderedDict[str, _Extraction] = OrderedDict()
        self.match_cache: OrderedDict[str, list[Mapping]] = OrderedDict()
        self.capacity = asyncio.Event()
        self.errors_by_kind: Counter[str] = Counter()
        self.outcomes: Counter[str] = Counter()
        self.counts: Counter[str] = Counter()
        self.started = time.monotonic()
        self.started_wall = time.time()
        # JavaScript rendering (only when some mapping asks for it)
        self.render_enabled = needs_browser(mappings)
        self.render_target: dict[str, str] = {}  # page key -> key of the URL being rendered
        self.render_waiting: dict[str, list[str]] = {}  # rendered URL's key -> page keys
        self.render_done: OrderedDict[str, None] = OrderedDict()  # renders tried (this run)
        self.render_queue: list[scrapy.Request] = []
        self.render_counts: Counter[str] = Counter()
        self.stats_written = False
        self.feed_done = False  # every record of the shard was fed to the frontier
        self.idle_retries: Counter[str] = Counter()  # page key -> requests re-sent at idle
        self.final_stats: dict[str, Any] = {}
        # learning and evaluating mappings: every page a record reaches is kept (collect.py)
        self.collector = PageCollector.for_params(params)

    @classmethod
    def from_crawler(cls, crawler, *args: Any, **kwargs: Any) -> EnrichSpider:
        spider = super().from_crawler(crawler, *args, **kwargs)
        # what the other components ask of the spider, they find in the crawl's context
        context = CrawlContext.of(crawler)
        context.pages = spider.pages
        context.unwanted = spider.unwanted
        context.claims = spider.claims
        crawler.signals.connect(spider._closed, signal=signals.spider_closed)
        crawler.signals.connect(spider._idle, signal=signals.spider_idle)
        return spider

    # -- persistent state ------------------------------------------------------------------------

    async def _open_state(self) -> None:
        uri = self.params.mongo_uri
        wants = self.config.shared_limiter or self.config.store_pages or self.recrawl_ttl > 0
        if not uri or not wants:
            return
        # unique per process: limiter tokens of two runs of one partition never collide
        worker = f"{self.params.partition}@{socket.gethostname()}:{os.getpid()}"
        state = CrawlState(uri, self.params.mongo_db, worker=worker)
        state.spill_dir = spill_dir(self.params.out_dir, self.params.mongo_db)
        try:
            await state.open()
            await asyncio.wait_for(state.db.command("ping"), 15)
        except Exception as exc:
            logger.warning("results database unreachable (%s): crawling without shared state", exc)
            await state.close()
            return
        self.state = state
        context = CrawlContext.of(self.crawler)
        context.state = state
        # pages an earlier crawl fetched while the database was away: stored first, not refetched
        replayed = await state.replay_spilled_pages()
        if replayed:
            logger.info("%d page(s) kept on disk by an earlier crawl stored", replayed)
        if self.config.shared_limiter:
            limiter = HostLimiter(state, max_wait=max(self.config.max_delay * 10, 600.0))
            scheduler = PoliteScheduler.of(self.crawler)
            if scheduler is not None:
                limiter.has_work = scheduler.has_work
            context.limiter = limiter

    # -- feeding records -------------------------------------------------------------------------

    def records(self) -> Iterator[dict[str, Any]]:
        return read_seed_shard(Path(self.params.seed_path))

    def _chunks(self) -> Iterator[list[dict[str, Any]]]:
        chunk: list[dict[str, Any]] = []
        for record in self.records():
            chunk.append(record)
            if len(chunk) >= FEED_CHUNK:
                yield chunk
                chunk = []
        if chunk:
            yield chunk

    async def start(self):
        await self._open_state()
        self._progress_task = asyncio.ensure_future(self._progress_loop())
        for chunk in self._chunks():
            fresh: dict[str, set[str]] = {}
            # a collecting crawl wants the pages whatever the results collection holds
            if self.state is not None and self.goal_directed and self.collector is None:
                fresh = await self.state.fresh_fields(
                    self.params.dataset,
                    {r["_id"]: list(r["_missing"]) for r in chunk if r["_missing"]},
                    self.recrawl_ttl,
                )
            # the chunk's records start together: one look-up of the crawled-URL store for all
            # their seed pages instead of one per record
            started: list[str] = []
            orders: list[FetchOrder] = []
            for record in chunk:
                # bounded: Scrapy pulls start() eagerly while the downloader is busy
                if self.frontier.active >= self.params.max_active_records:
                    for request in await self._start_records(started, orders):
                        yield request
                    started, orders = [], []
                    while self.frontier.active >= self.params.max_active_records:
                        self.capacity.clear()
                        await self.capacity.wait()
                if self.feed_done:  # closed meanwhile: the rest has its lines already
                    return
                self.counts["records"] += 1
                known = fresh.get(record["_id"], set())
                if known:
                    self.counts["fields_fresh"] += len(known)
                try:
                    orders.extend(
                        self.frontier.add_record(
                            record["_id"],
                            record["_urls"],
                            record["_missing"],
                            record["_url_errors"],
                            known=known,
                        )
                    )
                except Exception as exc:  # one bad record never stops the feed
                    logger.exception("record %s could not be started", record.get("_id"))
                    self._abandon(record.get("_id"), f"internal error: {exc}"[:300])
                    continue
                started.append(record["_id"])
            for request in await self._start_records(started, orders):
                yield request
        self.feed_done = True

    async def _start_records(self, started: list[str], orders: list[FetchOrder]) -> list[Any]:
        """The requests for the seed pages of records just added to the frontier."""
        try:
            return await self._dispatch(orders)
        except Exception as exc:  # never stops the feed: these records end with the reason
            logger.exception("records %s... could not be started", started[:3])
            for record_id in started:
                self._abandon(record_id, f"internal error: {exc}"[:300])
            return []

    async def _progress_loop(self) -> None:
        progress_file = Path(self.params.out_dir) / "progress.json"
        while True:
            await asyncio.sleep(self.params.progress_interval)
            try:
                snapshot = self.snapshot()
                _write_json_atomic(progress_file, snapshot)
                if self.progress is not None:
                    self.progress(snapshot)
            except Exception:  # progress must never break the crawl
                logger.exception("progress reporting failed")

    # -- the polite scheduler and downloader ask these -------------------------------------------

    def unwanted(self, request: scrapy.Request) -> bool:
        """True when no active record waits for this request's page any more."""
        if request.meta.get(ABANDONED):  # a subresource its render gave up on
            return True
        key = request.meta.get("page_key")
        if key is None or request.meta.get(ROBOTS_FETCH):
            return False
        if request.meta.get(RENDER) and self.render_target.get(key) in self.render_waiting:
            keys = self.render_waiting[self.render_target[key]]
            return not any(self.frontier.is_wanted(k) for k in keys)
        return not self.frontier.is_wanted(key)

    def discard_request(self, request: scrapy.Request) -> bool:
        """The scheduler drops a request whose records are all done, without fetching it."""
        if not self.unwanted(request):
            return False
        for key in self._request_keys(request):
            self.frontier.drop(key)
        self.counts["dropped"] += 1
        return True

    def claims(self, url: str) -> bool:
        """Some mapping handles this URL (such URLs pass the huge-sites deny list)."""
        return bool(self._matching(url))

    # -- requests --------------------------------------------------------------------------------

    async def _dispatch(self, orders: Iterable[FetchOrder]) -> list[scrapy.Request]:
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
                    queue.extend(self._process(order.key, page)[0])
                    continue
                failure = self.pages.failure(order.key)
                if failure is not None:
                    self.counts["failures_reused"] += 1
                    self._fail(order.key, failure)
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
                requests.append(self._request(order, doc))
        if self.render_queue:
            requests.extend(self.render_queue)
            self.render_queue = []
        return requests

    def _request(self, order: FetchOrder, doc: dict[str, Any] | None) -> scrapy.Request:
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
        if self.render_enabled:
            js, waits = self._js_before_fetch(order.key)
            if js:  # the URL is a js mapping's: render it directly (the document fetched once)
                meta[RENDER] = "js"
                meta[WAIT_FOR] = waits
                self._render_wait(order.key, order.key)
        return scrapy.Request(
            order.fetch_url,  # as found: the key's sorted query is for recognising pages only
            callback=self.parse,
            errback=self.on_error,
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
            self._fail(order.key, reason, "remembered from an earlier run")
            self.pages.put_failure(order.key, reason)
            return []
        page = self._stored_page(doc)
        if page is None:
            return None
        self.counts["pages_reused" if this_run else "pages_from_store"] += 1
        orders = self._process(order.key, page)[0]
        self._cache(order.key, page, stored=page.stored_body is not None)
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
                if self._matching(url + (f"#{waiter.fragment}" if waiter.fragment else "")):
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

    async def parse(self, response: Response, **kwargs: Any):
        key = response.meta["page_key"]
        render_mode = response.meta.get(RENDER)
        # a render answers every page key that waited for it (redirects to the same URL)
        keys = self._render_finished(key) if render_mode else [key]
        if response.status == 304 and response.meta.get("conditional"):
            for request in await self._not_modified(key, response):
                yield request
            return
        if not render_mode or response.meta.get(FETCHED):  # a render from the static body
            self.counts["pages"] += 1  # fetched nothing new
            self.counts["bytes"] += len(response.body)
        ctype = response.headers.get(b"Content-Type", b"").decode("latin-1")
        if not _is_text(ctype):
            for k in keys:
                self._fail(k, "not_text", ctype[:100])
                self._remember_failure(k, "not_text", response.url)
            return
        page = Page(response.url, response.body, content_type=ctype or None, status=response.status)
        page.fetched_at = dt.datetime.now(dt.timezone.utc).isoformat()
        page.content_hash = hashlib.sha1(response.body).hexdigest()
        page.rendered = RENDERED_FLAG in response.flags
        page.render_tried = bool(render_mode)
        if page.rendered:
            self.render_counts["rendered"] += 1
            self.render_counts[f"rendered_{render_mode}"] += 1
        final_key = page_key(response.url)
        if final_key not in keys:  # redirected: records waiting for the target get it now
            keys.append(final_key)
        orders: list[FetchOrder] = []
        useful = False
        for k in keys:
            more, also_useful = self._process(k, page)
            orders.extend(more)
            useful = useful or also_useful
        stored = False
        if key not in self.render_target:  # not waiting for its rendered version
            stored = self._persist(key, page, response, useful)
        for k in keys:
            self._cache(k, page, stored=stored and k == key)
        for request in await self._dispatch(orders):
            yield request

    async def _not_modified(self, key: str, response: Response) -> list[scrapy.Request]:
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
            return [self._request(order, None)]
        orders = self._process(key, page)[0]
        doc["fetched_at"] = now
        if self.state is not None:
            self.state.page_put(doc)
        self._cache(key, page, stored=doc.get("body") is not None and self.state is not None)
        return await self._dispatch(orders)

    def _persist(self, key: str, page: Page, response: Response, useful: bool) -> bool:
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

    def _remember_failure(self, key: str, reason: str, url: str) -> None:
        self.pages.put_failure(key, reason)
        if self.state is not None and self.config.store_pages and reason in PERMANENT_FAILURES:
            self.state.page_put(
                {"_id": key, "url": url, "reason": reason, "fetched_at": time.time(), "body": None}
            )
            self.state.mark_origin(origin_of(key))

    def on_error(self, failure):
        request = failure.request
        if request.meta.get(RENDER):
            return self._render_failed(failure)
        key = request.meta.get("page_key", request.url)
        reason = reason_for_exception(failure.value, request)
        if reason == "goal_reached":
            self.frontier.drop(key)
            self.counts["dropped"] += 1
            return
        self._fail(key, reason, str(failure.value)[:300])
        self._remember_failure(key, reason, request.url)

    def _abandon(self, record_id: Any, detail: str) -> None:
        state = self.frontier.records.get(record_id)
        if state is None:
            return
        url = state.seeds[0] if state.seeds else ""
        state.errors.append({"url": url, "reason": "error", "detail": detail})
        state.done = True
        self.frontier.completed += 1
        del self.frontier.records[record_id]
        self._record_done(state)

    def _fail(self, key: str, reason: str, detail: str = "") -> None:
        self.errors_by_kind[reason] += 1
        for waiter in self.frontier.take(key):
            self.frontier.record_error(waiter, reason, detail)
            self.frontier.release(waiter)

    # -- extraction ------------------------------------------------------------------------------

    def _matching(self, url: str) -> list[Mapping]:
        mappings = self.match_cache.get(url)
        if mappings is None:
            mappings = self.mappings.matching(url)
            self.match_cache[url] = mappings
            if len(self.match_cache) > 20000:
                self.match_cache.popitem(last=False)
        return mappings

    def _extraction(self, page: Page, mapping: Mapping, waiter: Waiter) -> _Extraction:
        """What `mapping` gave so far on `page` for this waiter's (fragment, record): shared by
        every record the page serves alike (same fragment and id, when the mapping reads them)."""
        key = "\x00".join(
            (
                page.url,
                page.content_hash or "",
                mapping.name,
                waiter.fragment if mapping.uses_fragment else "",
                waiter.record if mapping.uses_id else "",
            )
        )
        entry = self.extraction_cache.get(key)
        if entry is None:
            entry = self.extraction_cache[key] = _Extraction()
            if len(self.extraction_cache) > 1024:  # a page's waiters come together
                self.extraction_cache.popitem(last=False)
        return entry

    def _extract(
        self, page: Page, mapping: Mapping, waiter: Waiter, fields: Iterable[str]
    ) -> dict[str, Any]:
        """The values of `fields` (those the mapping has) on the page: each field's processors
        run once per page and waiter key, and only for fields some record asks for."""
        entry = self._extraction(page, mapping, waiter)
        todo = [name for name in fields if name not in entry.tried and name in mapping.field_set]
        if todo:
            entry.values.update(self._run_mapping(page, mapping, waiter, todo, links=False).fields)
            entry.tried.update(todo)
        return {name: entry.values[name] for name in fields if name in entry.values}

    def _links(self, page: Page, mapping: Mapping, waiter: Waiter) -> list[str]:
        """The mapping's url_parsers on the page, run when a record follows them (not for a
        record done with this page, nor at the depth limit)."""
        entry = self._extraction(page, mapping, waiter)
        if entry.links is None:
            entry.links = self._run_mapping(page, mapping, waiter, (), links=True).links
        return entry.links

    def _run_mapping(
        self, page: Page, mapping: Mapping, waiter: Waiter, fields: Iterable[str], *, links: bool
    ) -> MappingResult:
        result = run_mapping(
            mapping,
            page,
            fragment=waiter.fragment,
            record_id=waiter.record,
            field_types=self.field_types,
            only_fields=fields,
            with_links=links,
        )
        if result.errors:
            self.counts["extraction_errors"] += len(result.errors)
        return result

    def _generic_links(self, page: Page) -> list[str]:
        if page.known_useless:
            return []
        tree = page.tree
        if tree is None or not hasattr(tree, "xpath"):
            return []
        links = []
        seen = set()
        for href in tree.xpath("//a/@href"):
            url, _ = resolve_link(page.base_url, str(href))
            if url is None or url in seen:
                continue
            seen.add(url)
            # generic links are nobody's seed: refused ones are skipped silently
            if self.policy.check(url) is None:
                links.append(url)
        return links

    def _process(self, key: str, page: Page) -> tuple[list[FetchOrder], bool]:
        """Extract the page for every record waiting on it; (pages to fetch next, fed a mapping).
        A page that must be rendered first is left to its waiters' render (nothing to fetch)."""
        if self.render_enabled and self._should_render(key, page):
            return [], False
        orders: list[FetchOrder] = []
        useful = False
        for waiter in self.frontier.take(key):
            try:
                waiter_orders, waiter_useful = self._process_waiter(page, waiter)
            except Exception as exc:  # one bad page never stops the crawl or the record
                logger.exception("processing %s for record %s failed", page.url, waiter.record)
                self.errors_by_kind["error"] += 1
                self.frontier.record_error(waiter, "error", f"internal error: {exc}"[:300])
                self.frontier.release(waiter)
                continue
            orders.extend(waiter_orders)
            useful = useful or waiter_useful
        return orders, useful

    def _process_waiter(self, page: Page, waiter: Waiter) -> tuple[list[FetchOrder], bool]:
        orders: list[FetchOrder] = []
        useful = False
        state = self.frontier.records.get(waiter.record)
        if state is None:  # finished while this page was on its way
            return orders, useful
        url = page.url + (f"#{waiter.fragment}" if waiter.fragment else "")
        if self.collector is not None:
            self.collector.keep(waiter.record, page, fragment=waiter.fragment, depth=waiter.depth)
        mappings = [] if page.known_useless else self._matching(url)
        if mappings:
            useful = True
        if not mappings and waiter.depth == 0:
            state.errors.append({"url": waiter.url, "reason": "no_mapping"})
        needed_now = set(state.needed) if self.goal_directed else set(state.wanted)
        found: set[str] = set()
        on_page: set[str] = set()
        for mapping in mappings:
            # the record's wanted fields only: the others would be dropped here anyway
            for name, value in self._extract(page, mapping, waiter, state.wanted).items():
                if name not in needed_now:
                    on_page.add(name)
                    continue
                found.add(name)
                self.counts["candidates"] += 1
                self.out.write_candidate(
                    {
                        "record": waiter.record,
                        "field": name,
                        "value": value,
                        "url": url,
                        "mapping": mapping.name,
                        "priority": mapping.priority,
                        "depth": waiter.depth,
                        "fetched_at": page.fetched_at,
                        "http_status": page.status,
                        "content_hash": page.content_hash,
                        "rendered": page.rendered,
                    }
                )
        self.frontier.record_found(waiter, found, on_page)
        follow = bool(state.needed) or not self.goal_directed
        if follow and waiter.depth < self.config.depth:

            def want(links, priority: int) -> None:
                for link in links:
                    orders.extend(
                        self.frontier.want(
                            waiter.record,
                            link,
                            depth=waiter.depth + 1,
                            seed=waiter.seed,
                            priority=priority,
                        )
                    )

            want(
                [link for m in mappings for link in self._links(page, m, waiter)],
                PRIORITY_PARSER_LINK,
            )
            if self.collector is not None:
                want(
                    self.collector.links(page, lambda u: self.policy.check(u) is None),
                    PRIORITY_GENERIC_LINK,
                )
            if self.config.follow_all_links or not self.goal_directed:
                want(self._generic_links(page), PRIORITY_GENERIC_LINK)
        self.frontier.release(waiter)
        return orders, useful

    # -- JavaScript rendering --------------------------------------------------------------------

    def _cache(self, key: str, page: Page, *, stored: bool = False) -> None:
        """This run's copy of the page, unless its records wait for the rendered version;
        `stored`: the crawled-URL store keeps its body (under `key`)."""
        if key not in self.render_target:
            self.pages.put(key, page, stored=stored)

    def _render_wait(self, key: str, target: str) -> None:
        """The records of page `key` wait for the render of URL `target` (a page key)."""
        self.render_target[key] = target
        keys = self.render_waiting.setdefault(target, [])
        if key not in keys:
            keys.append(key)

    def _render_finished(self, key: str) -> list[str]:
        """The render requested for `key` is over: every page key that waited for it."""
        target = self.render_target.pop(key, None)
        if target is None:
            return [key]
        keys = self.render_waiting.pop(target, [])
        for other in keys:
            self.render_target.pop(other, None)
        self.render_done[target] = None
        if len(self.render_done) > 20000:
            self.render_done.popitem(last=False)
        return [key, *(k for k in keys if k != key)]

    def _request_keys(self, request: scrapy.Request) -> list[str]:
        key = request.meta["page_key"]
        return self._render_finished(key) if request.meta.get(RENDER) else [key]

    def _render_mappings(self, key: str, url: str) -> Iterator[tuple[Mapping, Waiter]]:
        """(mapping, waiter) for the js/auto mappings matching `url` for the live waiters."""
        for waiter in self.frontier.live_waiters(key):
            for mapping in self._matching(url + (f"#{waiter.fragment}" if waiter.fragment else "")):
                if mapping.render != "static":
                    yield mapping, waiter

    def _js_before_fetch(self, key: str) -> tuple[bool, list[str]]:
        """Does a `js` mapping claim this URL (patterns are known before fetching)?"""
        js, waits = False, []
        for mapping, _ in self._render_mappings(key, key):
            if mapping.render == "js":
                js = True
                if mapping.wait_for and mapping.wait_for not in waits:
                    waits.append(mapping.wait_for)
        return js, waits

    def _should_render(self, key: str, page: Page) -> bool:
        """Ask for a render of `page` (its records then wait for it) when a `js` mapping matches
        it, or an `auto` mapping finds none of its fields and the page looks script-built."""
        if page.rendered or page.render_tried or page.known_useless:
            return False
        target = page_key(page.url)
        if target in self.render_waiting:  # already on its way (a redirect to the same URL)
            self._render_wait(key, target)
            return True
        if target in self.render_done or page.status != 200 or page.kind != "html":
            return False
        mode, waits = self._render_verdict(key, page)
        if mode is None:
            return False
        task = self.frontier.tasks.get(key)
        depth = min((w.depth for w in task.waiters), default=0) if task else 0
        self._render_wait(key, target)
        self.render_queue.append(
            scrapy.Request(
                page.url,
                callback=self.parse,
                errback=self.on_error,
                priority=task.priority if task else 0,
                dont_filter=True,
                meta={
                    "page_key": key,
                    "enrich_depth": depth,
                    RENDER: mode,
                    DOCUMENT: Document.of_page(page),
                    WAIT_FOR: waits,
                },
            )
        )
        return True

    def _render_verdict(self, key: str, page: Page) -> tuple[str | None, list[str]]:
        js, auto_empty, auto_found = False, False, False
        waits: list[str] = []
        for mapping, waiter in self._render_mappings(key, page.url):
            if mapping.wait_for and mapping.wait_for not in waits:
                waits.append(mapping.wait_for)
            if mapping.render == "js":
                js = True
            elif self._extract(page, mapping, waiter, mapping.field_names):
                auto_found = True
            else:
                auto_empty = True
        if js:
            return "js", waits
        if not auto_empty:
            if auto_found:
                self.render_counts["skipped/fields_found"] += 1
            return None, []
        verdict = looks_script_built(page)
        if not verdict:
            self.render_counts["skipped/not_script_built"] += 1
            return None, []
        for signal in verdict.signals:
            self.render_counts[f"signals/{signal}"] += 1
        return "auto", waits

    def _render_failed(self, failure):
        """A render request failed: records fall back on the static page when there is one (the
        render's reason on them), else fail with the reason as a static fetch would."""
        request = failure.request
        keys = self._request_keys(request)
        reason = reason_for_exception(failure.value, request)
        if reason == "goal_reached":
            for key in keys:
                self.frontier.drop(key)
            self.counts["dropped"] += 1
            return None
        detail = str(getattr(failure.value, "detail", "") or failure.value)[:300]
        document: Document | None = request.meta.get(DOCUMENT)
        if reason in RENDER_REASONS:
            self.render_counts[f"failed/{reason}"] += 1
        if document is None:  # nothing fetched: as a static fetch that failed
            for key in keys:
                self._fail(key, reason, detail)
                self._remember_failure(key, reason, request.url)
            return None
        self.errors_by_kind[reason] += 1
        for key in keys:
            for waiter in self.frontier.waiters(key):
                self.frontier.record_error(waiter, reason, detail)
        self.render_counts["fallbacks"] += 1
        page = Page(
            document.url, document.body, content_type=document.content_type, status=document.status
        )
        page.fetched_at = document.fetched_at or dt.datetime.now(dt.timezone.utc).isoformat()
        page.content_hash = document.content_hash or hashlib.sha1(document.body).hexdigest()
        page.rendered = False
        page.render_tried = True
        if request.meta.get(FETCHED):
            self.counts["pages"] += 1
            self.counts["bytes"] += len(document.body)
        return self._serve_fallback(keys, page)

    async def _serve_fallback(self, keys: list[str], page: Page):
        orders: list[FetchOrder] = []
        for key in keys:
            orders.extend(self._process(key, page)[0])
            self._cache(key, page)
        for request in await self._dispatch(orders):
            yield request

    def render_snapshot(self) -> dict[str, Any]:
        counts = self.render_counts
        out: dict[str, Any] = {
            "enabled": self.render_enabled,
            "rendered_js": counts["rendered_js"],
            "rendered_auto": counts["rendered_auto"],
            "skipped": {
                "fields_found": counts["skipped/fields_found"],
                "not_script_built": counts["skipped/not_script_built"],
            },
            "signals": {k.split("/", 1)[1]: v for k, v in counts.items() if "signals/" in k},
            "failed": {k.split("/", 1)[1]: v for k, v in counts.items() if "failed/" in k},
            "fallbacks": counts["fallbacks"],
            "pending": len(self.render_target),
        }
        handler = getattr(getattr(self, "crawler", None), "enrich_render", None)
        if handler is not None:
            out["browser"] = handler.snapshot()
        return out

    # -- outcomes --------------------------------------------------------------------------------

    def _record_done(self, state: RecordState) -> None:
        errors = list(state.errors)
        failed_urls = {e["url"] for e in errors}
        if state.needed:
            for seed in state.seeds:
                if not state.seed_yield.get(seed) and seed not in failed_urls:
                    errors.append({"url": seed, "reason": "not_on_page"})
        outcome = crawl_outcome(state.wanted, state.needed, state.fresh)
        self.outcomes[outcome] += 1
        row: RecordOutcomeLine = {
            "record": state.id,
            "outcome": outcome,
            "errors": errors,
            "pages": state.pages,
            "found": sorted(state.found),
            "needed": sorted(state.needed),
            "seconds": round(time.monotonic() - state.started, 3),
        }
        if state.fresh:
            row["fresh"] = sorted(state.fresh)
        self.out.write_record(row)
        self.capacity.set()

    def snapshot(self) -> dict[str, Any]:
        crawler = getattr(self, "crawler", None)
        stats = crawler.stats.get_stats() if crawler else {}
        elapsed = max(time.monotonic() - self.started, 1e-6)
        resolved = self.outcomes["resolved"]
        robots = RobotsMiddleware.of(crawler) if crawler else None
        throttle = Throttle.of(crawler) if crawler else None
        scheduler = PoliteScheduler.of(crawler) if crawler else None
        limiter = CrawlContext.of(crawler).limiter if crawler else None
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
            "records_fed": self.counts["records"],
            "records_done": self.frontier.completed,
            "records_active": self.frontier.active,
            "records_not_started": self.counts["records_not_started"],
            "resent_at_idle": self.counts["resent_at_idle"],
            "outcomes": dict(self.outcomes),
            "pages": self.counts["pages"],
            "pages_reused": self.counts["pages_reused"],
            "pages_from_store": self.counts["pages_from_store"],
            "not_modified": self.counts["not_modified"],
            "conditional_requests": self.counts["conditional_requests"],
            "fields_fresh": self.counts["fields_fresh"],
            "bytes": self.counts["bytes"],
            "candidates": self.counts["candidates"],
            "pages_rendered": self.render_counts["rendered"],
            "render_skipped": self.render_counts["skipped/fields_found"]
            + self.render_counts["skipped/not_script_built"],
            "render": self.render_snapshot(),
            "dropped_requests": self.counts["dropped"],
            "errors_by_kind": dict(self.errors_by_kind),
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
            "state": dict(self.state.stats) if self.state else None,
            "pages_spilled": self.pages.spilled,
            "pages_left_to_store": self.pages.dropped,
            "seconds": round(elapsed, 3),
            "pages_per_second": round(self.counts["pages"] / elapsed, 3),
            "pages_per_resolved_record": round(self.counts["pages"] / resolved, 3)
            if resolved
            else None,
            "peak_rss_mb": peak_rss_mb(),
        }

    def _idle(self, spider=None) -> None:
        """Scrapy found nothing scheduled, in flight or being processed. Records still active then
        wait for pages whose request was lost on the way (a spider middleware that drops requests
        silently, such as Scrapy's URL length limit): send each such page once more, and fail it
        if it is lost again, so that no record ends `unfinished` when the crawl finishes."""
        if not self.frontier.records:
            return
        stuck = [
            (key, task)
            for key, task in self.frontier.tasks.items()
            if any(w.record in self.frontier.records for w in task.waiters)
        ]
        again = [(key, task) for key, task in stuck if not self.idle_retries[key]]
        if again:
            logger.warning(
                "crawl idle with %d active records: %d pages they wait for were never answered; "
                "sending them again (first: %s)",
                self.frontier.active,
                len(again),
                again[0][0][:200],
            )
            for key, task in again:
                self.idle_retries[key] += 1
                self.counts["resent_at_idle"] += 1
                depth = min((w.depth for w in task.waiters), default=0)
                order = FetchOrder(key, task.priority - depth, depth, task.url)
                self.crawler.engine.crawl(self._request(order, None))
            raise DontCloseSpider
        for key, _task in stuck:
            self.counts["lost_at_idle"] += 1
            self._fail(key, "error", "request lost twice: never answered (dropped on the way)")
        if self.frontier.records:
            logger.warning(
                "crawl idle with %d active records that wait for no page (first: %s)",
                self.frontier.active,
                next(iter(self.frontier.records)),
            )

    def _finish_unfed(self, reason: str) -> None:
        """A line in records.jsonl for every record the crawl stopped before feeding (time budget,
        termination): nothing is lost, the merge and the checks count them."""
        if self.feed_done:
            return
        why = reason if reason != "finished" else "unfinished"
        fed = self.counts["records"]
        for index, record in enumerate(self.records()):
            if index < fed:
                continue
            missing = sorted(record.get("_missing") or ())
            urls = record.get("_urls") or []
            errors = [dict(e) for e in record.get("_url_errors") or ()]
            if missing:
                errors.append(
                    {
                        "url": urls[0] if urls else "",
                        "reason": why,
                        "detail": f"not started: the crawl stopped ({reason}) before this record",
                    }
                )
            outcome = "not_started" if missing else "nothing_to_do"
            self.outcomes[outcome] += 1
            self.counts["records_not_started"] += 1
            self.out.write_record(
                {
                    "record": record["_id"],
                    "outcome": outcome,
                    "errors": errors,
                    "pages": 0,
                    "found": [],
                    "needed": missing,
                    "seconds": 0.0,
                }
            )
        self.feed_done = True

    async def _closed(self, spider, reason: str) -> None:
        task = getattr(self, "_progress_task", None)
        if task is not None:
            task.cancel()
        # records still active (time budget, termination): finish them with the reason
        for state in list(self.frontier.records.values()):
            state.errors.append(
                {
                    "url": state.seeds[0] if state.seeds else "",
                    "reason": reason if reason not in ("finished",) else "unfinished",
                }
            )
            state.done = True
            self.frontier.completed += 1
            self._record_done(state)
        self.frontier.records.clear()
        try:
            self._finish_unfed(reason)
        except Exception:  # the statistics must still be written
            logger.exception("records never fed to the crawl could not be written")
        limiter = CrawlContext.of(self.crawler).limiter  # hand back the hosts still held
        if limiter is not None:
            await limiter.close()
        snapshot = self.snapshot()
        snapshot["finish_reason"] = reason
        if self.collector is not None:
            snapshot["collected"] = self.collector.close()
        self.out.close()
        self.pages.close()
        if self.state is not None:
            await self.state.close()
            snapshot["state"] = dict(self.state.stats)
        _write_json_atomic(Path(self.params.out_dir) / CRAWL_STATS_FILE, snapshot)
        self.final_stats = snapshot
        self.stats_written = True
