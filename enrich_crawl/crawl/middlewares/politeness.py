"""Politeness: RobotsMiddleware fetches robots.txt (RFC 9309) before any other path of an origin,
refuses disallowed paths and sets the host's delay floor from Crawl-delay; the Throttle extension
adapts each host's delay to its latency (AutoThrottle's rule) without ever going below the floor
and without jitter (jitter would send requests closer than a Crawl-delay).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, OrderedDict
from typing import TYPE_CHECKING

from scrapy import Request, signals
from scrapy.http.request import NO_CALLBACK

from enrich_crawl.crawl.context import CrawlContext, crawl_config
from enrich_crawl.crawl.errors import Refused, reason_for_exception, reason_for_response
from enrich_crawl.crawl.robots import MAX_ROBOTS_BYTES, ROBOTS_FETCH, RobotsRules, origin_of

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

DELAY_MARGIN = 0.02  # seconds added to every floor: request start and server receipt drift apart
MAX_FLOORS = 50_000  # hosts whose floor is remembered (robots.txt of the others is cached anyway)


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
            spill = CrawlContext.of(self.crawler).pages
            if spill is not None:  # the run's scratch store: never fetched twice in a run
                spill.put_robots(old.to_doc())

    async def _load(self, origin: str) -> RobotsRules:
        context = CrawlContext.of(self.crawler)
        spill = context.pages
        if spill is not None:
            doc = spill.get_robots(origin)
            if doc is not None:
                return RobotsRules.from_doc(doc)
        state = context.state
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


class Throttle:
    """Per-host delays: the floor (Crawl-delay or the default) and AutoThrottle's latency rule.

    Replaces Scrapy's AutoThrottle, which can lower a slot's delay below a robots Crawl-delay.
    """

    def __init__(self, crawler: Crawler):
        self.crawler = crawler
        config = crawl_config(crawler)
        self.enabled = config.autothrottle
        self.target = crawler.settings.getfloat("AUTOTHROTTLE_TARGET_CONCURRENCY", 1.0)
        self.max_delay = config.max_delay
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
