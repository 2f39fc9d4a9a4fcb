"""The one definition of the counts a run reports (the CLI summary, the UI metadata of
`enriched_records`, and what MongoDB holds): all of them computed here, from the same sources.

- records by status: the dataset's documents in MongoDB by `status` (resolved | partial |
  unresolved);
- fields resolved: the (record, field) values in MongoDB that came from the web, i.e. the
  `lineage.<field>` entries of the dataset's fields (a value found again unchanged on a later run
  keeps its lineage and still counts; a value that equals the table's own is not a resolution);
- pages fetched: pages this run downloaded (the crawl statistics of its shards: no cache hits, no
  pages re-used from the crawl store);
- pages per resolved record: pages fetched / records whose status is `resolved` (every field
  present); n/a when no record is resolved;
- errors by kind: the `errors` of the documents (this run's reasons why a URL gave nothing:
  invalid_url, robots, http_<code>, not_on_page, ...), by `reason`.

Plain code: nothing here imports Dagster.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

# what to read of each document (the counts need nothing else)
PROJECTION = {"status": 1, "lineage": 1, "errors": 1}


def count_documents(
    documents: Iterable[Mapping[str, Any]], fields: Iterable[str]
) -> dict[str, Any]:
    """Records by status, fields resolved (total and per field) and errors by kind."""
    fields = list(fields)
    status: Counter[str] = Counter()
    per_field: Counter[str] = Counter({name: 0 for name in fields})
    errors: Counter[str] = Counter()
    records = 0
    for doc in documents:
        records += 1
        status[str(doc.get("status") or "unknown")] += 1
        lineage = doc.get("lineage") or {}
        for name in fields:
            if lineage.get(name):
                per_field[name] += 1
        for error in doc.get("errors") or []:
            errors[str((error or {}).get("reason") or "error")] += 1
    return {
        "records": records,
        "status": dict(sorted(status.items())),
        "fields_resolved": sum(per_field.values()),
        "fields": dict(per_field),
        "errors": dict(sorted(errors.items())),
    }


def pages_fetched(stats_files: Iterable[Path]) -> int:
    """Pages downloaded, summed over the shards' crawl statistics (stats.json)."""
    total = 0
    for path in stats_files:
        try:
            total += int(json.loads(Path(path).read_text("utf-8")).get("pages") or 0)
        except (OSError, ValueError, TypeError):
            continue
    return total


def pages_per_resolved_record(pages: int, resolved_records: int) -> float | None:
    return round(pages / resolved_records, 2) if resolved_records else None


def run_counts(
    documents: Iterable[Mapping[str, Any]], fields: Iterable[str], stats_files: Iterable[Path]
) -> dict[str, Any]:
    """Every count of a run (see the module docstring)."""
    counts = count_documents(documents, fields)
    counts["pages"] = pages_fetched(stats_files)
    counts["pages_per_resolved_record"] = pages_per_resolved_record(
        counts["pages"], counts["status"].get("resolved", 0)
    )
    return counts
