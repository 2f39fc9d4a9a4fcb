"""robots.txt as RFC 9309 says, plus the rules for errors, size and Crawl-delay.

Groups are formed here (RFC 9309 2.1, 2.2): one or more `User-agent` lines start a group, its
`Allow`/`Disallow` rules follow, and only a `User-agent` line after a rule starts the next group.
Other records (`Sitemap`, `Crawl-delay`, `Noindex`, unknown or broken lines) never end a group
(2.2.4: other records must not interfere with the grouping). A group applies to us when one of
its user agents is our product token, compared case-insensitively as a whole token (2.2.1):
`User-agent: enrich` is another robot's group. Every group naming us is combined; without one,
every `*` group; without either, nothing is disallowed. The rules of the chosen group are matched
by Protego (longest match, Allow wins ties, wildcards `*` and `$`, percent-encoding compared in
one form). Like Google's parser, the known misspellings of the record names (`useragent`,
`disallaw`, ...) and a missing colon (`Disallow /x`) are accepted: a webmaster's intent is plain.

- 2xx: the rules of the file. Only the first 500 KiB are read (RFC 9309 2.5 requires parsers to
  read at least that much; the download itself is cut there). A UTF-8 BOM is skipped; bytes that are
  not UTF-8 are replaced (the rules are ASCII). Lines that are not rules are ignored; an HTML page
  served as robots.txt (a soft 404) has no rules at all, so it allows everything, as RFC 9309 2.2
  and the big crawlers treat it;
- redirects are followed (up to 5 hops, RFC 9309 2.3.1.2) by the downloader;
- 4xx (401/403 included, RFC 9309 2.3.1.3): no rules, everything allowed;
- 5xx, or unreachable (connection refused, timeout, DNS): everything disallowed "for now" (this run;
  the cross-run cache keeps that verdict for UNREACHABLE_TTL only);
- Crawl-delay: read from the group that applies (the largest when several are combined);
  fractional seconds honoured; negative or unparsable values ignored; the default delay applies
  when there is none, and `crawl.max_delay` caps it.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from protego import Protego

MAX_ROBOTS_BYTES = 500 * 1024
ROBOTS_FETCH = "robots_fetch"  # request meta of robots.txt requests
UNREACHABLE_TTL = 30 * 60.0  # seconds a 5xx/unreachable verdict is cached across runs


_TOKEN = re.compile(r"\s*([A-Za-z_-]+)")
# record names as written, with the misspellings the big crawlers accept
_USER_AGENT = {"user-agent", "useragent", "user agent"}
_ALLOW = {"allow"}
_DISALLOW = {"disallow", "dissallow", "dissalow", "disalow", "diasllow", "disallaw"}
_CRAWL_DELAY = {"crawl-delay", "crawl delay", "crawldelay"}
_NAMES = _USER_AGENT | _ALLOW | _DISALLOW | _CRAWL_DELAY
# a record name with its colon forgotten: `Disallow /x`, `User-agent foo`
_NO_COLON = re.compile(
    r"^(user-agent|useragent|user agent|allow|disallow|dissallow|dissalow|disalow|diasllow|"
    r"disallaw|crawl-delay|crawl delay|crawldelay)\s+(\S.*)$",
    re.IGNORECASE,
)


def product_token(user_agent: str) -> str:
    """`enrich_crawl/0.1 (+https://...)` -> `enrich_crawl` (RFC 9309 2.2.1: letters, `_`, `-`)."""
    match = _TOKEN.match(user_agent)
    return match.group(1) if match else user_agent


@dataclass
class RobotsGroup:
    """One group of a robots.txt: its user agents (lower-case product tokens, `*` for all), its
    rules in file order, and its Crawl-delay as written."""

    agents: list[str] = field(default_factory=list)
    rules: list[tuple[str, str]] = field(default_factory=list)  # ("allow"|"disallow", path)
    crawl_delay: str | None = None


def _record(line: str) -> tuple[str, str] | None:
    """(name, value) of a line that is a record we read, else None. Comments are cut first."""
    line = line.split("#", 1)[0].strip()
    if not line:
        return None
    name, colon, value = line.partition(":")
    name = name.strip().lower()
    if colon and name in _NAMES:
        return name, value.strip()
    missing = _NO_COLON.match(line)
    if missing is not None:
        return missing.group(1).lower(), missing.group(2).strip()
    return None


def _agent_of(value: str) -> str | None:
    """The product token a `User-agent` value names (lower-case), `*`, or None. Like the major
    crawlers, the token is read up to the first character a token cannot hold (`Foo Bar` and
    `FooBot/2.1` name `foo` and `foobot`)."""
    if value == "*" or value.startswith(("* ", "*\t")):
        return "*"
    match = _TOKEN.match(value)
    return match.group(1).lower() if match else None


def parse_groups(text: str) -> list[RobotsGroup]:
    """The groups of a robots.txt (RFC 9309 2.1): rules before any `User-agent` line are ignored,
    and only a `User-agent` line after a rule starts a new group."""
    groups: list[RobotsGroup] = []
    current: RobotsGroup | None = None
    for line in text.splitlines():
        record = _record(line)
        if record is None:  # empty, comment, other record or garbage: the group goes on
            continue
        name, value = record
        if name in _USER_AGENT:
            if current is None or current.rules:
                current = RobotsGroup()
                groups.append(current)
            agent = _agent_of(value)
            if agent is not None:
                current.agents.append(agent)
        elif current is None:
            continue
        elif name in _ALLOW:
            current.rules.append(("allow", value))
        elif name in _DISALLOW:
            current.rules.append(("disallow", value))
        elif current.crawl_delay is None:  # Crawl-delay: the first of a group counts
            current.crawl_delay = value
    return groups


@dataclass
class AgentRules:
    """What applies to one product token: the combined group (or none) as a Protego parser."""

    matched: bool  # a group applies (ours or `*`)
    parser: Protego | None
    crawl_delay: float | None


def _delay(value: str | None) -> float | None:
    try:
        delay = float(value) if value is not None else None
    except ValueError:
        return None
    if delay is None or delay != delay or delay < 0:  # NaN is not a delay
        return None
    return delay


def rules_for(groups: list[RobotsGroup], token: str) -> AgentRules:
    """RFC 9309 2.2.1: every group naming `token` (whole token, any case), combined; else every
    `*` group, combined; else nothing applies."""
    token = token.lower()
    chosen = [g for g in groups if token in g.agents] or [g for g in groups if "*" in g.agents]
    if not chosen:
        return AgentRules(False, None, None)
    lines = ["User-agent: *"]
    for group in chosen:
        lines.extend(f"{kind}: {path}" for kind, path in group.rules if path)
    try:
        parser = Protego.parse("\n".join(lines))
    except Exception:  # a rule Protego cannot read at all: none of them
        parser = Protego.parse("")
    delays = [d for d in (_delay(g.crawl_delay) for g in chosen) if d is not None]
    return AgentRules(True, parser, max(delays) if delays else None)


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
    _groups: list[RobotsGroup] | None = field(default=None, repr=False, compare=False)
    _agents: dict[str, AgentRules] = field(default_factory=dict, repr=False, compare=False)

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
    def groups(self) -> list[RobotsGroup]:
        if self._groups is None:
            self._groups = parse_groups(self.text) if self.status == "ok" else []
        return self._groups

    def for_agent(self, user_agent: str) -> AgentRules:
        """The rules that apply to `user_agent`'s product token (parsed once per token)."""
        token = product_token(user_agent).lower()
        found = self._agents.get(token)
        if found is None:
            found = self._agents[token] = rules_for(self.groups, token)
            # the groups only served to build these rules: a crawl keeps the rules of hundreds
            # of origins, and another token (rare) parses the text again
            self._groups = None
        return found

    def allowed(self, url: str, user_agent: str) -> bool:
        if self.status == "allow_all":
            return True
        path = urlsplit(url).path
        if self.status == "disallow_all":
            # RFC 9309 2.3.1.4: /robots.txt itself is always allowed
            return path == "/robots.txt"
        if path == "/robots.txt":
            return True
        rules = self.for_agent(user_agent)
        if rules.parser is None:
            return True
        return bool(rules.parser.can_fetch(url, "*"))

    def crawl_delay(self, user_agent: str) -> float | None:
        if self.status != "ok":
            return None
        return self.for_agent(user_agent).crawl_delay

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
