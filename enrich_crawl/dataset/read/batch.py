"""What every reader yields: raw batches (the values, each record's row number and line, the
rows quarantined on the way), what reading found (`ReadStats`), the column names it gives, and the
object columns that carry values Arrow cannot type."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from enrich_crawl.dataset.cells import clean_cell

BATCH_ROWS = 65_536  # JSONL and Parquet batches
SAMPLE = 20
STRING = pa.string()


class ReadError(ValueError):
    """The table cannot be read at all; the message names the file and where it went wrong."""


@dataclass
class ReadStats:
    """What reading found, for the profile."""

    format: str = ""
    encoding: str = ""
    fallback_encoding: str | None = None
    decoded_lines: int = 0  # lines that were not UTF-8 and were decoded with the fallback
    decoded_sample: list[int] = field(default_factory=list)
    undecodable_lines: int = 0  # lines with bytes no decoder accepted (replaced by U+FFFD)
    undecodable_sample: list[int] = field(default_factory=list)
    empty_rows: int = 0  # blank lines / rows without any value: no record, nothing lost
    multiline_cells: int = 0  # quoted cells holding line breaks
    # cells whose lines look like whole rows: an unbalanced quote may have merged rows into one
    suspect_rows: int = 0
    suspect_sample: list[int] = field(default_factory=list)
    quarantined: int = 0
    header_fixes: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "encoding": self.encoding,
            "fallback_encoding": self.fallback_encoding,
            "decoded_lines": self.decoded_lines,
            "decoded_sample": self.decoded_sample,
            "undecodable_lines": self.undecodable_lines,
            "undecodable_sample": self.undecodable_sample,
            "empty_rows": self.empty_rows,
            "multiline_cells": self.multiline_cells,
            "suspect_rows": self.suspect_rows,
            "suspect_sample": self.suspect_sample,
            "quarantined": self.quarantined,
            "header_fixes": self.header_fixes,
        }


@dataclass
class RawBatch:
    table: pa.Table  # the raw values, one column per table column
    rows: np.ndarray  # 1-based record number of each row
    lines: np.ndarray | None  # physical line where each record starts (None: not a text file)
    quarantined: list[dict[str, Any]]  # malformed records up to this batch's last row


def quarantine_entry(row: int, line: int, reason: str, text: str) -> dict[str, Any]:
    """One malformed record as `rejected.jsonl` keeps it: where it is, why, and its full text."""
    return {"row": row, "line": line, "reason": reason, "text": text, "text_length": len(text)}


def fix_header(raw_names: list[str], stats: ReadStats) -> list[str]:
    """Column names cleaned like cells; blank ones named `column_<n>`, repeated ones `name.<k>`."""
    names: list[str] = []
    seen: set[str] = set()
    for i, raw in enumerate(raw_names):
        name = clean_cell(raw) or f"column_{i + 1}"
        base, k = name, 0
        while name in seen:
            k += 1
            name = f"{base}.{k}"
        seen.add(name)
        names.append(name)
        if name != raw:
            stats.header_fixes.append({"column": i + 1, "raw": raw, "name": name})
    return names


# A column Arrow cannot type (mixed or nested values, decimals, dates) travels as the JSON text of
# its Python values in a large_string column (string columns are always plain `string`); the
# cleaner decodes it and treats it value by value.
OBJECT = pa.large_string()


def object_array(values: list[Any]) -> pa.Array:
    return pa.array(
        [None if v is None else json.dumps(v, ensure_ascii=False, default=str) for v in values],
        OBJECT,
    )


def is_object_array(array: pa.Array | pa.ChunkedArray) -> bool:
    return array.type == OBJECT


def object_values(array: pa.Array | pa.ChunkedArray) -> list[Any]:
    return [None if v is None else json.loads(v) for v in array.to_pylist()]
