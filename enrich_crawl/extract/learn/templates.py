"""Site templates: which example pages a mapping is written for, and the URL patterns that
say where it applies."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

GENERIC_PATTERN = {"type": "regex", "pattern": "^https?://[^/]+/[^#]*(?:#.*)?$"}


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")[:60] or "site"


def template_key(prepared: Any) -> tuple[str, str]:
    """(host, path prefix) of the record's first page: the site a mapping is written for."""
    parts = urlsplit(prepared.pages[0].source.url)
    host = (parts.hostname or "").lower()
    path = parts.path or "/"
    directory = path.rsplit("/", 1)[0] + "/" if "/" in path else "/"
    segments = [s for s in directory.split("/") if s]
    # the first path segment keeps shared hosts' sites apart (sites.host/<slug>/...)
    return host, ("/" + segments[0] + "/") if segments else "/"


def url_pattern(host: str, prefix: str) -> dict[str, Any]:
    host_re = re.escape(host.removeprefix("www."))
    prefix_re = re.escape(prefix) if prefix != "/" else "/"
    return {
        "type": "regex",
        "pattern": f"^https?://(?:www\\.)?{host_re}(?::\\d+)?{prefix_re}[^#]*(?:#.*)?$",
    }
