"""Regular expressions that cannot hang a worker.

Mappings are written by users and run on pages written by strangers, so every pattern a mapping
uses (`regex`, `replace`, `split`, `filter`, URL patterns) goes through two guards:

1. At load time, `backtracking_hazard(pattern)` looks for the shapes that make a backtracking engine
   take exponential time: a repeated group whose body can match the same text in more than one way.
   That is a quantified piece inside a repeat without a mandatory delimiter that the inner piece
   cannot consume (`(a+)+`, `(\\w+\\s?)*`, `(.*,)+`), or a repeated alternation whose branches can
   match the same text (`(a|a)+`, `(\\w|\\d)+`, `(a|aa)+`). Unambiguous nestings such as
   `(?:[^,]+,)+` or `(\\d+\\.)+` pass. Atomic groups `(?>...)` and possessive quantifiers `a++`
   (Python 3.11 `re`) never backtrack and are accepted.
2. At run time every match runs in the `regex` module with a timeout (and on bounded input), so
   what the static check cannot see (polynomial blow-ups like `.*a.*b.*c` on megabytes of text)
   stops with an error on that one field instead of hanging the crawl.

The analysis works on Python's own parse tree (`re._parser`), so it sees exactly what `re` sees.
Character sets are compared on a probe alphabet (ASCII, representative non-ASCII characters, and the
literals and range bounds of the pattern itself), which is exact for the literal/range cases and a
close approximation for Unicode categories.
"""

from __future__ import annotations

import re
from typing import Any

try:  # Python 3.11+
    from re import _constants as _c
    from re import _parser as _p
except ImportError:  # pragma: no cover - Python 3.10
    import sre_constants as _c  # type: ignore[no-redef]
    import sre_parse as _p  # type: ignore[no-redef]

# a repeat allowing at least this many iterations counts as unbounded for the hazard analysis
UNBOUNDED = 10
# limits of the bounded-alternation check (expansions per branch, length of an expansion)
_MAX_EXPANSIONS = 64
_MAX_EXPANSION_LEN = 12

_BACKTRACKING_REPEATS = {_c.MAX_REPEAT, _c.MIN_REPEAT}
_POSSESSIVE = getattr(_c, "POSSESSIVE_REPEAT", None)
_ATOMIC = getattr(_c, "ATOMIC_GROUP", None)
_SIMPLE_CHAR_OPS = {_c.LITERAL, _c.NOT_LITERAL, _c.ANY, _c.IN}

_BASE_PROBES = [chr(i) for i in range(128)] + list(
    "\u00a0éßΩжあ中١\u2028\u212aſİＡ\U0001f600\u200b\u0301"
)
_CATEGORY_RE = {
    _c.CATEGORY_DIGIT: r"\d",
    _c.CATEGORY_NOT_DIGIT: r"\D",
    _c.CATEGORY_SPACE: r"\s",
    _c.CATEGORY_NOT_SPACE: r"\S",
    _c.CATEGORY_WORD: r"\w",
    _c.CATEGORY_NOT_WORD: r"\W",
}


class _Analysis:
    def __init__(self, pattern: str, parsed: Any):
        self.flags = parsed.state.flags
        self.state = parsed.state
        probes = set(_BASE_PROBES)
        self._collect_probes(list(parsed), probes)
        self.probes = frozenset(probes)
        self._categories: dict[Any, frozenset[str]] = {}
        self.groups: dict[int, frozenset[str]] = {}
        self._collect_groups(list(parsed))

    # -- character sets ------------------------------------------------------------------------

    def _collect_probes(self, items: list, probes: set[str]) -> None:
        for op, av in items:
            if op in (_c.LITERAL, _c.NOT_LITERAL):
                probes.add(chr(av))
            elif op is _c.RANGE:
                lo, hi = av
                probes.update(chr(x) for x in {lo, hi, lo + 1 if lo < hi else lo, (lo + hi) // 2})
            elif op is _c.IN:
                self._collect_probes(av, probes)
            else:
                for sub in _children(op, av):
                    self._collect_probes(sub, probes)

    def _collect_groups(self, items: list) -> None:
        for op, av in items:
            if op is _c.SUBPATTERN and av[0]:
                self.groups[av[0]] = self.chars(av[3])
            for sub in _children(op, av):
                self._collect_groups(sub)

    def _category(self, category: Any) -> frozenset[str]:
        cached = self._categories.get(category)
        if cached is None:
            flags = re.ASCII if self.flags & _c.SRE_FLAG_ASCII else 0
            regex = re.compile(_CATEGORY_RE.get(category, r"[\s\S]"), flags)
            cached = frozenset(ch for ch in self.probes if regex.match(ch))
            self._categories[category] = cached
        return cached

    def _fold(self, chars: set[str]) -> set[str]:
        if not self.flags & _c.SRE_FLAG_IGNORECASE:
            return chars
        out = set(chars)
        for ch in self.probes:
            if ch.lower() in chars or ch.upper() in chars or ch.casefold() in chars:
                out.add(ch)
        return out

    def _in(self, items: list) -> frozenset[str]:
        negate = False
        chars: set[str] = set()
        for op, av in items:
            if op is _c.NEGATE:
                negate = True
            elif op is _c.LITERAL:
                chars.add(chr(av))
            elif op is _c.RANGE:
                lo, hi = av
                chars.update(ch for ch in self.probes if lo <= ord(ch) <= hi)
            elif op is _c.CATEGORY:
                chars.update(self._category(av))
            else:  # pragma: no cover - unknown set member: assume anything
                chars.update(self.probes)
        chars = self._fold(chars)
        return frozenset(self.probes - chars) if negate else frozenset(chars)

    def char(self, op: Any, av: Any) -> frozenset[str]:
        """The characters one single-character item can consume."""
        if op is _c.LITERAL:
            return frozenset(self._fold({chr(av)}))
        if op is _c.NOT_LITERAL:
            return frozenset(self.probes - self._fold({chr(av)}))
        if op is _c.ANY:
            if self.flags & _c.SRE_FLAG_DOTALL:
                return self.probes
            return frozenset(self.probes - {"\n"})
        if op is _c.IN:
            return self._in(av)
        raise ValueError(op)  # pragma: no cover

    def chars(self, items: list) -> frozenset[str]:
        """Every character a sequence of items can consume, at any position."""
        out: set[str] = set()
        for op, av in items:
            if op in _SIMPLE_CHAR_OPS:
                out |= self.char(op, av)
            elif op is _c.GROUPREF:
                out |= self.groups.get(av, self.probes)
            elif op in (_c.ASSERT, _c.ASSERT_NOT, _c.AT):
                continue
            else:
                for sub in _children(op, av, lookarounds=False):
                    out |= self.chars(sub)
        return frozenset(out)

    def min_width(self, items: list) -> int:
        return _p.SubPattern(self.state, list(items)).getwidth()[0]

    # -- hazards -------------------------------------------------------------------------------

    def hazard(self, items: list) -> str | None:
        for op, av in items:
            if op in _BACKTRACKING_REPEATS:
                _low, high, body = av
                if high >= UNBOUNDED or high == _c.MAXREPEAT:
                    reason = self._ambiguous_body(list(body))
                    if reason:
                        return reason
            for sub in _children(op, av):
                reason = self.hazard(sub)
                if reason:
                    return reason
        return None

    def _ambiguous_body(self, body: list) -> str | None:
        for inner, path in _inner_repeats(body, []):
            inner_chars = self.chars(list(inner[2]))
            delimited = any(
                self.min_width([item]) > 0 and not (self.chars([item]) & inner_chars)
                for seq, index in path
                for position, item in enumerate(seq)
                if position != index
            )
            if not delimited:
                return (
                    "a repeated group contains another quantifier and nothing in the group "
                    "separates the repetitions (like (a+)+, (\\w+\\s?)* or (.*,)+), so the same "
                    "text can be matched in exponentially many ways"
                )
        if self._ambiguous_iterations(body):
            return (
                "a repeated group can match the same text in more than one way (like (a|a)+, "
                "(a|aa)+ or (1?\\d?\\d\\.)+), so failing matches take exponential time"
            )
        return None

    def _ambiguous_iterations(self, body: list) -> bool:
        """For a bounded body: can one iteration match a text in two ways, or can one iteration
        match what two iterations match?"""
        strings = self._expand(body)
        if strings is None:
            return False
        for i, a in enumerate(strings):
            if any(_overlap(a, b) for b in strings[i + 1 :]):
                return True
        nonempty = [s for s in strings if s]
        for whole in nonempty:
            for head in nonempty:
                if len(head) < len(whole) and _overlap(head, whole[: len(head)]):
                    rest = whole[len(head) :]
                    if any(_overlap(tail, rest) for tail in nonempty):
                        return True
        return False

    def _expand(self, items: list) -> list[tuple[frozenset[str], ...]] | None:
        """The strings (as sequences of character sets) a bounded sequence can match; None when
        the sequence is unbounded or has too many expansions."""
        results: list[tuple[frozenset[str], ...]] = [()]
        for op, av in items:
            if op in _SIMPLE_CHAR_OPS:
                options = [(self.char(op, av),)]
            elif op in (_c.AT, _c.ASSERT, _c.ASSERT_NOT):
                continue
            elif op is _c.SUBPATTERN:
                sub = self._expand(list(av[3]))
                if sub is None:
                    return None
                options = sub
            elif op is _c.BRANCH:
                options = []
                for alt in av[1]:
                    sub = self._expand(list(alt))
                    if sub is None:
                        return None
                    options.extend(sub)
            elif op in _BACKTRACKING_REPEATS:
                low, high, body = av
                if high > 4:
                    return None
                sub = self._expand(list(body))
                if sub is None:
                    return None
                options = []
                for count in range(low, high + 1):
                    combos: list[tuple[frozenset[str], ...]] = [()]
                    for _ in range(count):
                        combos = [c + s for c in combos for s in sub][:_MAX_EXPANSIONS]
                    options.extend(combos)
            else:
                return None
            results = [r + o for r in results for o in options]
            if len(results) > _MAX_EXPANSIONS or any(len(r) > _MAX_EXPANSION_LEN for r in results):
                return None
        return results


def _overlap(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(x & y for x, y in zip(a, b, strict=True))


def _children(op: Any, av: Any, *, lookarounds: bool = True) -> list[list]:
    """The sub-sequences of one parse-tree item."""
    if op is _c.SUBPATTERN:
        return [list(av[3])]
    if op in _BACKTRACKING_REPEATS or (_POSSESSIVE is not None and op is _POSSESSIVE):
        return [list(av[2])]
    if op is _c.BRANCH:
        return [list(alt) for alt in av[1]]
    if _ATOMIC is not None and op is _ATOMIC:
        return [list(av)]
    if op in (_c.ASSERT, _c.ASSERT_NOT):
        return [list(av[1])] if lookarounds else []
    if op is _c.GROUPREF_EXISTS:
        return [list(av[1])] + ([list(av[2])] if av[2] else [])
    return []


def _inner_repeats(seq: list, path: list) -> list:
    """Backtracking repeats with a variable count inside `seq` (through groups and alternations,
    not through atomic groups, possessive repeats or lookarounds), each with the path of
    (sequence, index) pairs that leads to it."""
    found = []
    for index, (op, av) in enumerate(seq):
        here = [*path, (seq, index)]
        if op in _BACKTRACKING_REPEATS:
            low, high, _body = av
            if high > 1 and low != high:
                found.append((av, here))
        elif op is _c.SUBPATTERN:
            found.extend(_inner_repeats(list(av[3]), here))
        elif op is _c.BRANCH:
            for alt in av[1]:
                found.extend(_inner_repeats(list(alt), here))
        elif op is _c.GROUPREF_EXISTS:
            for sub in _children(op, av):
                found.extend(_inner_repeats(sub, here))
    return found


def backtracking_hazard(pattern: str, flags: int = 0) -> str | None:
    """Why `pattern` can backtrack catastrophically, or None. Raises re.error if it is invalid."""
    parsed = _p.parse(pattern, flags)
    return _Analysis(pattern, parsed).hazard(list(parsed))
