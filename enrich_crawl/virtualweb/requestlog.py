"""The virtual web's request log, and reading it back.

Every request is logged as one JSON line (line-buffered) in the request log::

    {"t": <epoch float, request received>, "host", "path" (with query), "method", "ua", "status",
     "bytes" (body bytes sent), "proxy": bool, "conn": <connection id>, "tls": bool, "dur": <seconds>}

plus ``"note"`` for answers that are not HTTP answers (``hang``, ``close``, ``unreachable``; their
status is 0). CONNECT requests are logged with ``"method": "CONNECT"`` and ``"path": "host:port"``;
:func:`requests_by_host` leaves them out by default.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path


def read_log(path: str | os.PathLike) -> list[dict]:
    """The entries of a request log (an incomplete last line is skipped)."""
    entries = []
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            entries.append(json.loads(line))
        except ValueError:
            continue
    return entries


def requests_by_host(
    log_entries: Iterable[dict] | str | os.PathLike, *, include_connect: bool = False
) -> dict[str, list[dict]]:
    """Request log entries grouped by host, each list in order of arrival (``t``).

    CONNECT entries (tunnel set-up, not requests to the site) are left out unless asked for.
    """
    if isinstance(log_entries, (str, os.PathLike)):
        log_entries = read_log(log_entries)
    out: dict[str, list[dict]] = {}
    for entry in log_entries:
        host = entry.get("host")
        if not host or (entry.get("method") == "CONNECT" and not include_connect):
            continue
        out.setdefault(host, []).append(entry)
    for entries in out.values():
        entries.sort(key=lambda e: e.get("t", 0.0))
    return out
