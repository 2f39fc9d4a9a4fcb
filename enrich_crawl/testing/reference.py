"""The loader's record semantics, one row at a time, in plain Python (slow, obviously right).

This is the executable statement of what `prepare_dataset` does to each row: the tests run it next
to the vectorised loader on dirty tables and require identical records, rejections and profiles,
and the benchmark uses it as the per-row baseline. Production code never calls it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from enrich_crawl.dataset.cells import (
    clean_value,
    coerce_cell,
    is_stale,
    marker_set,
    no_url_error,
    raw_value,
    record_id,
)
from enrich_crawl.dataset.shard import shard_for_urls
from enrich_crawl.dataset.spec import DatasetSpec
from enrich_crawl.urls import normalise_url, split_url_cell

TYPE_ERROR_SAMPLE = 5
REJECTED_SAMPLE = 20


@dataclass
class RowNotes:
    """What cleaning one row found; added to the profile only if the row is usable."""

    missing: list[str] = field(default_factory=list)
    outdated: list[str] = field(default_factory=list)
    type_errors: list[dict[str, Any]] = field(default_factory=list)
    invalid_urls: int = 0


def clean_record(
    spec: DatasetSpec,
    raw: dict[str, Any],
    columns: list[str],
    row: int,
    keys: list[str],
    today: dt.date,
    markers: frozenset[str] | None = None,
) -> tuple[dict[str, Any], RowNotes]:
    """The seed record of one raw row (decoded: lists and dicts, not JSON text) and its notes."""
    markers = marker_set(spec.missing_values) if markers is None else markers
    notes = RowNotes()
    data: dict[str, Any] = {}
    changed: dict[str, Any] = {}
    for column in columns:
        value = raw_value(raw.get(column))
        cleaned = clean_value(value, markers)
        data[column] = cleaned
        # an empty cell that becomes null is no change worth keeping: "" and null say the same
        if value is not None and value != "" and cleaned != value:
            changed[column] = value
    cleaned_cells = dict(data)
    rid = record_id(data.get(spec.id))

    missing: list[str] = []
    cell_errors: list[dict[str, Any]] = []
    for name, fspec in spec.fields.items():
        value = data.get(name)
        if value is not None:
            try:
                typed, lossy = coerce_cell(value, fspec.type)
            except ValueError as exc:
                error = {"field": name, "value": str(value)[:80], "reason": str(exc)}
                cell_errors.append(error)
                notes.type_errors.append({"row": row, "id": rid, **error})
                typed, lossy = None, True
            data[name] = typed
            if lossy:
                changed.setdefault(name, raw_value(raw.get(name)))
            value = typed
        else:
            data[name] = None
        if value is None:
            notes.missing.append(name)
            missing.append(name)
        elif fspec.refresh:
            notes.outdated.append(name)
            missing.append(name)
    if spec.stale is not None and is_stale(
        cleaned_cells.get(spec.stale.column), spec.stale.days, today
    ):
        for name in spec.stale.fields or tuple(spec.fields):
            if name not in missing:
                notes.outdated.append(name)
                missing.append(name)

    urls: list[str] = []
    url_errors: list[dict[str, str]] = []
    for column in spec.urls:
        # the cleaned cell: a missing marker ("-", "N/A") means no URL, not an invalid one
        for token in split_url_cell(cleaned_cells.get(column)):
            url, reason = normalise_url(token)
            if url is None:
                kind, _, detail = (reason or "invalid_url").partition(": ")
                url_errors.append({"url": token, "reason": kind, "detail": detail})
                notes.invalid_urls += 1
            elif url not in urls:
                urls.append(url)
    if not urls and not url_errors and missing:
        url_errors.append(no_url_error(spec.urls))
    record = {
        "_id": rid,
        "_row": row,
        "_urls": urls,
        "_url_errors": url_errors,
        "_missing": missing,
        "_data": data,
        "_raw": changed,
        "_cell_errors": cell_errors,
        "_shard": shard_for_urls(urls, keys),
    }
    return record, notes


def reference_prepare(
    spec: DatasetSpec,
    rows: Iterable[tuple[int, dict[str, Any]]],
    columns: list[str],
    keys: list[str],
    today: dt.date,
) -> dict[str, Any]:
    """Records, rejections and profile counts of `(row number, raw row)` pairs, row at a time."""
    markers = marker_set(spec.missing_values)
    new_columns = [name for name in spec.fields if name not in columns]
    records: list[dict[str, Any]] = []
    rejected: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    profile: dict[str, Any] = {
        "rows": 0,
        "usable": 0,
        "missing_ids": 0,
        "duplicate_ids": 0,
        "invalid_urls": 0,
        "records_without_urls": 0,
        "records_to_enrich": 0,
        "fields": {n: {"missing": 0, "outdated": 0, "type_errors": 0} for n in spec.fields},
        "type_error_samples": {n: [] for n in spec.fields},
    }
    for row, raw in rows:
        profile["rows"] += 1
        record, notes = clean_record(spec, raw, columns, row, keys, today, markers)
        rid = record["_id"]
        if rid is None:
            profile["missing_ids"] += 1
            rejected.append({"row": row, "id": None, "reason": "missing id"})
            continue
        if rid in seen:
            profile["duplicate_ids"] += 1
            rejected.append(
                {"row": row, "id": rid, "reason": f"duplicate id (first at row {seen[rid]})"}
            )
            continue
        seen[rid] = row
        profile["usable"] += 1
        for name in notes.missing:
            profile["fields"][name]["missing"] += 1
        for name in notes.outdated:
            profile["fields"][name]["outdated"] += 1
        for sample in notes.type_errors:
            profile["fields"][sample["field"]]["type_errors"] += 1
            samples = profile["type_error_samples"][sample["field"]]
            if len(samples) < TYPE_ERROR_SAMPLE:
                samples.append(sample)
        profile["invalid_urls"] += notes.invalid_urls
        profile["records_without_urls"] += not record["_urls"]
        profile["records_to_enrich"] += bool(record["_missing"])
        for name in new_columns:
            record["_data"].setdefault(name, None)
        records.append(record)
    return {"records": records, "rejected": rejected, "profile": profile}
