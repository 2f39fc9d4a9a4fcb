"""HTTP/1.1 as the virtual web speaks it: a connection, a request read from it (RFC 9112, with the
limits that keep a hostile client from exhausting the server) and the header values it interprets.
"""

from __future__ import annotations

import asyncio
import email.utils
import http
import re
import time
from dataclasses import dataclass, field

LINE_LIMIT = 64 * 1024  # longest request or header line
MAX_HEADER_BYTES = 64 * 1024  # all header lines together
MAX_HEADERS = 200
MAX_DISCARDED_BODY = 1024 * 1024  # request bodies up to this size are read and dropped

TOKEN = re.compile(rb"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_HOST_OK = re.compile(r"^[a-z0-9_.:-]+$")


@dataclass
class Conn:
    id: int
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    tls: bool = False
    tunnel_host: str | None = None


@dataclass
class Request:
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


class Reject(Exception):
    """A request that cannot be parsed: answer ``status`` and close the connection."""

    def __init__(self, status: int, message: str, t: float | None = None, target: str = ""):
        super().__init__(message)
        self.status, self.message, self.t, self.target = status, message, t, target


def reason_phrase(status: int) -> str:
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


_date_cache: tuple[int, str] = (0, "")


def http_date() -> str:
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


def etag_matches(header: str, etag: str) -> bool:
    for tag in header.split(","):
        tag = tag.strip()
        if tag == "*":
            return True
        tag = tag.removeprefix("W/").strip('"')
        if tag.removesuffix("-gz") == etag:
            return True
    return False


def accepts_gzip(header: str) -> bool:
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


async def _readline(reader: asyncio.StreamReader, timeout: float) -> bytes:
    return await asyncio.wait_for(reader.readuntil(b"\n"), timeout)


async def read_request(
    reader: asyncio.StreamReader, *, idle_timeout: float, header_timeout: float
) -> Request | None:
    """The next request of a connection, None when the client is gone or idle for
    `idle_timeout`; the header lines must all come within `header_timeout`. Raises Reject."""
    for _ in range(16):  # tolerate a few empty lines between requests (RFC 9112 2.2)
        try:
            line = await _readline(reader, idle_timeout)
        except (asyncio.IncompleteReadError, TimeoutError, asyncio.TimeoutError):
            return None
        except asyncio.LimitOverrunError:
            raise Reject(414, "request line too long", time.time()) from None
        if line.strip():
            break
    else:
        raise Reject(400, "no request line", time.time())
    t = time.time()
    parts = line.rstrip(b"\r\n").split(b" ")
    target_text = parts[1].decode("latin-1") if len(parts) > 1 else ""
    if len(parts) != 3 or not TOKEN.match(parts[0]) or not parts[1]:
        raise Reject(400, "malformed request line", t, target_text)
    method, target, version = (p.decode("latin-1") for p in parts)
    if not version.startswith("HTTP/1."):
        code = 505 if version.startswith("HTTP/") else 400
        raise Reject(code, "only HTTP/1.x is served", t, target)
    headers: dict[str, str] = {}
    total, count, last = 0, 0, None
    deadline = time.monotonic() + header_timeout
    while True:
        try:
            raw = await _readline(reader, max(deadline - time.monotonic(), 0.001))
        except (asyncio.IncompleteReadError, TimeoutError, asyncio.TimeoutError):
            return None
        except asyncio.LimitOverrunError:
            raise Reject(431, "header line too long", t, target) from None
        total += len(raw)
        count += 1
        if total > MAX_HEADER_BYTES or count > MAX_HEADERS:
            raise Reject(431, "request headers too large", t, target)
        raw = raw.rstrip(b"\r\n")
        if not raw:
            break
        if raw[:1] in (b" ", b"\t"):  # obsolete line folding
            if last is None:
                raise Reject(400, "malformed header", t, target)
            headers[last] += " " + raw.strip().decode("latin-1")
            continue
        name, sep, value = raw.partition(b":")
        if not sep or not TOKEN.match(name):
            raise Reject(400, "malformed header", t, target)
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
    return Request(
        t=t, method=method, target=target, version=version, headers=headers, keep_alive=keep
    )


async def discard_body(reader: asyncio.StreamReader, req: Request, timeout: float) -> None:
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
        raise Reject(400, "bad Content-Length", req.t, req.target) from None
    if size < 0:
        raise Reject(400, "bad Content-Length", req.t, req.target)
    if size > MAX_DISCARDED_BODY:
        req.keep_alive = False
        return
    await asyncio.wait_for(reader.readexactly(size), timeout)
