"""Generated dirty tables of any size, with their ground truth (tests and `bench/bench_load.py`).

15 columns in the shape of the seed's story (organisations with gaps), with the dirt real exports
carry: padding and odd whitespace (NBSP, tabs, newlines inside quoted cells), decomposed Unicode,
NUL bytes, missing markers, schemeless / uppercase / several / invalid URLs, numbers written
"1,200" or "about 300", dates in several formats, duplicate and missing ids, rows with the wrong
number of fields, and lines in cp1252 inside a UTF-8 file. Generation is vectorised (Arrow), so a
million rows take seconds; the same seed gives the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

COLUMNS = [
    "org_id",
    "name",
    "website",
    "profile_url",
    "description",
    "city",
    "country",
    "founded",
    "employees",
    "email",
    "phone",
    "tags",
    "open_source",
    "last_release",
    "last_checked",
]

SPEC_YAML = """\
name: {name}
source: {source}
id: org_id
urls: [website, profile_url]
fields:
  description: {{}}
  city: {{}}
  country: {{}}
  founded: {{type: integer}}
  employees: {{type: integer}}
  email: {{}}
  phone: {{}}
  tags: {{type: list}}
  open_source: {{type: boolean}}
  last_release: {{type: date, refresh: true}}
missing_values: ["N/A", "-", "unknown", "n.a."]
stale: {{column: last_checked, days: 365, fields: [employees, last_release]}}
"""

_WORDS = [
    "acme",
    "blue",
    "river",
    "north",
    "wind",
    "copper",
    "leaf",
    "solar",
    "grid",
    "data",
    "forge",
    "open",
    "field",
    "bright",
    "path",
    "stone",
    "bridge",
    "silver",
    "lake",
    "red",
    "oak",
    "green",
    "valley",
    "iron",
    "works",
    "quantum",
    "labs",
    "nova",
    "terra",
]
_SUFFIX = ["Inc", "GmbH", "Ltd", "SA", "Labs", "AG", "BV", "Oy", "LLC", ""]
_TLDS = ["com", "org", "net", "de", "fr", "io", "co.uk", "com.au", "nl", "example"]
_CITIES = [
    "Springfield",
    "  Paris ",
    "Zürich",
    "Zu\u0308rich",
    "São Paulo",
    "Köln",
    "Aarhus",
    "New\u00a0York",
    "N/A",
    "unknown",
    "",
    "",
    "",
    "Bristol",
    "Lyon",
    "Kraków",
    "-",
]
_COUNTRIES = ["Germany", "France", "United Kingdom", "  Denmark", "N/A", "", "", "USA", "Brasil"]
_DESCRIPTIONS = [
    "",
    "",
    "",
    "N/A",
    "Builds widgets, sprockets and gears.",
    '  Makes "smart" sensors   for farms ',
    "Applied research lab for water sensing,\nflood forecasting and open hardware.",
    "Caf\u0065\u0301 roaster;\tspecialty coffee.",
    "Software\u00a0for logistics\r\nand fleets.",
    "Open-source\x00 tooling for data teams.",
    "Robots for cold-storage warehouses.",
]
_FOUNDED = ["1998", " 2001 ", "-", "", "", "circa 1990", "19xx", "2017", "1,987", "2010.0"]
_EMPLOYEES = ["1200", "1,200", "about 300", "", "", "N/A", "12.5", "many", "64", "38"]
_TAGS = ["", "", "widgets, gears", "robotics; ROS", "sensors|hydrology", "open hardware", ",;"]
_BOOLS = ["yes", "no", "TRUE", "false", "0", "1", "", "", "maybe"]
_RELEASES = [
    "2023-01-15",
    "",
    "",
    "March 3, 2025",
    "15.01.2023",
    "2023-02-30",
    "N/A",
    "2024-11-02T10:00:00Z",
    "2022-06-30",
]
_PHONES = ["+1 555 010 0200", "", "", "unknown", "+44 117 496 0321", "(0)30 1234567"]


@dataclass
class Truth:
    """What the generator put in: the loader must find exactly this."""

    rows: int = 0  # data records written (all of them, malformed ones included)
    malformed: list[int] = field(default_factory=list)  # row numbers of ragged rows
    malformed_lines: list[int] = field(default_factory=list)
    duplicates: list[int] = field(default_factory=list)  # row numbers of repeated ids
    sources: list[int] = field(default_factory=list)  # the rows they repeat
    missing_ids: list[int] = field(default_factory=list)
    cp1252_lines: list[int] = field(default_factory=list)
    empty_lines: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "malformed": len(self.malformed),
            "duplicates": len(self.duplicates),
            "missing_ids": len(self.missing_ids),
            "cp1252_lines": len(self.cp1252_lines),
            "empty_lines": self.empty_lines,
        }


def _pick(rng: np.random.Generator, pool: list[str], n: int) -> pa.Array:
    return pa.array(pool, pa.string()).take(pa.array(rng.integers(0, len(pool), n)))


def _join(*parts: Any) -> pa.Array:
    return pc.binary_join_element_wise(*parts, "")


def dirty_table(rows: int, seed: int = 0, *, dirt: float = 1.0) -> tuple[pa.Table, Truth]:
    """The dirty table as strings (before any file format), and the ids' ground truth."""
    rng = np.random.default_rng(seed)
    n = rows
    truth = Truth(rows=n)
    number = pc.cast(pa.array(np.arange(1, n + 1)), pa.string())
    ids = _join(pa.scalar("ORG-"), pc.utf8_lpad(number, 7, "0"))
    # duplicate ids (a later row repeats an earlier one) and missing ids
    special = rng.permutation(n)
    n_dup = int(n * 0.004 * dirt)
    n_missing = int(n * 0.001 * dirt)
    dup_rows = np.sort(special[:n_dup])
    dup_rows = dup_rows[dup_rows > 0]
    missing_rows = np.sort(special[n_dup : n_dup + n_missing])
    ids_np = np.asarray(ids.to_numpy(zero_copy_only=False), dtype=object)
    protected = np.zeros(n, bool)
    protected[dup_rows] = True
    protected[missing_rows] = True
    for r in dup_rows.tolist():
        source = int(rng.integers(0, r))
        while protected[source]:
            source = int(rng.integers(0, r))
        ids_np[r] = ids_np[source]
        truth.sources.append(source + 1)
    markers = np.array(["", "  ", "N/A"], dtype=object)
    ids_np[missing_rows] = markers[rng.integers(0, 3, len(missing_rows))]
    truth.duplicates = (dup_rows + 1).tolist()
    truth.missing_ids = (missing_rows + 1).tolist()
    ids = pa.array(ids_np, pa.string())

    word_a, word_b = _pick(rng, _WORDS, n), _pick(rng, _WORDS, n)
    name = _join(
        pc.utf8_capitalize(word_a), pa.scalar(" "), word_b, pa.scalar(" "), _pick(rng, _SUFFIX, n)
    )
    # hosts unique per record (a real table's sites are mostly distinct), in a mix of forms
    host = _join(word_a, word_b, number, pa.scalar("."), _pick(rng, _TLDS, n))
    form = rng.integers(0, 20, n)
    website = _join(pa.scalar("www."), host)
    website = pc.if_else(pa.array(form == 1), _join(pa.scalar("https://"), host, "/"), website)
    website = pc.if_else(
        pa.array(form == 2), _join(pa.scalar("HTTP://"), pc.utf8_upper(host), "/About"), website
    )
    website = pc.if_else(
        pa.array(form == 3),
        _join(pa.scalar("http://"), host, "/ ; https://github.com/", word_a, number),
        website,
    )
    website = pc.if_else(pa.array(form == 4), pa.scalar("not a url"), website)
    website = pc.if_else(pa.array(form == 5), pa.scalar("ftp://files.example.org/x"), website)
    website = pc.if_else(pa.array(form == 6), pa.scalar(""), website)
    website = pc.if_else(
        pa.array(form == 7), _join(pa.scalar("https://"), host, "/products?b=2&a=1"), website
    )
    profile = pc.if_else(
        pa.array(rng.random(n) < 0.4),
        _join(pa.scalar("https://directory.example/orgs.html#org-"), number),
        pa.scalar(""),
    )
    days = rng.integers(0, 3 * 365, n)
    checked = pc.strftime(
        pa.array((np.datetime64("2026-01-01") - days).astype("datetime64[s]")), format="%Y-%m-%d"
    )
    checked = pc.if_else(pa.array(rng.random(n) < 0.05), pa.scalar(""), checked)
    table = pa.table(
        {
            "org_id": ids,
            "name": name,
            "website": website,
            "profile_url": profile,
            "description": _pick(rng, _DESCRIPTIONS, n),
            "city": _pick(rng, _CITIES, n),
            "country": _pick(rng, _COUNTRIES, n),
            "founded": _pick(rng, _FOUNDED, n),
            "employees": _pick(rng, _EMPLOYEES, n),
            "email": _join(pa.scalar("info@"), host),
            "phone": _pick(rng, _PHONES, n),
            "tags": _pick(rng, _TAGS, n),
            "open_source": _pick(rng, _BOOLS, n),
            "last_release": _pick(rng, _RELEASES, n),
            "last_checked": checked,
        }
    )
    return table, truth


def _csv_cells(column: pa.Array, delimiter: str) -> pa.Array:
    needs = pc.match_substring_regex(column, f'["\\r\\n{delimiter}]')
    quoted = _join(pa.scalar('"'), pc.replace_substring(column, '"', '""'), pa.scalar('"'))
    return pc.if_else(needs, quoted, column)


def write_dirty_csv(
    path: Path, rows: int, seed: int = 0, *, delimiter: str = ",", dirt: float = 1.0
) -> Truth:
    """A dirty CSV (or TSV) file; returns its ground truth."""
    table, truth = dirty_table(rows, seed, dirt=dirt)
    rng = np.random.default_rng(seed + 1)
    n = rows
    cells = [_csv_cells(table.column(c).combine_chunks(), delimiter) for c in COLUMNS]
    records = pc.binary_join_element_wise(*cells, delimiter)
    # rows with a missing or an extra field (a typical hand-edited export): never an id repeat
    taken = np.zeros(n, bool)
    taken[np.array(truth.duplicates, dtype=np.int64) - 1] = True
    taken[np.array(truth.missing_ids, dtype=np.int64) - 1] = True
    taken[np.array(truth.sources, dtype=np.int64) - 1] = True
    candidates = np.flatnonzero(~taken)
    n_bad = int(n * 0.0005 * dirt)
    bad = np.sort(rng.choice(candidates, size=min(n_bad, len(candidates)), replace=False))
    short = pc.binary_join_element_wise(*cells[:-2], delimiter)
    long = pc.binary_join_element_wise(*cells, pa.scalar("extra"), delimiter)
    mask = np.zeros(n, bool)
    mask[bad] = True
    shape = rng.integers(0, 2, n)
    records = pc.if_else(pa.array(mask), pc.if_else(pa.array(shape == 0), short, long), records)
    truth.malformed = (bad + 1).tolist()
    # cp1252 lines: rows whose city has Latin-1 letters, written in cp1252
    latin = (
        np.asarray(
            pc.match_substring_regex(records, "[äöüßéèçãáóÄÖÜ]").to_numpy(zero_copy_only=False),
            dtype=bool,
        )
        & (rng.random(n) < 0.002 * dirt)
        & ~mask
    )
    for index in np.flatnonzero(latin).tolist():
        try:
            records[index].as_py().encode("cp1252")
        except UnicodeEncodeError:  # e.g. a decomposed accent: not a cp1252 line
            latin[index] = False
    spans = 1 + pc.count_substring_regex(records, r"\r\n|\r|\n").to_numpy()
    starts = 2 + np.concatenate([[0], np.cumsum(spans)[:-1]])  # the header is line 1
    truth.malformed_lines = starts[bad].tolist()
    truth.cp1252_lines = starts[latin].tolist()
    header = delimiter.join(COLUMNS) + "\n"
    with open(path, "wb") as out:
        out.write(header.encode("utf-8"))
        special = np.flatnonzero(latin)
        previous = 0
        step = 50_000
        for index in [*special.tolist(), n]:
            for start in range(previous, index, step):
                stop = min(start + step, index)
                block = "\n".join(records.slice(start, stop - start).to_pylist())
                out.write(block.encode("utf-8") + b"\n")
            if index < n:
                out.write(records[index].as_py().encode("cp1252") + b"\n")
            previous = index + 1
    return truth


def write_dirty_parquet(path: Path, rows: int, seed: int = 0) -> Truth:
    """The same dirty table as Parquet: strings, except `founded` (int64) and `open_source`
    (bool), as a typed export would have them."""
    table, truth = dirty_table(rows, seed)
    founded = pc.cast(
        pc.if_else(
            pc.match_substring_regex(table.column("founded"), r"^\s*[0-9]{4}\s*$"),
            pc.utf8_trim_whitespace(table.column("founded")),
            pa.scalar(None, pa.string()),
        ),
        pa.int64(),
    )
    flags = table.column("open_source")
    open_source = pc.if_else(
        pc.is_in(flags, pa.array(["yes", "TRUE", "1"])),
        True,
        pc.if_else(pc.is_in(flags, pa.array(["no", "false", "0"])), False, None),
    )
    table = table.set_column(COLUMNS.index("founded"), "founded", founded)
    table = table.set_column(COLUMNS.index("open_source"), "open_source", open_source)
    pq.write_table(table, path, row_group_size=131_072, compression="zstd")
    return truth


def write_spec(folder: Path, source: str, name: str = "dirty") -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(SPEC_YAML.format(name=name, source=source), encoding="utf-8")
    return path
