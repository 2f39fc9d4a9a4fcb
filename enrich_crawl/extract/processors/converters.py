"""Conversions: parse each value as a date, a number or a boolean, and drop what does not parse."""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

from enrich_crawl.extract.errors import MappingError
from enrich_crawl.extract.processors.registry import (
    NONEMPTY,
    PAGE,
    STRING,
    Context,
    Fn,
    as_text,
    describe,
    map_strings,
    processor,
)
from enrich_crawl.values import clean_text, parse_bool, parse_date, parse_number


def _check_date_format(fmt: str, where: str) -> None:
    if "%" not in fmt:
        raise MappingError(where, f"date format {fmt!r} has no %-directive (e.g. %Y-%m-%d)")
    try:
        probe = dt.datetime(2001, 2, 3, 4, 5, 6).strftime(fmt)
        dt.datetime.strptime(probe, fmt)
    except ValueError as exc:
        raise MappingError(where, f"invalid date format {fmt!r}: {exc}") from exc


@processor(
    "date",
    params={
        "format": describe(
            {"oneOf": [NONEMPTY, {"type": "array", "items": NONEMPTY, "minItems": 1}]},
            "strptime format(s), tried in order; default: ISO 8601 and common formats",
        )
    },
    kind="convert",
)
def _date(params: dict[str, Any], where: str) -> Fn:
    """Parse each value as a date (the `format`s given, else ISO 8601 and common formats like
    'March 5, 2024' or '05.03.2024') into ISO `YYYY-MM-DD`; values that are no date are dropped."""
    fmt = params.get("format")
    formats = [fmt] if isinstance(fmt, str) else list(fmt or [])
    for i, one in enumerate(formats):
        _check_date_format(one, f"{where}.format" + (f"[{i}]" if isinstance(fmt, list) else ""))

    def convert(text: str) -> str:
        if not formats:
            return parse_date(text)
        for one in formats:
            try:
                return parse_date(text, one)
            except ValueError:
                continue
        raise ValueError(f"not a date in the format(s) given: {text[:40]!r}")

    return map_strings(convert)


def _number(text: str, decimal: str) -> int | float:
    number = parse_number(text, decimal=decimal)
    return int(number) if number.is_integer() and abs(number) < 2**53 else number


@processor(
    "number",
    params={
        "decimal": describe(
            {"enum": [".", ","]}, "decimal mark: '.' (1,234.5, default) or ',' (1.234,5)"
        )
    },
    kind="convert",
)
def _number_proc(params: dict[str, Any], where: str) -> Fn:
    """The first number in each value ('1,200 staff' -> 1200, '-3.5e2' -> -350); integers stay
    integers; values without a number are dropped."""
    decimal = params.get("decimal", ".")

    def run(values: list[Any], ctx: Context) -> list[Any]:
        out: list[Any] = []
        for value in values:
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                if not (isinstance(value, float) and (math.isnan(value) or math.isinf(value))):
                    out.append(value)
                continue
            text = ctx.page.text if value is PAGE else as_text(value)
            if text is None:
                continue
            try:
                out.append(_number(text, decimal))
            except (ValueError, OverflowError):
                continue
        return out

    return run


_WORDS = {"type": "array", "items": STRING, "minItems": 1}


@processor(
    "boolean",
    params={
        "true": describe(_WORDS, "extra words meaning true (case-insensitive)"),
        "false": describe(_WORDS, "extra words meaning false (case-insensitive)"),
    },
    kind="convert",
)
def _boolean(params: dict[str, Any], where: str) -> Fn:
    """Parse each value as a boolean: yes/no, true/false, 1/0, on/off (and a few languages), plus
    the `true`/`false` word lists; other values are dropped."""
    trues = {clean_text(v).lower() for v in params.get("true", [])}
    falses = {clean_text(v).lower() for v in params.get("false", [])}
    both = sorted(trues & falses)
    if both:
        raise MappingError(f"{where}.false", f"{both[0]!r} is listed as both true and false")

    def convert(value: Any) -> bool | None:
        if isinstance(value, bool):
            return value
        text = clean_text(as_text(value) or "").lower()
        if text in trues:
            return True
        if text in falses:
            return False
        try:
            return parse_bool(text)
        except ValueError:
            return None

    def run(values: list[Any], ctx: Context) -> list[Any]:
        return [b for b in (convert(v) for v in values if v is not PAGE) if b is not None]

    return run
