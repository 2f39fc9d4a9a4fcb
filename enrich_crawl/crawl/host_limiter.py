"""The fleet-wide per-host limiter: one request at a time per host, `delay` apart, across every
crawl process of every run (MongoDB `_crawl_hosts`, see enrich_crawl.crawl.state)."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from enrich_crawl.crawl.state import HOSTS, ByIdReads, CrawlState, epoch_seconds

IDLE_GRACE = 0.5  # seconds a host is kept after its delay for a next request of this process
MAX_LIMITER_ERRORS = 3  # failed limiter round trips in a row before politeness goes per process
# The limiter's writes go to the database in batches, one `bulk_write` for all the takes and
# hand-backs of a moment (every database call costs the crawl process ~0.3 ms of CPU whatever it
# holds). A take waits at most TAKE_WINDOW for others to join it (a burst of hosts whose delays
# end together, a page full of links to new hosts); a hand-back at most RELEASE_WINDOW, or less
# when a take leaves first. Waiting only ever makes a host's next request later: its `next_at`
# (answer + delay) was fixed when the answer came.
TAKE_WINDOW = 0.02
RELEASE_WINDOW = 0.5
DUPLICATE_KEY = 11000


class HostBusy(Exception):
    """Another crawl process kept a host longer than a request may wait."""


def _holder_is_dead(token: Any) -> bool:
    """Whether a limiter token (`<partition>@<hostname>:<pid>:<n>`) names a process of this
    machine that no longer exists, or exited and was not yet reaped by its parent (a zombie: a
    launcher waiting for its crawl processes one after the other reaps a finished one only when
    it gets to it). Tokens of other machines are never judged dead: their leases run out by
    themselves."""
    if not isinstance(token, str):
        return False
    holder, _, rest = token.rpartition("@")
    hostname, _, pid_and_n = rest.partition(":")
    pid = pid_and_n.partition(":")[0]
    if not holder or hostname != socket.gethostname() or not pid.isdigit():
        return False
    import psutil

    if int(pid) == os.getpid():
        return False
    try:
        return psutil.Process(int(pid)).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:  # not ours to look at: judged alive, its lease runs out by itself
        return False


@dataclass
class _Hold:
    token: str
    lease_end: float  # epoch seconds: `next_at` of the host's document while we hold it
    since: float  # monotonic
    idle_since: float | None = None  # monotonic: answered, next local request not yet sent
    free_at: float = 0.0  # epoch: answer time + delay of the last request
    delay: float = 1.0  # the host's delay when it was taken


@dataclass
class _Write:
    """One take or hand-back waiting for the next batch."""

    op: Any  # pymongo UpdateOne
    done: asyncio.Future  # True: written (a take: the host is ours); False: a take found it busy


class HostLimiter:
    """One request at a time per host, `delay` apart, across every crawl process (MongoDB
    `_crawl_hosts`, one document per host: `{_id: host, next_at, by}`).

    A process takes a host with an atomic `update_one({_id: host, next_at: {$lte: now}},
    {$set: {next_at: now + lease, by: token}}, upsert=True)` (the upsert creates the document on
    first use; a duplicate key means the host exists and is busy) right before sending: from then on every other process sees the host busy.
    When the answer is in, it hands the host back with `next_at = answer time + delay` (only if it
    still holds it: `by` is its token). Spacing counts from the *answer* of one request to the
    *send* of the next, so no delay between a reservation and the real send (a busy event loop,
    a slow database) can bring two requests closer than the delay; it costs the response time of
    each request on top of the delay. A process that loses waits (polling `next_at` at least every
    `delay`) and tries again.

    A process keeps a host between its own requests (the answer to one usually brings the next:
    links found on the page), at most `max_hold` seconds, then hands it back so that others get
    their turn; a host it has no more requests for is handed back `IDLE_GRACE` after its delay.
    A host crawled by one process costs two database writes per visit, not per request. Its own
    requests are spaced by its downloader slot, which also counts from the previous answer. A host
    nobody hands back (a killed process) is free again when its lease ends, or `delay` after
    another process of the same machine sees that its holder no longer exists (the retry of a
    killed shard need not wait out the lease).

    Round trips: the takes and hand-backs of a moment leave together in one unordered
    `bulk_write` (see TAKE_WINDOW): a take that finds the host busy fails on its `_id` alone, and
    the error's index says which; the looks at busy hosts are one `find({_id: {$in: ...}})` for
    all the hosts waited for at that moment. A crawl that ends hands back every host it still
    holds (`close`), so that nobody waits for its leases.

    Clocks: `time.time()` of each machine; NTP keeps them within milliseconds of each other.
    """

    def __init__(
        self,
        state: CrawlState | None,
        *,
        lease: float = 90.0,
        max_hold: float = 30.0,
        max_wait: float = 600.0,
    ):
        self.state = state
        self.lease = lease
        self.max_hold = max_hold
        self.max_wait = max_wait
        self.held: dict[str, _Hold] = {}
        self.in_flight: set[str] = set()
        self.releasing: dict[str, asyncio.Task] = {}
        self.stats: Counter[str] = Counter()
        self.wait_seconds = 0.0
        self.db_seconds = 0.0
        self._token = 0
        self._hosts: Any = None  # the `_crawl_hosts` collection handle, made once
        self._reads: ByIdReads | None = None  # batched looks at busy hosts
        self._takes: dict[str, _Write] = {}  # takes waiting for the next batch, by host
        self._releases: dict[str, _Write] = {}  # hand-backs waiting for the next batch
        self._batch_timer: asyncio.TimerHandle | None = None
        self._batch_due = 0.0  # loop time the pending batch leaves at
        self._batches: set[asyncio.Task] = set()  # batches being written
        self._closing = False  # writes leave at once
        self._sweeper: asyncio.Task | None = None
        # host -> this process still has requests queued for it (set by the downloader)
        self.has_work: Callable[[str], bool] | None = None
        self.broken = False  # the database failed the limiter MAX_LIMITER_ERRORS times in a row
        self.errors_in_row = 0

    @property
    def shared(self) -> bool:
        # only the limiter's own failures switch it off: a failed page-cache write or read
        # (`state.available`) must not drop the fleet-wide politeness of the rest of the run
        return self.state is not None and self.state.db is not None and not self.broken

    def _collection(self) -> Any:
        # pymongo builds a new Collection object (codec options, read/write concerns) on every
        # `db[name]`: one handle for the run
        if self._hosts is None:
            assert self.state is not None
            self._hosts = self.state.db[HOSTS]
        return self._hosts

    def keep(self, host: str, timeout: float) -> bool:
        """Take `host` again without a database call when this process still holds it with a
        lease long enough for a request of `timeout` (most requests: the answer to one brings
        the next for the same host). False: `acquire` must be awaited."""
        hold = self.held.get(host)
        if hold is None or not self.shared or hold.lease_end - time.time() <= timeout + 10.0:
            return False
        hold.idle_since = None
        self.stats["kept"] += 1
        self.errors_in_row = 0
        self.in_flight.add(host)
        return True

    async def acquire(self, host: str, delay: float, timeout: float) -> float:
        """Wait until this process may send to `host`; returns the seconds waited for others."""
        if not self.shared:
            return 0.0
        if self.keep(host, timeout):
            return 0.0
        if self._sweeper is None:
            self._sweeper = asyncio.ensure_future(self._sweep_loop())
        started = time.monotonic()
        while True:
            try:
                waited = await self._acquire(host, delay, timeout)
                break
            except HostBusy:
                raise
            except Exception as exc:
                # a slow or failing database answer: try again (sending without the host would
                # break the delay for the other processes); when it keeps failing the database
                # went away, and politeness stays per process
                self.stats["errors"] += 1
                self.errors_in_row += 1
                if self.errors_in_row >= MAX_LIMITER_ERRORS:
                    self.broken = True
                    assert self.state is not None
                    self.state._failed("limiter", exc)
                    return 0.0
                await asyncio.sleep(0.5)
        self.errors_in_row = 0
        self.in_flight.add(host)
        self.db_seconds += time.monotonic() - started - waited
        self.wait_seconds += waited
        return waited

    async def _acquire(self, host: str, delay: float, timeout: float) -> float:
        collection = self._collection()
        lease = max(self.lease, timeout + 30.0)
        hold = self.held.get(host)
        if hold is not None:  # held, but its lease is too short for this request (see `keep`)
            hold.idle_since = None
            lease_end = time.time() + lease
            result = await collection.update_one(
                {"_id": host, "by": hold.token}, {"$set": {"next_at": lease_end}}
            )
            self.stats["extended"] += 1
            if result.matched_count:
                hold.lease_end = lease_end
                return 0.0
            del self.held[host]  # the lease ran out and someone took the host
        pending = self.releasing.get(host)
        if pending is not None:  # our own hand-back of it first, and no later than a take
            self._send_within(TAKE_WINDOW)
            await asyncio.shield(pending)
        waited = 0.0
        doc: dict[str, Any] | None = None  # the host's document as last read (None: take it)
        while True:
            if doc is None or (epoch_seconds(doc.get("next_at")) or 0.0) <= time.time():
                self._token += 1
                assert self.state is not None
                token = f"{self.state.worker}:{self._token}"
                now = time.time()
                lease_end = now + lease
                # taken when free, created when new; a busy host's document does not match,
                # and the upsert's insert then fails on its _id (in a batch with the others)
                if await self._take(host, now, lease_end, token):
                    break
            # busy: one read per look until the host is free, then one try to take it
            if self._reads is None:
                self._reads = ByIdReads(self.state, HOSTS)
            doc = await self._reads.get(host)
            if doc is None:  # removed meanwhile: take it again
                continue
            wait = (epoch_seconds(doc.get("next_at")) or 0.0) - time.time()
            if wait > delay and _holder_is_dead(doc.get("by")):
                # a killed crawl process of this machine (a retried or re-run shard's previous
                # attempt) holds the host until its lease ends: its request died with it, so
                # the host is free `delay` from now, as after an answer
                await collection.update_one(
                    {"_id": host, "by": doc["by"]}, {"$set": {"next_at": time.time() + delay}}
                )
                self.stats["reclaimed"] += 1
                doc = None
                continue
            if wait > 0:
                if waited >= self.max_wait:
                    raise HostBusy(f"{host} kept busy by other crawl processes for {waited:.0f} s")
                wait = min(wait, max(delay, 0.5), self.max_wait - waited + 0.01)
                self.stats["waits"] += 1
                waited += wait
                await asyncio.sleep(wait)
        self.stats["acquired"] += 1
        self.held[host] = _Hold(token, lease_end, time.monotonic(), delay=delay)
        return waited

    def done(self, host: str, delay: float, *, keep: bool) -> None:
        """The request to `host` is answered: hand the host back (`next_at` = now + delay), or keep
        it for this process's next request."""
        self.in_flight.discard(host)
        hold = self.held.get(host)
        if hold is None:
            return
        hold.free_at = time.time() + delay
        if keep and time.monotonic() - hold.since < self.max_hold:
            hold.idle_since = time.monotonic()
            return
        self._release(host)

    def _release(self, host: str) -> None:
        hold = self.held.pop(host)
        next_at = hold.free_at or (time.time() + 60.0)  # never answered: keep it a while
        self.releasing[host] = asyncio.ensure_future(self._write_release(host, hold.token, next_at))

    async def _write_release(self, host: str, token: str, next_at: float) -> None:
        from pymongo import UpdateOne

        op = UpdateOne({"_id": host, "by": token}, {"$set": {"next_at": next_at}})
        try:
            await self._batched(self._releases, host, op, RELEASE_WINDOW)
            self.stats["released"] += 1
        except Exception as exc:
            self.stats["errors"] += 1
            if self.state is not None:
                self.state._failed("limiter release", exc)
        finally:
            if self.releasing.get(host) is asyncio.current_task():
                del self.releasing[host]

    async def _take(self, host: str, now: float, lease_end: float, token: str) -> bool:
        """Take `host` when its `next_at` is past (creating its document on first use); False when
        another process has it. Leaves in the next batch of writes."""
        from pymongo import UpdateOne

        op = UpdateOne(
            {"_id": host, "next_at": {"$lte": now}},
            {"$set": {"next_at": lease_end, "by": token}},
            upsert=True,
        )
        write = await self._queue_write(self._takes, host, op, TAKE_WINDOW)
        try:
            return await asyncio.shield(write.done)
        except asyncio.CancelledError:
            # the request was given up while its take was on the way: if the take went through,
            # hand the host back as it was (free since `now` at the latest), never keep it leased
            def give_back(done: asyncio.Future) -> None:
                if not done.cancelled() and done.exception() is None and done.result():
                    self.releasing[host] = asyncio.ensure_future(
                        self._write_release(host, token, now)
                    )

            write.done.add_done_callback(give_back)
            raise

    async def _batched(self, queue: dict[str, _Write], host: str, op: Any, window: float) -> bool:
        write = await self._queue_write(queue, host, op, window)
        return await asyncio.shield(write.done)

    async def _queue_write(
        self, queue: dict[str, _Write], host: str, op: Any, window: float
    ) -> _Write:
        earlier = queue.get(host)
        if earlier is not None:  # never two writes of one host in a batch: after that one
            await asyncio.wait([earlier.done])
        write = queue[host] = _Write(op, asyncio.get_running_loop().create_future())
        self._send_within(0.0 if self._closing else window)
        return write

    def _send_within(self, window: float) -> None:
        """The pending batch leaves `window` seconds from now at the latest."""
        loop = asyncio.get_running_loop()
        due = loop.time() + window
        if self._batch_timer is None or due < self._batch_due:
            if self._batch_timer is not None:
                self._batch_timer.cancel()
            self._batch_due = due
            self._batch_timer = loop.call_at(due, self._send_batch)

    def _send_batch(self) -> None:
        self._batch_timer = None
        writes = [*self._releases.values(), *self._takes.values()]
        self._releases, self._takes = {}, {}
        if writes:
            task = asyncio.ensure_future(self._write_batch(writes))
            self._batches.add(task)
            task.add_done_callback(self._batches.discard)

    async def _write_batch(self, writes: list[_Write]) -> None:
        """One unordered `bulk_write` of the batch; each write's future says how it went."""
        from pymongo.errors import BulkWriteError

        refused: dict[int, dict[str, Any]] = {}
        try:
            await self._collection().bulk_write([w.op for w in writes], ordered=False)
        except BulkWriteError as exc:
            refused = {e["index"]: e for e in exc.details.get("writeErrors") or []}
        except Exception as exc:
            for write in writes:
                if not write.done.done():
                    write.done.set_exception(exc)
            return
        finally:
            self.stats["batches"] += 1
        for index, write in enumerate(writes):
            if write.done.done():
                continue
            error = refused.get(index)
            if error is None:
                write.done.set_result(True)
            elif error.get("code") == DUPLICATE_KEY:  # a take of a busy host
                write.done.set_result(False)
            else:
                write.done.set_exception(RuntimeError(f"limiter write refused: {error}"))

    async def _sweep_loop(self) -> None:
        """Hand back hosts kept for a next request that did not come (its records finished)."""
        while True:
            await asyncio.sleep(0.25)
            now = time.monotonic()
            wall = time.time()
            for host, hold in list(self.held.items()):
                if host in self.in_flight or hold.idle_since is None:
                    continue
                if now - hold.since > self.max_hold:
                    self.stats["handed_over"] += 1  # others get their turn
                    self._release(host)
                elif wall > hold.free_at + IDLE_GRACE and not (
                    self.has_work is not None and self.has_work(host)
                ):
                    self.stats["swept"] += 1
                    self._release(host)

    async def close(self) -> None:
        """Hand back every host still held, at once (other processes need not wait for the
        leases): one answered is free at its answer + delay, one whose request is still out
        (the crawl stopped midway: its connection dies with the process) `delay` from now."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        self._closing = True
        for host in list(self.held):
            hold = self.held[host]
            if host in self.in_flight or not hold.free_at:
                hold.free_at = time.time() + hold.delay
            self.in_flight.discard(host)
            self._release(host)
            self.stats["closed"] += 1
        if self._batch_timer is not None:  # now, not after the window
            self._batch_timer.cancel()
            self._send_batch()
        if self.releasing:
            await asyncio.gather(*self.releasing.values(), return_exceptions=True)
        if self._batches:
            await asyncio.gather(*self._batches, return_exceptions=True)
