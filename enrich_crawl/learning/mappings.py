"""Learned mappings beside given ones: which take precedence, which files an earlier `learn`
wrote."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

REPORT_FILE = "learn-report.json"


def with_learned(given: Any, learned: Any) -> Any:
    """The given mappings plus the learned ones, the given ones taking precedence: a learned
    mapping named like a given one is left out, and the learned ones rank below every given one
    (their priorities shifted down together, so their own order holds)."""
    from enrich_crawl.extract.mapping import MappingSet

    names = {m.name for m in given}
    kept = [m for m in learned if m.name not in names]
    if len(given) and kept:
        shift = min(0, min(m.priority for m in given) - 1 - max(m.priority for m in kept))
        for mapping in kept:
            mapping.priority += shift
    combined = MappingSet([*given, *kept])
    combined.errors = [*given.errors, *learned.errors]
    return combined


def has_mappings(directory: Path | None) -> bool:
    from enrich_crawl.extract.mapping import mapping_files

    return directory is not None and Path(directory).is_dir() and bool(mapping_files(directory))


def clear_learned(out_dir: Path) -> None:
    """Remove what an earlier `learn` wrote in `out_dir` (its report and the mapping files with
    a `learned` object); hand-written mappings there are left alone."""
    if not out_dir.is_dir():
        return
    (out_dir / REPORT_FILE).unlink(missing_ok=True)
    for path in out_dir.glob("*.json"):
        try:
            raw = json.loads(path.read_text("utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(raw, dict) and isinstance(raw.get("learned"), dict):
            path.unlink(missing_ok=True)
