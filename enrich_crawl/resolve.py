"""resolved_fields: pick, for every record and field, the winning candidate of the crawl.

Conflicting candidates are resolved by mapping priority (higher first), then depth (closer to the
record's own URL first), then recency (fetched later first); ties then go to the value more
candidates agree on, then to the smaller URL, so the outcome does not depend on crawl order. The
losers whose value disagrees with the winner's (case and spacing ignored) are counted as conflicts
(per line, field and shard) and the best of each losing value is kept as `alternatives`.

The output lines carry everything the merge needs, so the merge reads one file and never the
crawl's raw output; that file is the durable hand-over to the merge (a MongoDB outage never sends
the crawl back to work).
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

from enrich_crawl.contracts import CANDIDATE_LINEAGE_KEYS, ResolvedLine
from enrich_crawl.dataset.seedfile import read_seed_shard
from enrich_crawl.staging import DatasetStage, read_jsonl, write_json, write_jsonl

ALTERNATIVES_LIMIT = 3


def _timestamp(value: Any) -> float:
    """Seconds since the epoch of an ISO time (naive = UTC); 0 when unknown (oldest)."""
    if not value:
        return 0.0
    try:
        parsed = dt.datetime.fromisoformat(str(value))
    except ValueError:
        return 0.0
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.timezone.utc)
    return parsed.timestamp()


def _key(value: Any) -> Any:
    """The form in which two candidate values count as the same (case, spacing and list order of
    strings ignored), so reformatting is not a conflict."""
    if isinstance(value, str):
        return " ".join(value.split()).casefold()
    if isinstance(value, list):
        return tuple(sorted(repr(_key(v)) for v in value))
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value if isinstance(value, (int, float)) or value is None else repr(value)


def _rank(candidate: dict[str, Any], support: int = 1) -> tuple:
    """Sort key, best first: higher mapping priority, then lower depth (closer to the record's own
    URL), then later fetch, then more candidates agreeing, then URL (stable across runs)."""
    return (
        -int(candidate.get("priority") or 0),
        int(candidate.get("depth") or 0),
        -_timestamp(candidate.get("fetched_at")),
        -support,
        str(candidate.get("url") or ""),
        repr(candidate.get("value")),
    )


def choose(candidates: list[dict[str, Any]]) -> tuple[dict[str, Any], int]:
    """(winner, number of candidates disagreeing with it)."""
    winner, losers = rank_candidates(candidates)
    return winner, len(losers)


def rank_candidates(
    candidates: list[dict[str, Any]],
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(winner, the candidates whose value disagrees with the winner's, best first)."""
    support: dict[Any, int] = defaultdict(int)
    keys = [_key(c["value"]) for c in candidates]
    for key in keys:
        support[key] += 1
    order = sorted(range(len(candidates)), key=lambda i: _rank(candidates[i], support[keys[i]]))
    best = order[0]
    winner = candidates[best]
    losers = [candidates[i] for i in order[1:] if keys[i] != keys[best]]
    return winner, losers


def _alternatives(losers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The best candidate of each losing value, a few at most (auditable without the crawl files)."""
    sample: list[dict[str, Any]] = []
    seen: set[Any] = set()
    for loser in losers:
        key = _key(loser["value"])
        if key in seen:
            continue
        seen.add(key)
        sample.append(
            {
                "value": loser["value"],
                "source_url": loser.get("url"),
                "mapping": loser.get("mapping"),
                "depth": loser.get("depth"),
            }
        )
        if len(sample) == ALTERNATIVES_LIMIT:
            break
    return sample


def resolve_shard(stage: DatasetStage, shard: str) -> dict[str, Any]:
    """Write `resolved/<shard>.jsonl`; returns a summary (counts per field, conflicts, outcomes)."""
    by_record: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for candidate in read_jsonl(stage.candidates(shard)):
        by_record[candidate["record"]][candidate["field"]].append(candidate)
    outcomes = {row["record"]: row for row in read_jsonl(stage.record_outcomes(shard))}

    summary: dict[str, Any] = {
        "shard": shard,
        "records": 0,
        "crawled": 0,
        "fields_resolved": 0,
        "conflicts": 0,
        "fields_with_conflicts": 0,
        "per_field": defaultdict(int),
        "conflicts_per_field": defaultdict(int),
        "records_with_values": 0,
        "pages": 0,
    }

    def lines() -> Iterator[ResolvedLine]:
        for record in read_seed_shard(stage.seed_shard(shard)):
            rid = record["_id"]
            summary["records"] += 1
            outcome = outcomes.get(rid)
            if outcome is not None:
                summary["crawled"] += 1
                summary["pages"] += int(outcome.get("pages") or 0)
            fields: dict[str, Any] = {}
            for name, candidates in by_record.pop(rid, {}).items():
                if name not in record["_missing"]:
                    continue
                winner, losers = rank_candidates(candidates)
                fields[name] = {
                    "value": winner["value"],
                    "source_url": winner.get("url"),
                    **{k: winner.get(k) for k in CANDIDATE_LINEAGE_KEYS if k != "source_url"},
                    "candidates": len(candidates),
                    "conflicts": len(losers),
                }
                if losers:
                    fields[name]["alternatives"] = _alternatives(losers)
                    summary["conflicts_per_field"][name] += len(losers)
                    summary["fields_with_conflicts"] += 1
                summary["fields_resolved"] += 1
                summary["conflicts"] += len(losers)
                summary["per_field"][name] += 1
            if fields:
                summary["records_with_values"] += 1
            errors = list(record["_url_errors"])
            if outcome is not None:
                errors.extend(e for e in outcome.get("errors", []) if e not in errors)
            yield {
                "record": rid,
                "row": record["_row"],
                "data": record["_data"],
                "raw": record["_raw"],
                "missing_before": record["_missing"],
                "urls": record["_urls"],
                "fields": fields,
                "errors": errors,
                "pages": int(outcome.get("pages") or 0) if outcome else 0,
                "crawled": outcome is not None,
            }

    write_jsonl(stage.resolved(shard), lines())
    summary["per_field"] = dict(summary["per_field"])
    summary["conflicts_per_field"] = dict(summary["conflicts_per_field"])
    write_json(stage.resolved_summary(shard), summary)
    return summary
