"""'Did you mean' for a misspelt key, option, type or name, shared by every error message that names
what is allowed (dataset specs, crawl settings, mappings)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """ "; did you mean 'x'?" for a near miss, else ""."""
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.75)
    return f"; did you mean {close[0]!r}?" if close else ""
