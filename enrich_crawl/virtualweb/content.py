"""What the virtual web sends: the file that answers a path, file contents cached in memory, content
types, and the generated bodies of the ``bomb`` and ``huge`` behaviours.

Paths map to files: ``/`` and ``.../`` -> ``index.html``; a directory -> 301 to ``path/``; a missing
``path`` falls back to ``path.html``; ``path?query`` is served from a file named exactly
``path?query`` when it exists (percent-encoding of the query as sent), else the query is ignored;
misses are 404 (body from ``404.html`` when present). Files whose name starts with ``_`` (such as the
per-host config ``_web.json``) are never served. Unknown hosts get ``502`` with ``X-Proxy-Error: dns``.
"""

from __future__ import annotations

import email.utils
import gzip as gzip_module
import hashlib
import mimetypes
import os
import posixpath
import stat
import struct
import zlib
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

CHUNK = 64 * 1024

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


def compressible(ctype: str) -> bool:
    ctype = ctype.split(";", 1)[0].strip().lower()
    return (
        ctype.startswith("text/")
        or ctype.endswith(("+json", "+xml", "/json", "/xml", "javascript"))
        or ctype in ("application/jsonl", "image/svg+xml", "application/yaml")
    )


def resolve_file(root: Path, host: str, raw_path: str, query: str | None) -> tuple:
    """The file of `root`/`host` that answers a path (see the module docstring):
    ("file", fs_path, stat, served_name) | ("dir",) | ("missing",)."""
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
    host_dir = os.path.join(root, host)
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


def _stat(path: str) -> os.stat_result | None:
    try:
        return os.stat(path)
    except (OSError, ValueError):
        return None


@dataclass
class FileEntry:
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


class ContentCache:
    """File contents by path, validated by (mtime, size), bounded by bytes (LRU)."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.max_item = max(max_bytes // 8, 1)
        self._items: OrderedDict[str, FileEntry] = OrderedDict()
        self._bytes = 0

    def get(self, path: str, st: os.stat_result) -> FileEntry:
        entry = self._items.get(path)
        if entry is not None and entry.mtime_ns == st.st_mtime_ns and entry.size == st.st_size:
            self._items.move_to_end(path)
            return entry
        with open(path, "rb") as fh:
            data = fh.read()
        entry = FileEntry(
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

    def gzipped(self, path: str, entry: FileEntry) -> bytes:
        """The gzip form of an entry, computed once and counted in the cache's size."""
        if entry.gz is None:
            body = entry.gzipped()
            if self._items.get(path) is entry:
                self._bytes += len(body)
            return body
        return entry.gz


def bomb_body(size: int) -> bytes:
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


_HUGE_UNIT = (b"<p>virtual web: a huge body, generated on the fly</p>\n" * 2000)[:CHUNK]


def generated_body(size: int) -> Iterator[bytes]:
    while size > 0:
        chunk = _HUGE_UNIT if size >= CHUNK else _HUGE_UNIT[:size]
        size -= len(chunk)
        yield chunk
