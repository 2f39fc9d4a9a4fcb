"""How records end: a page that fails fails its waiting records, a record is abandoned on an
internal error or finished when the crawl stops, and every finished record gets its line in
records.jsonl (candidates.jsonl beside it, both in OutputFiles)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from enrich_crawl.contracts import (
    CANDIDATES_FILE,
    RECORD_OUTCOMES_FILE,
    CandidateLine,
    RecordOutcomeLine,
    crawl_outcome,
)
from enrich_crawl.crawl.frontier import Frontier, RecordState
from enrich_crawl.crawl.tally import Tally
from enrich_crawl.staging import dumps


class OutputFiles:
    """candidates.jsonl and records.jsonl of the partition, appended as the crawl goes."""

    def __init__(self, out_dir: Path):
        out_dir.mkdir(parents=True, exist_ok=True)
        self.candidates = open(out_dir / CANDIDATES_FILE, "w", encoding="utf-8")  # noqa: SIM115
        self.records = open(out_dir / RECORD_OUTCOMES_FILE, "w", encoding="utf-8")  # noqa: SIM115
        self.last_flush = time.monotonic()

    def write_candidate(self, row: CandidateLine) -> None:
        self.candidates.write(dumps(row) + "\n")

    def write_record(self, row: RecordOutcomeLine) -> None:
        self.records.write(dumps(row) + "\n")
        now = time.monotonic()
        if now - self.last_flush > 1.0:
            self.flush()
            self.last_flush = now

    def flush(self) -> None:
        self.candidates.flush()
        self.records.flush()

    def close(self) -> None:
        self.flush()
        self.candidates.close()
        self.records.close()


class Outcomes:
    """Ends records and writes their lines. The frontier calls `record_done` for each record it
    finishes; `capacity` is set then, for the feed waiting to start more records."""

    def __init__(self, out: OutputFiles, tally: Tally):
        self.out = out
        self.tally = tally
        self.capacity = asyncio.Event()
        self.frontier: Frontier | None = None  # the frontier these records live in (attach)

    def attach(self, frontier: Frontier) -> None:
        self.frontier = frontier

    def record_done(self, state: RecordState) -> None:
        errors = list(state.errors)
        failed_urls = {e["url"] for e in errors}
        if state.needed:
            for seed in state.seeds:
                if not state.seed_yield.get(seed) and seed not in failed_urls:
                    errors.append({"url": seed, "reason": "not_on_page"})
        outcome = crawl_outcome(state.wanted, state.needed, state.fresh)
        self.tally.outcomes[outcome] += 1
        row: RecordOutcomeLine = {
            "record": state.id,
            "outcome": outcome,
            "errors": errors,
            "pages": state.pages,
            "found": sorted(state.found),
            "needed": sorted(state.needed),
            "seconds": round(time.monotonic() - state.started, 3),
        }
        if state.fresh:
            row["fresh"] = sorted(state.fresh)
        self.out.write_record(row)
        self.capacity.set()

    def fail(self, key: str, reason: str, detail: str = "") -> None:
        """The page `key` failed: every record waiting on it records the reason."""
        self.tally.errors_by_kind[reason] += 1
        for waiter in self.frontier.take(key):
            self.frontier.record_error(waiter, reason, detail)
            self.frontier.release(waiter)

    def abandon(self, record_id: Any, detail: str) -> None:
        """The record ends now with an internal error (one bad record never stops the crawl)."""
        state = self.frontier.records.get(record_id)
        if state is None:
            return
        url = state.seeds[0] if state.seeds else ""
        state.errors.append({"url": url, "reason": "error", "detail": detail})
        state.done = True
        self.frontier.completed += 1
        del self.frontier.records[record_id]
        self.record_done(state)

    def finish_active(self, reason: str) -> None:
        """Records still active when the crawl stops (time budget, termination) end with the
        reason."""
        for state in list(self.frontier.records.values()):
            state.errors.append(
                {
                    "url": state.seeds[0] if state.seeds else "",
                    "reason": reason if reason not in ("finished",) else "unfinished",
                }
            )
            state.done = True
            self.frontier.completed += 1
            self.record_done(state)
        self.frontier.records.clear()

    def not_started(self, record: dict[str, Any], reason: str) -> None:
        """The line of a record the crawl stopped before feeding: nothing is lost, the merge and
        the checks count them."""
        why = reason if reason != "finished" else "unfinished"
        missing = sorted(record.get("_missing") or ())
        urls = record.get("_urls") or []
        errors = [dict(e) for e in record.get("_url_errors") or ()]
        if missing:
            errors.append(
                {
                    "url": urls[0] if urls else "",
                    "reason": why,
                    "detail": f"not started: the crawl stopped ({reason}) before this record",
                }
            )
        outcome = "not_started" if missing else "nothing_to_do"
        self.tally.outcomes[outcome] += 1
        self.tally.counts["records_not_started"] += 1
        self.out.write_record(
            {
                "record": record["_id"],
                "outcome": outcome,
                "errors": errors,
                "pages": 0,
                "found": [],
                "needed": missing,
                "seconds": 0.0,
            }
        )
