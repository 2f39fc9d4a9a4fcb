"""Persistent crawl state in the results database, shared by every crawl process of every run.

Persistent crawl state lives in the results database (never in an unrelated global place).
The results database is the one store every crawl process reaches, on one machine or many, so the
state that must be shared lives there (collections whose names start with `_`, which a dataset name
cannot):

`_crawl_hosts`   `{_id: host, next_at: epoch seconds, by}`: the fleet-wide per-host limiter (see
                 HostLimiter).
`_crawl_robots`  `{_id: origin, status, text, http_status, fetched_at, cause}`: robots.txt verdicts,
                 reused for `robots_ttl_hours` (30 min for "unreachable/5xx: disallow for now").
`_crawl_pages`   the crawled-URL store, one document per page key (canonical URL without fragment):
                 `{_id, url (final), status, fetched_at, etag, last_modified, content_type,
                 content_hash, useful, body, reason}`. Pages that fed a mapping keep their body
                 (compressed, see `compress`; at most `max_stored_page_bytes`): a later run re-extracts them without a
                 fetch while they are fresh (`recrawl_ttl_hours`), and revalidates them with
                 If-None-Match / If-Modified-Since once stale (a 304 re-uses the stored body).
                 Pages that fed nothing keep no body: while fresh, they are known to feed nothing.
                 Permanent failures (404, 410, too large, not text, redirect loop) are remembered
                 the same way; transient ones (5xx, timeouts, DNS) are retried by the next run.
`_crawl_origins` `{_id: origin, stored_at}`: the origins that have pages in `_crawl_pages`, so that
                 a crawl asks the store only about pages of origins it knows something about (one
                 lookup per origin and run instead of one per page on a first crawl).

Everything is async (pymongo's AsyncMongoClient on the reactor's asyncio loop): the crawl never
blocks on the database. Writes are batched and flushed in the background. When the database is
unreachable, the crawl goes on without persistence and says so in its statistics.

Only plain pymongo features that nx-27017 implements are used (see DEVELOPERS.md).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import logging
import os
import socket
import time
import zlib
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from pymongo.errors import BulkWriteError

from enrich_crawl.crawl.robots import RobotsRules

logger = logging.getLogger(__name__)

HOSTS = "_crawl_hosts"
ROBOTS = "_crawl_robots"
PAGES = "_crawl_pages"
# every field of a `_crawl_pages` document (enrich_crawl.crawl.spider writes them)
PAGE_FIELDS = (
    "_id",
    "url",
    "status",
    "fetched_at",
    "etag",
    "last_modified",
    "content_type",
    "content_hash",
    "rendered",
    "useful",
    "body",
    "run_id",
    "reason",
)
ORIGINS = "_crawl_origins"  # {_id: origin, stored_at}: origins with pages in _crawl_pages

# failures worth remembering until the page is stale: asking again soon gives the same answer
PERMANENT_FAILURES = frozenset(
    {"http_404", "http_410", "too_large", "not_text", "redirect_loop", "invalid_url"}
)
# writes are batched: every database call costs the crawl process ~0.3 ms of CPU (pymongo's
# asyncio client), whatever the batch holds. Pages and origins wait up to FLUSH_INTERVAL (this
# process sees its own queued pages meanwhile); robots.txt verdicts, which other processes are
# about to need, leave within ROBOTS_FLUSH_DELAY
FLUSH_INTERVAL = 2.0
ROBOTS_FLUSH_DELAY = 0.1
IDLE_GRACE = 0.5  # seconds a host is kept after its delay for a next request of this process
MAX_LIMITER_ERRORS = 3  # failed limiter round trips in a row before politeness goes per process
FLUSH_BATCH = 200


def _epoch(value: Any) -> float | None:
    """Epoch seconds from a float, a datetime or an ISO string (nx-27017 may return strings)."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, dt.datetime):
        value = value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)
        return value.timestamp()
    try:
        parsed = dt.datetime.fromisoformat(str(value))
    except ValueError:
        return None
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.timezone.utc)).timestamp()


class BoundedSet:
    """A set that forgets its oldest members beyond `limit` (memory stays flat however many hosts
    a crawl meets; forgetting only costs a database round trip later)."""

    def __init__(self, limit: int):
        self.limit = limit
        self._items: OrderedDict[str, None] = OrderedDict()

    def __contains__(self, item: object) -> bool:
        return item in self._items

    def __len__(self) -> int:
        return len(self._items)

    def add(self, item: str) -> None:
        self._items[item] = None
        self._items.move_to_end(item)
        if len(self._items) > self.limit:
            self._items.popitem(last=False)

    def discard(self, item: str) -> None:
        self._items.pop(item, None)


# Bodies are kept compressed, by LZ4 through pyarrow (a dependency anyway): every page the crawl
# keeps is compressed once, on the crawl's critical path, and LZ4 does it in half the time of
# zstd's fastest level (a third of the size of the page against a quarter; a MongoDB server
# compresses its storage again). A blob carries a 6-byte header, magic and size (pyarrow needs the
# size to decompress), which also tells it from the zstd bodies and the zlib bodies of earlier
# versions (a zlib stream never starts with "L" or "Z"), still read back.
_MAGIC_CODECS = {b"L4": "lz4", b"ZS": "zstd"}
_WRITE_MAGIC = b"L4"


@functools.lru_cache(maxsize=4)
def _codec(name: str) -> Any:
    try:
        import pyarrow as pa

        return pa.Codec(name) if pa.Codec.is_available(name) else None
    except ImportError:  # pragma: no cover - pyarrow is a dependency
        return None


def compress(body: bytes) -> bytes:
    """A page body as the crawled-URL store and the run's page cache keep it."""
    codec = _codec(_MAGIC_CODECS[_WRITE_MAGIC])
    if codec is None:
        return zlib.compress(body, 1)
    return _WRITE_MAGIC + len(body).to_bytes(4, "big") + codec.compress(body, asbytes=True)


def decompress(data: bytes) -> bytes:
    """The body `compress` made (or a zstd or zlib body of an earlier version)."""
    data = bytes(data)
    name = _MAGIC_CODECS.get(data[:2])
    if name is not None:
        size = int.from_bytes(data[2:6], "big")
        return _codec(name).decompress(data[6:], decompressed_size=size, asbytes=True)
    return zlib.decompress(data)


def stored_body(page: Any) -> bytes:
    """The page's body compressed, made once per page for whatever keeps it (the crawled-URL
    store, the run's page cache); a page read back from one of them starts with its bytes."""
    blob = page.__dict__.get("_stored_body")
    if blob is None:
        blob = page.__dict__["_stored_body"] = compress(page.body)
    return blob


class ByIdReads:
    """`find({_id: {$in: [...]}})` once for every key asked within `window` seconds: the
    robots.txt verdicts of all the hosts a burst of requests meets (a batch of records starting,
    a page full of links) in one database call instead of one each."""

    def __init__(self, state: CrawlState, collection: str, window: float = 0.005):
        self.state = state
        self.collection = collection
        self.window = window
        self.waiting: dict[str, asyncio.Future] = {}
        self._timer: asyncio.TimerHandle | None = None

    async def get(self, key: str) -> dict[str, Any] | None:
        future = self.waiting.get(key)
        if future is None:
            loop = asyncio.get_running_loop()
            future = self.waiting[key] = loop.create_future()
            if self._timer is None:
                self._timer = loop.call_later(self.window, self._start)
        return await asyncio.shield(future)

    def _start(self) -> None:
        self._timer = None
        waiting, self.waiting = self.waiting, {}
        self.state._background(self._read(waiting))

    async def _read(self, waiting: dict[str, asyncio.Future]) -> None:
        try:
            docs = await (
                self.state.db[self.collection].find({"_id": {"$in": list(waiting)}}).to_list(None)
            )
        except Exception as exc:
            for future in waiting.values():
                if not future.done():
                    future.set_exception(exc)
            return
        self.state.stats[f"reads/{self.collection}"] += 1
        found = {doc["_id"]: doc for doc in docs}
        for key, future in waiting.items():
            if not future.done():
                future.set_result(found.get(key))


class CrawlState:
    """The results database as the crawl's memory across processes and runs."""

    def __init__(self, uri: str, db: str, *, worker: str = "", timeout_ms: int = 10000):
        self.uri = uri
        self.db_name = db
        self.worker = worker or f"{socket.gethostname()}:{os.getpid()}"
        self.timeout_ms = timeout_ms
        self.client: Any = None
        self.db: Any = None
        self.pending: dict[str, list[Any]] = {ROBOTS: [], PAGES: [], ORIGINS: []}
        # page documents queued and not yet written (with their write): what `pages_get` must see
        self.unflushed: dict[str, tuple[Any, dict[str, Any]]] = {}
        self.origins: OrderedDict[str, bool] = OrderedDict()  # origin -> has stored pages
        self.marked = BoundedSet(100_000)  # origins this process recorded in ORIGINS
        self.stats: Counter[str] = Counter()
        self.available = True
        self._flusher: asyncio.Task | None = None
        self._soon: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task] = set()  # background flushes and reads
        self._robots_reads = ByIdReads(self, ROBOTS)
        self._flush_lock: asyncio.Lock | None = None
        self._write_error_logged = False

    # -- life cycle ------------------------------------------------------------------------------

    async def open(self) -> None:
        from pymongo import AsyncMongoClient

        self.client = AsyncMongoClient(
            self.uri,
            serverSelectionTimeoutMS=self.timeout_ms,
            connectTimeoutMS=self.timeout_ms,
            appname="enrich_crawl.crawl",
        )
        self.db = self.client[self.db_name]
        self._flush_lock = asyncio.Lock()
        self._flusher = asyncio.ensure_future(self._flush_loop())

    async def close(self) -> None:
        if self._flusher is not None:
            self._flusher.cancel()
            self._flusher = None
        if self._soon is not None:
            self._soon.cancel()
            self._soon = None
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.flush()
        if self.client is not None:
            try:
                await self.client.close()
            except Exception:  # closing must never fail a crawl
                logger.debug("closing the state client failed", exc_info=True)
            self.client = None

    def _failed(self, what: str, exc: BaseException) -> None:
        self.stats[f"errors/{what}"] += 1
        if self.available:
            logger.warning("crawl state unavailable (%s: %s): going on without it", what, exc)
        self.available = False

    # -- batched writes --------------------------------------------------------------------------

    def _queue(self, collection: str, op: Any) -> None:
        self.pending[collection].append(op)

    def _flush_soon(self) -> None:
        if self.db is None or self._soon is not None:
            return
        self._soon = asyncio.get_event_loop().call_later(ROBOTS_FLUSH_DELAY, self._flush_now)

    def _flush_now(self) -> None:
        self._soon = None
        self._background(self.flush(ROBOTS))

    def _background(self, coroutine: Any) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_INTERVAL)
            try:
                await self.flush()
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.debug("state flush failed", exc_info=True)

    async def flush(self, only: str | None = None) -> None:
        """Write what is queued (for the collection `only`, or all)."""
        if self.db is None or self._flush_lock is None:
            return
        async with self._flush_lock:
            for name, ops in self.pending.items():
                while ops and only in (None, name):
                    batch, ops[:] = ops[:FLUSH_BATCH], ops[FLUSH_BATCH:]
                    try:
                        await self.db[name].bulk_write(batch, ordered=False)
                        self.stats[f"writes/{name}"] += len(batch)
                        if name == PAGES:
                            self._written(batch)
                    except BulkWriteError as exc:
                        # documents the server refused, one by one: the rest of the batch
                        # (unordered) was written, and the database is still there
                        refused = exc.details.get("writeErrors") or []
                        self.stats[f"writes/{name}"] += len(batch) - len(refused)
                        if name == PAGES:
                            self._written(batch)
                        self.stats[f"write_errors/{name}"] += len(refused)
                        if refused and not self._write_error_logged:
                            self._write_error_logged = True
                            logger.warning(
                                "%s: %d of %d documents refused (%s); going on",
                                name,
                                len(refused),
                                len(batch),
                                refused[0].get("errmsg"),
                            )
                    except Exception as exc:
                        self._failed(f"write {name}", exc)
                        ops.clear()
                        if name == PAGES:
                            self.unflushed.clear()

    def _written(self, batch: list[Any]) -> None:
        """Page documents of `batch` are in the database now (or were refused): not pending."""
        done = {id(op) for op in batch}
        for key in [k for k, (op, _) in self.unflushed.items() if id(op) in done]:
            del self.unflushed[key]

    # -- robots.txt cache ------------------------------------------------------------------------

    async def robots_get(self, origin: str, ttl_seconds: float) -> RobotsRules | None:
        if self.db is None:
            return None
        try:
            doc = await self._robots_reads.get(origin)
        except Exception as exc:
            self._failed("robots read", exc)
            return None
        if doc is None:
            return None
        doc["fetched_at"] = _epoch(doc.get("fetched_at")) or 0.0
        try:
            rules = RobotsRules.from_doc(doc)
        except (KeyError, TypeError, ValueError):
            return None
        if rules.expired(ttl_seconds):
            return None
        return rules

    def robots_put(self, rules: RobotsRules) -> None:
        from pymongo import ReplaceOne

        doc = rules.to_doc()
        self._queue(ROBOTS, ReplaceOne({"_id": doc["_id"]}, doc, upsert=True))
        self._flush_soon()

    # -- crawled-URL store -----------------------------------------------------------------------

    async def origins_with_pages(self, origins: Iterable[str]) -> set[str]:
        """Those of `origins` that have pages in the store (cached for the run)."""
        origins = set(origins)
        unknown = [o for o in origins if o not in self.origins]
        if unknown and self.db is not None:
            try:
                docs = await self.db[ORIGINS].find({"_id": {"$in": unknown}}).to_list(None)
            except Exception as exc:
                self._failed("origins read", exc)
                docs = None
            if docs is not None:
                found = {d["_id"] for d in docs}
                for origin in unknown:
                    self.origins[origin] = origin in found
                while len(self.origins) > 200_000:
                    self.origins.popitem(last=False)
        return {o for o in origins if self.origins.get(o)}

    def mark_origin(self, origin: str) -> None:
        """`origin` has (or will have) pages in the store."""
        if origin in self.marked:
            return
        from pymongo import ReplaceOne

        self.marked.add(origin)
        doc = {"_id": origin, "stored_at": time.time()}
        self._queue(ORIGINS, ReplaceOne({"_id": origin}, doc, upsert=True))

    async def pages_get(self, keys: Iterable[str]) -> dict[str, dict[str, Any]]:
        keys = list(dict.fromkeys(keys))
        if self.db is None or not keys:
            return {}
        out = {}
        for key in keys:  # queued by this process, not written yet
            pending = self.unflushed.get(key)
            if pending is not None:
                out[key] = dict(pending[1])
        ask = [key for key in keys if key not in out]
        try:
            docs = await self.db[PAGES].find({"_id": {"$in": ask}}).to_list(None) if ask else []
        except Exception as exc:
            self._failed("pages read", exc)
            return out
        for doc in docs:
            doc["fetched_at"] = _epoch(doc.get("fetched_at")) or 0.0
            out[doc["_id"]] = doc
        self.stats["pages_looked_up"] += len(keys)
        self.stats["pages_known"] += len(out)
        return out

    def page_put(self, doc: dict[str, Any]) -> None:
        # `$set` of every field a page document can have (absent ones as null): a replacement,
        # written as an update because some MongoDB-wire servers (nx-27017) refuse to replace a
        # stored document that holds binary data
        from pymongo import UpdateOne

        fields = dict.fromkeys(PAGE_FIELDS) | doc
        del fields["_id"]
        op = UpdateOne({"_id": doc["_id"]}, {"$set": fields}, upsert=True)
        self._queue(PAGES, op)
        self.unflushed[doc["_id"]] = (op, {**fields, "_id": doc["_id"]})

    # -- records already resolved ----------------------------------------------------------------

    async def fresh_fields(
        self, collection: str, wanted: dict[str, list[str]], ttl_seconds: float
    ) -> dict[str, set[str]]:
        """For each record id, the wanted fields whose value in the results collection was fetched
        less than `ttl_seconds` ago (`lineage.<field>.fetched_at` of the results)."""
        if self.db is None or not wanted or ttl_seconds <= 0:
            return {}
        try:
            docs = await (
                self.db[collection]
                .find({"_id": {"$in": list(wanted)}}, {"data": 1, "lineage": 1})
                .to_list(None)
            )
        except Exception as exc:
            self._failed("results read", exc)
            return {}
        now = time.time()
        fresh: dict[str, set[str]] = {}
        for doc in docs:
            data = doc.get("data") or {}
            lineage = doc.get("lineage") or {}
            found = set()
            for name in wanted.get(doc["_id"], ()):
                entry = lineage.get(name)
                if not isinstance(entry, dict) or data.get(name) is None:
                    continue
                fetched = _epoch(entry.get("fetched_at"))
                if fetched is not None and now - fetched < ttl_seconds:
                    found.add(name)
            if found:
                fresh[doc["_id"]] = found
        return fresh


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
            if doc is None or (_epoch(doc.get("next_at")) or 0.0) <= time.time():
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
            wait = (_epoch(doc.get("next_at")) or 0.0) - time.time()
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
