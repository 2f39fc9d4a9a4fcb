"""The crawl's counters, one object that every room of the spider adds to and the report reads."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class Tally:
    counts: Counter[str] = field(default_factory=Counter)  # records, pages, bytes, candidates...
    errors_by_kind: Counter[str] = field(default_factory=Counter)  # reason -> pages failed
    outcomes: Counter[str] = field(default_factory=Counter)  # record outcome -> records
    render: Counter[str] = field(default_factory=Counter)  # rendered, skipped/..., failed/...
