"""robots.txt as RFC 9309 says, on top of Protego (group by product token, longest match, Allow wins
ties, wildcards `*` and `$`), plus the rules for errors, size and Crawl-delay.

- 2xx: the rules of the file. Only the first 500 KiB are read (RFC 9309 2.5 requires parsers to
  read at least that much; the download itself is cut there). A UTF-8 BOM is skipped; bytes that are
  not UTF-8 are replaced (the rules are ASCII). Lines that are not rules are ignored; an HTML page
  served as robots.txt (a soft 404) has no rules at all, so it allows everything, as RFC 9309 2.2
  and the big crawlers treat it;
- redirects are followed (up to 5 hops, RFC 9309 2.3.1.2) by the downloader;
- 4xx (401/403 included, RFC 9309 2.3.1.3): no rules, everything allowed;
- 5xx, or unreachable (connection refused, timeout, DNS): everything disallowed "for now" (this run;
  the cross-run cache keeps that verdict for UNREACHABLE_TTL only);
- Crawl-delay: fractional seconds honoured; negative or unparsable values ignored; the default
  delay applies when there is none, and `crawl.max_delay` caps it.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from protego import Protego

MAX_ROBOTS_BYTES = 500 * 1024
UNREACHABLE_TTL = 30 * 60.0  # seconds a 5xx/unreachable verdict is cached across runs


def product_token(user_agent: str) -> str:
    """`enrich_crawl/0.1 (+https://...)` -> `enrich_crawl` (RFC 9309 2.2.1: letters, `_`, `-`)."""
    match = re.match(r"\s*([A-Za-z_-]+)", user_agent)
    return match.group(1) if match else user_agent


def looks_like_html(text: str) -> bool:
    head = text.lstrip()[:512].lower()
    return head.startswith(("<!doctype html", "<html", "<head", "<body", "<?xml")) or (
        "<html" in head and "user-agent" not in head
    )


@dataclass
class RobotsRules:
    """The verdict for one origin (scheme://host:port)."""

    origin: str
    status: str  # "ok" | "allow_all" | "disallow_all"
    text: str = ""
    http_status: int | None = None
    fetched_at: float = field(default_factory=time.time)
    # why everything is disallowed: "robots" (5xx answer) or the fetch failure (dns, timeout, ...)
    cause: str = "robots"
    # what was odd about the file: "html" (a page, not rules), "truncated" (over 500 KiB)
    note: str = ""
    _parser: Protego | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_response(
        cls, origin: str, status: int, body: bytes, *, truncated: bool = False
    ) -> RobotsRules:
        if 200 <= status < 300:
            cut = len(body) > MAX_ROBOTS_BYTES
            text = body[:MAX_ROBOTS_BYTES].decode("utf-8-sig", errors="replace")
            if cut:  # the last line may be cut in the middle: drop it
                text = text.rsplit("\n", 1)[0]
            note = "truncated" if (truncated or cut) else ""
            if looks_like_html(text):  # a page (soft 404), not rules: nothing is disallowed
                text, note = "", "html"
            return cls(origin, "ok", text, status, note=note)
        if 400 <= status < 500:
            return cls(origin, "allow_all", "", status)
        return cls(origin, "disallow_all", "", status)

    @classmethod
    def unreachable(cls, origin: str, cause: str = "connection") -> RobotsRules:
        return cls(origin, "disallow_all", "", None, cause=cause)

    @property
    def parser(self) -> Protego | None:
        if self.status != "ok":
            return None
        if self._parser is None:
            try:
                self._parser = Protego.parse(self.text)
            except Exception:  # a file Protego cannot read at all: no usable rules
                self._parser = Protego.parse("")
        return self._parser

    def allowed(self, url: str, user_agent: str) -> bool:
        if self.status == "allow_all":
            return True
        path = urlsplit(url).path
        if self.status == "disallow_all":
            # RFC 9309 2.3.1.4: /robots.txt itself is always allowed
            return path == "/robots.txt"
        if path == "/robots.txt":
            return True
        return bool(self.parser.can_fetch(url, product_token(user_agent)))

    def crawl_delay(self, user_agent: str) -> float | None:
        if self.parser is None:
            return None
        try:
            delay = self.parser.crawl_delay(product_token(user_agent))
        except Exception:
            return None
        if delay is None:
            return None
        try:
            delay = float(delay)
        except (TypeError, ValueError):
            return None
        return delay if delay >= 0 and delay == delay else None  # NaN is not a delay

    def expired(self, ttl_seconds: float, now: float | None = None) -> bool:
        now = time.time() if now is None else now
        ttl = min(ttl_seconds, UNREACHABLE_TTL) if self.status == "disallow_all" else ttl_seconds
        return now - self.fetched_at > ttl

    def to_doc(self) -> dict:
        return {
            "_id": self.origin,
            "status": self.status,
            "text": self.text,
            "http_status": self.http_status,
            "fetched_at": self.fetched_at,
            "cause": self.cause,
            "note": self.note,
        }

    @classmethod
    def from_doc(cls, doc: dict) -> RobotsRules:
        return cls(
            doc["_id"],
            doc["status"],
            doc.get("text") or "",
            doc.get("http_status"),
            float(doc.get("fetched_at") or 0),
            cause=doc.get("cause") or "robots",
            note=doc.get("note") or "",
        )


def origin_of(url: str) -> str:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    port = parts.port
    default = {"http": 80, "https": 443}.get(scheme)
    if ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}" + (f":{port}" if port and port != default else "")
