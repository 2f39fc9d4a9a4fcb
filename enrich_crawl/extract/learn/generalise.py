"""A value cut out of a longer text, generalised over several records: what stays the same around
it is kept literally, what changes from record to record becomes a wildcard.

    "tool-alpha - Widget docs", "tool-beta - Gadget docs"   (values "Widget docs", "Gadget docs")
    -> ^tool\\-\\S+ \\- (.+)$

One record's text alone cannot tell which part of its context is the site's (`tool-`, ` - `) and
which is the record's (`alpha`): a rule written from one record overfits (`^tool\\-alpha \\- (.+)$`)
or guesses (everything up to the first `-`, which cuts `tool-alpha` in two). The texts that one
selector gives on several training records tell.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from enrich_crawl.extract.learn.locate import CROSS_SITE_KINDS, Candidate, candidate, value_steps
from enrich_crawl.extract.learn.selectors import xp

MIN_RECORDS = 2  # contexts of at least this many records before generalising
MAX_CONTEXTS = 12  # contexts kept per selector


def _common_prefix(texts: list[str]) -> str:
    shortest = min(texts, key=len)
    for index, char in enumerate(shortest):
        if any(t[index] != char for t in texts):
            return shortest[:index]
    return shortest


def _boundary_prefix(texts: list[str]) -> str:
    """The common prefix of `texts`, cut back so that it does not end inside a word that goes
    on differently in one of them."""
    prefix = _common_prefix(texts)
    if not prefix:
        return ""
    if all(
        len(t) == len(prefix) or not (prefix[-1].isalnum() and t[len(prefix)].isalnum())
        for t in texts
    ):
        return prefix
    cut = len(prefix)
    while cut and prefix[cut - 1].isalnum():
        cut -= 1
    return prefix[:cut]


def _boundary_suffix(texts: list[str]) -> str:
    reversed_texts = [t[::-1] for t in texts]
    return _boundary_prefix(reversed_texts)[::-1]


def _escape(text: str) -> str:
    return re.escape(text).replace("\\ ", " ")


def _wildcard(middles: list[str], *, lazy: bool) -> str:
    if any(not m for m in middles):
        return ".*?"
    if not any(ch.isspace() for m in middles for ch in m):
        return "\\S+"
    return ".+?" if lazy else ".+"


def _side(texts: list[str], *, lazy: bool) -> tuple[str, bool] | None:
    """(pattern of one side of the value, does it vary) or None when the texts share nothing
    around what varies (a wildcard alone teaches nothing)."""
    if len(set(texts)) == 1:
        return _escape(texts[0]), False
    prefix = _boundary_prefix(texts)
    rests = [t[len(prefix) :] for t in texts]
    suffix = _boundary_suffix(rests)
    middles = [r[: len(r) - len(suffix)] if suffix else r for r in rests]
    if not prefix and not suffix:
        return None
    return _escape(prefix) + _wildcard(middles, lazy=lazy) + _escape(suffix), True


def generalised_patterns(contexts: list[tuple[str, str, str]]) -> list[str]:
    """Regex patterns (one capture group) that cut each needle out of its text, from
    (before, needle, after) of several records; only those that do on every one of them."""
    if len({c for c in contexts}) < MIN_RECORDS:
        return []
    befores = [b for b, _n, _a in contexts]
    afters = [a for _b, _n, a in contexts]
    if len(set(befores)) == 1 and len(set(afters)) == 1:
        return []  # the same context everywhere: the literal rule of one record says it
    head = _side(befores, lazy=False)
    tail = _side(afters, lazy=True)
    patterns = []
    if head is not None and tail is not None:
        capture = "(.+?)" if tail[1] else "(.+)"
        patterns.append("^" + head[0] + capture + tail[0] + "$")
    if head is not None and head[1] and head[0]:
        # what follows the value may change in ways the training records do not show
        patterns.append("^" + head[0] + "(\\S.*?)(?: \\([^()]*\\))*$")
    if tail is not None and not any(befores):
        prefix = _boundary_prefix(afters)
        if prefix.strip():  # the value, then a separator (" - ", " | ") and what varies
            patterns.append("^(.+?)" + _escape(prefix))
    out = []
    for pattern in patterns:
        try:
            compiled = re.compile(pattern)
        except re.error:
            continue
        if pattern not in out and all(_cuts(compiled, c) for c in contexts):
            out.append(pattern)
    return out


def _cuts(compiled: re.Pattern[str], context: tuple[str, str, str]) -> bool:
    before, needle, after = context
    match = compiled.search(before + needle + after)
    return match is not None and match.group(1).strip() == needle


def generalised_steps(
    contexts: list[tuple[str, str, str]], tail: list[dict[str, Any]]
) -> list[list[dict[str, Any]]]:
    """The processor steps after the selector: trim, the generalised regex, the field's type."""
    trim = {"type": "trim", "parameters": {}}
    return [
        [trim, {"type": "regex", "parameters": {"pattern": p}}, *tail]
        for p in generalised_patterns(contexts)
    ]


def add_generalised(
    contexts: dict[tuple[str, str], list[tuple[str, str, str]]],
    ftype: str,
    found: dict[str, Candidate],
    support: Counter[str],
    *,
    generic: bool,
) -> None:
    """Regex rules generalised over the training records that one selector gives a longer text
    on (a prefix that changes from record to record, `tool-alpha - `, `tool-beta - `)."""
    tail = value_steps(ftype)
    tail = [] if tail == [{"type": "trim", "parameters": {}}] else tail
    for (expression, kind), seen in contexts.items():
        if len(seen) < MIN_RECORDS or (generic and kind == "positional"):
            continue
        if kind in CROSS_SITE_KINDS and expression.startswith("//"):
            # a `<meta>` or `<title>` is on every page of a site: with wildcards, its rule also
            # reads the pages on the way to the record's ("About us - Acme" as a name), which
            # held-out records cannot show (the crawl passes them, judging skips them); only
            # on the kind of page the value is on (`/html[body[@data-page=...]]`)
            continue
        for steps in generalised_steps(seen, tail):
            made = candidate([xp(expression), *steps], kind)
            found.setdefault(made.processors, made)
            support[made.processors] = max(support[made.processors], len(seen))
