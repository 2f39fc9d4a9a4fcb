"""When an extracted value "is" the known one: both read the way the dataset loader reads a cell.

The known values come from the dataset after its cleaning (`dataset/cells.py`) and type coercion
(`values.coerce`); the extracted ones from the mapping engine, which types them with the same
`coerce`. Strings are compared after the loader's cell cleaning (whitespace runs collapsed),
casefolded (a table that writes a description in capitals means the text the page writes in mixed
case) and with typographic quotes read as straight ones (a page renders `"x"` as `“x”`: the same
text to a reader); numbers by value; dates as ISO dates; lists item by item.

Only the comparison is this lenient: the learner finds a value on a page as the page writes it
(see facts.PageFacts.variants) and the rules it writes select that text exactly.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

from enrich_crawl.dataset.cells import clean_cell, coerce_cell

_TYPOGRAPHIC = str.maketrans({"\u201c": '"', "\u201d": '"', "\u2018": "'", "\u2019": "'"})


def fold(text: str) -> str:
    """A text as compared: cleaned, typographic quotes straightened, casefolded."""
    return clean_cell(text).translate(_TYPOGRAPHIC).casefold()


def known_value(value: Any, ftype: str) -> Any:
    """The value as the loader holds it (None when the loader would call it missing)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, str):
        value = clean_cell(value)
        if not value:
            return None
    try:
        typed, _lossy = coerce_cell(value, ftype)
    except ValueError:
        return None
    return typed


def same_value(extracted: Any, known: Any, ftype: str) -> bool:
    """Does the extracted (typed) value equal the known one, as the dataset means equal?"""
    if extracted is None or known is None:
        return False
    got = known_value(extracted, ftype)
    if got is None:
        return False
    if ftype == "string":
        return fold(got) == fold(str(known))
    if ftype == "list":
        return [fold(str(v)) for v in got] == [fold(str(v)) for v in known]
    if ftype in ("integer", "number"):
        try:
            return math.isclose(float(got), float(known), rel_tol=1e-9, abs_tol=1e-12)
        except (TypeError, ValueError):
            return False
    return got == known


def renderings(value: Any, ftype: str) -> list[str]:
    """How a known value may be written on a page: the texts to look for."""
    if ftype == "boolean":
        return []
    if ftype == "list":
        items = [str(v) for v in value]
        return [", ".join(items)] if items else []
    if ftype == "integer" and isinstance(value, int):
        forms = [str(value)]
        if abs(value) >= 1000:
            forms += [f"{value:,}", f"{value:,}".replace(",", "."), f"{value:,}".replace(",", " ")]
        return forms
    if ftype == "number" and isinstance(value, (int, float)):
        forms = [repr(value)]
        if float(value).is_integer():
            forms.insert(0, str(int(value)))
        return forms
    if ftype == "date":
        try:
            day = dt.date.fromisoformat(str(value))
        except ValueError:
            return [str(value)]
        return [
            day.isoformat(),
            f"{day:%B} {day.day}, {day.year}",
            f"{day.day} {day:%B} {day.year}",
            f"{day:%b} {day.day}, {day.year}",
            f"{day.day} {day:%b} {day.year}",
            f"{day:%d.%m.%Y}",
            f"{day:%m/%d/%Y}",
            f"{day:%d/%m/%Y}",
            f"{day:%Y/%m/%d}",
        ]
    text = clean_cell(str(value))
    forms = [text]
    curly = text.replace('"', "\u201c", 1).replace('"', "\u201d", 1)
    if curly != text:
        forms.append(curly)
    if "'" in text:
        forms.append(text.replace("'", "\u2019"))
    return forms
