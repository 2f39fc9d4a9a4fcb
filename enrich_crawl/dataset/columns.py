"""The table's columns against its spec, and the error of a table that cannot be used: apart from
load.py so that a check before a run (preflight) needs neither pandas nor Arrow's kernels."""

from __future__ import annotations

from enrich_crawl.dataset.spec import DatasetSpec
from enrich_crawl.suggest import closest


class DatasetError(ValueError):
    """The table cannot be used at all (missing file, no id column, unreadable)."""


def _suggest(name: str, columns: list[str]) -> str:
    # looser than a field's check: a column the spec needs is missing, any hint helps
    close = closest(name, columns, cutoff=0.6)
    return f" (did you mean {close!r}?)" if close else ""


def check_columns(spec: DatasetSpec, columns: list[str]) -> list[str]:
    """Refuse a table without the spec's id/url/stale columns; return the fields it lacks (new
    columns to fill)."""
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


def near_miss_fields(spec: DatasetSpec, columns: list[str]) -> dict[str, str]:
    """{field: column} for the fields that are not columns of the table but nearly one
    (`sumary` for `summary`): most likely a typo, though a new column to fill is legitimate, so
    the load goes on and says so (log, seed metadata); `new: true` on a field says it is meant."""
    near: dict[str, str] = {}
    for name in spec.fields:
        if name in columns or spec.fields[name].new:
            continue
        meant = closest(name, columns)
        if meant is not None:
            near[name] = meant
    return near


def near_miss_warnings(spec: DatasetSpec, columns: list[str]) -> list[str]:
    """One line per near-miss field (near_miss_fields): what the load logs and the preflight
    prints on the terminal before a run, in the same words."""
    return [
        f"{spec.path}: fields.{name}: {name!r} is not a column of {spec.source.name} (did you mean "
        f"{column!r}?); it is filled as a new column (write `{name}: {{new: true}}` under "
        "`fields` to say it is meant)"
        for name, column in near_miss_fields(spec, columns).items()
    ]
