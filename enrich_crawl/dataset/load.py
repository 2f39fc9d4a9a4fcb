"""Load a dirty table, clean it, profile it and write it out sharded for the crawl.

The table is streamed in batches (`enrich_crawl.dataset.read`), each batch is cleaned column by
column with Arrow kernels (`enrich_crawl.dataset.clean`) and its usable records are appended to
their shard's Parquet file, so memory stays bounded by the batch size whatever the table's size and
the table is materialised once. Nothing is dropped silently: malformed rows, rows without an id and
rows with a duplicate id go to `rejected.jsonl` with their row number, line and reason.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from enrich_crawl.dataset.clean import ChunkCleaner, CleanChunk
from enrich_crawl.dataset.columns import (
    DatasetError,
    check_columns,
    near_miss_fields,
    near_miss_warnings,
)
from enrich_crawl.dataset.profile import TYPE_ERROR_SAMPLE, FieldProfile, Profile
from enrich_crawl.dataset.read import BATCH_ROWS, RawBatch, ReadError, open_reader
from enrich_crawl.dataset.seedfile import read_seed_shard
from enrich_crawl.dataset.spec import DatasetSpec, SpecError
from enrich_crawl.staging import DatasetStage, atomic_write, dumps, write_json

logger = logging.getLogger(__name__)

__all__ = [
    "CHUNK_ROWS",
    "SEED_SCHEMA",
    "DatasetError",
    "FieldProfile",
    "Profile",
    "prepare_dataset",
    "read_seed_shard",
]

CHUNK_ROWS = BATCH_ROWS  # JSONL and Parquet batch size; CSV batches are ~8 MB of text
SHARD_ROW_GROUP = 8192  # records per row group of a seed shard
SEED_SCHEMA = pa.schema(
    [
        ("_id", pa.string()),
        ("_row", pa.int64()),
        ("_urls", pa.list_(pa.string())),
        ("_url_errors", pa.string()),
        ("_missing", pa.list_(pa.string())),
        ("_data", pa.string()),
        ("_raw", pa.string()),
        # extensions (docs/ARCHITECTURE.md): where the record starts in the file, and the cells
        # that could not be coerced to their field's type
        ("_line", pa.int64()),
        ("_cell_errors", pa.string()),
    ]
)


# -- ids: first wins ----------------------------------------------------------------------------


class IdIndex:
    """The row of the first record of every id seen, in 16 bytes per id (a 64-bit hash and a row).

    Sorted runs merged like a log-structured tree, so adding N ids costs O(N log N) and looking
    one up O(log^2 N). Two distinct ids share a 64-bit hash with probability ~N^2/2^65 (1e-6 for
    6 million ids); such a record would be reported as a duplicate in rejected.jsonl, not lost.
    """

    def __init__(self) -> None:
        self.runs: list[tuple[np.ndarray, np.ndarray]] = []

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        found = np.full(len(keys), -1, dtype=np.int64)
        for run_keys, run_rows in self.runs:
            pos = np.searchsorted(run_keys, keys)
            pos[pos == len(run_keys)] = 0
            hit = run_keys[pos] == keys
            found[hit] = run_rows[pos[hit]]
        return found

    def add(self, keys: np.ndarray, rows: np.ndarray) -> None:
        """Add new ids (sorted, unique, none seen before)."""
        if not len(keys):
            return
        self.runs.append((keys, rows))
        while len(self.runs) >= 2 and len(self.runs[-2][0]) <= 2 * len(self.runs[-1][0]):
            (k1, r1), (k2, r2) = self.runs.pop(), self.runs.pop()
            keys_all = np.concatenate([k2, k1])
            order = np.argsort(keys_all, kind="stable")
            self.runs.append((keys_all[order], np.concatenate([r2, r1])[order]))

    def first_rows(self, ids: pa.Array, rows: np.ndarray) -> np.ndarray:
        """For each id (null: -1): the row where it was first seen, this batch included."""
        out = np.full(len(ids), -1, dtype=np.int64)
        valid = np.asarray(pc.is_valid(ids).to_numpy(zero_copy_only=False), dtype=bool)
        if not valid.any():
            return out
        values = ids.filter(pa.array(valid)).to_numpy(zero_copy_only=False)
        hashes = pd.util.hash_array(values, categorize=False)
        unique, first, inverse = np.unique(hashes, return_index=True, return_inverse=True)
        own_rows = rows[valid]
        earlier = self.lookup(unique)
        new = earlier < 0
        self.add(unique[new], own_rows[first][new])
        winner = np.where(new, own_rows[first], earlier)
        out[valid] = winner[inverse.reshape(-1)]
        return out


# -- shard files --------------------------------------------------------------------------------


class ShardWriters:
    """One Parquet writer per shard, opened on first use; each batch appended as a row group."""

    def __init__(self, stage: DatasetStage, keys: list[str]):
        self.stage = stage
        self.keys = keys
        self.writers: dict[str, pq.ParquetWriter] = {}
        self.tmp_paths: dict[str, Path] = {}
        self.counts: dict[str, int] = dict.fromkeys(keys, 0)

    def append(self, shard: str, table: pa.Table) -> None:
        if not table.num_rows:
            return
        writer = self.writers.get(shard)
        if writer is None:
            final = self.stage.seed_shard(shard)
            tmp = final.with_name(final.name + ".tmp")
            tmp.parent.mkdir(parents=True, exist_ok=True)
            writer = pq.ParquetWriter(
                tmp,
                SEED_SCHEMA,
                compression="zstd",
                # dictionaries and statistics only where they pay (few distinct values, keys)
                use_dictionary=["_missing", "_url_errors", "_cell_errors"],
                write_statistics=["_id", "_row", "_line"],
            )
            self.writers[shard] = writer
            self.tmp_paths[shard] = tmp
        # bounded row groups: a reader of the shard (a crawl) decodes one row group at a time,
        # whatever the size of the loader's batches
        writer.write_table(table, row_group_size=SHARD_ROW_GROUP)
        self.counts[shard] += table.num_rows

    def close(self, *, commit: bool) -> None:
        for shard in self.keys:
            final = self.stage.seed_shard(shard)
            if shard in self.writers:
                self.writers[shard].close()
                if commit:
                    self.tmp_paths[shard].replace(final)
                else:
                    self.tmp_paths[shard].unlink(missing_ok=True)
            elif commit:  # an empty shard still gets a valid, empty file
                tmp = final.with_name(final.name + ".tmp")
                tmp.parent.mkdir(parents=True, exist_ok=True)
                pq.write_table(SEED_SCHEMA.empty_table(), tmp)
                tmp.replace(final)


# -- the load -----------------------------------------------------------------------------------


def _warn_near_misses(
    spec: DatasetSpec, columns: list[str], profile: Profile, warn: Callable[[str], Any] | None
) -> None:
    profile.near_miss_fields = near_miss_fields(spec, columns)
    for line in near_miss_warnings(spec, columns):
        if warn is None:
            logger.warning("%s", line)
        else:
            warn(line)


def default_workers() -> int:
    """Threads that clean batches side by side (Arrow kernels run without the GIL): one core is
    left to the reader and the writer, at most two cleaners (more buys little: the rest of a
    batch's work holds the GIL)."""
    return max(1, min(2, (os.cpu_count() or 1) - 1))


def prepare_dataset(
    spec: DatasetSpec,
    stage: DatasetStage,
    keys: list[str],
    *,
    today: dt.date | None = None,
    workers: int | None = None,
    warn: Callable[[str], Any] | None = None,
) -> dict[str, Any]:
    """Read, clean, profile and shard `spec`'s table into `stage`; returns the manifest.

    What is worth a look but does not stop the load (a field named almost like a column) goes to
    `warn` (seed_dataset: the run's log), else to this module's logger.

    The reader runs ahead in a thread of its own and `workers` threads clean batches in
    parallel; ids, the profile and the shard files are updated in file order by this thread,
    so the result does not depend on the number of workers.
    """
    started = time.monotonic()
    if not spec.source.is_file():
        raise DatasetError(f"{spec.source}: source table not found (named by {spec.path})")
    today = today or dt.date.today()
    workers = workers or default_workers()
    try:
        reader = open_reader(spec, work_dir=stage.seed_dir)
    except ReadError as exc:
        raise DatasetError(str(exc)) from exc
    except (OSError, pa.ArrowException, UnicodeError) as exc:
        raise DatasetError(f"{spec.source}: cannot read the table: {exc}") from exc
    profile = Profile(fields={name: FieldProfile() for name in spec.fields})
    stage.seed_dir.mkdir(parents=True, exist_ok=True)
    writers = ShardWriters(stage, keys)
    ids = IdIndex()
    timings = {"read": 0.0, "clean": 0.0, "write": 0.0}
    cleaner = ChunkCleaner(spec, keys, today, reader.columns)
    if reader.columns:
        profile.new_columns = check_columns(spec, reader.columns)
        _warn_near_misses(spec, reader.columns, profile, warn)
    checked = bool(reader.columns)
    committed = False
    try:
        with atomic_write(stage.rejected) as rejected_file:
            for batch, chunk in _cleaned(reader.batches(), cleaner, workers, timings):
                if not checked and cleaner.columns:  # JSONL: the columns come with the records
                    profile.new_columns = check_columns(spec, cleaner.columns)
                    _warn_near_misses(spec, cleaner.columns, profile, warn)
                    checked = True
                tick = time.monotonic()
                _take_batch(spec, batch, chunk, ids, profile, writers, rejected_file)
                timings["write"] += time.monotonic() - tick
        committed = True
    except (SpecError, DatasetError):
        raise
    except ReadError as exc:
        raise DatasetError(str(exc)) from exc
    except (UnicodeError, OSError, ValueError, pa.ArrowException) as exc:
        raise DatasetError(f"{spec.source}: cannot read the table: {exc}") from exc
    finally:
        writers.close(commit=committed)

    columns = list(cleaner.columns)
    profile.reading = reader.stats.to_dict()
    manifest = {
        "dataset": spec.name,
        "spec": spec.to_dict(),
        "source": str(spec.source),
        "columns": columns + [c for c in profile.new_columns if c not in columns],
        "shards": writers.counts,
        "profile": profile.to_dict(),
        "created_at": dt.datetime.now(dt.timezone.utc).isoformat(),
        "seconds": round(time.monotonic() - started, 3),
        # busy time of each stage; they overlap (reader, cleaners and writer run side by side)
        "timings": {k: round(v, 3) for k, v in timings.items()},
        "workers": workers,
    }
    write_json(stage.seed_manifest, manifest)
    return manifest


_DONE = object()


def _read_ahead(
    batches: Iterator[RawBatch], timings: dict[str, float], depth: int
) -> Iterator[RawBatch]:
    """Run the reader in a thread of its own, `depth` batches ahead (its errors re-raised here)."""
    box: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            while not stop.is_set():
                tick = time.monotonic()
                try:
                    batch = next(batches)
                except StopIteration:
                    break
                finally:
                    timings["read"] += time.monotonic() - tick
                box.put(batch)
            box.put(_DONE)
        except BaseException as exc:  # handed to the consumer
            box.put(exc)
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()  # the reader's files, from the thread that iterated it

    thread = threading.Thread(target=produce, name="seed-reader", daemon=True)
    thread.start()
    try:
        while True:
            item = box.get()
            if item is _DONE:
                break
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        while thread.is_alive():  # unblock a producer waiting on a full queue
            with contextlib.suppress(queue.Empty):
                box.get(timeout=0.1)
        thread.join()


def _cleaned(
    batches: Iterator[RawBatch], cleaner: ChunkCleaner, workers: int, timings: dict[str, float]
) -> Iterator[tuple[RawBatch, CleanChunk | None]]:
    """(batch, cleaned batch) in file order, up to `workers` batches cleaned at once."""

    def clean(batch: RawBatch, names: tuple[str, ...]) -> CleanChunk | None:
        if not batch.table.num_rows:
            return None
        tick = time.monotonic()
        try:
            return cleaner.clean(batch.table, names)
        finally:
            timings["clean"] += time.monotonic() - tick

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="seed-clean") as pool:
        pending: deque[tuple[RawBatch, Future[CleanChunk | None]]] = deque()
        for batch in _read_ahead(batches, timings, depth=workers + 1):
            names = cleaner.register(batch.table.column_names)
            pending.append((batch, pool.submit(clean, batch, names)))
            if len(pending) > workers:
                done, future = pending.popleft()
                yield done, future.result()
        while pending:
            done, future = pending.popleft()
            yield done, future.result()


def _take_batch(
    spec: DatasetSpec,
    batch: RawBatch,
    chunk: CleanChunk | None,
    ids: IdIndex,
    profile: Profile,
    writers: ShardWriters,
    rejected_file: Any,
) -> None:
    """Sort one cleaned batch into usable records (written to their shards) and rejections."""
    entries: list[tuple[int, str]] = []
    for entry in batch.quarantined:
        entry = {"row": entry["row"], "line": entry["line"], "id": None, **entry}
        profile.quarantined += 1
        profile.rows += 1
        profile.reject(entry)
        entries.append((entry["row"], dumps(entry)))
    if chunk is not None:
        n = chunk.n
        rows = batch.rows
        lines = batch.lines if batch.lines is not None else np.full(n, -1, dtype=np.int64)
        first = ids.first_rows(chunk.ids, rows)
        missing_id = first < 0
        duplicate = ~missing_id & (first != rows)
        usable = ~missing_id & ~duplicate
        profile.rows += n
        bad = np.flatnonzero(~usable)
        if len(bad):
            bad_ids = chunk.ids.take(pa.array(bad)).to_pylist()
            bad_data = chunk.data.take(pa.array(bad)).to_pylist()
            for i, rid, data in zip(bad.tolist(), bad_ids, bad_data, strict=True):
                row = int(rows[i])
                entry: dict[str, Any] = {"row": row}
                if lines[i] >= 0:
                    entry["line"] = int(lines[i])
                entry["id"] = rid
                if missing_id[i]:
                    profile.missing_ids += 1
                    entry["reason"] = "missing id"
                else:
                    profile.duplicate_ids += 1
                    entry["reason"] = f"duplicate id (first at row {int(first[i])})"
                profile.reject(entry)
                # the cleaned record goes along, so a rejected row can be read without the file
                entries.append((row, dumps(entry)[:-1] + ',"data":' + data + "}"))
        _profile_usable(spec, chunk, usable, rows, profile)
        _write_usable(writers.keys, chunk, usable, rows, lines, batch.lines is not None, writers)
    for _, line in sorted(entries, key=lambda e: e[0]):
        rejected_file.write(line + "\n")


def _profile_usable(
    spec: DatasetSpec,
    chunk: CleanChunk,
    usable: np.ndarray,
    rows: np.ndarray,
    profile: Profile,
) -> None:
    profile.usable += int(usable.sum())
    names = list(spec.fields)
    missing = chunk.field_missing[usable].sum(axis=0)
    outdated = chunk.field_outdated[usable].sum(axis=0)
    errors = chunk.field_errors[usable].sum(axis=0)
    for j, name in enumerate(names):
        fp = profile.fields[name]
        fp.missing += int(missing[j])
        fp.outdated += int(outdated[j])
        fp.type_errors += int(errors[j])
    profile.type_errors += int(errors.sum())
    for name, (has_error, values, reasons) in chunk.errors.items():
        fp = profile.fields[name]
        room = TYPE_ERROR_SAMPLE - len(fp.type_error_sample)
        if room <= 0:
            continue
        for i in np.flatnonzero(has_error & usable)[:room].tolist():
            fp.type_error_sample.append(
                {
                    "row": int(rows[i]),
                    "id": chunk.ids[i].as_py(),
                    "field": name,
                    "value": values[i].as_py(),
                    "reason": reasons[i].as_py(),
                }
            )
    invalid = chunk.invalid_urls[usable]
    profile.invalid_urls += int(invalid.sum())
    profile.records_with_invalid_urls += int((invalid > 0).sum())
    lengths = pc.list_value_length(chunk.urls).to_numpy(zero_copy_only=False)[usable]
    profile.urls += int(lengths.sum())
    profile.records_without_urls += int((lengths == 0).sum())
    to_resolve = pc.list_value_length(chunk.to_resolve).to_numpy(zero_copy_only=False)[usable]
    profile.records_to_enrich += int((to_resolve > 0).sum())
    profile.add_columns(list(chunk.columns), chunk.column_missing[usable])


def _write_usable(
    keys: list[str],
    chunk: CleanChunk,
    usable: np.ndarray,
    rows: np.ndarray,
    lines: np.ndarray,
    has_lines: bool,
    writers: ShardWriters,
) -> None:
    which = np.flatnonzero(usable)
    if not len(which):
        return
    shard = chunk.shards[which]
    order = which[np.argsort(shard, kind="stable")]
    take = pa.array(order)
    table = pa.Table.from_arrays(
        [
            chunk.ids.take(take),
            pa.array(rows[order], pa.int64()),
            chunk.urls.take(take),
            chunk.url_errors.take(take),
            chunk.to_resolve.take(take),
            chunk.data.take(take),
            chunk.raw.take(take),
            pa.array(
                lines[order] if has_lines else np.zeros(len(order)),
                pa.int64(),
                mask=None if has_lines else np.ones(len(order), bool),
            ),
            chunk.cell_errors.take(take),
        ],
        schema=SEED_SCHEMA,
    )
    sorted_shards = chunk.shards[order]
    bounds = np.searchsorted(sorted_shards, np.arange(len(keys) + 1))
    for index, key in enumerate(keys):
        start, stop = int(bounds[index]), int(bounds[index + 1])
        if stop > start:
            writers.append(key, table.slice(start, stop - start))

