"""How to spell a command in a hint printed to the user, so that it works when pasted.

The package is installed in a virtual environment (`scripts/setup.sh` makes `.venv`) whose `bin`
folder is often not on PATH: `enrich-crawl` and `dagster` then only exist as `.venv/bin/...`. A hint
names the command by its short name when PATH finds this very environment's copy, else by its path.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path


def command(name: str) -> str:
    """`name` if PATH resolves it to the copy beside this Python, else that copy's path (relative to
    the working folder when inside it, e.g. `.venv/bin/dagster`); `name` when this environment has
    no such command."""
    beside = Path(sys.executable).parent / name
    if not beside.is_file():
        return name
    found = shutil.which(name)
    if found and os.path.realpath(found) == os.path.realpath(beside):
        return name
    relative = os.path.relpath(beside)
    return str(beside) if relative.startswith("..") else relative
