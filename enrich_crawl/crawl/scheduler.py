"""The politeness-aware scheduler: a request leaves it only when its host may be sent one.

Scrapy's own scheduler hands requests to the downloader as soon as there is room, and the downloader
parks them in per-host slots until the host's delay has passed; a parked request holds one of the
CONCURRENT_REQUESTS places all that time. With a 1 s delay per host, 64 places give at most 64
pages/s however many hosts are waiting, and a request parked for a record that finished meanwhile is
still sent. This scheduler keeps one priority queue per host (higher priority first: url_parsers
links before generic links, shallower before deeper) and a heap of hosts by the time they may next
be sent a request (the slot's last send + its delay), so that:

- a request leaves only when its host is idle and its delay has passed: the downloader's places are
  used by requests in flight, never by requests that wait, and hosts are served as fast as their
  delays allow whatever their number (heap: O(log hosts) per request);
- a request whose records are all done is dropped when it comes up, without a fetch;
- a retry waits out its backoff (`enrich_not_before` in meta) here, not in the downloader.

The downloader (enrich_crawl.crawl.downloader.PoliteDownloader) tells `release()` when a request it
received is finished, whatever the outcome; the host becomes ready again at last send + delay.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from scrapy.core.scheduler import BaseScheduler

from enrich_crawl.crawl.context import CrawlContext

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

NOT_BEFORE = "enrich_not_before"  # request meta: monotonic time before which it must not leave


class PoliteScheduler(BaseScheduler):
    def __init__(self, crawler: Crawler):
        self.crawler = crawler
        self.queues: dict[str, list[tuple[int, int, Request]]] = {}  # host -> (-prio, seq, req)
        self.ready: list[tuple[float, int, str]] = []  # (ready_at, seq, host), lazy deletion
        self.scheduled: dict[str, float] = {}  # host -> its valid ready_at in `ready`
        self.busy: dict[str, Request] = {}  # host -> the request it is handling
        self.delayed: list[tuple[float, int, Request]] = []  # (not_before, seq, request)
        self.count = 0
        self.seq = itertools.count()
        self.stats: Counter[str] = Counter()
        self.discard: Callable[[Request], bool] | None = None
        self._wakeup: Any = None
        self._wakeup_at = float("inf")

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> PoliteScheduler:
        scheduler = cls(crawler)
        crawler.enrich_scheduler = scheduler  # type: ignore[attr-defined]
        return scheduler

    @staticmethod
    def of(crawler: Crawler) -> PoliteScheduler | None:
        return getattr(crawler, "enrich_scheduler", None)

    # -- BaseScheduler ---------------------------------------------------------------------------

    def open(self, spider: Spider) -> None:
        # the feed may veto requests when they come up (records done meanwhile)
        self.discard = CrawlContext.of(self.crawler).discard

    def close(self, reason: str) -> None:
        if self._wakeup is not None:
            self._wakeup.cancel()
            self._wakeup = None

    def has_pending_requests(self) -> bool:
        return self.count > 0

    def __len__(self) -> int:
        return self.count

    def enqueue_request(self, request: Request) -> bool:
        self.count += 1
        self.stats["enqueued"] += 1
        not_before = request.meta.get(NOT_BEFORE)
        if not_before is not None and not_before > time.monotonic():
            heapq.heappush(self.delayed, (not_before, next(self.seq), request))
            self._arm(time.monotonic())
            return True
        self._push(request)
        return True

    def next_request(self) -> Request | None:
        now = time.monotonic()
        while self.delayed and self.delayed[0][0] <= now:
            _, _, request = heapq.heappop(self.delayed)
            self._push(request)
        while self.ready:
            ready_at, _, host = self.ready[0]
            if self.scheduled.get(host) != ready_at or host in self.busy or host not in self.queues:
                heapq.heappop(self.ready)  # stale entry
                if self.scheduled.get(host) == ready_at:
                    del self.scheduled[host]
                continue
            if ready_at > now:
                break
            actual = self._ready_at(host)
            if actual > now + 0.001:  # the host's delay grew since (AutoThrottle, Crawl-delay)
                heapq.heappop(self.ready)
                self._schedule(host, actual)
                continue
            heapq.heappop(self.ready)
            del self.scheduled[host]
            queue = self.queues[host]
            _, _, request = heapq.heappop(queue)
            if not queue:
                del self.queues[host]
            self.count -= 1
            if self.discard is not None and self.discard(request):
                self.stats["discarded"] += 1
                if host in self.queues:
                    self._schedule(host, now)
                continue
            self.busy[host] = request
            self.stats["handed_out"] += 1
            return request
        self._arm(now)
        return None

    # -- hosts -----------------------------------------------------------------------------------

    def host_of(self, request: Request) -> str:
        return self.crawler.engine.downloader.get_slot_key(request)

    def _ready_at(self, host: str) -> float:
        slot = self.crawler.engine.downloader.slots.get(host)
        if slot is None:
            return 0.0
        return slot.lastseen + slot.delay

    def _push(self, request: Request) -> None:
        host = self.host_of(request)
        queue = self.queues.get(host)
        if queue is None:
            queue = self.queues[host] = []
        heapq.heappush(queue, (-request.priority, next(self.seq), request))
        if host not in self.busy and host not in self.scheduled:
            self._schedule(host, self._ready_at(host))

    def _schedule(self, host: str, ready_at: float) -> None:
        self.scheduled[host] = ready_at
        heapq.heappush(self.ready, (ready_at, next(self.seq), host))

    def has_queued(self, host: str) -> bool:
        return host in self.queues

    def has_work(self, host: str) -> bool:
        """Requests for `host` are queued or on their way."""
        return host in self.queues or host in self.busy

    def release(self, request: Request) -> None:
        """The downloader is done with `request` (response, error or refusal)."""
        host = request.meta.get("download_slot") or self.host_of(request)
        if self.busy.get(host) is not request:
            return
        del self.busy[host]
        if host in self.queues and host not in self.scheduled:
            self._schedule(host, self._ready_at(host))
            self._arm(time.monotonic())

    # -- waking the engine up --------------------------------------------------------------------

    def _arm(self, now: float) -> None:
        """Make the engine ask again when the next host becomes ready (it otherwise only asks after
        a download finishes or every 5 s)."""
        when = float("inf")
        while self.ready and (
            self.scheduled.get(self.ready[0][2]) != self.ready[0][0]
            or self.ready[0][2] in self.busy
            or self.ready[0][2] not in self.queues
        ):
            ready_at, _, host = heapq.heappop(self.ready)
            if self.scheduled.get(host) == ready_at:
                del self.scheduled[host]
        if self.ready:
            when = self.ready[0][0]
        if self.delayed:
            when = min(when, self.delayed[0][0])
        if when == float("inf"):
            return
        if self._wakeup is not None and self._wakeup_at <= when:
            return
        if self._wakeup is not None:
            self._wakeup.cancel()
        import asyncio

        loop = asyncio.get_event_loop()
        self._wakeup_at = when
        self._wakeup = loop.call_later(max(0.0, when - now), self._kick)

    def _kick(self) -> None:
        self._wakeup = None
        self._wakeup_at = float("inf")
        self.stats["wakeups"] += 1
        slot = getattr(self.crawler.engine, "_slot", None)
        if slot is not None:
            slot.nextcall.schedule()

    def snapshot(self) -> dict[str, int]:
        return {
            "queued": self.count,
            "hosts_queued": len(self.queues),
            "hosts_busy": len(self.busy),
            "delayed": len(self.delayed),
            **self.stats,
        }
