"""Writing learned mappings, and measuring any mappings against known values."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from enrich_crawl.extract.learn.compare import known_value, same_value
from enrich_crawl.extract.learn.model import Example, LearnResult
from enrich_crawl.extract.mapping import MappingSet, run_mapping
from enrich_crawl.extract.page import Page

REPORT_NAME = "learn-report.json"


def write_learned(result: LearnResult, out_dir: Path) -> list[Path]:
    """Write each mapping as `<name>.json` and the report as `learn-report.json` into `out_dir`
    (a valid mappings folder as it stands); returns the paths written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for mapping in result.mappings:
        path = out_dir / f"{mapping['name']}.json"
        path.write_text(json.dumps(mapping, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        written.append(path)
    report = out_dir / REPORT_NAME
    report.write_text(
        json.dumps(result.report, indent=2, ensure_ascii=False, default=str) + "\n",
        encoding="utf-8",
    )
    written.append(report)
    return written


def evaluate(
    mappings: MappingSet,
    examples: list[Example],
    field_types: dict[str, str],
    *,
    max_disagreements: int = 5,
) -> dict[str, Any]:
    """How well `mappings` agree with the examples' known values.

    Per mapping and field: `examples` (records with a known value whose pages the mapping
    matched), `yielded` (those where it gave a value: the first of the record's pages, shallowest
    first), `agreed`, `precision` (agreement: agreed / yielded), `recall` (yield: agreed /
    examples) and up to `max_disagreements` disagreements with their URLs. `fields` gives the
    same per field for what the crawl would resolve (highest priority first)."""
    per: dict[str, dict[str, dict[str, Any]]] = {}
    resolved: dict[str, dict[str, Any]] = {}

    def slot(table: dict, key: str) -> dict[str, Any]:
        return table.setdefault(
            key, {"examples": 0, "yielded": 0, "agreed": 0, "disagreements": []}
        )

    def count(entry: dict, value: Any, known: Any, ftype: str, record: str, url: str) -> None:
        if value is None:
            return
        entry["yielded"] += 1
        if same_value(value, known, ftype):
            entry["agreed"] += 1
        elif len(entry["disagreements"]) < max_disagreements:
            entry["disagreements"].append(
                {"record": record, "url": url, "expected": known, "got": value}
            )

    for example in examples:
        known = {}
        for name, value in (example.values or {}).items():
            if name in field_types:
                typed = known_value(value, field_types[name])
                if typed is not None:
                    known[name] = typed
        if not known:
            continue
        by_mapping: dict[str, dict[str, tuple[Any, str]]] = {}
        first: dict[str, tuple[Any, str, int]] = {}
        matched: set[str] = set()
        for source in sorted(example.pages, key=lambda p: p.depth):
            try:
                page = Page(source.url, source.body, content_type=source.content_type)
            except (ValueError, TypeError):
                continue
            url = source.url + (f"#{source.fragment}" if source.fragment else "")
            for mapping in mappings.matching(url):
                matched.add(mapping.name)
                result = run_mapping(
                    mapping,
                    page,
                    fragment=source.fragment,
                    record_id=example.record_id,
                    field_types=field_types,
                    only_fields=known,
                    with_links=False,
                )
                got = by_mapping.setdefault(mapping.name, {})
                for name, value in result.fields.items():
                    got.setdefault(name, (value, url))
                    # the crawl's order: shallowest page first, then the highest priority
                    first.setdefault(name, (value, url, mapping.priority))
        for mapping_name in matched:
            mapping = mappings.by_name[mapping_name]
            got = by_mapping.get(mapping_name, {})
            for name in mapping.field_set & set(known):
                entry = slot(per.setdefault(mapping_name, {}), name)
                entry["examples"] += 1
                if name in got:
                    value, url = got[name]
                    count(entry, value, known[name], field_types[name], example.record_id, url)
        for name, value in known.items():
            entry = slot(resolved, name)
            entry["examples"] += 1
            if name in first:
                got_value, url, _priority = first[name]
                count(entry, got_value, value, field_types[name], example.record_id, url)

    def finish(entry: dict[str, Any]) -> dict[str, Any]:
        entry["precision"] = (
            round(entry["agreed"] / entry["yielded"], 4) if entry["yielded"] else None
        )
        entry["recall"] = (
            round(entry["agreed"] / entry["examples"], 4) if entry["examples"] else None
        )
        return entry

    return {
        "mappings": {
            m: {f: finish(e) for f, e in sorted(fields.items())}
            for m, fields in sorted(per.items())
        },
        "fields": {f: finish(e) for f, e in sorted(resolved.items())},
    }
