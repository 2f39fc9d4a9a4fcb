"""What the asset checks measure (enrich_crawl.defs.checks), as plain functions over documents,
logs and staged files; nothing here imports Dagster, Scrapy or Twisted.

Robots violations. A violation is a request the crawler sent for a URL that the origin's
robots.txt disallows for the crawler's product token (RFC 9309 as enrich_crawl.crawl.robots
implements it: 4xx robots.txt allows all, 5xx/unreachable disallows all), or a request to a host
sent before that host's robots.txt was answered. Two independent records are audited:

- the server-side request log of a virtual web (datasets that bring their own web, the demo, tests
  and benchmarks: `crawl/<shard>/web-requests.jsonl`): every request, in order, whatever the
  crawler believes it did; the rules are those of the robots.txt the log shows was served;
- the crawler's own record of what it fetched (the crawled-URL store `_crawl_pages` of the results
  database, pages fetched since the run started) against the robots.txt verdicts it stored
  (`_crawl_robots`): this works on the real web.

A refusal (the crawler declining a disallowed URL: `robots` in a record's errors) is not a
violation; it is the rule working.
"""

from __future__ import annotations

import datetime as dt
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from enrich_crawl.contracts import LINEAGE_REQUIRED
from enrich_crawl.crawl.robots import RobotsRules, origin_of


def _is_robots(path: str) -> bool:
    return path.split("?", 1)[0] == "/robots.txt"


def _robots_file(web_root: Path, host: str) -> bytes | None:
    try:
        return (web_root / host / "robots.txt").read_bytes()
    except OSError:
        return None


def audit_request_log(
    rows: Iterable[Mapping[str, Any]], web_root: Path, user_agent: str
) -> list[dict[str, Any]]:
    """Robots violations in a virtual web's request log (see the module docstring)."""
    by_origin: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for row in rows:
        method = str(row.get("method", "GET")).upper()
        host = str(row.get("host", "")).lower()
        if method not in ("GET", "HEAD") or not host or not (web_root / host).is_dir():
            continue  # CONNECT tunnels, and requests to hosts that are not part of this web
        origin = origin_of(f"{'https' if row.get('tls') else 'http'}://{host}/")
        by_origin[origin].append(row)

    violations: list[dict[str, Any]] = []
    for origin, requests in sorted(by_origin.items()):
        requests.sort(key=lambda r: float(r.get("t", 0)))
        host = urlsplit(origin).hostname or ""
        robots = next((r for r in requests if _is_robots(str(r.get("path", "")))), None)
        if robots is not None:
            status = int(robots.get("status") or 0)
            if status == 0:
                rules = RobotsRules.unreachable(origin)
            else:
                rules = RobotsRules.from_response(
                    origin, status, _robots_file(web_root, host) or b""
                )
            answered = float(robots.get("t", 0)) + float(robots.get("dur") or 0)
        else:
            # robots.txt not asked in this log: the crawler used its cached verdict (robots TTL);
            # judge by the file the site serves
            body = _robots_file(web_root, host)
            rules = (
                RobotsRules.from_response(origin, 200, body)
                if body is not None
                else RobotsRules(origin, "allow_all")
            )
            answered = -math.inf
        for row in requests:
            path = str(row.get("path", "/"))
            if _is_robots(path):
                continue
            url = origin + path
            if float(row.get("t", 0)) < answered:
                violations.append(
                    {"url": url, "reason": "before_robots", "t": row.get("t"), "source": "server"}
                )
            elif not rules.allowed(url, user_agent):
                violations.append(
                    {"url": url, "reason": "disallowed", "t": row.get("t"), "source": "server"}
                )
    return violations


def _epoch(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, dt.datetime):
        return (value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)).timestamp()
    try:
        parsed = dt.datetime.fromisoformat(str(value))
    except ValueError:
        return None
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.timezone.utc)).timestamp()


def audit_fetched_pages(
    pages: Iterable[Mapping[str, Any]],
    robots_docs: Iterable[Mapping[str, Any]],
    user_agent: str,
    since: float,
) -> list[dict[str, Any]]:
    """Robots violations among the pages the crawler recorded as fetched since `since` (epoch)."""
    rules = {}
    for doc in robots_docs:
        try:
            verdict = RobotsRules.from_doc(dict(doc))
        except (KeyError, TypeError, ValueError):
            continue
        rules[verdict.origin] = verdict
    violations: list[dict[str, Any]] = []
    for page in pages:
        fetched = _epoch(page.get("fetched_at"))
        status = page.get("status")
        if fetched is None or fetched < since or not status:
            continue  # not fetched by this run, or never answered (refused, failed)
        url = str(page.get("url") or page.get("_id") or "")
        if not url or _is_robots(urlsplit(url).path):
            continue
        verdict = rules.get(origin_of(url))
        if verdict is not None and not verdict.allowed(url, user_agent):
            violations.append(
                {"url": url, "reason": "disallowed", "t": fetched, "source": "crawled_pages"}
            )
    return violations


def resolution_rates(
    docs: Iterable[Mapping[str, Any]], fields: Iterable[str]
) -> dict[str, dict[str, Any]]:
    """Per field: records that needed it (still missing, or filled by the crawl) and how many got a
    value; rate = resolved / needed (1.0 when no record needed the field)."""
    names = list(fields)
    counts = {name: {"needed": 0, "resolved": 0} for name in names}
    for doc in docs:
        data = doc.get("data") or {}
        lineage = doc.get("lineage") or {}
        for name in names:
            if data.get(name) is None:
                counts[name]["needed"] += 1
            elif name in lineage:
                counts[name]["needed"] += 1
                counts[name]["resolved"] += 1
    for entry in counts.values():
        entry["rate"] = round(entry["resolved"] / entry["needed"], 4) if entry["needed"] else 1.0
    return counts


def lineage_problems(
    docs: Iterable[Mapping[str, Any]],
    fields: Iterable[str],
    inputs: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Values without (matching, complete) lineage.

    A field's value needs lineage when enrichment gave it, i.e. the input had no value for it
    (`inputs`: record id -> normalised input data, from the seed; without it, an empty `original`
    says so). Lineage must carry the value it explains and where it came from.
    """
    names = list(fields)
    problems: list[dict[str, Any]] = []
    for doc in docs:
        rid = doc.get("_id")
        data = doc.get("data") or {}
        original = doc.get("original") or {}
        lineage = doc.get("lineage") or {}
        given = (inputs or {}).get(rid) if inputs is not None else None
        for name in names:
            value = data.get(name)
            entry = lineage.get(name)
            if entry is None:
                if value is None:
                    continue
                if given is not None:
                    input_missing = given.get(name) is None
                else:  # no seed to ask: an `original` that was empty says the input lacked it
                    before = original.get(name, ...)
                    input_missing = before is None or (
                        isinstance(before, str) and not before.strip()
                    )
                if input_missing:
                    problems.append({"record": rid, "field": name, "problem": "no_lineage"})
                continue
            missing = [k for k in LINEAGE_REQUIRED if entry.get(k) in (None, "")]
            if missing:
                problems.append(
                    {
                        "record": rid,
                        "field": name,
                        "problem": "incomplete_lineage",
                        "missing": missing,
                    }
                )
            elif entry.get("value") != value:
                problems.append(
                    {"record": rid, "field": name, "problem": "value_differs_from_lineage"}
                )
    return problems


def document_coverage(
    expected_ids: Iterable[str], present_ids: Iterable[str], all_usable: Iterable[str] | None = None
) -> dict[str, Any]:
    """Usable records missing from MongoDB, and documents that are no usable record."""
    expected = set(expected_ids)
    present = set(present_ids)
    usable = set(all_usable) if all_usable is not None else expected
    return {
        "expected": len(expected),
        "present": len(expected & present),
        "missing": sorted(expected - present),
        "extra": sorted(present - usable),
    }
