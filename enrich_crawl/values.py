"""Typed values shared by the dataset loader and the extractor (the dataset spec's field types).

`coerce(value, type)` turns a cleaned string (or an already typed value) into the field's type, or
raises `ValueError` with a short reason. Dates are ISO `YYYY-MM-DD` strings (portable in JSON,
Parquet and MongoDB alike); lists are lists of strings.
"""

from __future__ import annotations

import datetime as dt
import math
import re
import unicodedata
from typing import Any

_WS = re.compile(r"\s+")
_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:[,\u00a0\u202f' ]\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?")
_TRUE = {"true", "yes", "y", "1", "on", "t", "oui", "ja", "si", "sí"}
_FALSE = {"false", "no", "n", "0", "off", "f", "non", "nein"}
_LIST_SPLIT = re.compile(r"\s*[,;|]\s*")

DATE_FORMATS = (
    "%Y-%m-%d",
    "%Y/%m/%d",
    "%d.%m.%Y",
    "%d/%m/%Y",
    "%m/%d/%Y",
    "%B %d, %Y",
    "%b %d, %Y",
    "%d %B %Y",
    "%d %b %Y",
    "%B %Y",
    "%b %Y",
    "%Y-%m",
    "%Y",
)


def clean_text(value: str) -> str:
    """Unicode NFC, whitespace collapsed, trimmed."""
    return _WS.sub(" ", unicodedata.normalize("NFC", value)).strip()


def is_missing(value: Any, markers: frozenset[str] = frozenset()) -> bool:
    if value is None:
        return True
    if isinstance(value, float) and math.isnan(value):
        return True
    if isinstance(value, str):
        text = value.strip()
        return text == "" or text in markers or text.lower() in markers
    if isinstance(value, (list, tuple)):
        return len(value) == 0
    return False


_NUMBER_COMMA_DECIMAL = re.compile(
    r"[-+]?(?:\d{1,3}(?:[.\u00a0\u202f' ]\d{3})+|\d+)(?:,\d+)?(?:[eE][-+]?\d+)?"
)


def parse_number(text: str, decimal: str = ".") -> float:
    """The first number in `text`; `decimal` is the decimal mark ("." as in 1,234.5 or "," as in
    1.234,5); thousands separators (the other mark, spaces, apostrophes) are dropped."""
    if decimal not in (".", ","):
        raise ValueError(f"decimal mark must be '.' or ',', not {decimal!r}")
    text = text.replace("\u2212", "-")
    match = (_NUMBER if decimal == "." else _NUMBER_COMMA_DECIMAL).search(text)
    if not match:
        raise ValueError(f"no number in {text[:40]!r}")
    if decimal == ".":
        token = re.sub(r"[,\u00a0\u202f' ]", "", match.group(0))
    else:
        token = re.sub(r"[.\u00a0\u202f' ]", "", match.group(0)).replace(",", ".")
    return float(token)


def parse_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"not a boolean: {str(value)[:40]!r}")


def parse_date(value: Any, fmt: str | None = None) -> str:
    if isinstance(value, dt.datetime):
        return value.date().isoformat()
    if isinstance(value, dt.date):
        return value.isoformat()
    text = clean_text(str(value))
    if fmt:
        return dt.datetime.strptime(text, fmt).date().isoformat()
    iso = re.match(r"^(\d{4}-\d{2}-\d{2})(?:[T ][\d:.]+(?:Z|[+-]\d{2}:?\d{2})?)?$", text)
    if iso:
        return dt.date.fromisoformat(iso.group(1)).isoformat()
    cleaned = re.sub(r"(\d)(st|nd|rd|th)\b", r"\1", text)
    for candidate in DATE_FORMATS:
        try:
            return dt.datetime.strptime(cleaned, candidate).date().isoformat()
        except ValueError:
            continue
    raise ValueError(f"not a date: {text[:40]!r}")


def coerce(value: Any, ftype: str) -> Any:
    """Convert to the field type; raises ValueError with a short reason."""
    if ftype == "string":
        if isinstance(value, (list, tuple)):
            return clean_text(" ".join(str(v) for v in value))
        return clean_text(str(value)) if not isinstance(value, str) else clean_text(value)
    if ftype == "integer":
        if isinstance(value, bool):
            raise ValueError("a boolean is not an integer")
        if isinstance(value, int):
            return value
        number = value if isinstance(value, float) else parse_number(str(value))
        if math.isnan(number) or math.isinf(number):
            raise ValueError("not a finite number")
        if number != int(number):
            raise ValueError(f"not an integer: {value!r}")
        return int(number)
    if ftype == "number":
        if isinstance(value, bool):
            raise ValueError("a boolean is not a number")
        if isinstance(value, (int, float)):
            return float(value)
        return parse_number(str(value))
    if ftype == "boolean":
        return parse_bool(value)
    if ftype == "date":
        return parse_date(value)
    if ftype == "list":
        if isinstance(value, (list, tuple)):
            items = [clean_text(str(v)) for v in value]
        else:
            items = _LIST_SPLIT.split(clean_text(str(value)))
        return [item for item in items if item]
    raise ValueError(f"unknown field type {ftype!r}")
