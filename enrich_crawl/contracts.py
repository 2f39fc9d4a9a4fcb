"""What the stages hand to each other, defined once: the files of a shard's crawl, the lines in
them, the lineage kept per value, and a record's outcome.

seed_dataset --seed/shard=<key>.parquet--> crawl worker --candidates.jsonl, records.jsonl,
stats.json--> resolve --resolved/<key>.jsonl--> merge --MongoDB documents with lineage-->

Plain data (TypedDicts and constants): every stage can import it, from the crawl worker to the
Dagster wiring, without pulling anything else in. The paths themselves are built by
enrich_crawl.staging.DatasetStage; the seed shard is read by enrich_crawl.dataset.seedfile.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection
from typing import Any, Literal, TypedDict

# -- files of one shard's crawl (crawl/<key>/) ---------------------------------------------------

CANDIDATES_FILE = "candidates.jsonl"  # CandidateLine per value found on a page
RECORD_OUTCOMES_FILE = "records.jsonl"  # RecordOutcomeLine per record the crawl finished
CRAWL_STATS_FILE = "stats.json"  # the crawl's statistics, written when it ends
CRAWL_PROGRESS_FILE = "progress.json"  # the crawl's statistics while it runs
CRAWL_FAILURE_FILE = "failure.json"  # why the crawl of the shard failed (after its retries)
WEB_REQUESTS_FILE = "web-requests.jsonl"  # a virtual web's request log (robots audit)

# files that describe one run of a shard's crawl: removed before a crawl starts, so that a crawl
# which dies early never leaves an older run's results to be resolved and merged as this run's
CRAWL_RUN_FILES = (
    CANDIDATES_FILE,
    RECORD_OUTCOMES_FILE,
    CRAWL_STATS_FILE,
    CRAWL_PROGRESS_FILE,
    CRAWL_FAILURE_FILE,
    WEB_REQUESTS_FILE,
)


# -- lines ---------------------------------------------------------------------------------------


class CandidateLine(TypedDict):
    """A value a mapping found for a record's field on one page (candidates.jsonl)."""

    record: str
    field: str
    value: Any
    url: str  # the page, with the record's fragment when it has one
    mapping: str
    priority: int
    depth: int
    fetched_at: str | None  # ISO time the page was fetched (None: unknown)
    http_status: int | None
    content_hash: str | None
    rendered: bool


class RecordError(TypedDict, total=False):
    url: str
    reason: str
    detail: str


# not_started: the crawl stopped (time budget, termination) before it fed the record
CrawlOutcome = Literal["nothing_to_do", "fresh", "resolved", "partial", "unresolved", "not_started"]
FillOutcome = Literal["resolved", "partial", "unresolved"]


class _RecordOutcomeRequired(TypedDict):
    record: str
    outcome: str  # a CrawlOutcome
    errors: list[RecordError]
    pages: int


class RecordOutcomeLine(_RecordOutcomeRequired, total=False):
    """How the crawl ended for one record (records.jsonl)."""

    found: list[str]  # fields a value was found for
    needed: list[str]  # fields still without one
    fresh: list[str]  # fields skipped: resolved recently enough (stale rule)
    seconds: float


class ResolvedField(TypedDict, total=False):
    """The winning candidate of one field, with its lineage (resolved line `fields`)."""

    value: Any
    source_url: str
    mapping: str
    depth: int
    fetched_at: str | None
    http_status: int | None
    content_hash: str | None
    rendered: bool
    candidates: int
    conflicts: int
    alternatives: list[dict[str, Any]]


class ResolvedLine(TypedDict):
    """One record of a shard, ready to merge (resolved/<key>.jsonl)."""

    record: str
    row: int | None
    data: dict[str, Any]
    raw: dict[str, Any]
    missing_before: list[str]
    urls: list[str]
    fields: dict[str, ResolvedField]
    errors: list[RecordError]
    pages: int
    crawled: bool


# -- lineage -------------------------------------------------------------------------------------

# what a candidate carries into the lineage of the value it gives
CANDIDATE_LINEAGE_KEYS = (
    "source_url",
    "mapping",
    "depth",
    "fetched_at",
    "http_status",
    "content_hash",
    "rendered",
)
# without these, a value cannot be explained (values_have_lineage)
LINEAGE_REQUIRED = ("value", "source_url", "mapping", "run_id", "partition")


class LineageEntry(TypedDict, total=False):
    """Why a record holds a value it did not have (document `lineage.<field>`)."""

    value: Any
    previous: Any
    source_url: str
    mapping: str
    depth: int
    fetched_at: dt.datetime | None
    http_status: int | None
    run_id: str
    partition: str
    content_hash: str | None
    rendered: bool
    candidates: int
    conflicts: int
    alternatives: list[dict[str, Any]]


# -- a record's outcome --------------------------------------------------------------------------


def fill_outcome(still_missing: bool, filled_any: bool) -> FillOutcome:
    """resolved: no field left without a value; partial: some were filled, not all; unresolved:
    none was filled. The one definition behind the crawl's outcome and the document's status."""
    if not still_missing:
        return "resolved"
    return "partial" if filled_any else "unresolved"


def crawl_outcome(
    wanted: Collection[str], needed: Collection[str], fresh: Collection[str]
) -> CrawlOutcome:
    """How the crawl ended for a record that wanted `wanted` fields, still `needed` some, and
    skipped `fresh` ones (resolved recently enough)."""
    if not wanted:
        return "nothing_to_do"
    if fresh and frozenset(fresh) == frozenset(wanted):
        return "fresh"
    return fill_outcome(bool(needed), len(needed) < len(wanted))
