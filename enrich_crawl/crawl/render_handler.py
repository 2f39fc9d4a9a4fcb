"""The browser: scrapy-playwright's download handler with Debian's Chromium, kept on a short leash.

Installed for http/https only when some mapping renders (enrich_crawl.crawl.render.needs_browser);
requests without the `enrich_render` meta key are plain HTTP/1.1 downloads, exactly as without it,
and the Playwright driver and Chromium start at the first page actually rendered, not before.

A render request is an ordinary Scrapy request: it leaves the PoliteScheduler when its host is
ready, passes the URL policy and robots.txt, and the PoliteDownloader holds the host (its slot and
the shared limiter) from before the render to its end; the host's delay counts from the end of the
render. What the browser asks for while it renders goes through `SubresourceGate`
(subresources.py), a route handler on every page; the browser itself never reaches the network:

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
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

from playwright.async_api import Error as PlaywrightError
from playwright.async_api import TimeoutError as PlaywrightTimeoutError
from scrapy import Request
from scrapy.core.downloader.handlers.http11 import HTTP11DownloadHandler
from scrapy.downloadermiddlewares.httpcompression import HttpCompressionMiddleware
from scrapy.downloadermiddlewares.httpproxy import HttpProxyMiddleware
from scrapy.exceptions import IgnoreRequest, NotConfigured
from scrapy.http import Headers, HtmlResponse
from scrapy_playwright.handler import ScrapyPlaywrightDownloadHandler
from scrapy_playwright.page import PageMethod

from enrich_crawl.crawl.context import CrawlContext, crawl_config
from enrich_crawl.crawl.middlewares.politeness import RobotsMiddleware
from enrich_crawl.crawl.policy import UrlPolicy
from enrich_crawl.crawl.process_tree import tree_memory
from enrich_crawl.crawl.render import (
    DOCUMENT,
    FETCHED,
    RENDER,
    RENDERED_FLAG,
    WAIT_FOR,
    Document,
    RenderConfig,
)
from enrich_crawl.crawl.subresources import GATE, ScriptCache, SubresourceGate
from enrich_crawl.extract.page import Page

if TYPE_CHECKING:
    from playwright.async_api import Page as BrowserPage
    from scrapy.crawler import Crawler
    from scrapy.http import Response

logger = logging.getLogger(__name__)

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


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)

    return {"p50": at(0.5), "p90": at(0.9), "p99": at(0.99), "max": round(ordered[-1], 3)}


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
        CrawlContext.of(crawler).browser_snapshot = self.snapshot  # read by the crawl's report

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
