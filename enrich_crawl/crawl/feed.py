"""Feeding records: the seed shard read lazily in chunks, each chunk checked for fresh fields and
started together (their seed pages served or requested as one batch), never more active records
than the crawl allows. The frontier's goal test for the scheduler (a request nobody waits for any
more is dropped), the pages re-sent when Scrapy goes idle, and the lines of the records the crawl
stopped before feeding."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import scrapy
from scrapy.exceptions import DontCloseSpider

from enrich_crawl.crawl.frontier import FetchOrder, Frontier
from enrich_crawl.crawl.outcomes import Outcomes
from enrich_crawl.crawl.params import WorkerParams
from enrich_crawl.crawl.render import ABANDONED
from enrich_crawl.crawl.robots import ROBOTS_FETCH
from enrich_crawl.crawl.sources import PageSources
from enrich_crawl.crawl.tally import Tally
from enrich_crawl.dataset.seedfile import read_seed_shard

logger = logging.getLogger(__name__)

FEED_CHUNK = 200  # records read, checked for freshness and started together
# the columns of the seed shard a crawl reads (Outcomes.not_started uses no others): the rest
# (`_data`, `_raw`: most of a shard's bytes) would be held for a whole row group meanwhile
FEED_COLUMNS = ("_id", "_urls", "_missing", "_url_errors")


class RecordFeed:
    def __init__(
        self,
        *,
        params: WorkerParams,
        frontier: Frontier,
        sources: PageSources,
        outcomes: Outcomes,
        tally: Tally,
    ):
        self.params = params
        self.frontier = frontier
        self.sources = sources
        self.rendering = sources.rendering
        self.outcomes = outcomes
        self.counts = tally.counts
        self.goal_directed = sources.goal_directed
        self.done = False  # every record of the shard was fed to the frontier
        self.idle_retries: Counter[str] = Counter()  # page key -> requests re-sent at idle

    def records(self) -> Iterator[dict[str, Any]]:
        return read_seed_shard(Path(self.params.seed_path), FEED_COLUMNS)

    def _chunks(self) -> Iterator[list[dict[str, Any]]]:
        chunk: list[dict[str, Any]] = []
        for record in self.records():
            chunk.append(record)
            if len(chunk) >= FEED_CHUNK:
                yield chunk
                chunk = []
        if chunk:
            yield chunk

    async def requests(self):
        """The requests of the records' seed pages, as Scrapy pulls them (the spider's start)."""
        capacity = self.outcomes.capacity
        for chunk in self._chunks():
            fresh: dict[str, set[str]] = {}
            # a collecting crawl wants the pages whatever the results collection holds
            state = self.sources.state
            if state is not None and self.goal_directed and self.sources.collector is None:
                fresh = await state.fresh_fields(
                    self.params.dataset,
                    {r["_id"]: list(r["_missing"]) for r in chunk if r["_missing"]},
                    self.sources.recrawl_ttl,
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
                        capacity.clear()
                        await capacity.wait()
                if self.done:  # closed meanwhile: the rest has its lines already
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
                    self.outcomes.abandon(record.get("_id"), f"internal error: {exc}"[:300])
                    continue
                started.append(record["_id"])
            for request in await self._start_records(started, orders):
                yield request
        self.done = True

    async def _start_records(self, started: list[str], orders: list[FetchOrder]) -> list[Any]:
        """The requests for the seed pages of records just added to the frontier."""
        try:
            return await self.sources.dispatch(orders)
        except Exception as exc:  # never stops the feed: these records end with the reason
            logger.exception("records %s... could not be started", started[:3])
            for record_id in started:
                self.outcomes.abandon(record_id, f"internal error: {exc}"[:300])
            return []

    # -- the polite scheduler and downloader ask these -------------------------------------------

    def unwanted(self, request: scrapy.Request) -> bool:
        """True when no active record waits for this request's page any more."""
        if request.meta.get(ABANDONED):  # a subresource its render gave up on
            return True
        key = request.meta.get("page_key")
        if key is None or request.meta.get(ROBOTS_FETCH):
            return False
        keys = self.rendering.waited_keys(request)
        if keys is not None:
            return not any(self.frontier.is_wanted(k) for k in keys)
        return not self.frontier.is_wanted(key)

    def discard_request(self, request: scrapy.Request) -> bool:
        """The scheduler drops a request whose records are all done, without fetching it."""
        if not self.unwanted(request):
            return False
        for key in self.rendering.request_keys(request):
            self.frontier.drop(key)
        self.counts["dropped"] += 1
        return True

    def resend_lost(self, engine: Any) -> None:
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
                engine.crawl(self.sources.request(order, None))
            raise DontCloseSpider
        for key, _task in stuck:
            self.counts["lost_at_idle"] += 1
            self.outcomes.fail(
                key, "error", "request lost twice: never answered (dropped on the way)"
            )
        if self.frontier.records:
            logger.warning(
                "crawl idle with %d active records that wait for no page (first: %s)",
                self.frontier.active,
                next(iter(self.frontier.records)),
            )

    def finish_unfed(self, reason: str) -> None:
        """A line in records.jsonl for every record the crawl stopped before feeding (time budget,
        termination): nothing is lost, the merge and the checks count them."""
        if self.done:
            return
        fed = self.counts["records"]
        for index, record in enumerate(self.records()):
            if index < fed:
                continue
            self.outcomes.not_started(record, reason)
        self.done = True
