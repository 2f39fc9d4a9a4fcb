"""Persistent crawl state in the results database, shared by every crawl process of every run.

Persistent crawl state lives in the results database (never in an unrelated global place).
The results database is the one store every crawl process reaches, on one machine or many, so the
state that must be shared lives there (collections whose names start with `_`, which a dataset name
cannot):

`_crawl_hosts`   `{_id: host, next_at: epoch seconds, by}`: the fleet-wide per-host limiter (see
                 enrich_crawl.crawl.host_limiter).
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
import base64
import datetime as dt
import functools
import json
import logging
import os
import socket
import time
import zlib
from collections import Counter, OrderedDict
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Generic, TypeVar

from pymongo.errors import BulkWriteError

from enrich_crawl.crawl.robots import RobotsRules

logger = logging.getLogger(__name__)

T = TypeVar("T")

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
# asyncio client), whatever the batch holds. Pages and origins wait up to FLUSH_INTERVAL, or until
# FLUSH_BATCH pages are queued (this process sees its own queued pages meanwhile; a killed process
# loses at most those, which the next run fetches again); robots.txt verdicts, which other
# processes may need, leave within ROBOTS_FLUSH_DELAY, all those of that second in one write (a
# process that asks before then fetches robots.txt itself, through the limiter like any request)
FLUSH_INTERVAL = 5.0
ROBOTS_FLUSH_DELAY = 1.0
FLUSH_BATCH = 200


def spill_dir(out_dir: str | Path, database: str) -> Path:
    """Where a crawl keeps the pages the database could not take: beside the dataset's crawl
    folders (`<stage>/pending_pages/<database>/`), the same for every shard and attempt."""
    out = Path(out_dir).resolve()
    for parent in (out, *out.parents):
        if parent.name == "crawl":
            return parent.parent / "pending_pages" / database
    return out / "pending_pages" / database


def _encode_spilled(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        return {"$bytes": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, dt.datetime):
        return value.isoformat()
    raise TypeError(f"cannot keep {type(value).__name__} on disk")


def _decode_spilled(obj: dict[str, Any]) -> Any:
    if set(obj) == {"$bytes"}:
        return base64.b64decode(obj["$bytes"])
    return obj


def epoch_seconds(value: Any) -> float | None:
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


class BoundedSet(Generic[T]):
    """A set that forgets its oldest members beyond `limit` (memory stays flat however many hosts
    a crawl meets; forgetting only costs a database round trip later)."""

    def __init__(self, limit: int):
        self.limit = limit
        self._items: OrderedDict[T, None] = OrderedDict()

    def __contains__(self, item: object) -> bool:
        return item in self._items

    def __len__(self) -> int:
        return len(self._items)

    def add(self, item: T) -> None:
        self._items[item] = None
        self._items.move_to_end(item)
        if len(self._items) > self.limit:
            self._items.popitem(last=False)

    def discard(self, item: T) -> None:
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
    blob = page.stored_body
    if blob is None:
        blob = page.stored_body = compress(page.body)
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
        # origins this process recorded in ORIGINS
        self.marked: BoundedSet[str] = BoundedSet(100_000)
        self.stats: Counter[str] = Counter()
        self.available = True
        self._flusher: asyncio.Task | None = None
        self._soon: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task] = set()  # background flushes and reads
        # a new host's verdict waits up to 50 ms for those of the other hosts met meanwhile
        self._robots_reads = ByIdReads(self, ROBOTS, window=0.05)
        self._flush_lock: asyncio.Lock | None = None
        self._write_error_logged = False
        # pages the database could not take (it went away mid-crawl) go to a file here, and the
        # next crawl that reaches the database writes them into the store first: what was
        # fetched is not fetched again (see spill_pages / replay_spilled_pages)
        self.spill_dir: Path | None = None

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
        if not self.available:
            # the database is gone: keep the pages on disk now rather than after a timeout
            # (the process may not live that long once its run is stopped)
            self.spill_pages()
            self.unflushed.clear()
            self.pending[PAGES].clear()
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
                    self.stats[f"batches/{name}"] += 1
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
                            self.spill_pages()
                            self.unflushed.clear()

    # -- pages kept on disk while the database is away -------------------------------------------

    def _spill_file(self) -> Path | None:
        if self.spill_dir is None:
            return None
        name = "".join(c if c.isalnum() or c in "-_." else "_" for c in self.worker)
        return self.spill_dir / f"{name}.jsonl"

    def _spill(self, docs: list[dict[str, Any]]) -> None:
        path = self._spill_file()
        if path is None or not docs:
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a", encoding="utf-8") as fh:
                for doc in docs:
                    fh.write(json.dumps(doc, default=_encode_spilled) + "\n")
            self.stats["pages_spilled_to_disk"] += len(docs)
        except OSError as exc:
            logger.warning("could not keep %d page(s) for the next run: %s", len(docs), exc)

    def spill_pages(self) -> None:
        """The page documents not written yet, to the spill file (the database went away)."""
        self._spill([dict(doc) for _op, doc in self.unflushed.values()])

    async def replay_spilled_pages(self) -> int:
        """Write the pages an earlier crawl kept on disk into the store (and their origins); each
        file is claimed by renaming it, so two crawls never replay one twice."""
        from pymongo import ReplaceOne, UpdateOne

        from enrich_crawl.crawl.robots import origin_of

        if self.spill_dir is None or self.db is None or not self.spill_dir.is_dir():
            return 0
        replayed = 0
        for path in sorted(self.spill_dir.glob("*.jsonl")):
            claimed = path.with_name(f"{path.name}.{os.getpid()}.replaying")
            try:
                os.replace(path, claimed)
            except OSError:
                continue  # another crawl took it
            docs = []
            for line in claimed.read_text("utf-8").splitlines():
                try:
                    docs.append(json.loads(line, object_hook=_decode_spilled))
                except ValueError:
                    continue  # a line cut short when the crawl was killed
            ops = [
                UpdateOne(
                    {"_id": d["_id"]}, {"$set": {k: v for k, v in d.items() if k != "_id"}}, True
                )
                for d in docs
            ]
            origins = {origin_of(d["_id"]) for d in docs}
            now = time.time()
            try:
                for start in range(0, len(ops), FLUSH_BATCH):
                    await self.db[PAGES].bulk_write(ops[start : start + FLUSH_BATCH], ordered=False)
                if origins:
                    await self.db[ORIGINS].bulk_write(
                        [
                            ReplaceOne({"_id": o}, {"_id": o, "stored_at": now}, True)
                            for o in origins
                        ],
                        ordered=False,
                    )
            except Exception as exc:  # still away: keep the file for the next crawl
                os.replace(claimed, path)
                self._failed("replay spilled pages", exc)
                return replayed
            claimed.unlink(missing_ok=True)
            for origin in origins:
                self.origins[origin] = True
            replayed += len(docs)
        self.stats["pages_replayed_from_disk"] += replayed
        return replayed

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
        doc["fetched_at"] = epoch_seconds(doc.get("fetched_at")) or 0.0
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
            doc["fetched_at"] = epoch_seconds(doc.get("fetched_at")) or 0.0
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
        if not self.available and self.spill_dir is not None:
            # the database is gone: straight to the spill file, the next run stores it
            self._spill([{**fields, "_id": doc["_id"]}])
            return
        op = UpdateOne({"_id": doc["_id"]}, {"$set": fields}, upsert=True)
        self._queue(PAGES, op)
        self.unflushed[doc["_id"]] = (op, {**fields, "_id": doc["_id"]})
        if len(self.pending[PAGES]) >= FLUSH_BATCH and self.db is not None:
            self._background(self.flush(PAGES))  # a full batch need not wait for the interval

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
                fetched = epoch_seconds(entry.get("fetched_at"))
                if fetched is not None and now - fetched < ttl_seconds:
                    found.add(name)
            if found:
                fresh[doc["_id"]] = found
        return fresh
