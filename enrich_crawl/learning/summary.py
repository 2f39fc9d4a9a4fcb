"""Summaries of what was learned and evaluated, for the CLI, the asset metadata and the checks."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from enrich_crawl.learning.mappings import REPORT_FILE
from enrich_crawl.staging import read_json


def _learned_numbers(learned: dict[str, Any], name: str) -> dict[str, Any]:
    """examples / precision / recall of field `name` in a mapping's `learned` object, whether it
    keeps them per field (`fields: {name: {...}}`) or per measure (`precision: {name: p}`)."""
    out: dict[str, Any] = {}
    per_field = (learned.get("fields") or {}).get(name)
    if isinstance(per_field, dict):
        out.update({k: per_field.get(k) for k in ("examples", "precision", "recall")})
    for key in ("examples", "precision", "recall", "held_out"):
        value = learned.get(key)
        if isinstance(value, dict) and name in value:
            out[key] = value[name]
        elif key not in out and isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = value
    return out


def learned_fields(mappings: Iterable[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Per field, the learned rules: mapping name, examples, held-out precision and recall, and
    the rule (the field's processors), best precision first."""
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for mapping in mappings:
        learned = mapping.get("learned") or {}
        for rule in mapping.get("fields") or []:
            name = rule.get("name")
            numbers = _learned_numbers(learned, name)
            out[name].append(
                {
                    "mapping": mapping.get("name"),
                    "examples": numbers.get("examples"),
                    "precision": numbers.get("precision"),
                    "recall": numbers.get("recall"),
                    "held_out": numbers.get("held_out"),
                    "rule": rule.get("processors"),
                }
            )
    for rules in out.values():
        rules.sort(key=lambda r: -(r["precision"] or 0.0))
    return dict(out)


def read_learned(out_dir: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The learned mapping documents of a folder and its learn report (empty when absent)."""
    mappings = []
    for path in sorted(Path(out_dir).glob("*.json")):
        if path.name == REPORT_FILE:
            continue
        try:
            raw = json.loads(path.read_text("utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(raw, dict) and isinstance(raw.get("learned"), dict):
            mappings.append(raw)
    report_path = Path(out_dir) / REPORT_FILE
    report = read_json(report_path) if report_path.exists() else {}
    return mappings, report


def evaluation_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (mapping, field) of an evaluation: examples, agreement, yield, disagreements."""
    rows = []
    for mapping, entry in sorted((result.get("mappings") or {}).items()):
        for name, numbers in sorted((entry or {}).items()):
            if not isinstance(numbers, dict):
                continue
            rows.append(
                {
                    "mapping": mapping,
                    "field": name,
                    "examples": int(numbers.get("examples") or 0),
                    "yielded": int(numbers.get("yielded") or 0),
                    "agreed": int(numbers.get("agreed") or 0),
                    "agreement": numbers.get("agreement", numbers.get("precision")),
                    "yield": numbers.get("yield", numbers.get("recall")),
                    "disagreements": list(numbers.get("disagreements") or []),
                }
            )
    return rows


def agreement_problems(
    result: dict[str, Any],
    *,
    min_agreement: float,
    min_disagreements: int = 2,
    min_examples: int = 3,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(disagreeing, silent) rows of an evaluation: mappings whose values disagree with the known
    ones (agreement below `min_agreement`, on at least `min_disagreements` records: one odd
    known value is not a broken mapping), and mappings that yield nothing at all on at least
    `min_examples` records that hold the field (a layout change often looks like that too)."""
    disagreeing, silent = [], []
    for row in evaluation_rows(result):
        agreement = row["agreement"]
        wrong = row["yielded"] - int(row.get("agreed") or 0)
        if agreement is not None and agreement < min_agreement and wrong >= min_disagreements:
            disagreeing.append(row)
        elif row["examples"] >= min_examples and not row["yield"]:
            silent.append(row)
    return disagreeing, silent
