"""The downloader: Scrapy's, plus the fleet-wide per-host limiter right before each send.

Scrapy's downloader keeps one slot per host (one request at a time, the host's delay between sends)
inside one process. `PoliteDownloader` adds what one process cannot know:

- right before a request leaves its slot for the network (in the download handlers, after the
  slot's delay), it takes the host in the shared limiter (`HostLimiter`, MongoDB `_crawl_hosts`),
  waiting while another crawl process has it or answered less than the delay ago; the slot stays
  busy meanwhile, so nothing can slip between the reservation and the send. When the answer is in,
  the host's delay starts (in the slot and in the limiter): the spacing is measured from one
  answer to the next send, which no event-loop lag can shorten. robots.txt fetches go through the
  same path;
- a request whose records are all done by then is not sent (`Refused("goal_reached")`);
- a retry waits out its backoff here when it did not come through the PoliteScheduler (which
  holds back scheduled retries itself): a robots.txt fetch goes through `engine.download_async`,
  whose retries come straight back to the downloader;
- it tells the PoliteScheduler when it is done with a request, whatever the outcome.

It wraps the download handlers as a whole, so any handler (HTTP, or a browser handler added for
JavaScript rendering) is limited the same way.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from scrapy.core.downloader import Downloader
from scrapy.utils.httpobj import urlparse_cached

from enrich_crawl.crawl.context import CrawlContext
from enrich_crawl.crawl.errors import Refused
from enrich_crawl.crawl.host_limiter import HostBusy
from enrich_crawl.crawl.scheduler import NOT_BEFORE, PoliteScheduler

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Response

logger = logging.getLogger(__name__)


def _open_only(put: Any) -> Any:
    """The pool's `_putConnection`, refusing a connection that is being closed. A download stopped
    midway (a binary body at its headers, robots.txt cut at its size limit) closes its connection,
    a page over max_page_bytes aborts it; when the rest of the body had already arrived, Twisted
    still finds the response complete and hands the connection back to the pool, and the next
    request sent on it is lost (then retried: the same request twice at its host, through a
    proxy any host)."""

    def put_open(key: Any, connection: Any) -> None:
        transport = connection.transport
        if (
            transport is None
            or getattr(transport, "disconnecting", False)
            or getattr(transport, "disconnected", False)
            or getattr(transport, "_aborting", False)
        ):
            return
        put(key, connection)

    return put_open


# headers in which proxies say why they did not open a tunnel (the virtual web, Squid)
PROXY_ERROR_HEADERS = (b"x-proxy-error", b"x-squid-error")


def _proxy_error(head: bytes) -> str:
    """The proxy's own word for a failed CONNECT (`dns`, `ERR_DNS_FAIL 0` ...), from the headers
    of its answer; "" when it gives none."""
    for line in bytes(head).split(b"\r\n\r\n", 1)[0].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() in PROXY_ERROR_HEADERS:
            return value.strip().decode("latin-1")
    return ""


def _tunnel_errors_say_why() -> None:
    """Scrapy's TunnelError keeps the status line of a proxy's refusal to CONNECT and drops its
    headers, which say why (an unknown host, a refused connection): without them an https host
    whose name does not resolve failed as `error`, where the same host over http is `dns`. The
    tunnelling endpoint's answer parser is wrapped so that the error it raises names the proxy's
    error header (errors.reason_for_exception reads it)."""
    from scrapy.core.downloader.handlers import http11

    endpoint = http11._TunnelingTCP4ClientEndpoint
    original = endpoint.processProxyResponse
    if getattr(original, "enrich_says_why", False):
        return

    def process_proxy_response(self: Any, data: bytes) -> None:
        head = bytes(self._connectBuffer) + data
        cause = _proxy_error(head) if b"\r\n\r\n" in head else ""
        if cause:
            deferred = self._tunnelReadyDeferred
            errback = deferred.errback

            def errback_saying_why(fail: Any = None) -> None:
                value = getattr(fail, "value", fail)
                if isinstance(value, http11.TunnelError):
                    fail = http11.TunnelError(f"{value} (proxy error: {cause})")
                errback(fail)

            deferred.errback = errback_saying_why
        original(self, data)

    process_proxy_response.enrich_says_why = True  # type: ignore[attr-defined]
    endpoint.processProxyResponse = process_proxy_response


class _LimitedHandlers:
    """The download handlers, with the limiter around every download."""

    def __init__(self, inner: Any, downloader: PoliteDownloader):
        self._inner = inner
        self._downloader = downloader
        self._tuned: set[int] = set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def _tune(self, request: Request) -> None:
        """Twisted's connection pool silently resends a request whose reused connection failed:
        a second request to the host at once, unseen by the delay. Switch that off, keep closing
        connections out of the pool (`_open_only`); through a proxy, keep as many connections to
        it as requests in flight."""
        try:
            handler = self._inner._get_handler(urlparse_cached(request).scheme)
        except Exception:
            return
        if handler is None or id(handler) in self._tuned:
            return
        self._tuned.add(id(handler))
        pool = getattr(handler, "_pool", None)
        if pool is not None:
            pool.retryAutomatically = False
            pool._putConnection = _open_only(pool._putConnection)
            settings = self._downloader.crawler.settings
            if settings.get("ENRICH_PROXY"):
                pool.maxPersistentPerHost = max(1, settings.getint("CONCURRENT_REQUESTS"))

    async def download_request_async(self, request: Request) -> Response:
        self._tune(request)
        wait = request.meta.get(NOT_BEFORE, 0.0) - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        held = self._downloader.send_now(request)
        if held is None:
            held = await self._downloader.before_send(request)
        try:
            return await self._inner.download_request_async(request)
        finally:
            self._downloader.after_answer(request, held)


class PoliteDownloader(Downloader):
    def __init__(self, crawler: Crawler):
        super().__init__(crawler)
        _tunnel_errors_say_why()
        self.context = CrawlContext.of(crawler)
        self.handlers = _LimitedHandlers(self.handlers, self)  # type: ignore[assignment]
        self.sent = 0
        self.limiter_wait = 0.0

    def fetch(self, request: Request, spider: Any = None):  # type: ignore[override]
        deferred = super().fetch(request)
        deferred.addBoth(self._fetched, request)
        return deferred

    def _fetched(self, result: Any, request: Request) -> Any:
        scheduler = PoliteScheduler.of(self.crawler)
        if scheduler is not None:
            scheduler.release(request)
        return result

    def _process_queue(self, slot: Any) -> None:
        # Scrapy's downloader re-enters this right after each send ("prevent burst") and, the
        # slot's queue now empty, arms a timer `delay` ahead that finds nothing to do: an event
        # loop wake-up per request. A request enqueued later comes through here and is delayed
        # as before.
        if not slot.queue:
            return
        super()._process_queue(slot)

    def _slot_of(self, request: Request) -> tuple[str, Any]:
        key = request.meta.get(self.DOWNLOAD_SLOT) or self.get_slot_key(request)
        return key, self.slots.get(key)

    def send_now(self, request: Request) -> bool | None:
        """`before_send` without awaiting when it needs no database call: True (the shared
        limiter's host is still held from this process's previous request to it), False (no
        shared limiter); None when `before_send` must be awaited."""
        limiter = self.context.limiter
        shared = limiter is not None and limiter.shared
        key = self._slot_of(request)[0] if shared else ""
        if shared and key not in limiter.held:
            return None
        if self.context.is_unwanted(request):
            raise Refused("goal_reached")
        if shared and not limiter.keep(key, float(request.meta.get("download_timeout") or 180.0)):
            return None
        self.sent += 1
        return shared

    async def before_send(self, request: Request) -> bool:
        """Right before the send: drop it if nobody needs it, take the host in the shared
        limiter (waiting for other processes); True when the limiter was taken."""
        if self.context.is_unwanted(request):
            raise Refused("goal_reached")
        limiter = self.context.limiter
        if limiter is None or not limiter.shared:
            self.sent += 1
            return False
        key, slot = self._slot_of(request)
        delay = slot.delay if slot is not None else self._delay
        timeout = float(request.meta.get("download_timeout") or 180.0)
        try:
            waited = await limiter.acquire(key, delay, timeout)
        except HostBusy as exc:
            raise Refused("host_busy", str(exc)) from None
        if waited > 0:
            self.limiter_wait += waited
            self.crawler.stats.inc_value("enrich/limiter/waited")
            if self.context.is_unwanted(request):
                limiter.done(key, delay, keep=False)
                raise Refused("goal_reached")
        self.sent += 1
        return True

    def after_answer(self, request: Request, held: bool) -> None:
        """The answer (or failure) is in: the host's delay counts from now, here and in the
        shared limiter, so that no send-side lag can bring two requests closer than the delay."""
        key, slot = self._slot_of(request)
        if slot is not None:
            slot.lastseen = time.monotonic()
        limiter = self.context.limiter
        if held and limiter is not None:
            # keep the host: the answer usually brings the next request for it (links found on
            # the page); the limiter hands it back when none comes within the delay
            delay = slot.delay if slot is not None else self._delay
            limiter.done(key, delay, keep=True)
