"""The goal-directed frontier: which records wait for which pages, and when a record is done.

Plain Python (no Scrapy): the spider asks it what to fetch and tells it what came back.

- Each record starts at its seed URLs (depth 0) with the set of fields it still needs.
- A page (URL without fragment) is fetched once per run, however many records need it: records that
  need a page already requested wait on it; records that need a page already processed are served
  from the extraction cache.
- Links found by a matching mapping's `url_parsers` are followed (depth + 1) while the record still
  needs fields and the depth limit allows; generic links only when the dataset asks for it.
- As soon as a record has every field it needs, it is done: its pending requests are dropped
  (the scheduler and the downloader ask `is_wanted` before a request leaves).
- A record never asks for more than `max_pages_per_record` pages.
- `stop_at_goal=False` gives a plain breadth-first crawl (every page to the depth limit, whatever
  was found), for comparisons.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from enrich_crawl.urls import fragment_of, page_key, without_fragment

PRIORITY_SEED = 0
PRIORITY_PARSER_LINK = 10
PRIORITY_GENERIC_LINK = -10


@dataclass
class RecordState:
    id: str
    needed: set[str]  # fields still to find
    wanted: frozenset[str]  # every field this record asked for
    seeds: list[str]
    pending: int = 0  # pages this record waits for
    pages: int = 0  # pages processed for this record
    found: dict[str, int] = field(default_factory=dict)  # field -> candidates found
    errors: list[dict[str, str]] = field(default_factory=list)
    seen_urls: set[str] = field(default_factory=set)  # page keys already used by this record
    seed_yield: dict[str, int] = field(default_factory=dict)  # seed -> candidates via it
    fresh: frozenset[str] = frozenset()  # wanted fields already fresh in the results database
    over_budget: int = 0  # pages not requested because of max_pages_per_record
    started: float = field(default_factory=time.monotonic)
    done: bool = False

    @property
    def goal_reached(self) -> bool:
        return not self.needed

    @property
    def requested(self) -> int:
        return self.pages + self.pending


@dataclass
class Waiter:
    record: str
    fragment: str
    depth: int
    seed: str  # the seed URL this path started from (for not_on_page reasons)
    url: str  # the URL as followed (with fragment)


@dataclass
class PageTask:
    key: str  # the page's identity (urls.page_key: canonical, no fragment)
    waiters: list[Waiter] = field(default_factory=list)
    priority: int = 0
    url: str = ""  # the URL to fetch: as the first record found it, without its fragment


@dataclass
class FetchOrder:
    """A page the spider must fetch: `url` as found (query order kept), `key` its identity."""

    key: str
    priority: int
    depth: int
    url: str = ""

    @property
    def fetch_url(self) -> str:
        return self.url or self.key


class Frontier:
    def __init__(
        self,
        *,
        max_depth: int,
        on_record_done: Callable[[RecordState], None],
        stop_at_goal: bool = True,
        max_pages_per_record: int = 50,
    ):
        self.max_depth = max_depth
        self.stop_at_goal = stop_at_goal
        self.max_pages_per_record = max_pages_per_record
        self.records: dict[str, RecordState] = {}
        self.tasks: dict[str, PageTask] = {}  # requested, not yet processed
        self.on_record_done = on_record_done
        self.completed = 0
        self.dropped_requests = 0

    # -- records -------------------------------------------------------------------------------

    def add_record(
        self,
        record_id: str,
        seeds: list[str],
        needed: Iterable[str],
        errors: list[dict[str, str]] | None = None,
        known: Iterable[str] = (),
    ) -> list[FetchOrder]:
        """Start a record; `known` fields are already fresh in the results database."""
        wanted = frozenset(needed)
        fresh = frozenset(known) & wanted
        needed_set = set(wanted - fresh)
        state = RecordState(
            record_id, needed_set, wanted, list(seeds), errors=list(errors or []), fresh=fresh
        )
        self.records[record_id] = state
        orders: list[FetchOrder] = []
        if needed_set:
            for seed in seeds:
                orders.extend(
                    self.want(record_id, seed, depth=0, seed=seed, priority=PRIORITY_SEED)
                )
        self._maybe_finish(state)
        return orders

    def want(
        self, record_id: str, url: str, *, depth: int, seed: str, priority: int
    ) -> list[FetchOrder]:
        """Record `record_id` wants page `url` (fragment kept for extraction) at `depth`."""
        state = self.records.get(record_id)
        if state is None or state.done or depth > self.max_depth:
            return []
        key = page_key(url)
        waiter_key = f"{key}#{fragment_of(url)}"
        if waiter_key in state.seen_urls:
            return []
        if state.requested >= self.max_pages_per_record:
            state.over_budget += 1
            return []
        state.seen_urls.add(waiter_key)
        waiter = Waiter(record_id, fragment_of(url), depth, seed, url)
        state.pending += 1
        task = self.tasks.get(key)
        if task is not None:
            task.waiters.append(waiter)
            return []
        fetch = without_fragment(url)
        self.tasks[key] = PageTask(key, [waiter], priority, fetch)
        return [FetchOrder(key, priority - depth, depth, fetch)]

    def waiters(self, key: str) -> list[Waiter]:
        task = self.tasks.get(key)
        return list(task.waiters) if task else []

    def live_waiters(self, key: str) -> list[Waiter]:
        """Waiters whose record is still active (finished records are removed from `records`)."""
        return [w for w in self.waiters(key) if w.record in self.records]

    def is_wanted(self, key: str) -> bool:
        """False when every record waiting for this page is already done (drop the request)."""
        task = self.tasks.get(key)
        if task is None:
            return False
        return any(w.record in self.records for w in task.waiters)

    def take(self, key: str) -> list[Waiter]:
        """The page was processed (or failed): remove its task and return its waiters."""
        task = self.tasks.pop(key, None)
        return task.waiters if task else []

    def release(self, waiter: Waiter) -> None:
        """One page of a record was handled (successfully or not)."""
        state = self.records.get(waiter.record)
        if state is None:
            return
        state.pending -= 1
        state.pages += 1
        self._maybe_finish(state)

    def record_found(
        self, waiter: Waiter, fields: Iterable[str], also_on_page: Iterable[str] = ()
    ) -> None:
        """`fields` were found for the record on a page reached from `waiter.seed`;
        `also_on_page` are wanted fields the page has too although they were already found (the
        seed still led to values: it is not `not_on_page`, whatever the crawl order)."""
        state = self.records.get(waiter.record)
        if state is None:
            return
        for name in fields:
            if name in state.wanted:
                state.found[name] = state.found.get(name, 0) + 1
                state.needed.discard(name)
                state.seed_yield[waiter.seed] = state.seed_yield.get(waiter.seed, 0) + 1
        if any(name in state.wanted for name in also_on_page):
            state.seed_yield[waiter.seed] = state.seed_yield.get(waiter.seed, 0) + 1

    def record_error(self, waiter: Waiter, reason: str, detail: str = "") -> None:
        state = self.records.get(waiter.record)
        if state is None:
            return
        entry = {"url": waiter.url, "reason": reason}
        if detail:
            entry["detail"] = detail
        if entry not in state.errors:
            state.errors.append(entry)

    def drop(self, key: str) -> None:
        """The request for `key` is dropped because its records are done."""
        self.dropped_requests += 1
        for waiter in self.take(key):
            self.release(waiter)

    def _maybe_finish(self, state: RecordState) -> None:
        if state.done:
            return
        if (self.stop_at_goal and state.goal_reached) or state.pending <= 0:
            state.done = True
            self.completed += 1
            del self.records[state.id]
            self.on_record_done(state)

    @property
    def active(self) -> int:
        return len(self.records)
