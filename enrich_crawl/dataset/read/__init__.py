"""Readers: a dirty table streamed as Arrow batches of raw values, with nothing lost on the way.

- CSV/TSV: Arrow's CSV reader (C++; serial, so its invalid-row handler knows row numbers). A file
  that is UTF-8 throughout (checked first, ASCII blocks at memory speed) is read as it is; any
  other is first copied to UTF-8 line by line (`Utf8Stream`): lines that are UTF-8 stay so, the
  others are decoded with a legacy encoding guessed from them (cp1252, cp1251, ...), so a file
  that mixes both is read correctly, and every such line is counted with its number. Malformed
  rows (wrong number of fields, a quote never closed) are quarantined with their row number,
  physical line and full text; every cell is read as the exact string in the file (no type or NA
  inference). The header is read with Python's csv module.
- JSONL: one JSON object per line; a line that is not one is quarantined with its line number.
- Parquet: row groups streamed; column types kept.

Each batch carries the 1-based row number of each record (the n-th record after the header, the
quarantined ones counted too, so numbers match the file) and its physical line.
"""

from __future__ import annotations

from pathlib import Path

from enrich_crawl.dataset.read.batch import (
    BATCH_ROWS,
    RawBatch,
    ReadError,
    ReadStats,
    is_object_array,
    object_values,
)
from enrich_crawl.dataset.read.delimited import CsvReader
from enrich_crawl.dataset.read.jsonl import JsonlReader
from enrich_crawl.dataset.read.parquet import ParquetReader
from enrich_crawl.dataset.spec import DatasetSpec

__all__ = [
    "BATCH_ROWS",
    "CsvReader",
    "JsonlReader",
    "ParquetReader",
    "RawBatch",
    "ReadError",
    "ReadStats",
    "is_object_array",
    "object_values",
    "open_reader",
]


def open_reader(
    spec: DatasetSpec, work_dir: Path | None = None
) -> CsvReader | JsonlReader | ParquetReader:
    """The reader of the spec's table; `work_dir` holds a transcoded copy if one is needed."""
    fmt = spec.source_format
    if fmt in ("csv", "tsv"):
        return CsvReader(spec, work_dir=work_dir)
    if fmt == "jsonl":
        return JsonlReader(spec)
    return ParquetReader(spec)
