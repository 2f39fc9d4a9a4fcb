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

How a path maps to a file: enrich_crawl.virtualweb.content; the per-host behaviours (``_web.json``):
enrich_crawl.virtualweb.config; the request log: enrich_crawl.virtualweb.requestlog.

In-process (the caller owns the event loop)::

    async with VirtualWeb(root, log_path=...) as web:
        ...  # web.port, web.proxy_url

In a subprocess: enrich_crawl.virtualweb.running_web.

Limitations: HTTP/1.1 only (ALPN offers ``http/1.1``), GET and HEAD only (others 405), request bodies
are discarded, no chunked responses (every body has a Content-Length; 204/304 have none), no
``Range``. Responses are not cached by the proxy: every request reaches the "site".
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import email.utils
import itertools
import json
import logging
import os
import random
import re
import socket
import struct
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from enrich_crawl.virtualweb.config import HostConfig, HostConfigs, first_match
from enrich_crawl.virtualweb.content import (
    CHUNK,
    ContentCache,
    FileEntry,
    bomb_body,
    compressible,
    generated_body,
    guess_content_type,
    resolve_file,
)
from enrich_crawl.virtualweb.http1 import (
    LINE_LIMIT,
    Conn,
    Reject,
    Request,
    accepts_gzip,
    discard_body,
    etag_matches,
    http_date,
    normalize_host,
    read_request,
    reason_phrase,
)
from enrich_crawl.virtualweb.tls import CertificateAuthority, start_tls

__all__ = ["VirtualWeb"]

log = logging.getLogger("enrich_crawl.virtualweb")

SERVER_NAME = "enrich-crawl-virtual-web"


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
        self._configs = HostConfigs(self.root)
        self.seed = seed if seed is not None else self._configs.seed()
        self._cache = ContentCache(cache_bytes)
        self._rngs: dict[str, random.Random] = {}
        self._fail_counts: dict[tuple[str, str], int] = {}
        self._bombs: dict[int, bytes] = {}
        self._conn_ids = itertools.count(1)
        self._tasks: set[asyncio.Task] = set()
        self._server: asyncio.base_events.Server | None = None
        self._log_file = None
        self._tls: CertificateAuthority | None = None

    # -- life cycle ---------------------------------------------------------------------------------

    @property
    def proxy_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def ca_pem(self) -> bytes:
        """PEM of the CA that signs the per-host certificates (for clients that verify)."""
        return self._tls_state().ca_pem

    def _tls_state(self) -> CertificateAuthority:
        if self._tls is None:
            self._tls = CertificateAuthority()
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
        conn = Conn(next(self._conn_ids), reader, writer)
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

    async def _serve_connection(self, conn: Conn) -> None:
        while True:
            try:
                req = await read_request(
                    conn.reader, idle_timeout=self.idle_timeout, header_timeout=self.header_timeout
                )
                if req is None or not await self._dispatch(conn, req):
                    return
            except Reject as rej:
                await self._reject(conn, rej)
                return

    async def _reject(self, conn: Conn, rej: Reject) -> None:
        req = Request(
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

    async def _dispatch(self, conn: Conn, req: Request) -> bool:
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
                raise Reject(400, "missing Host header", req.t, target)
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
            await discard_body(conn.reader, req, self.header_timeout)
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

    async def _connect(self, conn: Conn, req: Request) -> bool:
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
        await start_tls(conn.writer, ctx)
        conn.tls, conn.tunnel_host = True, host
        return True

    async def _serve(self, conn: Conn, req: Request, cfg: HostConfig) -> bool:
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
        slow = first_match(cfg.slow, path)
        rate = slow[1] if slow else None

        hit = first_match([(r, (c, t)) for r, c, t in cfg.redirects], path)
        if hit:
            match, (code, to) = hit
            try:
                location = match.expand(to)
            except (re.error, IndexError):
                location = to
            body = f"redirecting to {location}\n".encode()
            headers = [("Location", location), ("Content-Type", "text/plain; charset=utf-8")]
            return await self._send(conn, req, code, headers, body, cfg=cfg, rate=rate)

        hit = first_match(cfg.fail_first, path)
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
        hit = first_match(cfg.status, path)
        if hit:
            code = hit[1]
            found = resolve_file(self.root, req.host, raw_path, query if sep else None)
            if found[0] == "file":
                return await self._send_file(conn, req, cfg, code, found, decoded, rate)
            return await self._send_text(conn, req, code, reason_phrase(code), cfg=cfg, rate=rate)

        hit = first_match(cfg.bomb, path)
        if hit:
            body = await self._bomb(hit[1])
            ctype = cfg.content_type_for(decoded, path) or guess_content_type(decoded, b"<")
            headers = [("Content-Type", ctype), ("Content-Encoding", "gzip")]
            return await self._send(conn, req, 200, headers, body, cfg=cfg, rate=rate)

        hit = first_match(cfg.huge, path)
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
                chunks=generated_body(size),
            )

        found = resolve_file(self.root, req.host, raw_path, query if sep else None)
        if found[0] == "file":
            return await self._send_file(conn, req, cfg, 200, found, decoded, rate)
        if found[0] == "dir":
            location = raw_path + "/" + (f"?{query}" if sep else "")
            headers = [("Location", location), ("Content-Type", "text/plain; charset=utf-8")]
            body = f"moved to {location}\n".encode()
            return await self._send(conn, req, 301, headers, body, cfg=cfg, rate=rate)
        not_found = resolve_file(self.root, req.host, "/404.html", None)
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
                body = await loop.run_in_executor(None, bomb_body, size)
            else:
                body = bomb_body(size)
            self._bombs[size] = body
        return body

    async def _send_file(
        self,
        conn: Conn,
        req: Request,
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
        gz = cfg.gzip and compressible(ctype)
        if gz:
            headers.append(("Vary", "Accept-Encoding"))
            if accepts_gzip(req.headers.get("accept-encoding", "")):
                body = self._cache.gzipped(fs_path, entry)
                etag += "-gz"
                headers.append(("Content-Encoding", "gzip"))
        headers.append(("ETag", f'"{etag}"'))
        if status == 200 and self._not_modified(req, entry):
            return await self._send(conn, req, 304, headers, b"", cfg=cfg)
        return await self._send(conn, req, status, headers, body, cfg=cfg, rate=rate)

    @staticmethod
    def _not_modified(req: Request, entry: FileEntry) -> bool:
        inm = req.headers.get("if-none-match")
        if inm is not None:
            return etag_matches(inm, entry.etag)
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
        conn: Conn,
        req: Request,
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
        conn: Conn,
        req: Request,
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
            f"HTTP/1.1 {status} {reason_phrase(status)}",
            f"Date: {http_date()}",
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

    def _log(self, conn: Conn, req: Request, status: int, nbytes: int, note: str = "") -> None:
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
    def _reset(conn: Conn) -> None:
        """Drop the connection with a TCP reset (what an unreachable or reset host looks like)."""
        sock = conn.writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError, AttributeError, TypeError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.writer.transport.abort()

    async def _hang(self, conn: Conn) -> None:
        """Never answer; return when the client gives up (or the server stops)."""
        while await conn.reader.read(CHUNK):
            pass


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
