"""JSONL: one JSON object per line; a line that is not one is quarantined with its line number."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from enrich_crawl.dataset.read.batch import (
    BATCH_ROWS,
    STRING,
    RawBatch,
    ReadStats,
    object_array,
    quarantine_entry,
)
from enrich_crawl.dataset.read.encoding import (
    Utf8Stream,
)
from enrich_crawl.dataset.spec import DatasetSpec

try:  # several times faster than json for JSONL; optional, results are the same
    import orjson
except ImportError:  # pragma: no cover - depends on the environment
    orjson = None


def _loads(line: bytes) -> Any:
    if orjson is not None:
        try:
            return orjson.loads(line)
        except orjson.JSONDecodeError:
            pass  # json accepts a little more (NaN, huge integers): same result when both parse
    return json.loads(line)


class JsonlReader:
    def __init__(self, spec: DatasetSpec, path: Path | None = None):
        self.path = path or spec.source
        self.encoding = spec.format.get("encoding")
        self.fallback = spec.format.get("fallback_encoding")
        self.stats = ReadStats(format="jsonl")
        self.columns: list[str] = []
        self._index: dict[str, int] = {}
        # the columns are the keys of the records, in order of first appearance; the first batch
        # is read here so that the columns are known before the table is cleaned
        self._stream = Utf8Stream(self.path, self.encoding, self.fallback, self.stats)
        self._text = io.BufferedReader(self._stream, buffer_size=1 << 20)
        self._line = 0
        self._row = 0
        self._first = self._next_batch()

    def _next_batch(self) -> RawBatch | None:
        records: list[dict[str, Any]] = []
        rows: list[int] = []
        lines: list[int] = []
        quarantined: list[dict[str, Any]] = []
        for raw in self._text:
            self._line += 1
            if not raw.strip():
                self.stats.empty_rows += 1
                continue
            self._row += 1
            try:
                value = _loads(raw)
            except ValueError as exc:
                value, reason = None, f"malformed line: not JSON: {exc}"
            else:
                reason = None if isinstance(value, dict) else "malformed line: not a JSON object"
            if reason is not None:
                self.stats.quarantined += 1
                text = raw.decode("utf-8", "replace").rstrip("\r\n")
                quarantined.append(quarantine_entry(self._row, self._line, reason, text))
                continue
            if not value:
                self.stats.empty_rows += 1
                continue
            for key in value:
                if key not in self._index:
                    self._index[key] = len(self.columns)
                    self.columns.append(key)
            records.append(value)
            rows.append(self._row)
            lines.append(self._line)
            if len(records) >= BATCH_ROWS:
                break
        if not records and not quarantined:
            return None
        columns = {name: _jsonl_column([r.get(name) for r in records]) for name in self.columns}
        table = pa.table(columns) if records else pa.table({})
        return RawBatch(
            table, np.array(rows, dtype=np.int64), np.array(lines, dtype=np.int64), quarantined
        )

    def batches(self) -> Iterator[RawBatch]:
        try:
            batch = self._first
            while batch is not None:
                yield batch
                batch = self._next_batch()
        finally:
            self._text.close()


def _jsonl_column(values: list[Any]) -> pa.Array:
    """A JSONL column as Arrow: strings, integers, floats or booleans when the values agree, else
    an object column."""
    kinds = {type(v) for v in values if v is not None}
    try:
        if kinds <= {str}:
            return pa.array(values, STRING)
        if kinds == {bool}:
            return pa.array(values, pa.bool_())
        if kinds == {int}:
            return pa.array(values, pa.int64())
        if kinds == {float}:
            return pa.array(values, pa.float64())
    except (pa.ArrowException, OverflowError, UnicodeEncodeError):
        pass  # huge integers, lone surrogates: keep the Python values
    return object_array(values)
