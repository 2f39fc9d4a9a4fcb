"""The table's columns against its spec, and the error of a table that cannot be used: apart from
load.py so that a check before a run (preflight) needs neither pandas nor Arrow's kernels."""

from __future__ import annotations

import difflib

from enrich_crawl.dataset.spec import DatasetSpec


class DatasetError(ValueError):
    """The table cannot be used at all (missing file, no id column, unreadable)."""


def _suggest(name: str, columns: list[str]) -> str:
    close = difflib.get_close_matches(name, columns, n=1, cutoff=0.6)
    if not close:
        lowered = {c.lower(): c for c in columns}
        close = [lowered[name.lower()]] if name.lower() in lowered else []
    return f" (did you mean {close[0]!r}?)" if close else ""


def check_columns(spec: DatasetSpec, columns: list[str]) -> list[str]:
    """Refuse a table without the spec's id/url/stale columns; return the fields it lacks."""
    shown = ", ".join(repr(c) for c in columns[:40]) + (" ..." if len(columns) > 40 else "")
    wanted = [("id", spec.id)] + [("urls", c) for c in spec.urls]
    if spec.stale is not None:
        wanted.append(("stale.column", spec.stale.column))
    for key, column in wanted:
        if column not in columns:
            raise DatasetError(
                f"{spec.source}: the {key} column {column!r} named by {spec.path} is not in the "
                f"table{_suggest(column, columns)}; the table's columns are: {shown}"
            )
    return [name for name in spec.fields if name not in columns]
