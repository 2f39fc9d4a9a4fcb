"""What the loader does to one value: the cell-level rules, stated once in plain Python.

The fast loader (`enrich_crawl.dataset.vector`) applies these rules to whole columns with Arrow
kernels and falls back to the functions here for the values its kernels do not cover; the
row-at-a-time reference (`enrich_crawl.testing.reference`) applies them cell by cell, and the tests
check that both agree.

Text cells:
- junk characters are removed: C0/C1 control characters that are not whitespace (NUL, ESC, ...),
  the zero-width space and stray byte-order marks;
- Unicode NFC;
- every run of whitespace (anything `str.isspace()` accepts: tabs, newlines, NBSP, ...) becomes
  one space, and the ends are trimmed;
- a cell that is then empty or equal (case-insensitively) to a `missing_values` marker is missing.

Typed fields (the dataset spec's field types) are coerced with `enrich_crawl.values.coerce`; a value that
cannot be coerced is a type error (the cell becomes missing, the error and the raw value are kept).
A coercion that loses how the value was written (`"1,200"` -> 1200, `"yes"` -> true,
`"March 3, 2025"` -> `"2025-03-03"`) keeps the raw text too, so the original is never lost.
"""

from __future__ import annotations

import datetime as dt
import math
import re
import unicodedata
from typing import Any

from enrich_crawl.values import coerce, parse_date

# str.isspace() (Python 3.11, Unicode 14): verified against the predicate by the tests
WHITESPACE_RANGES = (
    (0x09, 0x0D),
    (0x1C, 0x20),
    (0x85, 0x85),
    (0xA0, 0xA0),
    (0x1680, 0x1680),
    (0x2000, 0x200A),
    (0x2028, 0x2029),
    (0x202F, 0x202F),
    (0x205F, 0x205F),
    (0x3000, 0x3000),
)
# control characters that are not whitespace, the zero-width space and a stray BOM
JUNK_RANGES = (
    (0x00, 0x08),
    (0x0E, 0x1B),
    (0x7F, 0x84),
    (0x86, 0x9F),
    (0x200B, 0x200B),
    (0xFEFF, 0xFEFF),
)


def python_class(ranges: tuple[tuple[int, int], ...]) -> str:
    return "[" + "".join(f"\\U{a:08x}-\\U{b:08x}" for a, b in ranges) + "]"


def re2_class(ranges: tuple[tuple[int, int], ...]) -> str:
    """The same character class in RE2 syntax (Arrow's regex engine)."""
    return "[" + "".join(f"\\x{{{a:x}}}-\\x{{{b:x}}}" for a, b in ranges) + "]"


_JUNK = re.compile(python_class(JUNK_RANGES))
_WS = re.compile(python_class(WHITESPACE_RANGES) + "+")

# how a typed value may be written without losing anything when it is coerced
LOSSLESS_INTEGER = r"-?(?:0|[1-9][0-9]*)"
LOSSLESS_NUMBER = r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?"
_LOSSLESS_INTEGER = re.compile(LOSSLESS_INTEGER)
_LOSSLESS_NUMBER = re.compile(LOSSLESS_NUMBER)


def clean_cell(text: str) -> str:
    """Junk removed, NFC, whitespace runs collapsed to one space, ends trimmed."""
    return _WS.sub(" ", unicodedata.normalize("NFC", _JUNK.sub("", text))).strip(" ")


def marker_set(missing_values: tuple[str, ...] | list[str]) -> frozenset[str]:
    """The spec's missing markers as compared: cleaned and lower-cased."""
    return frozenset(clean_cell(str(m)).lower() for m in missing_values)


def raw_value(value: Any) -> Any:
    """A value as read, made JSON-friendly: NaN -> None, numpy scalars -> Python, dates -> ISO."""
    if value is None:
        return None
    if isinstance(value, float) and math.isnan(value):
        return None
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        value = value.tolist()
    if isinstance(value, (dt.date, dt.datetime, dt.time)):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value


def clean_value(value: Any, markers: frozenset[str]) -> Any:
    """The normalised form of one cell (None when missing)."""
    value = raw_value(value)
    if value is None:
        return None
    if isinstance(value, str):
        cleaned = clean_cell(value)
        return None if cleaned == "" or cleaned.lower() in markers else cleaned
    if isinstance(value, (list, tuple, dict)) and len(value) == 0:
        return None
    return value


def record_id(cleaned: Any) -> str | None:
    if cleaned is None:
        return None
    return cleaned if isinstance(cleaned, str) else str(cleaned)


def coerce_cell(value: Any, ftype: str) -> tuple[Any, bool]:
    """(typed value or None, lossy); raises ValueError with a short reason.

    `value` is a cleaned, non-missing value. `lossy` says the raw value must be kept because the
    typed value does not say how it was written. An empty list (a cell of separators only) is
    missing, and lossy.
    """
    typed = coerce(value, ftype)
    if ftype == "list" and not typed:
        return None, True
    if not isinstance(value, str):
        return typed, typed != value
    if ftype == "string":
        return typed, typed != value
    if ftype == "integer":
        return typed, _LOSSLESS_INTEGER.fullmatch(value) is None
    if ftype == "number":
        return typed, _LOSSLESS_NUMBER.fullmatch(value) is None
    if ftype == "boolean":
        return typed, value not in ("true", "false")
    if ftype == "list":
        return typed, ", ".join(typed) != value
    return typed, typed != value  # date: ISO text in, the same text out


def is_stale(value: Any, days: float, today: dt.date) -> bool:
    """A record is stale when its check date is missing, unreadable or older than `days`."""
    if value is None:
        return True
    try:
        checked = dt.date.fromisoformat(parse_date(value))
    except ValueError:
        return True
    return (today - checked).days > days


NO_URL = "no_url"  # a reason of `_url_errors` and of the result document's `errors`


def no_url_error(url_columns: tuple[str, ...] | list[str]) -> dict[str, str]:
    """The `_url_errors` entry of a record that has fields to resolve and not one URL token in
    its URL columns (blank or missing-marker cells): without it the record would end
    `unresolved` with no reason at all. A record whose tokens are all invalid has its
    `invalid_url` entries instead; one with nothing to resolve needs no URL."""
    if not url_columns:
        detail = "the spec names no URL column (key `urls`)"
    else:
        names = ", ".join(repr(c) for c in url_columns)
        detail = f"no URL in column{'s' if len(url_columns) > 1 else ''} {names}"
    return {"url": "", "reason": NO_URL, "detail": detail}
