"""One batch of raw rows -> seed records, column by column (`reference.clean_record`, vectorised).

A column is cleaned as Arrow text (CSV cells, string columns), as Arrow numbers/booleans
(Parquet, JSONL), or value by value in Python when Arrow cannot type it (mixed or nested JSONL
values, dates and decimals in Parquet). The record's JSON (`_data`, `_raw`) is assembled from
per-column JSON fragments, so no Python object is made per row.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from enrich_crawl.dataset import vector as vec
from enrich_crawl.dataset.cells import clean_value, is_stale, marker_set, no_url_error, record_id
from enrich_crawl.dataset.read import is_object_array, object_values
from enrich_crawl.dataset.spec import DatasetSpec
from enrich_crawl.staging import dumps
from enrich_crawl.urls import LIST_PUNCTUATION, URL_START, split_url_cell

STRING = pa.string()
_EPOCH = dt.date(1970, 1, 1)


@dataclass
class Column:
    """A table column after normalisation."""

    kind: str  # "text" | "typed" | "object"
    raw: pa.Array  # as read
    cleaned: pa.Array | list[Any]  # normalised (null = missing); a list for "object"
    missing: np.ndarray
    json: pa.Array | None  # JSON text of the cleaned value (text columns: made when needed)
    changed: np.ndarray  # the raw value differs from the cleaned one

    def fragments(self) -> pa.Array:
        if self.json is None:
            self.json = vec.json_strings(self.cleaned, may_hold_controls=False)
        return self.json

    def raw_fragments(self, mask: np.ndarray) -> pa.Array:
        """JSON text of the raw values where `mask` is set (null elsewhere)."""
        n = len(mask)
        if not mask.any():
            return pa.nulls(n, STRING)
        if self.kind == "object":
            values = object_values(self.raw.filter(pa.array(mask)))
            part = pa.array([dumps(v) for v in values], STRING)
        elif self.kind == "text":
            part = vec.json_strings(self.raw.filter(pa.array(mask)))
        else:
            part = vec.json_numbers(self.raw.filter(pa.array(mask)))
        return pc.replace_with_mask(pa.nulls(n, STRING), pa.array(mask), part)

    def python_values(self) -> list[Any]:
        return self.cleaned if isinstance(self.cleaned, list) else self.cleaned.to_pylist()


@dataclass
class Field:
    fragments: pa.Array
    missing: np.ndarray
    lossy: np.ndarray
    errors: pa.Array  # reason per cell, null when none
    shown: list[Any] | pa.Array | None  # the cleaned value, for error reports


@dataclass
class CleanChunk:
    """The seed records of one batch (not yet sorted into usable and rejected)."""

    n: int
    ids: pa.Array
    urls: pa.Array  # list<string>
    url_errors: pa.Array  # JSON list per row
    invalid_urls: np.ndarray
    to_resolve: pa.Array  # list<string>: the `_missing` column
    data: pa.Array
    raw: pa.Array
    cell_errors: pa.Array
    field_missing: np.ndarray  # (n, fields)
    field_outdated: np.ndarray
    field_errors: np.ndarray
    errors: dict[str, tuple[np.ndarray, pa.Array, pa.Array]]  # field -> (has error, value, reason)
    columns: tuple[str, ...]
    column_missing: np.ndarray  # (n, columns)
    shards: np.ndarray


class ChunkCleaner:
    def __init__(
        self, spec: DatasetSpec, keys: list[str], today: dt.date, columns: list[str]
    ) -> None:
        self.spec = spec
        self.keys = keys
        self.today = today
        self.columns = list(columns)
        self.markers = marker_set(spec.missing_values)
        self.marker_array = pa.array(sorted(self.markers), STRING)
        self.fields = list(spec.fields.values())
        self.field_index = {f.name: i for i, f in enumerate(self.fields)}
        self.no_url_json = dumps([no_url_error(spec.urls)])

    # -- columns ---------------------------------------------------------------------------

    def clean_column(self, raw: pa.Array) -> Column:
        n = len(raw)
        if is_object_array(raw):
            values = object_values(raw)
            cleaned = [clean_value(v, self.markers) for v in values]
            changed = np.array(
                [
                    v is not None and v != "" and c != v
                    for v, c in zip(values, cleaned, strict=True)
                ],
                bool,
            )
            missing = np.array([c is None for c in cleaned], bool)
            fragments = pa.array(["null" if c is None else dumps(c) for c in cleaned], STRING)
            return Column("object", raw, cleaned, missing, fragments, changed)
        if pa.types.is_string(raw.type):
            tidy = vec.clean_strings(raw)
            missing = vec.missing_mask(tidy, self.marker_array)
            cleaned = vec.with_nulls(tidy, missing)
            # an empty cell that becomes null is no change worth keeping: "" and null say the same
            changed = vec.as_numpy_bool(pc.not_equal(raw, "")) & (
                missing | vec.as_numpy_bool(pc.not_equal(tidy, raw))
            )
            return Column("text", raw, cleaned, missing, None, changed)
        cleaned = raw
        if pa.types.is_floating(raw.type):
            cleaned = vec.with_nulls(raw, vec.as_numpy_bool(pc.is_nan(raw)))
        missing = vec.as_numpy_bool(pc.is_null(cleaned))
        return Column("typed", raw, cleaned, missing, vec.json_numbers(cleaned), np.zeros(n, bool))

    # -- fields ----------------------------------------------------------------------------

    def coerce_field(self, column: Column | None, ftype: str, n: int) -> Field:
        if column is None:
            return Field(
                pa.array(["null"] * n, STRING),
                np.ones(n, bool),
                np.zeros(n, bool),
                pa.nulls(n, STRING),
                None,
            )
        if column.kind == "text":
            out = vec.coerce_strings(column.cleaned, ftype)
            return Field(out.fragments, out.missing, out.lossy, out.errors, column.cleaned)
        if column.kind == "typed":
            kind = column.cleaned.type
            same = (
                (ftype == "integer" and pa.types.is_integer(kind))
                or (ftype == "number" and pa.types.is_floating(kind))
                or (ftype == "boolean" and pa.types.is_boolean(kind))
            )
            if same:
                return Field(
                    column.fragments(),
                    column.missing,
                    np.zeros(n, bool),
                    pa.nulls(n, STRING),
                    None,
                )
            if ftype == "number" and pa.types.is_integer(kind):
                as_float = pc.cast(column.cleaned, pa.float64())
                return Field(
                    vec.json_numbers(as_float),
                    column.missing,
                    np.zeros(n, bool),
                    pa.nulls(n, STRING),
                    None,
                )
        values = column.python_values()
        fragments, missing, lossy, errors = vec.python_coercion(values, ftype)
        return Field(
            pa.array(fragments, STRING),
            np.array(missing, bool),
            np.array(lossy, bool),
            pa.array(errors, STRING),
            values,
        )

    def stale_mask(self, column: Column | None, n: int) -> np.ndarray:
        rule = self.spec.stale
        if column is None:
            return np.ones(n, bool)
        if column.kind == "text":
            dates = vec.coerce_strings(column.cleaned, "date").values
            known = vec.as_numpy_bool(pc.is_valid(dates))
            stale = ~known
            if known.any():
                iso = np.array(dates.filter(pa.array(known)).to_pylist(), dtype="datetime64[D]")
                age = (np.datetime64(self.today, "D") - iso).astype(np.int64)
                stale[known] = age > rule.days
            return stale
        return np.array([is_stale(v, rule.days, self.today) for v in column.python_values()], bool)

    # -- URLs ------------------------------------------------------------------------------

    def url_tokens(self, columns: dict[str, Column], n: int) -> tuple[np.ndarray, pa.Array]:
        """Every URL token of every row, row by row and, within a row, column by column."""
        parents: list[np.ndarray] = []
        tokens: list[pa.Array] = []
        for name in self.spec.urls:
            column = columns.get(name)
            if column is None:
                continue
            if column.kind == "text":
                # as urls.split_url_cell: a `,`/`;` run before the next URL
                # becomes a space, pieces split on spaces (cleaned cells hold single spaces) and
                # lose the list punctuation at their ends; commas inside a URL stay. Only the
                # cells holding a `,` or `;` need more than the split.
                cells = column.cleaned
                punct = pc.fill_null(
                    pc.or_(pc.match_substring(cells, ","), pc.match_substring(cells, ";")), False
                )
                has_punct = pc.any(punct).as_py()
                if has_punct:
                    separated = pc.replace_substring_regex(
                        cells.filter(punct), pattern=f"[,;]+ ?({URL_START})", replacement=r" \1"
                    )
                    cells = pc.replace_with_mask(cells, punct, separated)
                lists = pc.split_pattern(cells, pattern=" ")
                flat = pc.list_flatten(lists)
                if has_punct:
                    flat = pc.utf8_trim(flat, LIST_PUNCTUATION)
                owner = pc.list_parent_indices(lists).to_numpy()
                keep = vec.as_numpy_bool(pc.not_equal(flat, ""))
                parents.append(owner[keep])
                tokens.append(flat.filter(pa.array(keep)))
            else:
                owner_list: list[int] = []
                found: list[str] = []
                for i, value in enumerate(column.python_values()):
                    for token in split_url_cell(value):
                        owner_list.append(i)
                        found.append(token)
                parents.append(np.array(owner_list, dtype=np.int64))
                tokens.append(pa.array(found, STRING))
        if not parents:
            return np.zeros(0, np.int64), pa.array([], STRING)
        parent = np.concatenate(parents).astype(np.int64)
        order = np.argsort(parent, kind="stable")
        token = pa.concat_arrays([t.cast(STRING) for t in tokens]).take(pa.array(order))
        return parent[order], token

    def urls(
        self, columns: dict[str, Column], n: int
    ) -> tuple[pa.Array, pa.Array, np.ndarray, np.ndarray]:
        """(_urls lists, _url_errors JSON, invalid tokens per row, shard index per row)."""
        parent, tokens = self.url_tokens(columns, n)
        invalid = np.zeros(n, np.int64)
        errors = pa.array(["[]"] * n, STRING)
        if len(tokens) == 0:
            empty = pa.ListArray.from_arrays(
                pa.array(np.zeros(n + 1, np.int32)), pa.array([], STRING)
            )
            first = pa.nulls(n, STRING)
            return empty, errors, invalid, vec.shard_indices(first, first, len(self.keys))
        encoded = pc.dictionary_encode(tokens)
        distinct = encoded.dictionary
        done = vec.normalise_tokens(distinct)
        which = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        urls = done.urls.take(pa.array(which))
        hosts = done.hosts.take(pa.array(which))
        valid = vec.as_numpy_bool(pc.is_valid(urls))
        if not valid.all():
            bad = np.flatnonzero(~valid)
            invalid = np.bincount(parent[bad], minlength=n)
            errors = _url_errors_json(
                n, parent[bad], tokens.take(pa.array(bad)), which[bad], done.reasons
            )
        # valid URLs, first occurrence per row
        keep_parent = parent[valid]
        keep_urls = urls.filter(pa.array(valid))
        keep_hosts = hosts.filter(pa.array(valid))
        per_row = np.bincount(keep_parent, minlength=n)
        several = np.flatnonzero(per_row[keep_parent] > 1)
        if len(several):  # the same URL twice in a record: keep the first
            frame = pd.DataFrame(
                {
                    "row": keep_parent[several],
                    "url": keep_urls.take(pa.array(several)).to_numpy(zero_copy_only=False),
                }
            )
            first_seen = np.ones(len(keep_parent), bool)
            first_seen[several[frame.duplicated().to_numpy()]] = False
            keep_parent = keep_parent[first_seen]
            keep_urls = keep_urls.filter(pa.array(first_seen))
            keep_hosts = keep_hosts.filter(pa.array(first_seen))
        counts = np.bincount(keep_parent, minlength=n)
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
        lists = pa.ListArray.from_arrays(pa.array(offsets), keep_urls)
        has = counts > 0
        first_url = pa.nulls(n, STRING)
        first_host = pa.nulls(n, STRING)
        if has.any():
            starts = offsets[:-1][has]
            first_url = pc.replace_with_mask(
                first_url, pa.array(has), keep_urls.take(pa.array(starts))
            )
            first_host = pc.replace_with_mask(
                first_host, pa.array(has), keep_hosts.take(pa.array(starts))
            )
        shards = vec.shard_indices(first_url, first_host, len(self.keys))
        return lists, errors, invalid, shards

    # -- the batch -------------------------------------------------------------------------

    def register(self, names: list[str]) -> tuple[str, ...]:
        """Add the columns a batch brings (JSONL records may add keys); returns the columns."""
        for name in names:
            if name not in self.columns:
                self.columns.append(name)
        return tuple(self.columns)

    def clean(self, table: pa.Table, names: tuple[str, ...]) -> CleanChunk:
        """Clean one batch; `names` are the columns (`register`), so batches can be cleaned in
        parallel threads."""
        n = table.num_rows
        columns: dict[str, Column] = {}
        for name in names:
            raw = (
                table.column(name).combine_chunks()
                if name in table.column_names
                else pa.nulls(n, STRING)
            )
            columns[name] = self.clean_column(raw)

        ids = self.ids(columns.get(self.spec.id), n)

        k = len(self.fields)
        field_missing = np.zeros((n, k), bool)
        field_errors = np.zeros((n, k), bool)
        refresh = np.array([f.refresh for f in self.fields], bool)
        fields: list[Field] = []
        errors: dict[str, tuple[np.ndarray, pa.Array, pa.Array]] = {}
        for j, fspec in enumerate(self.fields):
            column = columns.get(fspec.name)
            done = self.coerce_field(column, fspec.type, n)
            fields.append(done)
            field_missing[:, j] = done.missing
            if column is not None:
                column.changed = column.changed | done.lossy
            has_error = vec.as_numpy_bool(pc.is_valid(done.errors))
            field_errors[:, j] = has_error
            if has_error.any():
                shown = done.shown
                if isinstance(shown, (pa.Array, pa.ChunkedArray)):
                    values = pc.utf8_slice_codeunits(pc.cast(shown, STRING), 0, 80)
                else:
                    values = pa.array(
                        [str(v)[:80] if e else None for v, e in zip(shown, has_error, strict=True)],
                        STRING,
                    )
                errors[fspec.name] = (has_error, vec.with_nulls(values, ~has_error), done.errors)

        # what to resolve: missing or refresh fields, then the fields the stale rule adds
        resolve = field_missing | (refresh[None, :] & ~field_missing)
        outdated = refresh[None, :] & ~field_missing
        listed = [f.name for f in self.fields]
        masks = [resolve]
        if self.spec.stale is not None:
            stale = self.stale_mask(columns.get(self.spec.stale.column), n)
            stale_fields = list(self.spec.stale.fields or listed)
            idx = [self.field_index[name] for name in stale_fields]
            added = stale[:, None] & ~resolve[:, idx]
            outdated[:, idx] |= added
            masks.append(added)
            listed = listed + stale_fields
        everything = np.hstack(masks) if len(masks) > 1 else resolve
        to_resolve = _list_from_mask(everything, listed)

        urls, url_errors, invalid, shards = self.urls(columns, n)
        no_url = (
            (pc.list_value_length(urls).to_numpy(zero_copy_only=False) == 0)
            & (invalid == 0)
            & (pc.list_value_length(to_resolve).to_numpy(zero_copy_only=False) > 0)
        )
        if no_url.any():
            url_errors = pc.if_else(pa.array(no_url), pa.scalar(self.no_url_json), url_errors)

        # _data: every column (typed for fields), then fields absent from the table
        data_names = list(names) + [f.name for f in self.fields if f.name not in columns]
        data_fragments = []
        for name in data_names:
            j = self.field_index.get(name)
            if j is not None:
                data_fragments.append(fields[j].fragments)
            else:
                data_fragments.append(columns[name].fragments())
        data = vec.json_objects(data_names, data_fragments, n)
        raw_names = [name for name in names if columns[name].changed.any()]
        raw = vec.sparse_json_objects(
            raw_names,
            [columns[name].raw_fragments(columns[name].changed) for name in raw_names],
            [columns[name].changed for name in raw_names],
            n,
        )
        cell_errors = _cell_errors_json(errors, n)
        column_missing = (
            np.stack([columns[c].missing for c in names], axis=1)
            if names
            else np.zeros((n, 0), bool)
        )
        return CleanChunk(
            n=n,
            ids=ids,
            urls=urls,
            url_errors=url_errors,
            invalid_urls=invalid,
            to_resolve=to_resolve,
            data=data,
            raw=raw,
            cell_errors=cell_errors,
            field_missing=field_missing,
            field_outdated=outdated,
            field_errors=field_errors,
            errors=errors,
            columns=names,
            column_missing=column_missing,
            shards=shards,
        )

    def ids(self, column: Column | None, n: int) -> pa.Array:
        if column is None:
            return pa.nulls(n, STRING)
        if column.kind == "text":
            return column.cleaned
        if column.kind == "typed" and pa.types.is_integer(column.cleaned.type):
            return pc.cast(column.cleaned, STRING)
        return pa.array([record_id(v) for v in column.python_values()], STRING)


def _url_errors_json(
    n: int, rows: np.ndarray, tokens: pa.Array, which: np.ndarray, reasons: list[str | None]
) -> pa.Array:
    """`_url_errors`: per row, a JSON list of {url, reason, detail} for its invalid tokens (given
    row by row, in order; `which` indexes the distinct tokens' `reasons`)."""
    needed, position = np.unique(which, return_inverse=True)  # the distinct invalid tokens
    kinds, details = [], []
    for index in needed.tolist():
        kind, _, detail = (reasons[index] or "invalid_url").partition(": ")
        kinds.append(kind)
        details.append(detail)
    take = pa.array(position.reshape(-1))
    entries = vec.concat(
        pa.scalar('{"url":'),
        vec.json_strings(tokens),
        pa.scalar(',"reason":'),
        vec.json_strings(pa.array(kinds, STRING)).take(take),
        pa.scalar(',"detail":'),
        vec.json_strings(pa.array(details, STRING)).take(take),
        pa.scalar("}"),
    )
    counts = np.bincount(rows, minlength=n)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    joined = pc.binary_join(pa.ListArray.from_arrays(pa.array(offsets), entries), ",")
    return vec.concat(pa.scalar("["), joined, pa.scalar("]"))


def _list_from_mask(mask: np.ndarray, names: list[str]) -> pa.Array:
    """A list<string> per row: the names whose column is set in `mask` (n x len(names))."""
    n = mask.shape[0]
    counts = mask.sum(axis=1)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    which = np.nonzero(mask)[1]  # row-major: in name order within each row
    values = pa.array(names, STRING).take(pa.array(which.astype(np.int64)))
    return (
        pa.ListArray.from_arrays(pa.array(offsets), values) if n else pa.array([], pa.list_(STRING))
    )


def _cell_errors_json(errors: dict[str, tuple[np.ndarray, pa.Array, pa.Array]], n: int) -> pa.Array:
    """`_cell_errors`: per row, a JSON list of {field, value, reason} in field order."""
    if not errors:
        return pa.array(["[]"] * n, STRING)
    parts = []
    for name, (has_error, values, reasons) in errors.items():
        entry = vec.concat(
            pa.scalar('{"field":' + json.dumps(name, ensure_ascii=False) + ',"value":'),
            vec.json_strings(values),
            pa.scalar(',"reason":'),
            vec.json_strings(reasons),
            pa.scalar("},"),
        )
        parts.append(pc.if_else(pa.array(has_error), entry, pa.scalar("")))
    body = pc.utf8_rtrim(vec.concat(*parts), ",")
    return vec.concat(pa.scalar("["), body, pa.scalar("]"))
