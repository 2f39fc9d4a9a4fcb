"""Downloader middlewares and extensions that make the crawl polite, safe and goal-directed.

Order of `process_request` (lowest first, closest to the engine): GoalMiddleware drops requests
nobody needs any more; UrlPolicyMiddleware refuses internal addresses and denied URLs
(enrich_crawl.crawl.policy); RobotsMiddleware fetches robots.txt before any other path of an
origin, refuses disallowed paths and sets the host's delay floor from Crawl-delay. On the way back,
RedirectLoopMiddleware stops a redirect that comes back to a URL of its own chain before Scrapy
follows it, and
BackoffRetryMiddleware retries transient failures only, after an exponential backoff that the
PoliteScheduler enforces.

Extensions: Throttle adapts each host's delay to its latency (AutoThrottle's rule) without ever
going below the floor and without jitter (jitter would send requests closer than a Crawl-delay);
DownloadGuard stops downloads of binary content as soon as the headers show it, and cuts robots.txt
at 500 KiB.
"""

from __future__ import annotations

import asyncio
import email.utils
import functools
import logging
import time
from collections import Counter, OrderedDict
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit
from urllib.request import proxy_bypass

from scrapy import Request, signals
from scrapy.downloadermiddlewares.httpproxy import HttpProxyMiddleware
from scrapy.downloadermiddlewares.redirect import MetaRefreshMiddleware
from scrapy.downloadermiddlewares.retry import RetryMiddleware
from scrapy.downloadermiddlewares.stats import DownloaderStats
from scrapy.exceptions import StopDownload
from scrapy.http.request import NO_CALLBACK
from scrapy.logformatter import LogFormatter
from scrapy.utils.httpobj import urlparse_cached

from enrich_crawl.config import CrawlConfig
from enrich_crawl.crawl.errors import (
    STOP_REASON,
    Refused,
    reason_for_exception,
    reason_for_response,
)
from enrich_crawl.crawl.policy import DEFAULT_DENY_EXTENSIONS, UrlPolicy
from enrich_crawl.crawl.robots import MAX_ROBOTS_BYTES, RobotsRules, origin_of
from enrich_crawl.crawl.scheduler import NOT_BEFORE
from enrich_crawl.urls import canonical, join_url

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.http import Response

logger = logging.getLogger(__name__)

DELAY_MARGIN = 0.02  # seconds added to every floor: request start and server receipt drift apart
MAX_FLOORS = 50_000  # hosts whose floor is remembered (robots.txt of the others is cached anyway)
ROBOTS_FETCH = "robots_fetch"  # request meta of robots.txt requests

__all__ = [
    "DEFAULT_DENY_EXTENSIONS",
    "BackoffRetryMiddleware",
    "CheapMetaRefreshMiddleware",
    "DownloadGuard",
    "GoalMiddleware",
    "LeanDownloaderStats",
    "ProxyMiddleware",
    "QuietLogFormatter",
    "RedirectLoopMiddleware",
    "Refused",
    "RobotsMiddleware",
    "Throttle",
    "UrlPolicyMiddleware",
]

# content types that can never hold field values: stop the download at the headers
BINARY_TYPES = (
    "image/",
    "audio/",
    "video/",
    "font/",
    "application/pdf",
    "application/zip",
    "application/gzip",
    "application/x-",
    "application/vnd.",
    "application/msword",
    "application/octet-stream",
    "application/java-archive",
    "application/wasm",
)


def crawl_config(crawler: Crawler) -> CrawlConfig:
    config = getattr(crawler, "enrich_crawl_config", None)
    if config is None:
        config = CrawlConfig.from_mapping(crawler.settings.getdict("ENRICH_CRAWL_CONFIG") or None)
        crawler.enrich_crawl_config = config  # type: ignore[attr-defined]
    return config


class GoalMiddleware:
    """Drop a request when every record waiting for its page is already done (the scheduler does
    it when the request comes up; this catches requests that reach the downloader otherwise)."""

    def __init__(self, crawler: Crawler):
        self.crawler = crawler

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> GoalMiddleware:
        return cls(crawler)

    def process_request(self, request: Request) -> None:
        unwanted = getattr(self.crawler.spider, "unwanted", None)
        if unwanted is not None and unwanted(request):
            self.crawler.stats.inc_value("enrich/dropped_goal_reached")
            raise Refused("goal_reached")


class UrlPolicyMiddleware:
    """enrich_crawl.crawl.policy.UrlPolicy on every request, redirects included."""

    def __init__(self, crawler: Crawler):
        self.crawler = crawler
        settings = crawler.settings
        self.policy = UrlPolicy(
            crawl_config(crawler),
            allow_private=settings.getbool("ENRICH_ALLOW_PRIVATE"),
            claimed=self._claimed,
        )

    def _claimed(self, url: str) -> bool:
        claims = getattr(self.crawler.spider, "claims", None)
        return bool(claims is not None and claims(url))

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> UrlPolicyMiddleware:
        return cls(crawler)

    def process_request(self, request: Request) -> None:
        verdict = self.policy.check(request.url, robots_fetch=bool(request.meta.get(ROBOTS_FETCH)))
        if verdict is not None:
            reason, detail = verdict
            self.crawler.stats.inc_value(f"enrich/refused/{reason}")
            raise Refused(reason, detail)


class RobotsMiddleware:
    """robots.txt per RFC 9309 (enrich_crawl.crawl.robots), fetched once per origin and run before
    any other path of the host (through the same per-host slot and shared limiter as pages), cached
    across runs in the results database; sets the host's delay floor from Crawl-delay."""

    MAX_ORIGINS_IN_MEMORY = 1000  # more are kept in the run's scratch file

    def __init__(self, crawler: Crawler):
        self.crawler = crawler
        settings = crawler.settings
        config = crawl_config(crawler)
        self.user_agent = settings.get("USER_AGENT")
        self.default_delay = config.default_delay
        self.max_delay = config.max_delay
        self.ttl = config.robots_ttl_hours * 3600.0
        self.timeout = min(config.download_timeout, 30.0)
        self.rules: OrderedDict[str, RobotsRules] = OrderedDict()
        self.pending: dict[str, asyncio.Future] = {}
        self.stats: Counter[str] = Counter()
        crawler.enrich_robots = self  # type: ignore[attr-defined]

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> RobotsMiddleware:
        return cls(crawler)

    @staticmethod
    def of(crawler: Crawler) -> RobotsMiddleware | None:
        return getattr(crawler, "enrich_robots", None)

    def _spider_attr(self, name: str) -> Any:
        return getattr(self.crawler.spider, name, None)

    async def process_request(self, request: Request) -> None:
        if request.meta.get(ROBOTS_FETCH):
            return
        rules = await self.rules_for(request.url)
        throttle = Throttle.of(self.crawler)
        if throttle is not None:
            delay = rules.crawl_delay(self.user_agent)
            floor = self.default_delay if delay is None else min(delay, self.max_delay)
            throttle.set_floor(request, floor, from_robots=delay is not None)
        if not rules.allowed(request.url, self.user_agent):
            if rules.status == "disallow_all" and rules.cause != "robots":
                # robots.txt unreachable: the host itself is the problem (dns, timeout, ...)
                self.crawler.stats.inc_value(f"enrich/refused/{rules.cause}")
                raise Refused(rules.cause, "host unreachable (robots.txt could not be fetched)")
            self.crawler.stats.inc_value("enrich/refused/robots")
            detail = (
                f"robots.txt answered {rules.http_status}: disallowed for now"
                if rules.status == "disallow_all"
                else "disallowed by robots.txt"
            )
            raise Refused("robots", detail)

    async def rules_for(self, url: str) -> RobotsRules:
        origin = origin_of(url)
        rules = self.rules.get(origin)
        if rules is not None:
            self.rules.move_to_end(origin)
            return rules
        waiter = self.pending.get(origin)
        if waiter is not None:
            return await asyncio.shield(waiter)
        future = asyncio.get_running_loop().create_future()
        self.pending[origin] = future
        try:
            rules = await self._load(origin)
        except Exception as exc:  # never leave waiters hanging
            logger.warning("robots.txt of %s: %s", origin, exc)
            rules = RobotsRules.unreachable(origin, reason_for_exception(exc))
        self._remember(rules)
        self.pending.pop(origin, None)
        future.set_result(rules)
        return rules

    def _remember(self, rules: RobotsRules) -> None:
        self.rules[rules.origin] = rules
        while len(self.rules) > self.MAX_ORIGINS_IN_MEMORY:
            _, old = self.rules.popitem(last=False)
            spill = self._spider_attr("pages")
            if spill is not None:  # the run's scratch store: never fetched twice in a run
                spill.put_robots(old.to_doc())

    async def _load(self, origin: str) -> RobotsRules:
        spill = self._spider_attr("pages")
        if spill is not None:
            doc = spill.get_robots(origin)
            if doc is not None:
                return RobotsRules.from_doc(doc)
        state = self._spider_attr("state")
        if state is not None:
            cached = await state.robots_get(origin, self.ttl)
            if cached is not None:
                self.stats["cache_hits"] += 1
                self.crawler.stats.inc_value("enrich/robots/cache_hit")
                return cached
        request = Request(
            f"{origin}/robots.txt",
            priority=1000,
            meta={
                ROBOTS_FETCH: True,
                "download_maxsize": 4 * MAX_ROBOTS_BYTES,
                "download_timeout": self.timeout,
                "redirect_max_times": 5,  # RFC 9309 2.3.1.2
            },
            callback=NO_CALLBACK,
            dont_filter=True,
        )
        self.stats["fetched"] += 1
        self.crawler.stats.inc_value("enrich/robots/fetched")
        try:
            response = await self.crawler.engine.download_async(request)
        except Exception as exc:
            cause = reason_for_exception(exc, request)
            if cause == "private_address":
                raise Refused(
                    "private_address", f"{origin} resolves to an internal address"
                ) from None
            logger.info("robots.txt of %s unreachable (%s): disallow for now", origin, exc)
            self.stats["unreachable"] += 1
            rules = RobotsRules.unreachable(origin, cause)
        else:
            self.stats[f"status/{response.status}"] += 1
            cause = reason_for_response(response.status, response.headers)
            if cause != f"http_{response.status}":  # a proxy reporting the host unreachable
                self.stats["unreachable"] += 1
                rules = RobotsRules.unreachable(origin, cause)
            else:
                truncated = "download_stopped" in (response.flags or [])
                rules = RobotsRules.from_response(
                    origin, response.status, response.body, truncated=truncated
                )
                if rules.note:
                    self.stats[rules.note] += 1
        if state is not None:
            state.robots_put(rules)
        return rules


class BackoffRetryMiddleware(RetryMiddleware):
    """Scrapy's retries for transient failures only (RETRY_HTTP_CODES, timeouts, resets), each
    after an exponential backoff (crawl.retry_backoff doubling, at least the host's delay, a
    Retry-After answer honoured up to crawl.retry_backoff_max). A proxy's "no such host" answer,
    DNS failures and refused internal addresses are not retried."""

    def __init__(self, settings: Any):
        super().__init__(settings)
        self.base = settings.getfloat("ENRICH_RETRY_BACKOFF", 2.0)
        self.cap = settings.getfloat("ENRICH_RETRY_BACKOFF_MAX", 120.0)

    def _backoff(self, request: Request, retry_after: float | None = None) -> float:
        attempt = request.meta.get("retry_times", 0)
        delay = self.base * (2**attempt)
        slot = self.crawler.engine.downloader.slots.get(request.meta.get("download_slot", ""))
        if slot is not None:
            delay = max(delay, slot.delay)
        if retry_after is not None:
            delay = max(delay, retry_after)
        return min(delay, self.cap)

    @staticmethod
    def _retry_after(response: Response) -> float | None:
        value = response.headers.get(b"Retry-After")
        if not value:
            return None
        text = value.decode("latin-1").strip()
        try:
            return max(0.0, float(text))
        except ValueError:
            pass
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        return max(0.0, when.timestamp() - time.time())

    def process_response(self, request: Request, response: Response, spider: Any = None):
        if request.meta.get("dont_retry", False) or response.status not in self.retry_http_codes:
            return response
        if reason_for_response(response.status, response.headers) == "dns":
            return response  # the proxy says the name does not exist: not transient
        retry_after = self._retry_after(response)
        if retry_after is not None and retry_after > self.cap:
            return response  # the server asks for more patience than a run has
        new = self._retry(request, f"{response.status}")
        if new is None:
            return response
        new.meta[NOT_BEFORE] = time.monotonic() + self._backoff(request, retry_after)
        return new

    def process_exception(self, request: Request, exception: Exception, spider: Any = None):
        if reason_for_exception(exception, request) in ("dns", "private_address", "too_large"):
            return None
        new = super().process_exception(request, exception)
        if isinstance(new, Request):
            new.meta[NOT_BEFORE] = time.monotonic() + self._backoff(request)
        return new


class RedirectLoopMiddleware:
    """A redirect to a URL already in its own chain is a loop: stop it at once (`redirect_loop`)
    instead of fetching it again up to REDIRECT_MAX_TIMES. The Location is resolved as a browser
    resolves it (WHATWG URL Standard, `urls.join_url`) and handed to Scrapy's RedirectMiddleware
    absolute, so the redirect followed is the one a browser would follow."""

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> RedirectLoopMiddleware:
        return cls()

    def process_response(self, request: Request, response: Response, spider: Any = None):
        if not 300 <= response.status < 400 or b"Location" not in response.headers:
            return response
        raw = response.headers[b"Location"]
        try:  # what browsers do with a non-ASCII Location: UTF-8, else each byte a character
            location = raw.decode("utf-8")
        except UnicodeDecodeError:
            location = raw.decode("latin-1")
        target = join_url(request.url, location)
        if target is None:  # not a URL: left to Scrapy (which does not follow it either)
            return response
        # the same URL up to spelling (query order, escapes): tracking parameters count here, a
        # server may redirect `/x` to `/x?utm_source=...` and serve it
        try:
            chain = {
                canonical(u, keep_fragment=False)
                for u in [*request.meta.get("redirect_urls", []), request.url]
            }
            looped = canonical(target, keep_fragment=False) in chain
        except ValueError:
            looped = False
        if looped:
            raise Refused("redirect_loop", f"{request.url} redirects back to {target}")
        if target != location:
            headers = response.headers.copy()
            headers[b"Location"] = target
            response = response.replace(headers=headers)
        return response


class Throttle:
    """Per-host delays: the floor (Crawl-delay or the default) and AutoThrottle's latency rule.

    Replaces Scrapy's AutoThrottle, which can lower a slot's delay below a robots Crawl-delay.
    """

    def __init__(self, crawler: Crawler):
        self.crawler = crawler
        settings = crawler.settings
        self.enabled = settings.getbool("ENRICH_AUTOTHROTTLE", True)
        self.target = settings.getfloat("AUTOTHROTTLE_TARGET_CONCURRENCY", 1.0)
        self.max_delay = settings.getfloat("ENRICH_MAX_DELAY", 60.0)
        self.floors: OrderedDict[str, float] = OrderedDict()  # host -> floor, recent hosts
        self.delay_counts: Counter[str] = Counter()  # hosts by floor (statistics)
        self.crawl_delay_hosts = 0
        self.raised = 0  # times AutoThrottle raised a delay above its floor
        crawler.signals.connect(self._response_downloaded, signal=signals.response_downloaded)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Throttle:
        throttle = cls(crawler)
        crawler.enrich_throttle = throttle  # type: ignore[attr-defined]
        return throttle

    @staticmethod
    def of(crawler: Crawler) -> Throttle | None:
        return getattr(crawler, "enrich_throttle", None)

    def _slot(self, request: Request):
        downloader = self.crawler.engine.downloader
        _key, slot = downloader._get_slot(request)
        return slot

    def set_floor(self, request: Request, floor: float, *, from_robots: bool = False) -> None:
        key = self.crawler.engine.downloader.get_slot_key(request)
        floor = floor + DELAY_MARGIN if floor > 0 else 0.0
        if key not in self.floors:
            # counted once per host and run (the floor of a host comes from its robots.txt)
            self.crawl_delay_hosts += int(from_robots)
            self.delay_counts[f"{round(max(floor - DELAY_MARGIN, 0.0), 2):g}"] += 1
        self.floors[key] = floor
        self.floors.move_to_end(key)
        while len(self.floors) > MAX_FLOORS:
            self.floors.popitem(last=False)
        slot = self._slot(request)
        slot.jitter = 0.0
        if slot.delay < floor:
            slot.delay = floor

    def floor_of(self, key: str) -> float:
        return self.floors.get(key, 0.0)

    def delays_histogram(self) -> dict[str, int]:
        """Hosts by the delay floor applied to them (seconds, rounded)."""
        return dict(sorted(self.delay_counts.items(), key=lambda kv: float(kv[0])))

    def _response_downloaded(self, response, request, spider=None) -> None:
        key = request.meta.get("download_slot")
        if key is None:
            return
        slot = self.crawler.engine.downloader.slots.get(key)
        if slot is None:
            return
        floor = self.floors.get(key, 0.0)
        if not self.enabled:
            slot.delay = max(floor, slot.delay)
            return
        latency = request.meta.get("download_latency")
        if latency is None:
            return
        target = latency / self.target
        new_delay = (slot.delay + target) / 2.0
        # errors and non-200 responses may not lower the delay (AutoThrottle's rule)
        if response.status != 200 and new_delay <= slot.delay:
            return
        new_delay = max(floor, min(self.max_delay, new_delay))
        if new_delay > floor and new_delay > slot.delay:
            self.raised += 1
        slot.delay = new_delay


class DownloadGuard:
    """Stop what must not be downloaded as soon as it shows: binary bodies (at the headers, reason
    `not_text`) and robots.txt beyond 500 KiB (cut there, the rest ignored as RFC 9309 allows)."""

    def __init__(self, crawler: Crawler):
        self.crawler = crawler
        self.stopped: Counter[str] = Counter()
        crawler.signals.connect(self._headers, signal=signals.headers_received)
        crawler.signals.connect(self._bytes, signal=signals.bytes_received)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> DownloadGuard:
        return cls(crawler)

    def _headers(self, headers, body_length, request, spider=None) -> None:
        if request.meta.get(ROBOTS_FETCH):
            return
        ctype = (headers.get(b"Content-Type") or b"").decode("latin-1").lower().strip()
        if ctype.startswith(BINARY_TYPES):
            self.stopped["not_text"] += 1
            request.meta[STOP_REASON] = "not_text"
            raise StopDownload(fail=True)

    def _bytes(self, data, request, spider=None) -> None:
        if not request.meta.get(ROBOTS_FETCH):
            return
        received = request.meta.get("enrich_robots_bytes", 0) + len(data)
        request.meta["enrich_robots_bytes"] = received
        if received > MAX_ROBOTS_BYTES:
            self.stopped["robots_truncated"] += 1
            raise StopDownload(fail=False)


def host_of(url: str) -> str:
    return (urlsplit(url).hostname or "").lower()


class ProxyMiddleware(HttpProxyMiddleware):
    """Scrapy's HttpProxyMiddleware (http_proxy / https_proxy / no_proxy of the environment, a
    `proxy` in request meta), with the no_proxy verdict cached per host: urllib's proxy_bypass()
    reads the whole environment on every call, a tenth of a millisecond per request."""

    def __init__(self, auth_encoding: str | None = "latin-1"):
        super().__init__(auth_encoding)
        self._bypass = functools.lru_cache(maxsize=4096)(proxy_bypass)

    def process_request(self, request: Request) -> None:
        if "proxy" in request.meta or not self.proxies:
            return super().process_request(request)
        parsed = urlparse_cached(request)
        scheme = parsed.scheme
        creds, proxy_url, use = None, None, None
        if (
            scheme not in ("http", "https")  # no_proxy is only read for http(s)
            or (parsed.hostname and not self._bypass(parsed.hostname))
        ) and scheme in self.proxies:
            use = scheme
            creds, proxy_url = self.proxies[scheme]
        self._set_proxy_and_creds(request, proxy_url, creds, use)
        return None


class LeanDownloaderStats(DownloaderStats):
    """Scrapy's downloader statistics (request, response, status and exception counts) without
    the byte counts, which re-serialise every request and the headers of every response; the
    crawl counts body bytes itself."""

    def process_request(self, request: Request) -> None:
        self.stats.inc_value("downloader/request_count")
        return None

    def process_response(self, request: Request, response: Response) -> Response:
        self.stats.inc_value("downloader/response_count")
        self.stats.inc_value(f"downloader/response_status_count/{response.status}")
        return response


# a `<meta http-equiv="refresh">` among the first 4,096 characters spells "refresh" in the first
# 16 KiB of an ASCII-compatible body (a character takes at most 4 bytes of UTF-8)
_REFRESH_SCAN = 4 * 4096


class CheapMetaRefreshMiddleware(MetaRefreshMiddleware):
    """Scrapy's MetaRefreshMiddleware, which decodes every HTML body whole to look at its first
    4,096 characters: a body whose first bytes cannot hold a refresh is passed on undecoded
    (UTF-16/32 bodies, with NUL bytes, always take Scrapy's path)."""

    def process_response(self, request: Request, response: Response) -> Response:
        head = response.body[:_REFRESH_SCAN]
        if b"\x00" not in head and b"refresh" not in head.lower():
            return response
        return super().process_response(request, response)


class QuietLogFormatter(LogFormatter):
    """Scrapy's log formatter, without the DEBUG "Crawled (200) <GET ...>" line of every response
    when the log level hides it anyway: Scrapy builds that record (and its referer) for every
    page before the handler drops it."""

    def __init__(self, debug: bool = False):
        self.debug = debug

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> QuietLogFormatter:
        level = crawler.settings.get("LOG_LEVEL") or "DEBUG"
        numeric = level if isinstance(level, int) else logging.getLevelName(str(level).upper())
        return cls(debug=isinstance(numeric, int) and numeric <= logging.DEBUG)

    def crawled(self, request: Request, response: Response, spider: Any) -> Any:
        return super().crawled(request, response, spider) if self.debug else None
