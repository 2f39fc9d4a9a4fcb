"""List processors: reduce or reshape the list of values (`split`, `join`, `first`, `last`, `nth`,
`unique`, `default`); `filter` is with the regexes."""

from __future__ import annotations

from typing import Any

from enrich_crawl.extract.processors.regexes import compile_regex, run_regex
from enrich_crawl.extract.processors.registry import (
    BOOLEAN,
    MAX_REGEX_INPUT,
    NONEMPTY,
    PAGE,
    STRING,
    Context,
    Fn,
    as_text,
    describe,
    processor,
    string_values,
)


@processor(
    "split",
    params={
        "separator": describe(NONEMPTY, "default ','"),
        "regex": describe(BOOLEAN, "the separator is a regular expression"),
        "maxsplit": describe(
            {"type": "integer", "minimum": 0}, "at most this many splits (0: all)"
        ),
    },
    kind="list",
)
def _split(params: dict[str, Any], where: str) -> Fn:
    """Split each value on `separator` (default ','; a regex with `regex`); parts are trimmed,
    empty parts dropped."""
    separator = params.get("separator", ",")
    maxsplit = params.get("maxsplit", 0)
    splitter = compile_regex(separator, f"{where}.separator") if params.get("regex") else None

    def run(values: list[Any], ctx: Context) -> list[Any]:
        out = []
        for text in string_values(values, ctx):
            if splitter is not None:
                parts = run_regex(
                    ctx,
                    splitter,
                    lambda t, s=text: splitter.split(
                        s[:MAX_REGEX_INPUT], maxsplit=maxsplit, timeout=t
                    ),
                )
                if parts is None:
                    continue
            else:
                parts = text.split(separator, maxsplit or -1)
            out.extend(part.strip() for part in parts if part and part.strip())
        return out

    return run


@processor("join", params={"separator": describe(STRING, "default ' '")}, kind="list")
def _join(params: dict[str, Any], where: str) -> Fn:
    """Join all values into one string with `separator` (default ' '); empty values skipped. With
    separator '' the text reads as a reader sees it: a whitespace-only value between two others
    (the space between two inline elements, `<var>a</var> <var>b</var>`) is kept as one space."""
    separator = params.get("separator", " ")

    def run(values: list[Any], ctx: Context) -> list[Any]:
        texts = string_values(values, ctx)
        if separator:
            kept = [t for t in texts if t.strip()]
            return [separator.join(kept)] if kept else []
        out: list[str] = []
        gap = False  # a whitespace-only run since the last text: it separates two words
        for text in texts:
            if not text.strip():
                gap = gap or bool(text)
                continue
            if gap and out and not out[-1][-1:].isspace() and not text[:1].isspace():
                out.append(" ")
            gap = False
            out.append(text)
        return ["".join(out)] if out else []

    return run


@processor("first", kind="list")
def _first(params: dict[str, Any], where: str) -> Fn:
    """Keep the first value."""
    return lambda values, ctx: values[:1]


@processor("last", kind="list")
def _last(params: dict[str, Any], where: str) -> Fn:
    """Keep the last value."""
    return lambda values, ctx: values[-1:]


@processor(
    "nth",
    params={"index": describe({"type": "integer"}, "0 is the first value, -1 the last")},
    required=("index",),
    kind="list",
)
def _nth(params: dict[str, Any], where: str) -> Fn:
    """Keep the value at `index` (0-based; negative counts from the end); none if out of range."""
    index = params["index"]

    def run(values: list[Any], ctx: Context) -> list[Any]:
        try:
            return [values[index]]
        except IndexError:
            return []

    return run


@processor("unique", kind="list")
def _unique(params: dict[str, Any], where: str) -> Fn:
    """Drop repeated values (by their string value), keeping the first of each."""

    def run(values: list[Any], ctx: Context) -> list[Any]:
        seen: set[str] = set()
        out = []
        for value in values:
            key = as_text(value)
            if key is None or value is PAGE:
                continue
            if key not in seen:
                seen.add(key)
                out.append(value)
        return out

    return run


@processor(
    "default",
    params={"value": {"description": "any JSON value"}},
    required=("value",),
    kind="list",
)
def _default(params: dict[str, Any], where: str) -> Fn:
    """Use `value` when the chain has produced nothing (no value, or only empty strings)."""
    value = params["value"]

    def run(values: list[Any], ctx: Context) -> list[Any]:
        present = [
            v
            for v in values
            if v is not PAGE and v is not None and not (isinstance(v, str) and not v.strip())
        ]
        return present if present else [value]

    return run
