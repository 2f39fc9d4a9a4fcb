"""'Did you mean' for a misspelt key, option, type or name, shared by every error message that names
what is allowed (dataset specs, crawl settings, mappings)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

CUTOFF = 0.75  # difflib similarity from which a word is taken for a misspelling of another


def closest(word: str, choices: Iterable[str], cutoff: float = CUTOFF) -> str | None:
    """The choice `word` is most likely a misspelling of: the same but for case, else the most
    similar at `cutoff` or above; None when nothing is close."""
    names = [str(c) for c in choices]
    lowered = {name.lower(): name for name in reversed(names)}
    if str(word).lower() in lowered:
        return lowered[str(word).lower()]
    close = difflib.get_close_matches(str(word), names, n=1, cutoff=cutoff)
    return close[0] if close else None


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """ "; did you mean 'x'?" for a near miss, else ""."""
    close = closest(word, choices)
    return f"; did you mean {close!r}?" if close else ""
