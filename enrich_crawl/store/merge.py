"""Merge resolved records into MongoDB with per-field lineage, idempotently (docs/results.md).

What one record's document becomes is enrich_crawl.store.document (the merge policy); this module
writes the documents.

Writing: documents are computed from the existing document and written whole, in unordered bulk
batches: `InsertOne` for a record known to be absent, `ReplaceOne(upsert=True)` for one that changed,
nothing for one that did not (a re-run writes nothing). Replaying a batch gives the same documents,
so batches are retried with backoff on transient errors (network, primary stepdown, shutdown). An
insert that meets a duplicate key (another writer, or our own write that was applied before the
connection dropped) is re-merged against the document now there: nothing is overwritten blindly.
Batches are built while the previous one is being written (one writer thread): the server and the
Python work overlap.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from pymongo import InsertOne, ReplaceOne
from pymongo.collection import Collection
from pymongo.errors import BulkWriteError, ConnectionFailure, OperationFailure, PyMongoError

from enrich_crawl.store.document import (
    HISTORY_LIMIT,
    Changes,
    as_datetime,
    build_document,
    to_ms,
)

__all__ = [
    "BATCH_SIZE",
    "HISTORY_LIMIT",
    "MergeError",
    "MergeStats",
    "Merger",
    "WriteRetry",
    "build_document",
    "rerun_command",
]

BATCH_SIZE = 2000

DUPLICATE_KEY = frozenset({11000, 11001})
# errors after which the same write may succeed: network, not-primary/stepdown, shutdown, timeouts
TRANSIENT_CODES = frozenset(
    {6, 7, 64, 89, 91, 189, 262, 9001, 10107, 11600, 11602, 13435, 13436, 50, 134}
)


@dataclass(frozen=True)
class WriteRetry:
    """Retries of a failed read or batch: `attempts` more tries, waiting initial_delay, then twice
    as long each time up to max_delay (defaults: 6 retries over about half a minute)."""

    attempts: int = 6
    initial_delay: float = 0.5
    max_delay: float = 16.0


class MergeError(RuntimeError):
    """The merge could not complete. The staged results are untouched: re-running the merge
    completes it (records already written compare equal and are skipped)."""

    def __init__(self, message: str, *, partition: str | None = None, kind: str = "unavailable"):
        super().__init__(message)
        self.partition = partition
        self.kind = kind  # unavailable | rejected | error


@dataclass
class MergeStats:
    records: int = 0
    inserted: int = 0
    updated: int = 0
    unchanged: int = 0
    fields_filled: int = 0
    fields_refreshed: int = 0
    fields_kept: int = 0
    fields_superseded: int = 0
    per_field: dict[str, int] = field(default_factory=dict)
    status: dict[str, int] = field(default_factory=dict)
    conflicts: int = 0
    retries: int = 0
    races: int = 0
    duplicate_lines: int = 0
    batches: int = 0
    failed: list[dict[str, Any]] = field(default_factory=list)

    @property
    def written(self) -> int:
        return self.inserted + self.updated

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "written": self.written}


@dataclass
class _Op:
    line: dict[str, Any]
    doc: dict[str, Any]
    changes: Changes
    insert: bool  # InsertOne (known absent) or ReplaceOne(upsert)
    existed: bool


@dataclass
class _Outcome:
    written: list[_Op] = field(default_factory=list)
    duplicates: list[_Op] = field(default_factory=list)
    failed: list[dict[str, Any]] = field(default_factory=list)
    retries: int = 0


def _transient(exc: BaseException) -> bool:
    if isinstance(exc, ConnectionFailure):  # AutoReconnect, NotPrimaryError, timeouts, selection
        return True
    if isinstance(exc, OperationFailure):
        return exc.code in TRANSIENT_CODES or exc.has_error_label("RetryableWriteError")
    return False


def _short(exc: BaseException, limit: int = 300) -> str:
    """The first line of an error (pymongo appends a long topology description)."""
    text = str(exc).split(", Timeout:")[0].split("\n")[0]
    name = type(exc).__name__
    return f"{name}: {text[:limit]}" if text else name


def _batches(lines: Iterable[dict[str, Any]], size: int) -> Iterator[list[dict[str, Any]]]:
    batch: list[dict[str, Any]] = []
    for line in lines:
        batch.append(line)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


class Merger:
    """Merges resolved lines (one per record, `resolved/<partition>.jsonl`) into one collection.

    One Merger per materialisation: it notes at the start whether the collection is empty, and then
    skips reading existing documents for partitions it has not merged yet (their ids cannot be there
    but through a concurrent writer, which the duplicate-key re-merge handles).
    """

    def __init__(
        self,
        collection: Collection,
        *,
        fields: dict[str, dict[str, Any]],
        run_id: str,
        now: dt.datetime | None = None,
        batch_size: int = BATCH_SIZE,
        retry: WriteRetry | None = None,
        fresh: bool | None = None,
        progress: Callable[[str, MergeStats], None] | None = None,
    ) -> None:
        self.collection = collection
        self.fields = fields
        self.run_id = run_id
        self.now = to_ms(now or dt.datetime.now(dt.timezone.utc))
        self.batch_size = max(1, batch_size)
        self.retry = retry or WriteRetry()
        self.progress = progress
        self._abort = threading.Event()
        self._merged: set[str] = set()
        self._partition = ""
        self.fresh = self._is_empty() if fresh is None else fresh

    # reads, retried like writes
    def _call(self, what: str, fn: Callable[[], Any]) -> Any:
        delay = self.retry.initial_delay
        for attempt in range(self.retry.attempts + 1):
            try:
                return fn()
            except PyMongoError as exc:
                if not _transient(exc):
                    raise MergeError(
                        f"{what} failed: {_short(exc)}", partition=self._partition, kind="error"
                    ) from exc
                if attempt == self.retry.attempts or self._abort.is_set():
                    raise MergeError(
                        f"MongoDB unavailable ({what}) after {attempt} retries: {_short(exc)}",
                        partition=self._partition,
                    ) from exc
            self._abort.wait(delay)
            delay = min(delay * 2, self.retry.max_delay)
        raise AssertionError("unreachable")

    def _is_empty(self) -> bool:
        return (
            self._call("checking the collection", lambda: self.collection.find_one({}, {"_id": 1}))
            is None
        )

    def _read(self, ids: list[str]) -> dict[str, dict[str, Any]]:
        def read() -> dict[str, dict[str, Any]]:
            return {doc["_id"]: doc for doc in self.collection.find({"_id": {"$in": ids}})}

        return self._call("reading existing documents", read)

    def _write(self, ops: list[_Op]) -> _Outcome:
        """Write one batch; transient failures are retried (only the ops not yet confirmed)."""
        outcome = _Outcome()
        remaining = ops
        delay = self.retry.initial_delay
        attempt = 0
        while remaining:
            requests = [
                InsertOne(op.doc)
                if op.insert
                else ReplaceOne({"_id": op.doc["_id"]}, op.doc, upsert=True)
                for op in remaining
            ]
            try:
                self.collection.bulk_write(requests, ordered=False)
                outcome.written.extend(remaining)
                return outcome
            except BulkWriteError as exc:
                cause: BaseException = exc
                details = exc.details or {}
                retry: list[_Op] = []
                failed_at: set[int] = set()
                for error in details.get("writeErrors", []):
                    index, code = error.get("index"), error.get("code")
                    op = remaining[index]
                    failed_at.add(index)
                    if code in DUPLICATE_KEY and op.insert:
                        outcome.duplicates.append(op)
                    elif code in TRANSIENT_CODES or code in DUPLICATE_KEY:  # upsert race
                        retry.append(op)
                    else:
                        outcome.failed.append(
                            {
                                "record": op.doc["_id"],
                                "code": code,
                                "reason": str(error.get("errmsg", ""))[:200],
                            }
                        )
                applied = [op for i, op in enumerate(remaining) if i not in failed_at]
                if details.get("writeConcernErrors"):
                    retry.extend(applied)  # applied but not confirmed durable: write again
                else:
                    outcome.written.extend(applied)
                remaining = retry
                if not remaining:
                    return outcome
            except PyMongoError as exc:
                if not _transient(exc):
                    raise MergeError(
                        f"bulk write failed: {_short(exc)}", partition=self._partition, kind="error"
                    ) from exc
                cause = exc  # unknown which ops were applied: replay all (inserts may meet dups)
            attempt += 1
            if attempt > self.retry.attempts or self._abort.is_set():
                raise MergeError(
                    f"MongoDB unavailable after {attempt - 1} retries: {_short(cause)}",
                    partition=self._partition,
                )
            outcome.retries += 1
            self._abort.wait(delay)
            delay = min(delay * 2, self.retry.max_delay)
        return outcome

    def _account(self, stats: MergeStats, op: _Op) -> None:
        if op.existed:
            stats.updated += 1
        else:
            stats.inserted += 1
        self._count_changes(stats, op.changes)

    @staticmethod
    def _count_changes(stats: MergeStats, changes: Changes) -> None:
        stats.fields_filled += len(changes.filled)
        stats.fields_refreshed += len(changes.refreshed)
        stats.fields_superseded += len(changes.superseded)
        stats.fields_kept += changes.kept
        stats.conflicts += changes.conflicts
        for name in (*changes.filled, *changes.refreshed):
            stats.per_field[name] = stats.per_field.get(name, 0) + 1

    def _build(self, line: dict[str, Any], old: dict[str, Any] | None, partition: str):
        return build_document(
            line, old, fields=self.fields, run_id=self.run_id, partition=partition, now=self.now
        )

    def _plan(self, batch: list[dict[str, Any]], partition: str, stats: MergeStats, fresh: bool):
        existing = {} if fresh else self._read([line["record"] for line in batch])
        ops: list[_Op] = []
        for line in batch:
            old = existing.get(line["record"])
            doc, changed, changes = self._build(line, old, partition)
            stats.status[doc["status"]] = stats.status.get(doc["status"], 0) + 1
            if changed:
                ops.append(_Op(line, doc, changes, insert=old is None, existed=old is not None))
            else:
                stats.unchanged += 1
                stats.fields_kept += changes.kept
        return ops

    def _collect(self, future: Future, stats: MergeStats, partition: str) -> None:
        outcome: _Outcome = future.result()
        stats.retries += outcome.retries
        stats.failed.extend(outcome.failed)
        for op in outcome.written:
            self._account(stats, op)
        if outcome.duplicates:
            self._remerge(outcome.duplicates, stats, partition)
        stats.batches += 1
        if self.progress is not None:
            self.progress(partition, stats)

    def _remerge(self, ops: list[_Op], stats: MergeStats, partition: str) -> None:
        """Inserts that met an existing document: ours (applied before a lost reply) or another
        writer's. Merge again against what is there."""
        existing = self._read([op.doc["_id"] for op in ops])
        again: list[_Op] = []
        for op in ops:
            old = existing.get(op.doc["_id"])
            if old is not None and as_datetime(old.get("updated_at")) == self.now:
                self._account(stats, op)  # our own insert, applied before the connection dropped
                continue
            stats.races += 1
            doc, changed, changes = self._build(op.line, old, partition)
            if changed:
                again.append(_Op(op.line, doc, changes, insert=False, existed=old is not None))
            else:
                stats.unchanged += 1
        if again:
            outcome = self._write(again)
            stats.retries += outcome.retries
            stats.failed.extend(outcome.failed)
            for op in outcome.written:
                self._account(stats, op)

    def merge(self, lines: Iterable[dict[str, Any]], *, partition: str) -> MergeStats:
        """Merge one partition's resolved lines; returns counts. Raises MergeError when MongoDB
        stays unavailable or refuses documents (nothing staged is lost: re-run the merge)."""
        self._partition = partition
        fresh = self.fresh and partition not in self._merged
        self._merged.add(partition)
        stats = MergeStats()
        seen: set[str] = set()
        pending: deque[Future] = deque()
        self._abort.clear()
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="merge-writer")
        try:
            for batch in _batches(lines, self.batch_size):
                unique = []
                for line in batch:
                    if line["record"] in seen:
                        stats.duplicate_lines += 1  # one line per record: the first wins
                        continue
                    seen.add(line["record"])
                    unique.append(line)
                stats.records += len(unique)
                ops = self._plan(unique, partition, stats, fresh)
                if ops:
                    pending.append(pool.submit(self._write, ops))
                while len(pending) > 1:
                    self._collect(pending.popleft(), stats, partition)
            while pending:
                self._collect(pending.popleft(), stats, partition)
        except MergeError as exc:
            self._abort.set()
            raise MergeError(
                f"{exc} ({stats.written} of the partition's records written before the failure)",
                partition=partition,
                kind=exc.kind,
            ) from exc.__cause__
        except BaseException:
            self._abort.set()
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        if stats.failed:
            sample = "; ".join(
                f"{f['record']}: {f['code']} {f['reason']}" for f in stats.failed[:3]
            )
            raise MergeError(
                f"MongoDB refused {len(stats.failed)} document(s) of partition {partition} "
                f"(the other {stats.written} were written): {sample}",
                partition=partition,
                kind="rejected",
            )
        return stats


def rerun_command(partitions: list[str]) -> str:
    """The command that re-runs just the merge of `partitions` (staged results, no re-crawl)."""
    base = "dagster asset materialize -m enrich_crawl.definitions --select enriched_records"
    if len(partitions) == 1:
        return f"{base} --partition {partitions[0]}"
    return f"{base} --partition-range {partitions[0]}...{partitions[-1]}"
