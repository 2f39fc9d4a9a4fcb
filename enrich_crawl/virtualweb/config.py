"""The per-host behaviour of the virtual web, read from ``_web.json`` files.

Per-host behaviour comes from ``ROOT/<host>/_web.json``, on top of ``ROOT/_web.json`` (its top-level
keys are defaults for every host, ``"hosts": {name: {...}}`` configures single hosts, even hosts that
have no folder, and ``"seed"`` seeds the latency draws). When merging, objects are merged key by key and
lists are concatenated; anything else is replaced. Keys (regexes are searched in the raw request path
including its query, ``/a/b?x=1``; globs are matched against the decoded path without query)::

    latency      0.2 | {"median": 0.15, "sigma": 0.6, "max": 5, "min": 0}  seconds before answering
                 (log-normal draws from one RNG per host seeded with (seed, host): reproducible)
    headers      {"Name": "value"}            extra headers on every response of the host
    content_type {"<glob or regex>": "text/html; charset=cp1252"}   first match wins
    status       {"<regex>": 503}             forced status (body from the file if any), even 999
    redirects    {"<regex>": "/to/\\1"} | {"<regex>": {"code": 301, "to": "http://x.example/"}}
                 302 by default; the target may use the regex groups (re.Match.expand)
    gzip         true                         gzip text bodies when the client accepts gzip
    bomb         {"<regex>": 1000000000}      gzip body inflating to that many zero bytes (always)
    huge         {"<regex>": 50000000}        generated body of that many bytes, streamed
    slow         {"<regex>": 500}             trickle the body at that many bytes per second
    hang         ["<regex>"]                  read the request, never answer
    close        ["<regex>"]                  reset the connection without an answer
    unreachable  true                         reset every request of the host (CONNECT included)
    fail_first   {"<regex>": 2}               503 to the first N requests of each matching path

Order of precedence for one request: unreachable/close, hang, latency, redirects, fail_first, status,
bomb, huge, then the file; ``slow`` and ``headers`` apply to whatever answer results. Unknown keys and
invalid values are ignored with a warning on the server's log (stderr). Config files are re-read when
they change.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import math
import os
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from enrich_crawl.virtualweb.http1 import TOKEN

log = logging.getLogger("enrich_crawl.virtualweb")

CONFIG_NAME = "_web.json"

HOST_KEYS = frozenset(
    {
        "latency",
        "headers",
        "content_type",
        "status",
        "redirects",
        "gzip",
        "bomb",
        "huge",
        "slow",
        "hang",
        "close",
        "unreachable",
        "fail_first",
    }
)
ROOT_KEYS = HOST_KEYS | {"hosts", "seed"}

# Headers the config must not set: they would break the message framing.
_FRAMING_HEADERS = frozenset({"content-length", "transfer-encoding", "connection"})


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        old = out.get(key)
        if isinstance(old, dict) and isinstance(value, dict):
            out[key] = {**old, **value}
        elif isinstance(old, list) and isinstance(value, list):
            out[key] = old + value
        else:
            out[key] = value
    return out


def _regex(pattern: Any, where: str) -> re.Pattern | None:
    try:
        return re.compile(pattern)
    except (re.error, TypeError) as exc:
        log.warning("%s: invalid regex %r ignored (%s)", where, pattern, exc)
        return None


def _number(value: Any, where: str, *, integer: bool = False) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        log.warning("%s: expected a non-negative number, got %r (ignored)", where, value)
        return None
    if integer and value != int(value):
        log.warning("%s: expected an integer, got %r (ignored)", where, value)
        return None
    return int(value) if integer else float(value)


@dataclass
class HostConfig:
    """The parsed behaviour of one host (see the module docstring for the keys)."""

    latency: tuple[float, float, float, float] | None = None  # median, sigma, min, max
    headers: list[tuple[str, str]] = field(default_factory=list)
    content_type: list[tuple[str, re.Pattern | None, str]] = field(default_factory=list)
    status: list[tuple[re.Pattern, int]] = field(default_factory=list)
    redirects: list[tuple[re.Pattern, int, str]] = field(default_factory=list)
    gzip: bool = False
    bomb: list[tuple[re.Pattern, int]] = field(default_factory=list)
    huge: list[tuple[re.Pattern, int]] = field(default_factory=list)
    slow: list[tuple[re.Pattern, float]] = field(default_factory=list)
    hang: list[re.Pattern] = field(default_factory=list)
    close: list[re.Pattern] = field(default_factory=list)
    unreachable: bool = False
    fail_first: list[tuple[re.Pattern, int]] = field(default_factory=list)

    @classmethod
    def parse(cls, raw: dict, where: str) -> HostConfig:
        cfg = cls()
        for key, value in raw.items():
            if key not in HOST_KEYS:
                log.warning("%s: unknown key %r ignored", where, key)
                continue
            try:
                getattr(cfg, f"_parse_{key}")(value, f"{where}: {key}")
            except (TypeError, ValueError, AttributeError) as exc:
                log.warning("%s: invalid %s %r ignored (%s)", where, key, value, exc)
        return cfg

    def _pairs(self, value: Any, where: str, *, integer: bool) -> list[tuple[re.Pattern, Any]]:
        out = []
        for pattern, number in dict(value).items():
            regex = _regex(pattern, where)
            num = _number(number, f"{where} {pattern!r}", integer=integer)
            if regex is not None and num is not None:
                out.append((regex, num))
        return out

    def _patterns(self, value: Any, where: str) -> list[re.Pattern]:
        if isinstance(value, str):
            value = [value]
        return [r for r in (_regex(p, where) for p in list(value)) if r is not None]

    def _parse_latency(self, value: Any, where: str) -> None:
        if isinstance(value, dict):
            median = _number(value.get("median", 0.1), f"{where}.median")
            sigma = _number(value.get("sigma", 0.0), f"{where}.sigma")
            low = _number(value.get("min", 0.0), f"{where}.min")
            high = _number(value.get("max", 30.0), f"{where}.max")
            if None not in (median, sigma, low, high):
                self.latency = (median, sigma, low, high)
        else:
            constant = _number(value, where)
            if constant is not None:
                self.latency = (constant, 0.0, constant, constant)

    def _parse_headers(self, value: Any, where: str) -> None:
        for name, val in dict(value).items():
            name = str(name).strip()
            if name.lower() in _FRAMING_HEADERS or not TOKEN.match(
                name.encode("latin-1", "replace")
            ):
                log.warning("%s: header %r cannot be configured (ignored)", where, name)
                continue
            self.headers.append((name, re.sub(r"[\r\n]+", " ", str(val))))

    def _parse_content_type(self, value: Any, where: str) -> None:
        for pattern, ctype in dict(value).items():
            try:
                regex = re.compile(pattern)
            except re.error:
                regex = None  # a glob such as "*.html" is not a valid regex
            self.content_type.append((str(pattern), regex, re.sub(r"[\r\n]+", " ", str(ctype))))

    def _parse_status(self, value: Any, where: str) -> None:
        for regex, code in self._pairs(value, where, integer=True):
            if 100 <= code <= 999:
                self.status.append((regex, code))
            else:
                log.warning("%s: status %r out of range 100-999 (ignored)", where, code)

    def _parse_redirects(self, value: Any, where: str) -> None:
        for pattern, target in dict(value).items():
            regex = _regex(pattern, where)
            code = 302
            if isinstance(target, dict):
                code = target.get("code", 302)
                target = target.get("to")
            if not isinstance(target, str) or not isinstance(code, int) or not 300 <= code <= 399:
                log.warning("%s: invalid redirect %r -> %r (ignored)", where, pattern, target)
                continue
            if regex is not None:
                self.redirects.append((regex, code, target))

    def _parse_gzip(self, value: Any, where: str) -> None:
        self.gzip = bool(value)

    def _parse_unreachable(self, value: Any, where: str) -> None:
        self.unreachable = bool(value)

    def _parse_bomb(self, value: Any, where: str) -> None:
        self.bomb = self._pairs(value, where, integer=True)

    def _parse_huge(self, value: Any, where: str) -> None:
        self.huge = self._pairs(value, where, integer=True)

    def _parse_slow(self, value: Any, where: str) -> None:
        self.slow = [(r, v) for r, v in self._pairs(value, where, integer=False) if v > 0]

    def _parse_fail_first(self, value: Any, where: str) -> None:
        self.fail_first = self._pairs(value, where, integer=True)

    def _parse_hang(self, value: Any, where: str) -> None:
        self.hang = self._patterns(value, where)

    def _parse_close(self, value: Any, where: str) -> None:
        self.close = self._patterns(value, where)

    def draw_latency(self, rng: random.Random) -> float:
        if self.latency is None:
            return 0.0
        median, sigma, low, high = self.latency
        value = median * math.exp(sigma * rng.gauss(0.0, 1.0)) if sigma else median
        return min(max(value, low), high)

    def content_type_for(self, decoded_path: str, raw_path: str) -> str | None:
        for pattern, regex, ctype in self.content_type:
            if fnmatch.fnmatchcase(decoded_path, pattern) or (regex and regex.search(raw_path)):
                return ctype
        return None


def first_match(pairs: list[tuple[re.Pattern, Any]], path: str) -> tuple[re.Match, Any] | None:
    for regex, value in pairs:
        match = regex.search(path)
        if match:
            return match, value
    return None


class HostConfigs:
    """Reads ``ROOT/_web.json`` and ``ROOT/<host>/_web.json``, re-reading them when they change."""

    def __init__(self, root: Path):
        self.root = root
        self._root_key: tuple | None = None
        self._root_raw: dict = {}
        self._hosts: dict[str, tuple[tuple, HostConfig]] = {}

    @staticmethod
    def _mtime(path: Path) -> int | None:
        try:
            return os.stat(path).st_mtime_ns
        except OSError:
            return None

    @staticmethod
    def _load(path: Path) -> dict:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning("%s: unreadable config ignored (%s)", path, exc)
            return {}
        if not isinstance(data, dict):
            log.warning("%s: config must be a JSON object (ignored)", path)
            return {}
        return data

    def root_raw(self) -> dict:
        path = self.root / CONFIG_NAME
        key = (self._mtime(path),)
        if key != self._root_key:
            raw = self._load(path) if key[0] is not None else {}
            for name in raw:
                if name not in ROOT_KEYS:
                    log.warning("%s: unknown key %r ignored", path, name)
            hosts = raw.get("hosts") or {}
            if not isinstance(hosts, dict):
                log.warning("%s: 'hosts' must be an object (ignored)", path)
                hosts = {}
            raw["hosts"] = {str(h).lower(): v for h, v in hosts.items() if isinstance(v, dict)}
            self._root_raw, self._root_key = raw, key
            self._hosts.clear()
        return self._root_raw

    def seed(self) -> int:
        seed = self.root_raw().get("seed", 0)
        return seed if isinstance(seed, int) else 0

    def host(self, host: str) -> HostConfig | None:
        """The config of a known host, or None when the host does not exist."""
        root_raw = self.root_raw()
        host_dir = self.root / host
        is_dir = os.path.isdir(host_dir)
        if not is_dir and host not in root_raw["hosts"]:
            return None
        host_file = host_dir / CONFIG_NAME
        key = (is_dir, self._mtime(host_file) if is_dir else None)
        cached = self._hosts.get(host)
        if cached is not None and cached[0] == key:
            return cached[1]
        defaults = {k: v for k, v in root_raw.items() if k in HOST_KEYS}
        raw = _merge(defaults, root_raw["hosts"].get(host, {}))
        if key[1] is not None:
            raw = _merge(raw, self._load(host_file))
        cfg = HostConfig.parse(raw, f"{host_file if key[1] is not None else self.root} [{host}]")
        self._hosts[host] = (key, cfg)
        return cfg
