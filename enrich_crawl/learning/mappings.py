"""Learned mappings on disk: whether a folder holds any, which files an earlier `learn` wrote
(the given mappings' precedence over learned ones is `MappingSet.with_learned`)."""

from __future__ import annotations

import json
from pathlib import Path

REPORT_FILE = "learn-report.json"


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
