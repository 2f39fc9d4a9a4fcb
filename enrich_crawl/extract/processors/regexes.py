"""Regular expressions: Python `re` syntax, checked for catastrophic backtracking, run by `regex`
with a per-call timeout and a per-page budget; the `regex`, `replace` and `filter` processors."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

import regex

from enrich_crawl.extract.errors import MappingError
from enrich_crawl.extract.processors.registry import (
    BOOLEAN,
    MAX_REGEX_INPUT,
    PAGE,
    PATTERN,
    REGEX_TIMEOUT,
    STRING,
    Context,
    Fn,
    as_text,
    describe,
    processor,
    string_values,
)
from enrich_crawl.extract.regex_safety import backtracking_hazard


def compile_regex(pattern: str, where: str, *, flags: int = 0) -> Any:
    """Compile a user pattern: valid for Python `re`, free of catastrophic backtracking shapes,
    compiled by the `regex` module (whose matching functions take a timeout).

    The pattern's matching functions keep the GIL (`_HoldingGil`)."""
    try:
        re.compile(pattern, flags)  # the documented dialect is Python's re: refuse what re refuses
        hazard = backtracking_hazard(pattern, flags)
        compiled = regex.compile(pattern, flags | regex.VERSION0)
    except (re.error, regex.error, OverflowError, RecursionError) as exc:
        raise MappingError(where, f"invalid regular expression /{pattern}/: {exc}") from exc
    if hazard:
        raise MappingError(
            where,
            f"regular expression /{pattern}/ is refused: {hazard}; rewrite it so that each "
            "text has one way to match (e.g. [^,]+ instead of .*), or make the group atomic "
            "(?>...) or the quantifier possessive (a++)",
        )
    return _HoldingGil(compiled)


class _HoldingGil:
    """A compiled `regex` pattern whose matching functions keep the GIL (`concurrent=False`).
    By default `regex` lets go of it while it matches, and in a crawl worker (pymongo's monitor
    threads, Twisted's thread pool) getting it back costs a thread switch each time: ~500 us of
    waiting and 3-4x the CPU of a 2 us URL match. The timeout holds either way
    (test_processors_regex counts the hand-overs). Every matching function is wrapped, used
    today or not, so that a new call cannot let go of the GIL by reaching the pattern's own;
    everything else (`pattern`, `groups`, ...) is the pattern's."""

    __slots__ = ("_pattern",)

    def __init__(self, pattern: Any):
        self._pattern = pattern

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pattern, name)

    def search(self, string: str, *args: Any, **kwargs: Any) -> Any:
        return self._pattern.search(string, *args, concurrent=False, **kwargs)

    def match(self, string: str, *args: Any, **kwargs: Any) -> Any:
        return self._pattern.match(string, *args, concurrent=False, **kwargs)

    def fullmatch(self, string: str, *args: Any, **kwargs: Any) -> Any:
        return self._pattern.fullmatch(string, *args, concurrent=False, **kwargs)

    def findall(self, string: str, *args: Any, **kwargs: Any) -> Any:
        return self._pattern.findall(string, *args, concurrent=False, **kwargs)

    def finditer(self, string: str, *args: Any, **kwargs: Any) -> Any:
        return self._pattern.finditer(string, *args, concurrent=False, **kwargs)

    def sub(self, repl: Any, string: str, *args: Any, **kwargs: Any) -> Any:
        return self._pattern.sub(repl, string, *args, concurrent=False, **kwargs)

    def subn(self, repl: Any, string: str, *args: Any, **kwargs: Any) -> Any:
        return self._pattern.subn(repl, string, *args, concurrent=False, **kwargs)

    def split(self, string: str, *args: Any, **kwargs: Any) -> Any:
        return self._pattern.split(string, *args, concurrent=False, **kwargs)


def run_regex(ctx: Context, pattern: Any, call: Callable[[float], Any]) -> Any:
    """Run `call(timeout)` within the per-call timeout and the run's regex budget; None (and an
    error on the context) when time runs out."""
    if ctx.regex_budget <= 0:
        ctx.error(f"regex /{pattern.pattern}/ skipped: this page's regex time budget is spent")
        return None
    timeout = min(REGEX_TIMEOUT, ctx.regex_budget)
    started = time.perf_counter()
    try:
        return call(timeout)
    except TimeoutError:
        ctx.error(f"regex /{pattern.pattern}/ timed out after {timeout:.2f}s")
        return None
    finally:
        ctx.regex_budget -= time.perf_counter() - started


def _flags(params: dict[str, Any]) -> int:
    return re.IGNORECASE if params.get("ignore_case") else 0


@processor(
    "regex",
    params={
        "pattern": PATTERN,
        "group": describe(
            {"type": ["integer", "string"], "minimum": 0},
            "group number or name; default 1 if the pattern has groups, else 0 (whole match)",
        ),
        "all": describe(BOOLEAN, "every match of each value, not only the first"),
        "ignore_case": BOOLEAN,
    },
    required=("pattern",),
)
def _regex(params: dict[str, Any], where: str) -> Fn:
    """Keep the match of `pattern` in each value: group 1 if the pattern has groups, else the whole
    match (or `group`); `all` keeps every match. Values without a match are dropped."""
    compiled = compile_regex(params["pattern"], f"{where}.pattern", flags=_flags(params))
    group = params.get("group", 1 if compiled.groups else 0)
    if isinstance(group, int) and group > compiled.groups:
        raise MappingError(
            f"{where}.group",
            f"the pattern has {compiled.groups} group(s), there is no group {group}",
        )
    if isinstance(group, str) and group not in compiled.groupindex:
        raise MappingError(f"{where}.group", f"the pattern has no group named {group!r}")
    find_all = params.get("all", False)

    def run(values: list[Any], ctx: Context) -> list[Any]:
        out: list[Any] = []
        for text in string_values(values, ctx):
            text = text[:MAX_REGEX_INPUT]
            if find_all:
                matches = run_regex(
                    ctx,
                    compiled,
                    lambda t, s=text: list(compiled.finditer(s, timeout=t)),
                )
                out.extend(m.group(group) for m in matches or () if m.group(group) is not None)
            else:
                match = run_regex(ctx, compiled, lambda t, s=text: compiled.search(s, timeout=t))
                if match is not None and match.group(group) is not None:
                    out.append(match.group(group))
        return out

    return run


@processor(
    "replace",
    params={
        "pattern": PATTERN,
        "replacement": describe(STRING, "replacement, \\1 or \\g<name> for groups; default ''"),
        "count": describe({"type": "integer", "minimum": 0}, "at most this many (0: all)"),
        "ignore_case": BOOLEAN,
    },
    required=("pattern",),
)
def _replace(params: dict[str, Any], where: str) -> Fn:
    """Replace every match of `pattern` (Python `re`) in each value by `replacement`."""
    compiled = compile_regex(params["pattern"], f"{where}.pattern", flags=_flags(params))
    replacement = params.get("replacement", "")
    count = params.get("count", 0)
    try:
        re.compile(params["pattern"], _flags(params)).sub(replacement, "")
        template = re.compile(params["pattern"], _flags(params))
        # a reference to a missing group only fails on a match: check the references now
        for ref in re.findall(r"\\(\d+)|\\g<(\w+)>", replacement):
            number, name = ref
            if number and int(number) > template.groups:
                raise re.error(f"invalid group reference {number}")
            if name and not name.isdigit() and name not in template.groupindex:
                raise re.error(f"unknown group name {name!r}")
            if name and name.isdigit() and int(name) > template.groups:
                raise re.error(f"invalid group reference {name}")
    except (re.error, IndexError) as exc:
        raise MappingError(
            f"{where}.replacement", f"invalid replacement {replacement!r}: {exc}"
        ) from exc

    def run(values: list[Any], ctx: Context) -> list[Any]:
        out = []
        for text in string_values(values, ctx):
            result = run_regex(
                ctx,
                compiled,
                lambda t, s=text: compiled.sub(
                    replacement, s[:MAX_REGEX_INPUT], count=count, timeout=t
                ),
            )
            if result is not None:
                out.append(result)
        return out

    return run


@processor(
    "filter",
    params={
        "pattern": PATTERN,
        "invert": describe(BOOLEAN, "keep the values that do not match"),
        "ignore_case": BOOLEAN,
    },
    required=("pattern",),
    kind="list",
)
def _filter(params: dict[str, Any], where: str) -> Fn:
    """Keep the values in which `pattern` is found (or, with `invert`, not found)."""
    compiled = compile_regex(params["pattern"], f"{where}.pattern", flags=_flags(params))
    invert = params.get("invert", False)

    def run(values: list[Any], ctx: Context) -> list[Any]:
        out = []
        for value in values:
            text = ctx.page.text if value is PAGE else as_text(value)
            if text is None:
                continue
            found = run_regex(
                ctx,
                compiled,
                lambda t, s=text: compiled.search(s[:MAX_REGEX_INPUT], timeout=t),
            )
            if (found is not None) != invert:
                out.append(value)
        return out

    return run
