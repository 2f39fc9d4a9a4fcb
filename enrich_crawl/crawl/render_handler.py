"""The browser: scrapy-playwright's download handler with Debian's Chromium, kept on a short leash.

Installed for http/https only when some mapping renders (enrich_crawl.crawl.render.needs_browser);
requests without the `enrich_render` meta key are plain HTTP/1.1 downloads, exactly as without it,
and the Playwright driver and Chromium start at the first page actually rendered, not before.

A render request is an ordinary Scrapy request: it leaves the PoliteScheduler when its host is
ready, passes the URL policy and robots.txt, and the PoliteDownloader holds the host (its slot and
the shared limiter) from before the render to its end; the host's delay counts from the end of the
render. What the browser asks for while it renders goes through `SubresourceGate`, a route handler
on every page; the browser itself never reaches the network:

- the document: answered from the static fetch (`auto`, or the answer this handler fetched for a
  `js` request through the crawler's HTTP stack), never fetched twice;
- images, fonts, media, stylesheets (and beacons, manifests, text tracks, event streams, iframes,
  web sockets): aborted;
- scripts and fetch/XHR on the page's host: fetched by the crawler's HTTP stack (its identity,
  proxy, internal-address refusal, size limit), one at a time, if robots.txt allows them, within
  the visit that holds the host; on other hosts of the same site: through the whole polite path
  (robots.txt first, the host's own delay and the shared limiter), as any request; on other sites:
  aborted unless `render.third_party`;
- at most `max_subresources` per page; scripts are cached for the run (a site's bundle is fetched
  once, not once per page).

Hygiene: bounded pages (`concurrency`) and contexts (`max_contexts`); a context is retired after
`recycle_after` pages and closed when its last page is done; every page is closed by this handler,
on success, failure and timeout (callbacks and errbacks never hold one); a whole-render timeout,
counted from the page's navigation (the wait for a context and a page is bounded apart);
a renderer crash or a lost browser is retried once, in a fresh context (a new browser when it died),
then reported as `render_crash`; V8's heap is capped so a runaway page crashes its renderer instead
of eating the machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import Counter, OrderedDict
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from playwright.async_api import Error as PlaywrightError
from playwright.async_api import TimeoutError as PlaywrightTimeoutError
from scrapy import Request
from scrapy.core.downloader.handlers.http11 import HTTP11DownloadHandler
from scrapy.downloadermiddlewares.httpcompression import HttpCompressionMiddleware
from scrapy.downloadermiddlewares.httpproxy import HttpProxyMiddleware
from scrapy.exceptions import IgnoreRequest, NotConfigured
from scrapy.http import Headers, HtmlResponse
from scrapy.http.request import NO_CALLBACK
from scrapy_playwright.handler import ScrapyPlaywrightDownloadHandler
from scrapy_playwright.page import PageMethod

from enrich_crawl.crawl.context import CrawlContext, crawl_config
from enrich_crawl.crawl.errors import Refused, reason_for_exception
from enrich_crawl.crawl.middlewares.politeness import RobotsMiddleware
from enrich_crawl.crawl.policy import UrlPolicy
from enrich_crawl.crawl.render import (
    ABANDONED,
    DOCUMENT,
    FETCHED,
    RENDER,
    RENDERED_FLAG,
    SUBRESOURCE,
    WAIT_FOR,
    Document,
    RenderConfig,
)
from enrich_crawl.crawl.robots import origin_of
from enrich_crawl.dataset.shard import registrable_domain
from enrich_crawl.extract.page import Page

if TYPE_CHECKING:
    from playwright.async_api import Page as BrowserPage
    from playwright.async_api import Request as BrowserRequest
    from playwright.async_api import Route
    from scrapy.crawler import Crawler
    from scrapy.http import Response

logger = logging.getLogger(__name__)

GATE = "enrich_render_gate"  # request meta: the SubresourceGate of this render
# resource types never fetched for a render: they cannot change the DOM's text
BLOCKED_TYPES = frozenset(
    {"image", "font", "media", "stylesheet", "manifest", "texttrack", "eventsource", "ping"}
)
# response headers not passed on to the browser (the body is decoded, cookies are off)
_DROPPED_HEADERS = frozenset(
    {"content-encoding", "content-length", "transfer-encoding", "connection", "set-cookie"}
)
_ACCEPT = {
    "script": "*/*",
    "fetch": "application/json,text/plain,*/*;q=0.8",
    "xhr": "application/json,text/plain,*/*;q=0.8",
}
_SCROLL = "() => window.scrollTo(0, document.documentElement.scrollHeight)"


class RenderFailed(IgnoreRequest):
    """A page could not be rendered; `reason` is render_crash, render_timeout or render_error."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class _Crash(Exception):
    """The renderer crashed or the browser went away (retried once)."""


def abort_everything(request: Any) -> bool:
    """PLAYWRIGHT_ABORT_REQUEST: scrapy-playwright's own route handler only sees a request when
    ours did not take it, which must not happen; fail closed."""
    return True


async def install_gate(page: BrowserPage, request: Request) -> None:
    """playwright_page_init_callback: our route handler, registered after scrapy-playwright's so
    that it answers every request of the page (Playwright runs the last registered route first)."""
    await request.meta[GATE].install(page)


def _is_crash(exc: BaseException) -> bool:
    text = str(exc).lower()
    return type(exc).__name__ == "TargetClosedError" or any(
        mark in text
        for mark in (
            "crash",
            "has been closed",
            "browser closed",
            "connection closed",
            "disconnect",
        )
    )


# -- memory of the process tree ------------------------------------------------------------------


def _children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", encoding="ascii", errors="replace") as handle:
                stat = handle.read()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 2:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    return children


def process_tree(pid: int) -> list[int]:
    """`pid` and all its descendants (Linux /proc)."""
    children = _children()
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo.extend(children.get(current, ()))
    return tree


def tree_memory(pid: int | None = None) -> dict[str, float]:
    """RSS summed over the process tree of `pid` (this process by default: the crawl, the
    Playwright driver and every Chromium process), and PSS (shared pages counted once), in total
    and by part: `crawl` (the root process), `driver` (Playwright's node), `browser` (Chromium)."""
    root = pid or os.getpid()
    rss = 0
    pss = {"crawl": 0, "driver": 0, "browser": 0}
    pids = process_tree(root)
    page_size = os.sysconf("SC_PAGE_SIZE")
    for proc in pids:
        try:
            with open(f"/proc/{proc}/statm", encoding="ascii") as handle:
                rss += int(handle.read().split()[1]) * page_size
            with open(f"/proc/{proc}/comm", encoding="ascii", errors="replace") as handle:
                comm = handle.read().strip()
            part = "crawl" if proc == root else "driver" if comm.startswith("node") else "browser"
            with open(f"/proc/{proc}/smaps_rollup", encoding="ascii") as handle:
                for line in handle:
                    if line.startswith("Pss:"):
                        pss[part] += int(line.split()[1]) * 1024
                        break
        except (OSError, ValueError, IndexError):
            continue
    mb = 1024 * 1024
    out = {
        "rss_mb": round(rss / mb, 1),
        "pss_mb": round(sum(pss.values()) / mb, 1),
        "processes": len(pids),
    }
    out.update({f"{part}_pss_mb": round(value / mb, 1) for part, value in pss.items()})
    return out


# -- the scripts of a run ---------------------------------------------------------------------


class ScriptCache:
    """Scripts by URL, least recently used dropped beyond `max_bytes`."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.bytes = 0
        self.entries: OrderedDict[str, tuple[int, dict[str, str], bytes]] = OrderedDict()

    def get(self, url: str) -> tuple[int, dict[str, str], bytes] | None:
        entry = self.entries.get(url)
        if entry is not None:
            self.entries.move_to_end(url)
        return entry

    def put(self, url: str, status: int, headers: dict[str, str], body: bytes) -> None:
        if status != 200 or len(body) > self.max_bytes // 4 or url in self.entries:
            return
        self.entries[url] = (status, headers, body)
        self.bytes += len(body)
        while self.bytes > self.max_bytes and self.entries:
            _, (_, _, old) = self.entries.popitem(last=False)
            self.bytes -= len(old)


# -- what the browser may fetch ------------------------------------------------------------------


def _host(url: str) -> str:
    try:
        return (urlsplit(url).hostname or "").lower()
    except ValueError:
        return ""


def _browser_headers(headers: Headers) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, values in headers.items():
        key = name.decode("latin-1")
        if key.lower() in _DROPPED_HEADERS or not values:
            continue
        out[key] = ", ".join(v.decode("latin-1") for v in values)
    return out


class SubresourceGate:
    """The route handler of one rendered page (see the module docstring for the rules)."""

    def __init__(self, handler: RenderDownloadHandler, request: Request, document: Document):
        self.handler = handler
        self.request = request
        self.document = document
        self.host = _host(document.url)
        self.site = registrable_domain(self.host)
        self.page: BrowserPage | None = None
        self.document_served = False
        self.fetched = 0
        self.latencies: list[float] = []
        self.created = time.monotonic()
        # the render's time counts from its page's navigation (`install`), not from the wait for
        # a browser context and a page before it (a new context can wait for a retiring one to
        # close, behind a page that hangs: a whole render timeout)
        self.navigated: float | None = None
        self.navigation = asyncio.Event()  # set by `install`: the render's own clock starts
        self.deadline = self.created + handler.render_config.timeout
        self.polite: list[Request] = []  # requests sent through the crawler's downloader
        self.closed = False
        self.inflight = 0  # requests of the page being answered (the gate sees all of them)
        self.last_activity = time.monotonic()

    async def install(self, page: BrowserPage) -> None:
        self.page = page
        self.navigated = time.monotonic()
        self.deadline = self.navigated + self.handler.render_config.timeout
        self.navigation.set()
        handler = self.handler
        handler.page_wait_max = max(handler.page_wait_max, self.navigated - self.created)
        await page.route("**", self.handle)
        # web sockets are answered by nobody (a mocked socket that never connects)
        await page.route_web_socket("**", self._no_socket)

    def _no_socket(self, socket: Any) -> None:
        self.handler.count("subresources/aborted/websocket")

    async def handle(self, route: Route, request: BrowserRequest) -> None:
        self.inflight += 1
        self.last_activity = time.monotonic()
        try:
            await self._handle(route, request)
        except Exception as exc:  # the page went away meanwhile, or a fetch failed oddly
            self.handler.count("subresources/failed")
            logger.debug("subresource %s of %s: %s", request.url, self.document.url, exc)
            with contextlib.suppress(Exception):
                await route.abort("failed")
        finally:
            self.inflight -= 1
            self.last_activity = time.monotonic()

    def quiet_for(self) -> float:
        """Seconds since the page's network went quiet (0 while a request is being answered)."""
        return 0.0 if self.inflight else time.monotonic() - self.last_activity

    async def _abort(self, route: Route, what: str, error: str = "blockedbyclient") -> None:
        self.handler.count(f"subresources/{what}")
        await route.abort(error)

    async def _handle(self, route: Route, request: BrowserRequest) -> None:
        main_frame = request.frame.parent_frame is None if request.frame else True
        if request.is_navigation_request():
            if main_frame and not self.document_served:
                self.document_served = True
                await route.fulfill(
                    status=self.document.status,
                    headers={"Content-Type": self.document.content_type},
                    body=self.document.body,
                )
                return
            # iframes, and script redirects of the page: a render is one page
            kind = "navigation" if main_frame else "frame"
            await self._abort(route, f"aborted/{kind}")
            return
        if self.closed:  # the render is over (a crash, a timeout): nothing more for this page
            await self._abort(route, "aborted/late", "aborted")
            return
        rtype = request.resource_type
        if rtype in BLOCKED_TYPES:
            await self._abort(route, f"aborted/{rtype}")
            return
        url = request.url
        if request.method not in ("GET", "HEAD"):
            await self._abort(route, "aborted/method")
            return
        verdict = self.handler.check(url)
        if verdict is not None:
            await self._abort(route, f"refused/{verdict}")
            return
        host = _host(url)
        same_host = host == self.host
        third_party = not same_host and registrable_domain(host) != self.site
        if third_party and not self.handler.render_config.third_party:
            await self._abort(route, "aborted/third_party")
            return
        if rtype == "script":
            cached = self.handler.scripts.get(url)
            if cached is not None:
                self.handler.count("subresources/cached")
                status, headers, body = cached
                await route.fulfill(status=status, headers=headers, body=body)
                return
        if self.fetched >= self.handler.render_config.max_subresources:
            await self._abort(route, "aborted/over_budget")
            return
        left = self.deadline - time.monotonic()
        if left < 0.5:
            await self._abort(route, "aborted/late", "timedout")
            return
        self.fetched += 1
        if same_host:
            response = await self._fetch_same_host(url, rtype, request.method, left)
        else:
            response = await self._fetch_polite(url, rtype, request.method, left)
        if response is None:
            await route.abort("failed")
            return
        headers = _browser_headers(response.headers)
        self.handler.count("subresources/bytes", len(response.body))
        if rtype == "script":
            self.handler.scripts.put(url, response.status, headers, response.body)
        await route.fulfill(status=response.status, headers=headers, body=response.body)

    def _request(self, url: str, rtype: str, method: str, left: float, **meta: Any) -> Request:
        timeout = max(0.5, min(left, self.handler.download_timeout))
        return Request(
            url,
            method=method,
            headers={"Accept": _ACCEPT.get(rtype, "*/*"), "Referer": self.document.url},
            meta={"download_timeout": timeout, "dont_retry": True, **meta},
            callback=NO_CALLBACK,
            dont_filter=True,
        )

    async def _fetch_same_host(
        self, url: str, rtype: str, method: str, left: float
    ) -> Response | None:
        """Within the visit: the PoliteDownloader holds this host for the render, so the request
        goes straight to the HTTP handler (the host's slot is this render's), one at a time."""
        handler = self.handler
        rules = handler.robots.rules.get(origin_of(url)) if handler.robots else None
        if rules is None:  # another scheme or port of the host, never checked: not now
            handler.count("subresources/refused/robots_unknown")
            return None
        if not rules.allowed(url, handler.user_agent):
            handler.count("subresources/refused/robots")
            return None
        request = self._request(url, rtype, method, left)
        request.headers["User-Agent"] = handler.user_agent
        if handler.proxies is not None:
            handler.proxies.process_request(request)
        # one at a time per host, across pages: a crashed page's fetch may still be running when
        # its retry starts
        async with handler.host_lock(self.host):
            if self.closed:
                handler.count("subresources/aborted/late")
                return None
            started = time.monotonic()
            try:
                response = await HTTP11DownloadHandler.download_request(handler, request)
            except Exception as exc:
                handler.count(f"subresources/failed/{reason_for_exception(exc, request)}")
                return None
            self.latencies.append(time.monotonic() - started)
        handler.count("subresources/same_host")
        return response

    async def _fetch_polite(self, url: str, rtype: str, method: str, left: float):
        """Another host: the whole polite path (robots.txt first, its delay, the shared limiter),
        given up (and never sent, if still waiting) when the render's time runs out."""
        handler = self.handler
        request = self._request(url, rtype, method, left, **{SUBRESOURCE: True})
        self.polite.append(request)
        task = asyncio.ensure_future(handler.crawler.engine.download_async(request))
        task.add_done_callback(_consume)
        try:
            response = await asyncio.wait_for(asyncio.shield(task), left)
        except asyncio.TimeoutError:
            request.meta[ABANDONED] = True
            handler.count("subresources/abandoned")
            return None
        except Refused as exc:
            handler.count(f"subresources/refused/{exc.reason}")
            return None
        except Exception as exc:
            handler.count(f"subresources/failed/{reason_for_exception(exc, request)}")
            return None
        handler.count("subresources/other_host")
        return response

    def abandon(self) -> None:
        """The render is over: requests still waiting for their host are not sent."""
        self.closed = True
        for request in self.polite:
            request.meta[ABANDONED] = True


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)

    return {"p50": at(0.5), "p90": at(0.9), "p99": at(0.99), "max": round(ordered[-1], 3)}


def _consume(task: asyncio.Future) -> None:
    if not task.cancelled():
        task.exception()


async def settle(
    page: BrowserPage,
    waits: list[str],
    config: RenderConfig,
    handler: RenderDownloadHandler,
    gate: SubresourceGate,
) -> None:
    """After the load event: wait for the mappings' `wait_for` selectors, scrolling to the bottom
    between tries (lazy and infinite-scroll content loads when it comes into view); without any,
    wait until the page's network has been quiet for `settle_quiet` seconds (the gate answers
    every request, so it knows; Playwright's `networkidle` always costs 500 ms). Neither is an
    error when it does not happen in time: the mappings then read what is there."""
    if not waits:
        deadline = time.monotonic() + config.settle_seconds
        while gate.quiet_for() < config.settle_quiet:
            if time.monotonic() >= deadline:
                handler.count("settle_timeouts")
                return
            await asyncio.sleep(0.05)
        return
    deadline = time.monotonic() + config.wait_for_seconds
    for selector in waits:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                handler.count("wait_for_timeouts")
                return
            try:
                await page.wait_for_selector(
                    selector, state="attached", timeout=min(750.0, left * 1000)
                )
                break
            except PlaywrightTimeoutError:
                await page.evaluate(_SCROLL)
                handler.count("scrolls")
            except PlaywrightError as exc:
                if _is_crash(exc):
                    raise
                handler.count("wait_for_invalid")  # not a selector Chromium understands
                logger.warning("wait_for %r on %s: %s", selector, page.url, exc)
                break


# -- the handler ---------------------------------------------------------------------------------


class RenderDownloadHandler(ScrapyPlaywrightDownloadHandler):
    lazy = False  # scrapy-playwright hooks engine_started; the browser itself starts lazily

    def __init__(self, crawler: Crawler):
        super().__init__(crawler)
        self.crawler = crawler
        settings = crawler.settings
        self.render_config = RenderConfig.from_mapping(settings.getdict("ENRICH_RENDER"))
        # crashes are retried here, once (scrapy-playwright would retry a closed target 3 times)
        self.config.target_closed_max_retries = 0
        self.user_agent = settings.get("ENRICH_RENDER_USER_AGENT") or settings.get("USER_AGENT")
        self.download_timeout = settings.getfloat("DOWNLOAD_TIMEOUT", 30.0)
        self.policy = UrlPolicy(
            crawl_config(crawler),
            allow_private=settings.getbool("ENRICH_ALLOW_PRIVATE"),
        )
        self.deny_patterns = self.policy.deny
        try:
            self.proxies: HttpProxyMiddleware | None = HttpProxyMiddleware.from_crawler(crawler)
        except NotConfigured:
            self.proxies = None
        self.decompress = HttpCompressionMiddleware(crawler=crawler)
        self.scripts = ScriptCache(int(self.render_config.script_cache_mb * 1024 * 1024))
        self.counts: Counter[str] = Counter()
        self.host_locks: dict[str, asyncio.Lock] = {}
        self.slots = asyncio.Semaphore(self.render_config.concurrency)
        self.started = False
        self.start_error: str | None = None
        self.chromium = (settings.getdict("PLAYWRIGHT_LAUNCH_OPTIONS") or {}).get("executable_path")
        self.closed = False
        self.start_lock = asyncio.Lock()
        self.generation = 0
        self.context_started: Counter[str] = Counter()
        self.context_open: Counter[str] = Counter()
        self.memory: list[dict[str, float]] = []
        self.durations: list[float] = []  # seconds per rendered page (the first 10,000)
        self.page_wait_max = 0.0  # the longest wait of a render for its context and page
        self.created = time.monotonic()
        self.peak_memory: dict[str, float] = {}
        self.context_kwargs = {
            "user_agent": self.user_agent,
            "service_workers": "block",
            "accept_downloads": False,
            "viewport": {"width": 1280, "height": 1024},
            "locale": "en-US",
        }
        crawler.enrich_render = self  # type: ignore[attr-defined]
        CrawlContext.of(crawler).browser = self  # the crawl's report asks it for its snapshot

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> RenderDownloadHandler:
        """One handler (one driver, one browser) for http and https."""
        existing = getattr(crawler, "enrich_render", None)
        return existing if isinstance(existing, cls) else cls(crawler)

    async def close(self) -> None:
        if self.closed:  # installed for two schemes: closed twice
            return
        self.closed = True
        await super().close()

    @staticmethod
    def of(crawler: Crawler | None) -> RenderDownloadHandler | None:
        return getattr(crawler, "enrich_render", None) if crawler is not None else None

    @property
    def robots(self) -> RobotsMiddleware | None:
        return RobotsMiddleware.of(self.crawler)

    def host_lock(self, host: str) -> asyncio.Lock:
        lock = self.host_locks.get(host)
        if lock is None:
            if len(self.host_locks) > 1000:  # forget idle hosts
                for name in [h for h, held in self.host_locks.items() if not held.locked()]:
                    del self.host_locks[name]
            lock = self.host_locks[host] = asyncio.Lock()
        return lock

    def count(self, key: str, n: int = 1) -> None:
        self.counts[key] += n

    def check(self, url: str) -> str | None:
        """The URL policy for subresources: http(s), no internal address, no `crawl.deny` match.
        (Extensions and the huge-sites list are about pages worth crawling, not a page's parts.)"""
        verdict = self.policy.check(url, robots_fetch=True)
        if verdict is not None:
            return verdict[0]
        if any(p.search(url) for p in self.deny_patterns):
            return "denied"
        return None

    # -- start and stop --------------------------------------------------------------------------

    async def _launch(self) -> None:
        """engine_started: nothing yet; the driver and Chromium start at the first render."""

    async def _ensure_started(self) -> None:
        async with self.start_lock:
            if self.start_error is not None:  # tried once: every render fails the same way
                raise RenderFailed("render_error", self.start_error)
            if self.started:
                return
            try:
                await super()._launch()
                await self._maybe_launch_browser()
            except Exception as exc:
                # no browser (ENRICH_CHROMIUM wrong, Chromium missing or broken): the pages keep
                # their static version, each record says why
                self.start_error = f"the browser did not start: {str(exc).splitlines()[0][:200]}"
                self.count("failed/browser_start")
                logger.error("%s (ENRICH_CHROMIUM=%s)", self.start_error, self.chromium)
                raise RenderFailed("render_error", self.start_error) from None
            self.started = True
            self.count("driver_started")

    async def _browser_disconnected_callback(self) -> None:
        self.count("browser_disconnected")
        await asyncio.gather(
            *[w.context.close() for w in self.context_wrappers.values()], return_exceptions=True
        )
        self.context_wrappers.clear()
        with contextlib.suppress(AttributeError):
            del self.browser  # the next page launches a new browser

    async def _maybe_launch_browser(self) -> None:
        had = hasattr(self, "browser")
        await super()._maybe_launch_browser()
        if not had:
            self.count("browser_launched")

    # -- downloads -------------------------------------------------------------------------------

    async def download_request(self, request: Request) -> Response:  # type: ignore[override]
        if not request.meta.get(RENDER):
            return await HTTP11DownloadHandler.download_request(self, request)
        document = request.meta.get(DOCUMENT)
        fetched: Response | None = None
        if document is None:
            fetched = self.decompress.process_response(
                request, await HTTP11DownloadHandler.download_request(self, request)
            )
            document = self._document_of(fetched)
            if document is None:  # a redirect, an error, not HTML: the crawl handles it as is
                self.count("not_renderable")
                return fetched
            # the spider falls back on this answer if the render fails
            request.meta[DOCUMENT] = document
            request.meta[FETCHED] = True
        async with self.slots:
            return await self._render(request, document, fetched)

    @staticmethod
    def _document_of(response: Response) -> Document | None:
        if response.status != 200:
            return None
        ctype = (response.headers.get(b"Content-Type") or b"").decode("latin-1")
        page = Page(response.url, response.body, content_type=ctype or None, status=200)
        if page.kind != "html":
            return None
        return Document.of_page(page)

    async def _render(self, request: Request, document: Document, fetched: Response | None):
        await self._ensure_started()
        started = time.monotonic()
        latency = request.meta.get("download_latency")
        for attempt in (1, 2):
            try:
                response, gate = await self._render_once(request, document)
                break
            except _Crash as exc:
                self.count("crashes")
                self.generation += 1  # the retry (and what follows) gets a fresh context
                if attempt == 2:
                    self.count("failed/render_crash")
                    raise RenderFailed("render_crash", str(exc)[:300]) from None
                self.count("retries")
                await self._wait_for_browser(str(exc))
        self.count("pages_rendered")
        if len(self.durations) < 10_000:
            self.durations.append(time.monotonic() - started)
        # AutoThrottle must see the server's latency, not the browser's time
        latencies = [latency] if fetched is not None and latency is not None else []
        latencies += gate.latencies
        if latencies:
            request.meta["download_latency"] = max(latencies)
        else:
            request.meta.pop("download_latency", None)
        self._sample_memory()
        return self._rendered_response(request, response, document, fetched)

    async def _wait_for_browser(self, error: str) -> None:
        """After a crash: a renderer that crashed leaves the browser as it was; when the browser
        itself went away, its disconnection arrives a moment after the page's error: wait for it
        and let the handler forget the browser (the retry then launches a new one)."""
        browser = getattr(self, "browser", None)
        if browser is None or "page crashed" in error.lower():
            return
        deadline = time.monotonic() + 3.0
        while browser.is_connected() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if browser.is_connected():
            return
        while getattr(self, "browser", None) is browser and time.monotonic() < deadline + 2.0:
            await asyncio.sleep(0.05)
        if getattr(self, "browser", None) is browser:
            await self._browser_disconnected_callback()

    async def _render_once(self, request: Request, document: Document):
        config = self.render_config
        name = self._next_context()
        gate = SubresourceGate(self, request, document)
        meta = request.meta
        meta.update(
            {
                "playwright": True,
                "playwright_context": name,
                "playwright_context_kwargs": self.context_kwargs,
                "playwright_page_init_callback": f"{__name__}.install_gate",
                "playwright_page_goto_kwargs": {
                    "wait_until": "load",
                    "timeout": config.timeout * 1000,
                },
                "playwright_page_methods": [
                    PageMethod(settle, list(meta.get(WAIT_FOR) or ()), config, self, gate)
                ],
                GATE: gate,
            }
        )
        try:
            response = await self._in_time(self._download_request(request), gate)
        except asyncio.TimeoutError:
            self.count("failed/render_timeout")
            if gate.navigated is None:
                raise RenderFailed(
                    "render_timeout", f"no browser page free within {self._page_wait:g} s"
                ) from None
            # a page that never gives its content back (a script spinning in the renderer)
            raise RenderFailed("render_timeout", f"no page within {config.timeout:g} s") from None
        except PlaywrightTimeoutError as exc:
            self.count("failed/render_timeout")
            raise RenderFailed("render_timeout", str(exc).splitlines()[0][:300]) from None
        except PlaywrightError as exc:
            if _is_crash(exc):
                raise _Crash(str(exc).splitlines()[0]) from None
            self.count("failed/render_error")
            raise RenderFailed("render_error", str(exc).splitlines()[0][:300]) from None
        finally:
            gate.abandon()
            await self._close_page(gate.page)
            for key in ("playwright_page_methods", GATE, "playwright_page_init_callback"):
                meta.pop(key, None)
            await self._page_done(name)
        return response, gate

    @property
    def _page_wait(self) -> float:
        """How long a render may wait for a browser context and a page: until another render
        ends (its own bound) and its page and context are closed (10 s each)."""
        return self.render_config.timeout + 25.0

    async def _in_time(self, download: Any, gate: SubresourceGate) -> Response:
        """`download` (scrapy-playwright's), cancelled (asyncio.TimeoutError) when the page waited
        longer than `_page_wait` for the browser, or its render took longer than the render timeout
        from its navigation (+5 s for the page's content to come back)."""
        task = asyncio.ensure_future(download)
        try:
            if gate.navigated is None:  # waiting for a page: until it navigates, at most _page_wait
                navigation = asyncio.ensure_future(gate.navigation.wait())
                left = gate.created + self._page_wait - time.monotonic()
                try:
                    await asyncio.wait(
                        {task, navigation},
                        timeout=max(left, 0.0),
                        return_when=asyncio.FIRST_COMPLETED,
                    )
                finally:
                    navigation.cancel()
            if gate.navigated is not None and not task.done():
                left = gate.navigated + self.render_config.timeout + 5.0 - time.monotonic()
                await asyncio.wait({task}, timeout=max(left, 0.0))
            if task.done():
                return task.result()
        except asyncio.CancelledError:  # the crawl is stopping: so is the render
            task.cancel()
            raise
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        raise asyncio.TimeoutError

    async def _close_page(self, page: BrowserPage | None) -> None:
        if page is None or page.is_closed():
            if page is not None:
                self.count("pages_closed")
            return
        try:
            await asyncio.wait_for(page.close(), 10)
            self.count("pages_closed")
        except Exception as exc:  # a wedged renderer: the context goes with it
            logger.warning("closing a page failed (%s): retiring its context", exc)
            self.generation += 1

    def _next_context(self) -> str:
        """The context for the next page: the current one until it has had `recycle_after`
        pages, then a new one (the old one closes when its last page is done)."""
        name = f"render-{self.generation}"
        self.context_started[name] += 1
        self.context_open[name] += 1
        if self.context_started[name] >= self.render_config.recycle_after:
            self.generation += 1
        return name

    async def _page_done(self, name: str) -> None:
        self.context_open[name] -= 1
        if self.context_open[name] > 0 or name == f"render-{self.generation}":
            return
        del self.context_open[name]
        self.context_started.pop(name, None)
        wrapper = self.context_wrappers.get(name)
        if wrapper is None:
            return
        try:
            await asyncio.wait_for(wrapper.context.close(), 10)
        except Exception as exc:
            logger.warning("closing browser context %s: %s", name, exc)
        self.count("contexts_recycled")

    def _rendered_response(
        self, request: Request, response: Response, document: Document, fetched: Response | None
    ) -> HtmlResponse:
        headers = Headers({"Content-Type": "text/html; charset=utf-8"})
        if fetched is not None:  # validators of the document, for the next run's revalidation
            for name in (b"ETag", b"Last-Modified"):
                if fetched.headers.get(name):
                    headers[name] = fetched.headers[name]
        return HtmlResponse(
            url=document.url,
            status=document.status,
            headers=headers,
            body=response.text.encode("utf-8"),
            encoding="utf-8",
            request=request,
            flags=[RENDERED_FLAG],
        )

    # -- statistics ------------------------------------------------------------------------------

    def _sample_memory(self) -> None:
        rendered = self.counts["pages_rendered"]
        every = max(1, self.render_config.memory_sample_every)
        if rendered != 1 and rendered % every:
            return
        sample = {
            "pages": rendered,
            "seconds": round(time.monotonic() - self.created, 3),
            **tree_memory(),
        }
        self.memory.append(sample)
        if len(self.memory) > 400:  # keep the first sample and every other one after it
            self.memory = self.memory[:1] + self.memory[2::2]
        if sample["rss_mb"] > self.peak_memory.get("rss_mb", 0.0):
            self.peak_memory = sample

    def snapshot(self) -> dict[str, Any]:
        counts = dict(self.counts)
        subresources: dict[str, Any] = {}
        failed: dict[str, int] = {}
        for key, value in counts.items():
            if key.startswith("subresources/"):
                subresources[key.split("/", 1)[1]] = value
            elif key.startswith("failed/"):
                failed[key.split("/", 1)[1]] = value
        stats = self.crawler.stats
        return {
            "browser_launched": counts.get("browser_launched", 0),
            "browser_disconnected": counts.get("browser_disconnected", 0),
            "pages_rendered": counts.get("pages_rendered", 0),
            "pages_opened": stats.get_value("playwright/page_count", 0),
            "pages_closed": counts.get("pages_closed", 0),
            "max_concurrent_pages": stats.get_value("playwright/page_count/max_concurrent", 0),
            "contexts_created": stats.get_value("playwright/context_count", 0),
            "contexts_recycled": counts.get("contexts_recycled", 0),
            "crashes": counts.get("crashes", 0),
            "retries": counts.get("retries", 0),
            "failed": failed,
            "not_renderable": counts.get("not_renderable", 0),
            "settle_timeouts": counts.get("settle_timeouts", 0),
            "wait_for_timeouts": counts.get("wait_for_timeouts", 0),
            "scrolls": counts.get("scrolls", 0),
            "subresources": subresources,
            "scripts_cached": len(self.scripts.entries),
            "render_seconds": _percentiles(self.durations),
            "page_wait_max_seconds": round(self.page_wait_max, 3),
            "memory": self.memory,
            "peak_memory": self.peak_memory,
            "config": self.render_config.to_dict(),
        }
