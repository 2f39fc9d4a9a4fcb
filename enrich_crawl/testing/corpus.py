"""A corpus for learned mappings, as both its builders write it (`learn_corpora` for pydocs and
synth, `structured_pages` for structured): the record model, the table's known cells drawn from the
truth, and the dataset (CSV + spec) and truth files it leaves on disk."""

from __future__ import annotations

import csv
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Corpus:
    name: str
    root: Path
    spec_path: Path
    web_root: Path
    field_types: dict[str, str]
    id_column: str
    url_columns: list[str]
    urls: dict[str, list[str]]  # record id -> its seed URLs (with fragments)
    known: dict[str, dict[str, Any]]  # record id -> the cells present in the table
    truth: dict[str, dict[str, Any]]  # record id -> every field's true value (None: none)
    hidden: dict[str, list[str]]  # record id -> blank fields whose truth is a value
    unfindable: dict[str, dict[str, str]] = field(default_factory=dict)  # record -> field -> why
    cells: dict[str, dict[str, str]] = field(default_factory=dict)  # the known cells as written
    depth: int = 1
    notes: list[str] = field(default_factory=list)

    @property
    def truth_path(self) -> Path:
        return self.root / "truth.json"

    def hidden_cells(self) -> int:
        return sum(len(v) for v in self.hidden.values())


def _text(value: Any, ftype: str) -> str:
    if value is None:
        return ""
    if ftype == "boolean":
        return "true" if value else "false"
    if ftype == "list":
        return ", ".join(str(v) for v in value)
    return str(value)


def _write(corpus: Corpus, cells: dict[str, dict[str, str]]) -> None:
    """The dataset (CSV + spec) and the truth files of a corpus."""
    corpus.cells = cells
    root = corpus.root
    source = root / f"{corpus.name}.csv"
    fields = list(corpus.field_types)
    with open(source, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow([corpus.id_column, *corpus.url_columns, *fields])
        for record_id, urls in corpus.urls.items():
            row_urls = list(urls) + [""] * (len(corpus.url_columns) - len(urls))
            writer.writerow(
                [record_id, *row_urls, *(cells.get(record_id, {}).get(f, "") for f in fields)]
            )
    lines = [
        f"name: learn_{corpus.name}",
        f"source: {source.name}",
        f"id: {corpus.id_column}",
        f"urls: [{', '.join(corpus.url_columns)}]",
        "fields:",
        *(
            f"  {f}: {{}}" if t == "string" else f"  {f}: {{type: {t}}}"
            for f, t in corpus.field_types.items()
        ),
        'missing_values: ["", "N/A", "-", "unknown", "n/a"]',
        "crawl:",
        f"  depth: {corpus.depth}",
        f"virtual_web: {corpus.web_root.relative_to(root)}",
        "",
    ]
    corpus.spec_path.write_text("\n".join(lines), encoding="utf-8")
    dump = {"ensure_ascii": False, "indent": 1, "sort_keys": True}
    corpus.truth_path.write_text(json.dumps(corpus.truth, **dump), encoding="utf-8")
    (root / "hidden.json").write_text(json.dumps(corpus.hidden, **dump), encoding="utf-8")
    (root / "unfindable.json").write_text(json.dumps(corpus.unfindable, **dump), encoding="utf-8")


def _split_cells(
    truth: dict[str, dict[str, Any]],
    field_types: dict[str, str],
    known_fraction: float,
    rng: random.Random,
    *,
    dirty: Any = None,
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, str]], dict[str, list[str]]]:
    """Per field, `known_fraction` of the cells that have a value are present in the table."""
    known: dict[str, dict[str, Any]] = {r: {} for r in truth}
    cells: dict[str, dict[str, str]] = {r: {} for r in truth}
    hidden: dict[str, list[str]] = {r: [] for r in truth}
    for fname, ftype in field_types.items():
        with_value = sorted(r for r in truth if truth[r].get(fname) is not None)
        chosen = set(rng.sample(with_value, round(len(with_value) * known_fraction)))
        for record_id in with_value:
            value = truth[record_id][fname]
            if record_id in chosen:
                known[record_id][fname] = value
                text = _text(value, ftype)
                cells[record_id][fname] = dirty(rng, value, text) if dirty else text
            else:
                hidden[record_id].append(fname)
    return known, cells, hidden
