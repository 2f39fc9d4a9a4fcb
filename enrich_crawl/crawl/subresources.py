"""What the browser may fetch while it renders a page: `SubresourceGate`, the route handler of
every rendered page (enrich_crawl.crawl.render_handler's docstring states the rules), and the
run's cache of scripts. The browser itself never reaches the network: the gate answers the
document from the static fetch, aborts what cannot change the DOM's text, and fetches the rest
through the crawler's HTTP stack (same host) or the whole polite path (other hosts)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

from scrapy import Request
from scrapy.core.downloader.handlers.http11 import HTTP11DownloadHandler
from scrapy.http import Headers
from scrapy.http.request import NO_CALLBACK

from enrich_crawl.crawl.errors import Refused, reason_for_exception
from enrich_crawl.crawl.render import ABANDONED, SUBRESOURCE, Document
from enrich_crawl.crawl.robots import origin_of
from enrich_crawl.dataset.shard import registrable_domain

if TYPE_CHECKING:
    from playwright.async_api import Page as BrowserPage
    from playwright.async_api import Request as BrowserRequest
    from playwright.async_api import Route
    from scrapy.crawler import Crawler
    from scrapy.downloadermiddlewares.httpproxy import HttpProxyMiddleware
    from scrapy.http import Response

    from enrich_crawl.crawl.middlewares.politeness import RobotsMiddleware
    from enrich_crawl.crawl.render import RenderConfig

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


class GateOwner(Protocol):
    """What a gate asks of the browser's download handler (render_handler.RenderDownloadHandler,
    an HTTP/1.1 handler too: same-host fetches go through its `download_request`)."""

    crawler: Crawler
    render_config: RenderConfig
    scripts: ScriptCache
    user_agent: str
    proxies: HttpProxyMiddleware | None
    download_timeout: float
    page_wait_max: float  # the longest wait of a render for its context and page

    @property
    def robots(self) -> RobotsMiddleware | None: ...

    def count(self, key: str, n: int = 1) -> None: ...

    def check(self, url: str) -> str | None: ...

    def host_lock(self, host: str) -> asyncio.Lock: ...


class SubresourceGate:
    """The route handler of one rendered page (see the module docstring for the rules)."""

    def __init__(self, handler: GateOwner, request: Request, document: Document):
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


def _consume(task: asyncio.Future) -> None:
    if not task.cancelled():
        task.exception()
