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

from enrich_crawl.crawl.state import HOSTS, CrawlState, epoch_seconds

IDLE_GRACE = 0.5  # seconds a host is kept after its delay for a next request of this process
MAX_LIMITER_ERRORS = 3  # failed limiter round trips in a row before politeness goes per process


class HostBusy(Exception):
    """Another crawl process kept a host longer than a request may wait."""


def _holder_is_dead(token: Any) -> bool:
    """Whether a limiter token (`<partition>@<hostname>:<pid>:<n>`) names a process of this
    machine that no longer exists. Tokens of other machines are never judged dead: their leases
    run out by themselves."""
    if not isinstance(token, str):
        return False
    holder, _, rest = token.rpartition("@")
    hostname, _, pid_and_n = rest.partition(":")
    pid = pid_and_n.partition(":")[0]
    if not holder or hostname != socket.gethostname() or not pid.isdigit():
        return False
    import psutil

    return int(pid) != os.getpid() and not psutil.pid_exists(int(pid))


@dataclass
class _Hold:
    token: str
    lease_end: float  # epoch seconds: `next_at` of the host's document while we hold it
    since: float  # monotonic
    idle_since: float | None = None  # monotonic: answered, next local request not yet sent
    free_at: float = 0.0  # epoch: answer time + delay of the last request


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
        from pymongo.errors import DuplicateKeyError

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
        if pending is not None:
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
                # one round trip: taken when free, created when new; a busy host's document
                # does not match, and the upsert's insert then fails on its _id
                try:
                    result = await collection.update_one(
                        {"_id": host, "next_at": {"$lte": now}},
                        {"$set": {"next_at": lease_end, "by": token}},
                        upsert=True,
                    )
                except DuplicateKeyError:
                    result = None
                if result is not None and (result.matched_count or result.upserted_id is not None):
                    break
            # busy: one read per look until the host is free, then one try to take it
            doc = await collection.find_one({"_id": host})
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
        self.held[host] = _Hold(token, lease_end, time.monotonic())
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
        task = asyncio.ensure_future(self._write_release(host, hold.token, next_at))
        self.releasing[host] = task

    async def _write_release(self, host: str, token: str, next_at: float) -> None:
        try:
            await self._collection().update_one(
                {"_id": host, "by": token}, {"$set": {"next_at": next_at}}
            )
            self.stats["released"] += 1
        except Exception as exc:
            self.stats["errors"] += 1
            if self.state is not None:
                self.state._failed("limiter release", exc)
        finally:
            if self.releasing.get(host) is asyncio.current_task():
                del self.releasing[host]

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
        """Hand back every host still held (other processes need not wait for the leases)."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for host in list(self.held):
            if host not in self.in_flight:
                self._release(host)
        if self.releasing:
            await asyncio.gather(*self.releasing.values(), return_exceptions=True)
