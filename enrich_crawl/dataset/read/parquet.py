"""Parquet: row groups streamed; column types kept (those Arrow cannot carry as they are travel as
object columns)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from enrich_crawl.dataset.cells import raw_value
from enrich_crawl.dataset.read.batch import (
    BATCH_ROWS,
    STRING,
    RawBatch,
    ReadError,
    ReadStats,
    fix_header,
    object_array,
)
from enrich_crawl.dataset.spec import DatasetSpec


class ParquetReader:
    def __init__(self, spec: DatasetSpec, path: Path | None = None):
        self.path = path or spec.source
        self.stats = ReadStats(format="parquet", encoding="utf-8")
        try:
            self._file = pq.ParquetFile(self.path)
        except (pa.ArrowException, OSError) as exc:
            raise ReadError(f"{self.path}: not a readable Parquet file: {exc}") from exc
        raw = list(self._file.schema_arrow.names)
        self.columns = fix_header(raw, self.stats)

    def batches(self) -> Iterator[RawBatch]:
        row = 0
        for batch in self._file.iter_batches(batch_size=BATCH_ROWS):
            n = batch.num_rows
            arrays = [_parquet_column(column) for column in batch.columns]
            table = pa.Table.from_arrays(arrays, names=self.columns)
            rows = np.arange(row + 1, row + n + 1, dtype=np.int64)
            row += n
            yield RawBatch(table, rows, None, [])


def _parquet_column(array: pa.Array) -> pa.Array:
    kind = array.type
    if pa.types.is_dictionary(kind):
        array = array.dictionary_decode()
        kind = array.type
    if pa.types.is_string(kind):
        return array
    if pa.types.is_large_string(kind) or pa.types.is_string_view(kind):
        return pc.cast(array, STRING)
    if pa.types.is_boolean(kind) or pa.types.is_integer(kind) or pa.types.is_floating(kind):
        if pa.types.is_unsigned_integer(kind) and kind.bit_width == 64:
            return object_array(array.to_pylist())  # may not fit in int64
        return array if kind in (pa.bool_(), pa.int64(), pa.float64()) else _widen(array)
    return object_array([raw_value(v) for v in array.to_pylist()])


def _widen(array: pa.Array) -> pa.Array:
    if pa.types.is_floating(array.type):
        return pc.cast(array, pa.float64())
    return pc.cast(array, pa.int64())
