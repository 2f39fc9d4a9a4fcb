"""The enriched dataset from MongoDB back to a table: CSV, TSV, Parquet or JSON lines.

One row per record, in the order of the source table (`row`), with every column of the record
(`data`, resolved values filled in). With `lineage=True` it adds `_status`, `_missing`,
`_updated_at` and, per enriched field, `<field>__<key>` for the lineage keys (value source, previous
value, time, run, partition, content hash) and `<field>__original` (the value before enrichment).

CSV cells: lists joined with "; " (the dataset loader splits them back), booleans `true`/`false`,
missing values empty. Parquet columns are typed from the dataset spec (integer -> int64, number ->
float64, boolean -> bool, date -> date32, list -> list<string>); a column whose values do not fit
its type falls back to strings rather than losing them. The file is written atomically.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pymongo.collection import Collection

from enrich_crawl.staging import atomic_write, json_default
from enrich_crawl.store.document import as_datetime

LINEAGE_KEYS = (
    "previous",
    "source_url",
    "mapping",
    "depth",
    "fetched_at",
    "http_status",
    "run_id",
    "partition",
    "content_hash",
)
LIST_SEPARATOR = "; "
FORMATS = {
    ".csv": "csv",
    ".tsv": "tsv",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
}


class ExportError(ValueError):
    """The export cannot be written as asked (unknown format, nothing to export, ...)."""


@dataclass
class ExportResult:
    path: Path
    format: str
    rows: int
    columns: list[str]
    status: dict[str, int]


def export_format(path: Path, fmt: str | None = None) -> str:
    """The format to write: `fmt` if given, else from the file's extension."""
    if fmt:
        fmt = fmt.lower()
        if fmt not in set(FORMATS.values()):
            raise ExportError(f"unknown format {fmt!r} (use csv, tsv, parquet or jsonl)")
        return fmt
    try:
        return FORMATS[path.suffix.lower()]
    except KeyError:
        raise ExportError(
            f"{path}: cannot tell the format from the extension (use .csv, .tsv, .parquet, "
            ".jsonl, or --format)"
        ) from None


def _lineage_columns(fields: Iterable[str]) -> list[str]:
    columns = ["_status", "_missing", "_updated_at"]
    for name in fields:
        columns += [f"{name}__{key}" for key in LINEAGE_KEYS]
        columns.append(f"{name}__original")
    return columns


def export_rows(
    collection: Collection,
    *,
    fields: Iterable[str],
    lineage: bool = False,
    statuses: Iterable[str] | None = None,
) -> tuple[list[str], list[dict[str, Any]], dict[str, int]]:
    """(columns, rows in source order, records per status) of the collection."""
    fields = list(fields)
    query: dict[str, Any] = {}
    if statuses:
        query["status"] = {"$in": list(statuses)}
    projection = ["data", "row", "status"]
    if lineage:
        projection += ["lineage", "original", "missing", "updated_at"]
    docs = list(collection.find(query, projection))
    docs.sort(key=lambda d: (d.get("row") is None, d.get("row") or 0, str(d["_id"])))
    columns: dict[str, None] = {}
    rows = []
    status: dict[str, int] = {}
    for doc in docs:
        data = doc.get("data") or {}
        columns.update(dict.fromkeys(data))
        row = dict(data)
        status[doc.get("status", "?")] = status.get(doc.get("status", "?"), 0) + 1
        if lineage:
            row["_status"] = doc.get("status")
            row["_missing"] = doc.get("missing") or []
            row["_updated_at"] = as_datetime(doc.get("updated_at"))
            original = doc.get("original") or {}
            for name, entry in (doc.get("lineage") or {}).items():
                for key in LINEAGE_KEYS:
                    value = entry.get(key)
                    row[f"{name}__{key}"] = (
                        as_datetime(value) if key == "fetched_at" and value else value
                    )
            for name in fields:
                if name in original:
                    row[f"{name}__original"] = original[name]
        rows.append(row)
    for name in fields:
        columns.setdefault(name, None)
    names = list(columns)
    if lineage:
        names += _lineage_columns(fields)
    return names, rows, status


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return LIST_SEPARATOR.join(_cell(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False, default=json_default)
    if isinstance(value, (dt.datetime, dt.date)):
        return value.isoformat()
    return str(value)


def _arrow_column(values: list[Any], kind: str | None):
    import pyarrow as pa

    try:
        if kind == "integer":
            return pa.array(values, pa.int64())
        if kind == "number":
            return pa.array(values, pa.float64())
        if kind == "boolean":
            return pa.array(values, pa.bool_())
        if kind == "date":
            return pa.array(
                [None if v is None else dt.date.fromisoformat(str(v)) for v in values],
                pa.date32(),
            )
        if kind == "list":
            return pa.array(
                [None if v is None else [_cell(x) for x in v] for v in values],
                pa.list_(pa.string()),
            )
        if kind == "timestamp":
            return pa.array([as_datetime(v) for v in values], pa.timestamp("ms", tz="UTC"))
        if kind == "string":
            return pa.array([None if v is None else _cell(v) for v in values], pa.string())
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, ValueError, TypeError, OverflowError):
        return pa.array([None if v is None else _cell(v) for v in values], pa.string())


def _column_kind(column: str, field_types: dict[str, str]) -> str | None:
    if column in field_types:
        return field_types[column]
    name, sep, key = column.rpartition("__")
    if sep and name in field_types:
        if key == "previous":
            return field_types[name]
        if key == "original":
            return None  # as the source table had it: inferred, strings if mixed
        if key in ("depth", "http_status"):
            return "integer"
        if key == "fetched_at":
            return "timestamp"
        return "string"
    return {"_status": "string", "_missing": "list", "_updated_at": "timestamp"}.get(column)


def write_table(
    path: Path,
    fmt: str,
    columns: list[str],
    rows: list[dict[str, Any]],
    field_types: dict[str, str] | None = None,
) -> None:
    field_types = field_types or {}
    if fmt in ("csv", "tsv"):
        with atomic_write(path) as handle:
            writer = csv.writer(handle, delimiter="," if fmt == "csv" else "\t")
            writer.writerow(columns)
            for row in rows:
                writer.writerow([_cell(row.get(c)) for c in columns])
    elif fmt == "jsonl":
        with atomic_write(path) as handle:
            for row in rows:
                handle.write(
                    json.dumps(
                        {c: row.get(c) for c in columns}, ensure_ascii=False, default=json_default
                    )
                )
                handle.write("\n")
    elif fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        arrays = [
            _arrow_column([row.get(c) for row in rows], _column_kind(c, field_types))
            for c in columns
        ]
        table = pa.Table.from_arrays(arrays, names=columns)
        with atomic_write(path, "wb") as handle:
            pq.write_table(table, handle)
    else:
        raise ExportError(f"unknown format {fmt!r}")


def export_dataset(
    collection: Collection,
    out: Path | str,
    *,
    field_types: dict[str, str],
    fmt: str | None = None,
    lineage: bool = False,
    statuses: Iterable[str] | None = None,
) -> ExportResult:
    """Write the collection's records to `out` (format from `fmt` or the extension)."""
    path = Path(out)
    fmt = export_format(path, fmt)
    columns, rows, status = export_rows(
        collection, fields=field_types, lineage=lineage, statuses=statuses
    )
    write_table(path, fmt, columns, rows, field_types)
    return ExportResult(path=path, format=fmt, rows=len(rows), columns=columns, status=status)
