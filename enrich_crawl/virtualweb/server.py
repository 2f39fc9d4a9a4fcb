"""The virtual web: one loopback HTTP/1.1 server and forward proxy serving many hostnames from a folder.

Tests, the demo and benchmarks never touch the internet. They point the crawler (Scrapy, and Chromium
through scrapy-playwright) at this server as its proxy (``http_proxy``/``https_proxy`` =
``http://127.0.0.1:PORT``) and it answers for every hostname that has a folder ``ROOT/<hostname>/``:

* absolute-form requests ``GET http://host.example/path?q HTTP/1.1`` (proxy style),
* origin-form requests ``GET /path`` with a ``Host:`` header (direct style),
* ``CONNECT host:443``: TLS is terminated here with a per-host certificate (signed by a CA generated at
  start-up, see :attr:`VirtualWeb.ca_pem`) and the tunnelled requests are served like plain ones.

Scrapy (urllib's ``getproxies()``) proxies ``https://`` URLs only when ``https_proxy`` is set too;
:meth:`WebHandle.proxy_env` gives both. Chromium's own background traffic (update checks...) also
reaches the proxy and gets 502s: filter the request log by host.

Paths map to files: ``/`` and ``.../`` -> ``index.html``; a directory -> 301 to ``path/``; a missing
``path`` falls back to ``path.html``; ``path?query`` is served from a file named exactly
``path?query`` when it exists (percent-encoding of the query as sent), else the query is ignored;
misses are 404 (body from ``404.html`` when present). Files whose name starts with ``_`` (such as the
per-host config ``_web.json``) are never served. Unknown hosts get ``502`` with ``X-Proxy-Error: dns``.

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

Every request is logged as one JSON line (line-buffered) in the request log::

    {"t": <epoch float, request received>, "host", "path" (with query), "method", "ua", "status",
     "bytes" (body bytes sent), "proxy": bool, "conn": <connection id>, "tls": bool, "dur": <seconds>}

plus ``"note"`` for answers that are not HTTP answers (``hang``, ``close``, ``unreachable``; their
status is 0). CONNECT requests are logged with ``"method": "CONNECT"`` and ``"path": "host:port"``;
:func:`requests_by_host` leaves them out by default.

Command line (the form tests use through :func:`running_web`)::

    python -m enrich_crawl.virtualweb ROOT [--host 127.0.0.1] [--port 0] [--log FILE]
        [--port-file FILE] [--seed N] [--ca-file FILE] [--exit-with-parent] [-v]

In-process (the caller owns the event loop)::

    async with VirtualWeb(root, log_path=...) as web:
        ...  # web.port, web.proxy_url

In a subprocess (no shared GIL with what is measured; always killed on exit)::

    with running_web(root) as web:
        requests.get("http://site.example/", proxies=web.proxies)
        by_host = requests_by_host(web.read_log())

Limitations: HTTP/1.1 only (ALPN offers ``http/1.1``), GET and HEAD only (others 405), request bodies
are discarded, no chunked responses (every body has a Content-Length; 204/304 have none), no
``Range``. Responses are not cached by the proxy: every request reaches the "site".
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import email.utils
import fnmatch
import gzip as gzip_module
import hashlib
import http
import ipaddress
import itertools
import json
import logging
import math
import mimetypes
import os
import posixpath
import random
import re
import shutil
import signal
import socket
import ssl
import stat
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

__all__ = [
    "VirtualWeb",
    "WebHandle",
    "read_log",
    "requests_by_host",
    "running_web",
]

log = logging.getLogger("enrich_crawl.virtualweb")  # also when run as __main__

SERVER_NAME = "enrich-crawl-virtual-web"
CONFIG_NAME = "_web.json"
LINE_LIMIT = 64 * 1024  # longest request or header line
MAX_HEADER_BYTES = 64 * 1024  # all header lines together
MAX_HEADERS = 200
MAX_DISCARDED_BODY = 1024 * 1024  # request bodies up to this size are read and dropped
CHUNK = 64 * 1024

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
_TOKEN = re.compile(rb"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_HOST_OK = re.compile(r"^[a-z0-9_.:-]+$")

# The built-in table only, so that every machine answers the same (no /etc/mime.types).
_MIME = mimetypes.MimeTypes(filenames=())
for _ext, _type in {
    ".json": "application/json",
    ".jsonl": "application/jsonl",
    ".js": "text/javascript",
    ".mjs": "text/javascript",
    ".xml": "application/xml",
    ".md": "text/markdown",
    ".csv": "text/csv",
    ".yaml": "application/yaml",
    ".yml": "application/yaml",
    ".svg": "image/svg+xml",
    ".webp": "image/webp",
    ".woff": "font/woff",
    ".woff2": "font/woff2",
    ".wasm": "application/wasm",
    ".ico": "image/vnd.microsoft.icon",
}.items():
    _MIME.add_type(_type, _ext)
_ENCODING_TYPES = {
    "gzip": "application/gzip",
    "bzip2": "application/x-bzip2",
    "xz": "application/x-xz",
    "br": "application/x-brotli",
    "compress": "application/x-compress",
}


def guess_content_type(name: str, data: bytes = b"") -> str:
    """Content-Type for a file name (no charset parameter); unknown extensions are sniffed."""
    ext = posixpath.splitext(name)[1].lower()
    if ext in _MIME.encodings_map:
        return _ENCODING_TYPES.get(_MIME.encodings_map[ext], "application/octet-stream")
    ctype = _MIME.types_map[True].get(ext) or _MIME.types_map[False].get(ext)
    if ctype:
        return ctype
    head = data[:512].lstrip()
    if head.startswith(b"<?xml"):
        return "application/xml"
    if head.startswith(b"<"):
        return "text/html"
    return "application/octet-stream"


def _compressible(ctype: str) -> bool:
    ctype = ctype.split(";", 1)[0].strip().lower()
    return (
        ctype.startswith("text/")
        or ctype.endswith(("+json", "+xml", "/json", "/xml", "javascript"))
        or ctype in ("application/jsonl", "image/svg+xml", "application/yaml")
    )


# --------------------------------------------------------------------------------------------------
# configuration


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
            if name.lower() in _FRAMING_HEADERS or not _TOKEN.match(
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


def _first(pairs: list[tuple[re.Pattern, Any]], path: str) -> tuple[re.Match, Any] | None:
    for regex, value in pairs:
        match = regex.search(path)
        if match:
            return match, value
    return None


class _Configs:
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


# --------------------------------------------------------------------------------------------------
# file contents


@dataclass
class _Entry:
    data: bytes
    etag: str  # without quotes
    mtime: float
    last_modified: str
    mtime_ns: int
    size: int
    gz: bytes | None = None

    def gzipped(self) -> bytes:
        if self.gz is None:
            self.gz = gzip_module.compress(self.data, compresslevel=6, mtime=0)
        return self.gz


class _ContentCache:
    """File contents by path, validated by (mtime, size), bounded by bytes (LRU)."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.max_item = max(max_bytes // 8, 1)
        self._items: OrderedDict[str, _Entry] = OrderedDict()
        self._bytes = 0

    def get(self, path: str, st: os.stat_result) -> _Entry:
        entry = self._items.get(path)
        if entry is not None and entry.mtime_ns == st.st_mtime_ns and entry.size == st.st_size:
            self._items.move_to_end(path)
            return entry
        with open(path, "rb") as fh:
            data = fh.read()
        entry = _Entry(
            data=data,
            etag=hashlib.blake2b(data, digest_size=12).hexdigest(),
            mtime=st.st_mtime,
            last_modified=email.utils.formatdate(st.st_mtime, usegmt=True),
            mtime_ns=st.st_mtime_ns,
            size=st.st_size,
        )
        self._drop(path)
        if len(data) <= self.max_item:
            self._items[path] = entry
            self._bytes += len(data)
            while self._bytes > self.max_bytes and self._items:
                self._drop(next(iter(self._items)))
        return entry

    def _drop(self, path: str) -> None:
        old = self._items.pop(path, None)
        if old is not None:
            self._bytes -= len(old.data) + len(old.gz or b"")

    def gzipped(self, path: str, entry: _Entry) -> bytes:
        """The gzip form of an entry, computed once and counted in the cache's size."""
        if entry.gz is None:
            body = entry.gzipped()
            if self._items.get(path) is entry:
                self._bytes += len(body)
            return body
        return entry.gz


def _bomb_body(size: int) -> bytes:
    """A gzip member that inflates to ``size`` zero bytes, built from one repeated deflate block."""
    block = 1 << 20
    comp = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    # After a full flush the deflate state is reset, so every further 1 MiB block of zeros
    # compresses to the same bytes: build the body by repetition instead of compressing it all.
    zeros = bytes(block)
    unit = comp.compress(zeros) + comp.flush(zlib.Z_FULL_FLUSH)
    count, rest = divmod(size, block)
    tail = comp.compress(bytes(rest)) + comp.flush(zlib.Z_FINISH)
    crc = 0
    for _ in range(count):
        crc = zlib.crc32(zeros, crc)
    crc = zlib.crc32(bytes(rest), crc)
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"
    trailer = struct.pack("<II", crc & 0xFFFFFFFF, size & 0xFFFFFFFF)
    return header + unit * count + tail + trailer


# --------------------------------------------------------------------------------------------------
# TLS


class _TLS:
    """A CA made at start-up and one certificate per host (SAN = the host), signed by it, cached."""

    def __init__(self) -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        self._x509, self._hashes, self._ec = x509, hashes, ec
        self._NameOID, self._EKU = NameOID, ExtendedKeyUsageOID
        self._dir = tempfile.TemporaryDirectory(prefix="virtual-web-tls-")
        self._contexts: dict[str, ssl.SSLContext] = {}
        now = datetime.datetime.now(datetime.timezone.utc)
        self._not_before = now - datetime.timedelta(days=1)
        self._ca_key = ec.generate_private_key(ec.SECP256R1())
        self._leaf_key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "enrich-crawl virtual web CA")])
        self._ca_name = name
        self._ca_cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self._ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(self._not_before)
            .not_valid_after(now + datetime.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(self._ca_key.public_key()), critical=False
            )
            .sign(self._ca_key, hashes.SHA256())
        )
        self.ca_pem = self._ca_cert.public_bytes(serialization.Encoding.PEM)
        self._key_file = Path(self._dir.name) / "leaf.key"
        self._key_file.write_bytes(
            self._leaf_key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        self._pem = serialization.Encoding.PEM

    def context(self, host: str) -> ssl.SSLContext:
        ctx = self._contexts.get(host)
        if ctx is not None:
            return ctx
        x509, NameOID = self._x509, self._NameOID
        try:
            san: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
        except ValueError:
            san = x509.DNSName(host)
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host[:64])])
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self._ca_name)
            .public_key(self._leaf_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(self._not_before)
            .not_valid_after(self._not_before + datetime.timedelta(days=365))
            .add_extension(x509.SubjectAlternativeName([san]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([self._EKU.SERVER_AUTH]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._ca_key.public_key()),
                critical=False,
            )
            .sign(self._ca_key, self._hashes.SHA256())
        )
        cert_file = Path(self._dir.name) / f"{hashlib.sha1(host.encode()).hexdigest()}.pem"
        cert_file.write_bytes(cert.public_bytes(self._pem) + self.ca_pem)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert_file, self._key_file)
        ctx.set_alpn_protocols(["http/1.1"])
        self._contexts[host] = ctx
        return ctx

    def cleanup(self) -> None:
        self._dir.cleanup()


async def _start_tls(writer: asyncio.StreamWriter, ctx: ssl.SSLContext) -> None:
    if hasattr(writer, "start_tls"):  # Python 3.11+
        await writer.start_tls(ctx, ssl_handshake_timeout=15)
        return
    # Python 3.10: the same steps as StreamWriter.start_tls of 3.11.
    loop = asyncio.get_running_loop()
    protocol = writer.transport.get_protocol()
    await writer.drain()
    transport = await loop.start_tls(
        writer.transport, protocol, ctx, server_side=True, ssl_handshake_timeout=15
    )
    writer._transport = transport  # type: ignore[attr-defined]
    protocol._transport = transport  # type: ignore[attr-defined]
    protocol._over_ssl = True  # type: ignore[attr-defined]


# --------------------------------------------------------------------------------------------------
# the server


@dataclass
class _Conn:
    id: int
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    tls: bool = False
    tunnel_host: str | None = None


@dataclass
class _Request:
    t: float
    method: str
    target: str
    version: str
    headers: dict[str, str]
    keep_alive: bool
    host: str | None = None
    path: str = ""
    proxy: bool = False
    tls: bool = False
    start: float = field(default_factory=time.monotonic)


class _Reject(Exception):
    """A request that cannot be parsed: answer ``status`` and close the connection."""

    def __init__(self, status: int, message: str, t: float | None = None, target: str = ""):
        super().__init__(message)
        self.status, self.message, self.t, self.target = status, message, t, target


def _reason(status: int) -> str:
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


_date_cache: tuple[int, str] = (0, "")


def _http_date() -> str:
    global _date_cache
    now = int(time.time())
    if _date_cache[0] != now:
        _date_cache = (now, email.utils.formatdate(now, usegmt=True))
    return _date_cache[1]


def normalize_host(value: str) -> str | None:
    """``Host.Example:80`` -> ``host.example``; ``[::1]:443`` -> ``::1``; None when unusable."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        value = value[1:end]
    elif value.count(":") == 1:
        value = value.split(":", 1)[0]
    value = value.rstrip(".")
    if not value or ".." in value or value.startswith(".") or not _HOST_OK.match(value):
        return None
    return value


def _etag_matches(header: str, etag: str) -> bool:
    for tag in header.split(","):
        tag = tag.strip()
        if tag == "*":
            return True
        tag = tag.removeprefix("W/").strip('"')
        if tag.removesuffix("-gz") == etag:
            return True
    return False


def _accepts_gzip(header: str) -> bool:
    for part in header.lower().split(","):
        coding, _, params = part.strip().partition(";")
        if coding.strip() in ("gzip", "x-gzip", "*"):
            q = params.strip()
            if q.startswith("q="):
                try:
                    return float(q[2:]) > 0
                except ValueError:
                    return False
            return True
    return False


class VirtualWeb:
    """The virtual web server (run it in an asyncio event loop; see the module docstring).

    ``root``: folder of host folders. ``seed``: latency seed (default: ``ROOT/_web.json`` ``"seed"``,
    else 0). ``log_path``: request log (JSON lines), None for no log. ``cache_bytes``: bound of the
    in-memory file cache. ``idle_timeout``: close keep-alive connections idle that long (seconds).
    """

    def __init__(
        self,
        root: str | os.PathLike,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        log_path: str | os.PathLike | None = None,
        seed: int | None = None,
        cache_bytes: int = 256 * 1024 * 1024,
        idle_timeout: float = 120.0,
        header_timeout: float = 30.0,
    ):
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise FileNotFoundError(f"virtual web root is not a directory: {self.root}")
        self.host = host
        self.port = port
        self.log_path = Path(log_path) if log_path is not None else None
        self.idle_timeout = idle_timeout
        self.header_timeout = header_timeout
        self._configs = _Configs(self.root)
        self.seed = seed if seed is not None else self._configs.seed()
        self._cache = _ContentCache(cache_bytes)
        self._rngs: dict[str, random.Random] = {}
        self._fail_counts: dict[tuple[str, str], int] = {}
        self._bombs: dict[int, bytes] = {}
        self._conn_ids = itertools.count(1)
        self._tasks: set[asyncio.Task] = set()
        self._server: asyncio.base_events.Server | None = None
        self._log_file = None
        self._tls: _TLS | None = None

    # -- life cycle ---------------------------------------------------------------------------------

    @property
    def proxy_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def ca_pem(self) -> bytes:
        """PEM of the CA that signs the per-host certificates (for clients that verify)."""
        return self._tls_state().ca_pem

    def _tls_state(self) -> _TLS:
        if self._tls is None:
            self._tls = _TLS()
        return self._tls

    async def start(self) -> int:
        """Listen; returns the port."""
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log_file = open(self.log_path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115
        self._tls_state()
        self._server = await asyncio.start_server(
            self._on_client, self.host, self.port, limit=LINE_LIMIT, backlog=1024
        )
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("virtual web on %s serving %s", self.proxy_url, self.root)
        return self.port

    async def close(self) -> None:
        """Stop listening, drop every connection, close the log."""
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)
            self._server = None
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        if self._tls is not None:
            self._tls.cleanup()
            self._tls = None

    async def __aenter__(self) -> VirtualWeb:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- connections --------------------------------------------------------------------------------

    async def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        conn = _Conn(next(self._conn_ids), reader, writer)
        try:
            await self._serve_connection(conn)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.TimeoutError, OSError):
            pass
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("connection %d failed", conn.id)
        finally:
            if task is not None:
                self._tasks.discard(task)
            with contextlib.suppress(Exception):
                if conn.writer.transport.is_closing():
                    conn.writer.transport.abort()
                else:
                    conn.writer.close()

    async def _serve_connection(self, conn: _Conn) -> None:
        while True:
            try:
                req = await self._read_request(conn)
                if req is None or not await self._dispatch(conn, req):
                    return
            except _Reject as rej:
                await self._reject(conn, rej)
                return

    async def _readline(self, reader: asyncio.StreamReader, timeout: float) -> bytes:
        return await asyncio.wait_for(reader.readuntil(b"\n"), timeout)

    async def _read_request(self, conn: _Conn) -> _Request | None:
        reader = conn.reader
        for _ in range(16):  # tolerate a few empty lines between requests (RFC 9112 2.2)
            try:
                line = await self._readline(reader, self.idle_timeout)
            except (asyncio.IncompleteReadError, TimeoutError, asyncio.TimeoutError):
                return None
            except asyncio.LimitOverrunError:
                raise _Reject(414, "request line too long", time.time()) from None
            if line.strip():
                break
        else:
            raise _Reject(400, "no request line", time.time())
        t = time.time()
        parts = line.rstrip(b"\r\n").split(b" ")
        target_text = parts[1].decode("latin-1") if len(parts) > 1 else ""
        if len(parts) != 3 or not _TOKEN.match(parts[0]) or not parts[1]:
            raise _Reject(400, "malformed request line", t, target_text)
        method, target, version = (p.decode("latin-1") for p in parts)
        if not version.startswith("HTTP/1."):
            code = 505 if version.startswith("HTTP/") else 400
            raise _Reject(code, "only HTTP/1.x is served", t, target)
        headers: dict[str, str] = {}
        total, count, last = 0, 0, None
        deadline = time.monotonic() + self.header_timeout
        while True:
            try:
                raw = await self._readline(reader, max(deadline - time.monotonic(), 0.001))
            except (asyncio.IncompleteReadError, TimeoutError, asyncio.TimeoutError):
                return None
            except asyncio.LimitOverrunError:
                raise _Reject(431, "header line too long", t, target) from None
            total += len(raw)
            count += 1
            if total > MAX_HEADER_BYTES or count > MAX_HEADERS:
                raise _Reject(431, "request headers too large", t, target)
            raw = raw.rstrip(b"\r\n")
            if not raw:
                break
            if raw[:1] in (b" ", b"\t"):  # obsolete line folding
                if last is None:
                    raise _Reject(400, "malformed header", t, target)
                headers[last] += " " + raw.strip().decode("latin-1")
                continue
            name, sep, value = raw.partition(b":")
            if not sep or not _TOKEN.match(name):
                raise _Reject(400, "malformed header", t, target)
            key = name.decode("latin-1").lower()
            text = value.strip().decode("latin-1")
            headers[key] = f"{headers[key]}, {text}" if key in headers else text
            last = key
        tokens = {
            tok.strip().lower()
            for tok in f"{headers.get('connection', '')},{headers.get('proxy-connection', '')}".split(
                ","
            )
        }
        keep = "keep-alive" in tokens if version == "HTTP/1.0" else "close" not in tokens
        return _Request(
            t=t, method=method, target=target, version=version, headers=headers, keep_alive=keep
        )

    async def _discard_body(self, conn: _Conn, req: _Request) -> None:
        """Drop a request body; the connection is closed after the answer when it cannot be read."""
        if "transfer-encoding" in req.headers:
            req.keep_alive = False
            return
        length = req.headers.get("content-length")
        if not length:
            return
        try:
            size = int(length)
        except ValueError:
            raise _Reject(400, "bad Content-Length", req.t, req.target) from None
        if size < 0:
            raise _Reject(400, "bad Content-Length", req.t, req.target)
        if size > MAX_DISCARDED_BODY:
            req.keep_alive = False
            return
        await asyncio.wait_for(conn.reader.readexactly(size), self.header_timeout)

    async def _reject(self, conn: _Conn, rej: _Reject) -> None:
        req = _Request(
            t=rej.t or time.time(),
            method="",
            target=rej.target,
            version="HTTP/1.1",
            headers={},
            keep_alive=False,
            host=conn.tunnel_host,
            path=rej.target,
            tls=conn.tls,
        )
        await self._send_text(conn, req, rej.status, rej.message)

    # -- dispatch -----------------------------------------------------------------------------------

    async def _dispatch(self, conn: _Conn, req: _Request) -> bool:
        """Answer one request; False when the connection must end."""
        req.tls = conn.tls
        if req.method == "CONNECT":
            return await self._connect(conn, req)
        target = req.target
        if conn.tunnel_host is not None:
            req.host, req.proxy = conn.tunnel_host, True
            if not target.startswith("/"):
                parts = urlsplit(target)
                target = (parts.path or "/") + (f"?{parts.query}" if "?" in target else "")
        elif target.startswith("/"):
            host_header = req.headers.get("host")
            if host_header is None:
                raise _Reject(400, "missing Host header", req.t, target)
            req.host = normalize_host(host_header)
        elif "://" in target:
            parts = urlsplit(target)
            req.proxy = True
            req.host = normalize_host(parts.netloc.rpartition("@")[2])
            target = (parts.path or "/") + (f"?{parts.query}" if "?" in target else "")
        else:
            req.path = target
            await self._send_text(conn, req, 400, "unsupported request target")
            return False
        req.path = target
        if req.host is None:
            req.keep_alive = False
            await self._send_text(conn, req, 400, "invalid host")
            return False
        if req.method not in ("GET", "HEAD"):
            req.keep_alive = False  # the request body is not read
        else:
            await self._discard_body(conn, req)
        cfg = self._configs.host(req.host)
        if cfg is None:
            await self._send_text(
                conn, req, 502, f"unknown host {req.host} (dns)", [("X-Proxy-Error", "dns")]
            )
            return req.keep_alive
        if req.method not in ("GET", "HEAD"):
            await self._send_text(conn, req, 405, "method not allowed", [("Allow", "GET, HEAD")])
            return False
        return await self._serve(conn, req, cfg)

    async def _connect(self, conn: _Conn, req: _Request) -> bool:
        req.path = req.target
        req.proxy = True
        host = normalize_host(req.target) if conn.tunnel_host is None else None
        req.host = host
        req.keep_alive = False
        if host is None:
            await self._send_text(conn, req, 400, "invalid CONNECT target")
            return False
        cfg = self._configs.host(host)
        if cfg is None:
            await self._send_text(
                conn, req, 502, f"unknown host {host} (dns)", [("X-Proxy-Error", "dns")]
            )
            return False
        if cfg.unreachable:
            self._log(conn, req, 0, 0, note="unreachable")
            self._reset(conn)
            return False
        self._log(conn, req, 200, 0)
        conn.writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await conn.writer.drain()
        ctx = self._tls_state().context(host)
        await _start_tls(conn.writer, ctx)
        conn.tls, conn.tunnel_host = True, host
        return True

    async def _serve(self, conn: _Conn, req: _Request, cfg: HostConfig) -> bool:
        path = req.path
        if cfg.unreachable or any(r.search(path) for r in cfg.close):
            self._log(conn, req, 0, 0, note="unreachable" if cfg.unreachable else "close")
            self._reset(conn)
            return False
        if any(r.search(path) for r in cfg.hang):
            self._log(conn, req, 0, 0, note="hang")
            await self._hang(conn)
            return False
        delay = cfg.draw_latency(self._rng(req.host))
        if delay > 0:
            await asyncio.sleep(delay)
        slow = _first(cfg.slow, path)
        rate = slow[1] if slow else None

        hit = _first([(r, (c, t)) for r, c, t in cfg.redirects], path)
        if hit:
            match, (code, to) = hit
            try:
                location = match.expand(to)
            except (re.error, IndexError):
                location = to
            body = f"redirecting to {location}\n".encode()
            headers = [("Location", location), ("Content-Type", "text/plain; charset=utf-8")]
            return await self._send(conn, req, code, headers, body, cfg=cfg, rate=rate)

        hit = _first(cfg.fail_first, path)
        if hit:
            key = (req.host, path)
            seen = self._fail_counts.get(key, 0)
            if seen < hit[1]:
                self._fail_counts[key] = seen + 1
                return await self._send_text(
                    conn, req, 503, "failing on purpose", cfg=cfg, rate=rate
                )

        raw_path, sep, query = path.partition("?")
        decoded = unquote(raw_path)
        hit = _first(cfg.status, path)
        if hit:
            code = hit[1]
            found = self._resolve(req.host, raw_path, query if sep else None)
            if found[0] == "file":
                return await self._send_file(conn, req, cfg, code, found, decoded, rate)
            return await self._send_text(conn, req, code, _reason(code), cfg=cfg, rate=rate)

        hit = _first(cfg.bomb, path)
        if hit:
            body = await self._bomb(hit[1])
            ctype = cfg.content_type_for(decoded, path) or guess_content_type(decoded, b"<")
            headers = [("Content-Type", ctype), ("Content-Encoding", "gzip")]
            return await self._send(conn, req, 200, headers, body, cfg=cfg, rate=rate)

        hit = _first(cfg.huge, path)
        if hit:
            size = hit[1]
            ctype = cfg.content_type_for(decoded, path) or guess_content_type(decoded, b"<")
            return await self._send(
                conn,
                req,
                200,
                [("Content-Type", ctype)],
                None,
                cfg=cfg,
                rate=rate,
                length=size,
                chunks=_generated(size),
            )

        found = self._resolve(req.host, raw_path, query if sep else None)
        if found[0] == "file":
            return await self._send_file(conn, req, cfg, 200, found, decoded, rate)
        if found[0] == "dir":
            location = raw_path + "/" + (f"?{query}" if sep else "")
            headers = [("Location", location), ("Content-Type", "text/plain; charset=utf-8")]
            body = f"moved to {location}\n".encode()
            return await self._send(conn, req, 301, headers, body, cfg=cfg, rate=rate)
        not_found = self._resolve(req.host, "/404.html", None)
        if not_found[0] == "file":
            return await self._send_file(conn, req, cfg, 404, not_found, decoded, rate)
        return await self._send_text(conn, req, 404, "Not Found", cfg=cfg, rate=rate)

    def _rng(self, host: str) -> random.Random:
        rng = self._rngs.get(host)
        if rng is None:
            rng = self._rngs[host] = random.Random(f"{self.seed}/{host}")
        return rng

    async def _bomb(self, size: int) -> bytes:
        body = self._bombs.get(size)
        if body is None:
            if size > 64 * 1024 * 1024:
                loop = asyncio.get_running_loop()
                body = await loop.run_in_executor(None, _bomb_body, size)
            else:
                body = _bomb_body(size)
            self._bombs[size] = body
        return body

    def _resolve(self, host: str, raw_path: str, query: str | None) -> tuple:
        """("file", fs_path, stat, served_name) | ("dir",) | ("missing",)."""
        decoded = unquote(raw_path)
        if "\x00" in decoded:
            return ("missing",)
        segments: list[str] = []
        for seg in decoded.split("/"):
            if seg in ("", "."):
                continue
            if seg == "..":
                if segments:
                    segments.pop()
                continue
            segments.append(seg)
        rel = "/".join(segments)
        as_dir = decoded.endswith("/") or not segments
        name = f"{rel}/index.html" if as_dir and rel else ("index.html" if as_dir else rel)
        if posixpath.basename(name).startswith("_"):
            return ("missing",)
        host_dir = os.path.join(self.root, host)
        if query is not None:
            candidate = os.path.normpath(os.path.join(host_dir, f"{name}?{query}"))
            if candidate.startswith(host_dir + os.sep):
                st = _stat(candidate)
                if st is not None and stat.S_ISREG(st.st_mode):
                    return ("file", candidate, st, name)
        full = os.path.join(host_dir, name)
        st = _stat(full)
        if st is not None:
            if stat.S_ISREG(st.st_mode):
                return ("file", full, st, name)
            if stat.S_ISDIR(st.st_mode) and not as_dir:
                return ("dir",)
        if not as_dir:
            st = _stat(full + ".html")
            if st is not None and stat.S_ISREG(st.st_mode):
                return ("file", full + ".html", st, name + ".html")
        return ("missing",)

    async def _send_file(
        self,
        conn: _Conn,
        req: _Request,
        cfg: HostConfig,
        status: int,
        found: tuple,
        decoded: str,
        rate: float | None,
    ) -> bool:
        _, fs_path, st, served = found
        try:
            entry = self._cache.get(fs_path, st)
        except OSError:
            return await self._send_text(conn, req, 404, "Not Found", cfg=cfg, rate=rate)
        ctype = cfg.content_type_for(decoded, req.path) or guess_content_type(served, entry.data)
        etag = entry.etag
        body = entry.data
        headers = [("Content-Type", ctype), ("Last-Modified", entry.last_modified)]
        gz = cfg.gzip and _compressible(ctype)
        if gz:
            headers.append(("Vary", "Accept-Encoding"))
            if _accepts_gzip(req.headers.get("accept-encoding", "")):
                body = self._cache.gzipped(fs_path, entry)
                etag += "-gz"
                headers.append(("Content-Encoding", "gzip"))
        headers.append(("ETag", f'"{etag}"'))
        if status == 200 and self._not_modified(req, entry):
            return await self._send(conn, req, 304, headers, b"", cfg=cfg)
        return await self._send(conn, req, status, headers, body, cfg=cfg, rate=rate)

    @staticmethod
    def _not_modified(req: _Request, entry: _Entry) -> bool:
        inm = req.headers.get("if-none-match")
        if inm is not None:
            return _etag_matches(inm, entry.etag)
        ims = req.headers.get("if-modified-since")
        if ims:
            try:
                since = email.utils.parsedate_to_datetime(ims)
            except (TypeError, ValueError, IndexError):
                return False
            if since.tzinfo is None:
                since = since.replace(tzinfo=datetime.timezone.utc)
            return int(entry.mtime) <= since.timestamp()
        return False

    # -- writing ------------------------------------------------------------------------------------

    async def _send_text(
        self,
        conn: _Conn,
        req: _Request,
        status: int,
        text: str,
        headers: list[tuple[str, str]] | None = None,
        *,
        cfg: HostConfig | None = None,
        rate: float | None = None,
    ) -> bool:
        body = f"{status} {text}\n".encode()
        hdrs = [("Content-Type", "text/plain; charset=utf-8"), *(headers or [])]
        return await self._send(conn, req, status, hdrs, body, cfg=cfg, rate=rate)

    async def _send(
        self,
        conn: _Conn,
        req: _Request,
        status: int,
        headers: list[tuple[str, str]],
        body: bytes | None,
        *,
        cfg: HostConfig | None = None,
        rate: float | None = None,
        length: int | None = None,
        chunks: Iterator[bytes] | AsyncIterator[bytes] | None = None,
    ) -> bool:
        """Write one answer; returns whether the connection stays open."""
        if cfg is not None and cfg.headers:
            names = {name.lower() for name, _ in cfg.headers}
            headers = [h for h in headers if h[0].lower() not in names] + cfg.headers
        no_body = status < 200 or status in (204, 304)
        size = length if length is not None else len(body or b"")
        lines = [
            f"HTTP/1.1 {status} {_reason(status)}",
            f"Date: {_http_date()}",
            f"Server: {SERVER_NAME}",
        ]
        if not no_body:
            lines.append(f"Content-Length: {size}")
        lines.extend(f"{name}: {value}" for name, value in headers)
        if not req.keep_alive:
            lines.append("Connection: close")
        elif req.version == "HTTP/1.0":
            lines.append("Connection: keep-alive")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", "replace")
        writer = conn.writer
        send_body = not no_body and req.method != "HEAD"
        if chunks is None and rate is None:
            payload = (body or b"") if send_body else b""
            self._log(conn, req, status, len(payload))
            writer.write(head + payload)
            await writer.drain()
            return req.keep_alive
        sent = 0
        try:
            writer.write(head)
            await writer.drain()
            if send_body:
                source = chunks if chunks is not None else _one(body or b"")
                async for chunk in _aiter(source):
                    if rate is None:
                        if writer.transport.is_closing():
                            raise ConnectionResetError("client went away")
                        writer.write(chunk)
                        await writer.drain()
                        sent += len(chunk)
                        continue
                    step = max(1, int(rate / 20))
                    for i in range(0, len(chunk), step):
                        if writer.transport.is_closing():
                            raise ConnectionResetError("client went away")
                        piece = chunk[i : i + step]
                        writer.write(piece)
                        await writer.drain()
                        sent += len(piece)
                        await asyncio.sleep(len(piece) / rate)
        finally:
            self._log(conn, req, status, sent)
        return req.keep_alive

    def _log(self, conn: _Conn, req: _Request, status: int, nbytes: int, note: str = "") -> None:
        if self._log_file is None:
            return
        entry: dict[str, Any] = {
            "t": round(req.t, 6),
            "host": req.host,
            "path": req.path,
            "method": req.method,
            "ua": req.headers.get("user-agent", ""),
            "status": status,
            "bytes": nbytes,
            "proxy": req.proxy,
            "conn": conn.id,
            "tls": req.tls,
            "dur": round(time.monotonic() - req.start, 6),
        }
        if note:
            entry["note"] = note
        try:
            self._log_file.write(json.dumps(entry) + "\n")
        except (OSError, ValueError):
            log.exception("cannot write the request log")

    @staticmethod
    def _reset(conn: _Conn) -> None:
        """Drop the connection with a TCP reset (what an unreachable or reset host looks like)."""
        sock = conn.writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError, AttributeError, TypeError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.writer.transport.abort()

    async def _hang(self, conn: _Conn) -> None:
        """Never answer; return when the client gives up (or the server stops)."""
        while await conn.reader.read(CHUNK):
            pass


def _stat(path: str) -> os.stat_result | None:
    try:
        return os.stat(path)
    except (OSError, ValueError):
        return None


async def _one(data: bytes) -> AsyncIterator[bytes]:
    for i in range(0, len(data), CHUNK):
        yield data[i : i + CHUNK]


async def _aiter(source: Iterator[bytes] | AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    if hasattr(source, "__aiter__"):
        async for chunk in source:  # type: ignore[union-attr]
            yield chunk
    else:
        for chunk in source:  # type: ignore[union-attr]
            yield chunk


_HUGE_UNIT = (b"<p>virtual web: a huge body, generated on the fly</p>\n" * 2000)[:CHUNK]


def _generated(size: int) -> Iterator[bytes]:
    while size > 0:
        chunk = _HUGE_UNIT if size >= CHUNK else _HUGE_UNIT[:size]
        size -= len(chunk)
        yield chunk


# --------------------------------------------------------------------------------------------------
# the request log


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


# --------------------------------------------------------------------------------------------------
# running it in a subprocess


@dataclass
class WebHandle:
    """A virtual web running in a subprocess (see :func:`running_web`)."""

    port: int
    proxy_url: str
    log_path: Path
    ca_path: Path
    stderr_path: Path
    process: subprocess.Popen

    @property
    def proxies(self) -> dict[str, str]:
        """For ``requests``: ``requests.get(url, proxies=web.proxies, verify=False)``."""
        return {"http": self.proxy_url, "https": self.proxy_url}

    def proxy_env(self) -> dict[str, str]:
        """Environment variables that send a child process's HTTP(S) traffic here."""
        return {
            "http_proxy": self.proxy_url,
            "https_proxy": self.proxy_url,
            "HTTP_PROXY": self.proxy_url,
            "HTTPS_PROXY": self.proxy_url,
        }

    def read_log(self) -> list[dict]:
        return read_log(self.log_path)

    def server_log(self) -> str:
        """What the server wrote on stderr (config warnings, errors)."""
        try:
            return self.stderr_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM the server's process group, SIGKILL it if it lingers. Idempotent."""
        proc = self.process
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout)


def _accepts_connections(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


@contextlib.contextmanager
def running_web(
    root: str | os.PathLike,
    *,
    log_path: str | os.PathLike | None = None,
    seed: int | None = None,
    port: int = 0,
    env: dict[str, str] | None = None,
    startup_timeout: float = 20.0,
    idle_timeout: float | None = None,
) -> Iterator[WebHandle]:
    """Run ``python -m enrich_crawl.virtualweb ROOT`` in its own session until the block ends.

    ``log_path``: request log (default: a temporary file, removed on exit). ``seed``: latency seed
    (default: ``ROOT/_web.json`` ``"seed"``, else 0). ``env``: extra environment for the server.
    ``idle_timeout``: seconds after which the server closes an idle keep-alive connection (default
    120; real servers often close after 5). The server also exits by itself if this process dies.
    """
    tmp = Path(tempfile.mkdtemp(prefix="virtual-web-"))
    log_file = Path(log_path) if log_path is not None else tmp / "requests.jsonl"
    port_file, ca_file, stderr_path = tmp / "port", tmp / "ca.pem", tmp / "server.log"
    cmd = [
        sys.executable,
        "-m",
        "enrich_crawl.virtualweb",
        str(root),
        "--port",
        str(port),
        "--port-file",
        str(port_file),
        "--log",
        str(log_file),
        "--ca-file",
        str(ca_file),
        "--exit-with-parent",
    ]
    if seed is not None:
        cmd += ["--seed", str(seed)]
    if idle_timeout is not None:
        cmd += ["--idle-timeout", str(idle_timeout)]
    child_env = dict(os.environ)
    child_env.update(env or {})
    package_parent = str(Path(__file__).resolve().parents[2])
    child_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (package_parent, child_env.get("PYTHONPATH", "")) if p
    )
    proc = None
    try:
        with open(stderr_path, "wb") as err:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                env=child_env,
                start_new_session=True,
            )
        deadline = time.monotonic() + startup_timeout
        bound = 0
        while True:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"virtual web exited with {proc.returncode}: "
                    f"{stderr_path.read_text(errors='replace')[-2000:]}"
                )
            if not bound and port_file.exists():
                with contextlib.suppress(ValueError):
                    bound = int(port_file.read_text().strip())
            if bound and _accepts_connections(bound):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"virtual web did not start within {startup_timeout} s")
            time.sleep(0.02)
        handle = WebHandle(
            port=bound,
            proxy_url=f"http://127.0.0.1:{bound}",
            log_path=log_file,
            ca_path=ca_file,
            stderr_path=stderr_path,
            process=proc,
        )
        yield handle
    finally:
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        shutil.rmtree(tmp, ignore_errors=True)


# --------------------------------------------------------------------------------------------------
# command line


async def _serve_cli(args: argparse.Namespace) -> None:
    web = VirtualWeb(
        args.root,
        host=args.host,
        port=args.port,
        log_path=args.log,
        seed=args.seed,
        idle_timeout=args.idle_timeout,
    )
    await web.start()
    if args.ca_file:
        Path(args.ca_file).write_bytes(web.ca_pem)
    if args.port_file:
        tmp = Path(f"{args.port_file}.tmp")
        tmp.write_text(str(web.port))
        os.replace(tmp, args.port_file)
    print(f"listening on http://{args.host}:{web.port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    watcher = None
    if args.exit_with_parent:
        parent = os.getppid()

        async def watch() -> None:
            while os.getppid() == parent:
                await asyncio.sleep(0.5)
            log.warning("parent process gone: stopping")
            stop.set()

        watcher = asyncio.ensure_future(watch())
    try:
        await stop.wait()
    finally:
        if watcher is not None:
            watcher.cancel()
        await web.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m enrich_crawl.virtualweb",
        description="Serve ROOT/<hostname>/... as a virtual web (HTTP server and forward proxy).",
    )
    parser.add_argument("root", help="folder of host folders")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=0, help="port (0: any free port)")
    parser.add_argument("--log", help="request log file (JSON lines)")
    parser.add_argument("--port-file", help="write the port to this file once listening")
    parser.add_argument("--seed", type=int, default=None, help="latency seed")
    parser.add_argument("--ca-file", help="write the CA certificate (PEM) to this file")
    parser.add_argument(
        "--idle-timeout",
        type=float,
        default=120.0,
        help="close keep-alive connections idle this long, in seconds (Apache's default: 5)",
    )
    parser.add_argument(
        "--exit-with-parent", action="store_true", help="stop when the parent process dies"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log more on stderr")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        import uvloop
    except ImportError:
        asyncio.run(_serve_cli(args))
    else:
        uvloop.run(_serve_cli(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
