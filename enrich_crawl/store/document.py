"""One record's document in the results collection (docs/results.md): the merge policy, with
per-field lineage and history, applied to the existing document and the record's resolved line.

Policy, per enriched field (a field of the dataset spec):
- a field present in the dataset and not `refresh` is never overwritten; if an earlier run had
  filled it and the dataset now has its own value, the dataset's value wins and the field's lineage
  is dropped (its history stays);
- a missing field is filled by the crawl's winner; a value an earlier run found is kept when this
  run finds nothing, and is replaced only by a newer (later `fetched_at`), different value;
- a `refresh` field is overwritten only by a newer, different value: the web value, with its fetch
  time, is taken as newer than the table's; the value it replaces goes to `lineage.<field>.previous`
  and the first value ever seen stays in `original`;
- `lineage.<field>` holds the documented keys (value, previous, source_url, mapping, depth, fetched_at,
  http_status, run_id, partition) plus content_hash, rendered, candidates and conflicts (how many
  candidates disagreed with the winner) and a sample of the losing values (`alternatives`);
- `history.<field>` keeps the last HISTORY_LIMIT values, appended only when the value changes, so
  re-running adds nothing; `status`, `missing` and `source_hosts` are recomputed every time,
  `errors` are this run's.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any
from urllib.parse import urlsplit

from enrich_crawl.contracts import LineageEntry, fill_outcome

HISTORY_LIMIT = 5
ALTERNATIVES_LIMIT = 3


@dataclass
class Changes:
    """What building one document changed (counted once its write is confirmed)."""

    filled: list[str] = field(default_factory=list)
    refreshed: list[str] = field(default_factory=list)
    superseded: list[str] = field(default_factory=list)
    kept: int = 0
    conflicts: int = 0


# -- values and times --------------------------------------------------------------------------


def as_datetime(value: Any) -> dt.datetime | None:
    """A timezone-aware datetime from a datetime or an ISO string (nx-27017 may return strings)."""
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)
    try:
        parsed = dt.datetime.fromisoformat(str(value))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.timezone.utc)


def to_ms(value: dt.datetime) -> dt.datetime:
    """BSON dates hold milliseconds: compare and store at that precision."""
    return value.replace(microsecond=value.microsecond // 1000 * 1000)


def _newer(candidate: dict[str, Any], lineage: dict[str, Any]) -> bool:
    new, old = as_datetime(candidate.get("fetched_at")), as_datetime(lineage.get("fetched_at"))
    if new is None or old is None:
        return True  # cannot tell: the crawl's value is the fresher evidence
    return to_ms(new) > to_ms(old)


def _same(a: Any, b: Any) -> bool:
    return (a == b and type(a) is type(b)) or (
        isinstance(a, (int, float))
        and isinstance(b, (int, float))
        and not isinstance(a, bool)
        and not isinstance(b, bool)
        and a == b
    )


@lru_cache(maxsize=65536)
def _host(url: str) -> str:
    try:
        return urlsplit(url).hostname or ""
    except ValueError:
        return ""


def _error(entry: dict[str, Any]) -> dict[str, Any]:
    error = {"url": entry.get("url"), "reason": entry.get("reason")}
    if entry.get("detail"):
        error["detail"] = entry["detail"]
    return error


def _fix_times(entries: Iterable[dict[str, Any]]) -> None:
    """Carried-over lineage/history entries keep BSON dates even if a server returned strings."""
    for entry in entries:
        value = entry.get("fetched_at")
        if isinstance(value, str):
            entry["fetched_at"] = as_datetime(value)


# -- one document ------------------------------------------------------------------------------


def build_document(
    line: dict[str, Any],
    existing: dict[str, Any] | None,
    *,
    fields: dict[str, dict[str, Any]],
    run_id: str,
    partition: str,
    now: dt.datetime,
) -> tuple[dict[str, Any], bool, Changes]:
    """(the new document of one record, whether it differs from `existing`, what changed)."""
    input_data = line["data"]
    data = dict(input_data)
    raw = line.get("raw") or {}
    winners = line.get("fields") or {}
    changes = Changes()
    if existing:
        old_data = existing.get("data") or {}
        old_lineage = existing.get("lineage") or {}
        old_original = existing.get("original") or {}
        old_history = existing.get("history") or {}
    else:
        old_data = old_lineage = old_original = old_history = {}
    original = dict(old_original)
    history = dict(old_history)
    lineage: dict[str, Any] = {}
    touched = False  # lineage or history differ from the existing document's

    for name, spec in fields.items():
        input_value = input_data.get(name)
        locked = input_value is not None and not spec.get("refresh")
        entry = old_lineage.get(name)
        current = input_value
        if entry is not None:
            if locked:
                # the dataset now has its own value: it wins, the web's lineage no longer applies
                changes.superseded.append(name)
                touched = True
                entry = None
            else:
                current = entry.get("value")
                data[name] = current
                lineage[name] = entry
        winner = winners.get(name)
        if winner is None or locked:
            if entry is not None:
                changes.kept += 1
            continue
        value = winner.get("value")
        if value is None:
            continue
        if current is not None and (
            _same(value, current) or (entry is not None and not _newer(winner, entry))
        ):
            if entry is not None:
                changes.kept += 1
            continue
        fetched_at = as_datetime(winner.get("fetched_at"))
        new_entry: LineageEntry = {
            "value": value,
            "previous": current,
            "source_url": winner.get("source_url"),
            "mapping": winner.get("mapping"),
            "depth": winner.get("depth"),
            "fetched_at": fetched_at,
            "http_status": winner.get("http_status"),
            "run_id": run_id,
            "partition": partition,
            "content_hash": winner.get("content_hash"),
            "rendered": bool(winner.get("rendered")),
            "candidates": winner.get("candidates", 1),
            "conflicts": winner.get("conflicts", 0),
        }
        if winner.get("alternatives"):
            new_entry["alternatives"] = winner["alternatives"][:ALTERNATIVES_LIMIT]
        lineage[name] = new_entry
        data[name] = value
        touched = True
        if name not in original:
            original[name] = raw.get(name, input_value)
        changes.conflicts += int(winner.get("conflicts") or 0)
        (changes.filled if current is None else changes.refreshed).append(name)
        past = history.get(name) or []
        if not past or not _same(past[-1].get("value"), value):
            history[name] = [
                *past[-(HISTORY_LIMIT - 1) :],
                {
                    "value": value,
                    "source_url": new_entry["source_url"],
                    "mapping": new_entry["mapping"],
                    "fetched_at": fetched_at,
                    "run_id": run_id,
                },
            ]

    # what normalisation changed is kept too (the original is never lost); a blank cell that
    # became null is no change worth recording
    for column, value in raw.items():
        if column not in original and not (isinstance(value, str) and not value.strip()):
            original[column] = value

    missing = [name for name in fields if data.get(name) is None]
    status = fill_outcome(
        bool(missing),
        any(input_data.get(n) is None and data.get(n) is not None for n in fields),
    )
    hosts = sorted({_host(e["source_url"]) for e in lineage.values() if e.get("source_url")})
    doc = {
        "_id": line["record"],
        "data": data,
        "original": original,
        "lineage": lineage,
        "history": history,
        "status": status,
        "missing": missing,
        "errors": [_error(e) for e in line.get("errors") or ()],
        "source_hosts": hosts,
        "pages": line.get("pages", 0),
        "row": line.get("row"),
        "updated_at": now,
    }
    if not existing:
        return doc, True, changes
    changed = (
        touched
        or len(lineage) != len(old_lineage)
        or data != old_data
        or original != old_original
        or status != existing.get("status")
        or missing != existing.get("missing")
        or doc["errors"] != existing.get("errors")
        or hosts != existing.get("source_hosts")
        or doc["pages"] != existing.get("pages")
        or doc["row"] != existing.get("row")
        or doc.keys() != existing.keys()
    )
    if changed:
        _fix_times(lineage.values())
        for entries in history.values():
            _fix_times(entries)
    return doc, changed, changes
