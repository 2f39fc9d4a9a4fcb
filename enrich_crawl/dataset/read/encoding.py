"""Encodings: the table's text as UTF-8 for Arrow. A file that is UTF-8 throughout (checked first,
ASCII blocks at memory speed) is read as it is; any other is copied to UTF-8 line by line
(`Utf8Stream`): lines that are UTF-8 stay so, the others are decoded with a legacy encoding guessed
from them (cp1252, cp1251, ...), and every such line is counted with its number."""

from __future__ import annotations

import codecs
import io
import os
import re
import shutil
import tempfile
from collections import deque
from pathlib import Path
from typing import Any

from enrich_crawl.dataset.read.batch import SAMPLE, ReadStats

STREAM_BLOCK = 4 << 20


def sniff_encoding(head: bytes) -> tuple[str, int]:
    """(encoding, BOM length) from a byte-order mark or the NUL pattern of UTF-16; else utf-8."""
    for bom, name in (
        (codecs.BOM_UTF32_LE, "utf-32-le"),
        (codecs.BOM_UTF32_BE, "utf-32-be"),
        (codecs.BOM_UTF8, "utf-8"),
        (codecs.BOM_UTF16_LE, "utf-16-le"),
        (codecs.BOM_UTF16_BE, "utf-16-be"),
    ):
        if head.startswith(bom):
            return name, len(bom)
    sample = head[:65536]
    if len(sample) >= 16:
        even, odd = sample[0::2], sample[1::2]
        if odd.count(0) > 0.4 * len(odd) and even.count(0) < 0.05 * len(even):
            return "utf-16-le", 0
        if even.count(0) > 0.4 * len(even) and odd.count(0) < 0.05 * len(odd):
            return "utf-16-be", 0
    return "utf-8", 0


def _ascii_compatible(encoding: str, sample: bytes) -> bool:
    try:
        sample.decode(encoding)
        return "id,a\tb;\r\n".encode(encoding) == b"id,a\tb;\r\n"
    except (UnicodeError, LookupError):
        return False


def guess_legacy_encoding(sample: bytes) -> str:
    """The one legacy encoding that best explains the lines that are not UTF-8: cp1252 (Western
    European) unless the detector is sure of another ASCII-compatible one (Cyrillic, Greek, ...)."""
    from charset_normalizer import from_bytes

    western = _ascii_compatible("cp1252", sample)
    if western and len(sample) < 4096:
        return "cp1252"  # too little text for a detector to beat the most common case
    candidates = [m for m in from_bytes(sample) if _ascii_compatible(m.encoding, sample)]
    if not candidates:
        return "cp1252"
    best = min(candidates, key=lambda m: m.percent_chaos)
    if western and any(
        m.encoding == "cp1252" and m.percent_chaos <= best.percent_chaos for m in candidates
    ):
        return "cp1252"
    return best.encoding


class Utf8Stream(io.RawIOBase):
    """A binary file re-encoded to UTF-8 as it is read, for Arrow's CSV reader.

    `encoding=None` (auto): blocks are checked as UTF-8 and passed through untouched when they are;
    in a block that is not, each line is decoded as UTF-8 or, failing that, with a legacy encoding
    guessed from the failing lines (or `fallback`), and re-encoded. Every such line is counted and
    its number sampled. A named encoding decodes the whole file (errors replaced and reported).
    """

    def __init__(
        self,
        path: Path,
        encoding: str | None = None,
        fallback: str | None = None,
        stats: ReadStats | None = None,
    ):
        super().__init__()
        self._file = open(path, "rb")  # noqa: SIM115 - closed by close()
        self.stats = stats if stats is not None else ReadStats()
        head = self._file.read(65536)
        sniffed, bom = sniff_encoding(head)
        self._file.seek(bom)
        name = codecs.lookup(encoding).name if encoding else codecs.lookup(sniffed).name
        self.encoding = name
        self.stats.encoding = name + ("" if encoding or bom or name != "utf-8" else " (auto)")
        self._auto = not encoding  # auto: UTF-8 lines as UTF-8, the others with a legacy encoding
        self.fallback = fallback
        self.stats.fallback_encoding = fallback
        # ASCII-compatible encodings are handled line by line; UTF-16/32 by a stream decoder
        self._wide = name.startswith(("utf-16", "utf-32"))
        self._decoder = codecs.getincrementaldecoder(name)("replace") if self._wide else None
        self._pending = b""
        self._chunks: deque[bytes] = deque()  # UTF-8 output not yet read
        self._offset = 0  # into the first chunk
        self._size = 0
        self._eof = False
        self._line = 0  # physical lines (\n, \r\n or \r) consumed before the current block
        self._line_at_match = 0  # the line being re-decoded (mixed blocks)

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        self._file.close()
        super().close()

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def read(self, size: int = -1) -> bytes:
        while (size is None or size < 0 or self._size < size) and not self._eof:
            self._fill()
        if size is None or size < 0:
            size = self._size
        parts = []
        while size > 0 and self._chunks:
            head = self._chunks[0]
            available = len(head) - self._offset
            take = min(size, available)
            parts.append(head[self._offset : self._offset + take])
            size -= take
            self._size -= take
            if take == available:
                self._chunks.popleft()
                self._offset = 0
            else:
                self._offset += take
        return b"".join(parts)

    def _put(self, data: bytes) -> None:
        if data:
            self._chunks.append(data)
            self._size += len(data)

    def _fill(self) -> None:
        chunk = self._file.read(STREAM_BLOCK)
        if not chunk:
            self._eof = True
            if self._wide:
                self._put(self._decoder.decode(b"", final=True).encode("utf-8"))
            elif self._pending:
                self._emit(self._pending)
                self._pending = b""
            return
        if self._wide:
            text = self._decoder.decode(chunk)
            if "\ufffd" in text:
                self._note_undecodable(self._line + 1)
            self._line += text.count("\n")
            self._put(text.encode("utf-8"))
            return
        data = self._pending + chunk
        cut = data.rfind(b"\n")
        if cut < 0:
            cut = data.rfind(b"\r")
        if cut < 0:  # no line end yet: wait for more (a single huge line)
            self._pending = data
            return
        self._pending = data[cut + 1 :]
        self._emit(data[: cut + 1])

    def _emit(self, block: bytes) -> None:
        if self.encoding == "utf-8":
            if block.isascii():
                self._put(block)
                self._line += _count_lines(block)
                return
            try:
                block.decode("utf-8")
            except UnicodeDecodeError:
                pass
            else:
                self._put(block)
                self._line += _count_lines(block)
                return
        else:
            try:
                self._put(block.decode(self.encoding).encode("utf-8"))
                self._line += _count_lines(block)
                return
            except UnicodeDecodeError:
                pass
        if self._auto and self.encoding == "utf-8":
            self._emit_mixed(block)
            return
        decoded = []
        for line in block.splitlines(keepends=True):
            self._line += 1
            decoded.append(self._decode_line(line))
        self._put("".join(decoded).encode("utf-8"))

    def _emit_mixed(self, block: bytes) -> None:
        """A block that is not all UTF-8: only the lines that are not are decoded otherwise.
        Undecodable bytes become lone surrogates (surrogateescape), which find those lines."""
        text = block.decode("utf-8", "surrogateescape")
        spans = _lines_with_surrogates(text)
        if self.fallback is None:
            bad = b"".join(text[a:b].encode("utf-8", "surrogateescape") for a, b in spans)
            self.fallback = guess_legacy_encoding(bad[:65536])
            self.stats.fallback_encoding = self.fallback
        # the block's bytes are kept as they are, except those lines (no re-encoding of the rest)
        parts: list[bytes] = []
        done = 0  # in text
        at = 0  # in block
        line = self._line
        for a, b in spans:
            line += _count_text_lines(text, done, a)
            self._line_at_match = line + 1
            raw = text[a:b].encode("utf-8", "surrogateescape")
            start = block.find(raw, at)
            parts.append(block[at:start])
            parts.append(self._decode_line(raw).encode("utf-8"))
            at = start + len(raw)
            done = b
        parts.append(block[at:])
        self._line += _count_lines(block)
        self._put(b"".join(parts))

    def _decode_line(self, line: bytes) -> str:
        if self._auto and self.encoding == "utf-8":
            try:
                return line.decode("utf-8")
            except UnicodeDecodeError:
                pass
            try:
                text = line.decode(self.fallback or "cp1252")
            except UnicodeDecodeError:
                pass
            else:
                self.stats.decoded_lines += 1
                if len(self.stats.decoded_sample) < SAMPLE:
                    self.stats.decoded_sample.append(self._line_at_match)
                return text
        else:
            try:
                return line.decode(self.encoding)
            except UnicodeDecodeError:
                pass
        self._note_undecodable(self._line_at_match if self._auto else self._line)
        return line.decode(self.encoding, "replace")

    def _note_undecodable(self, line: int) -> None:
        self.stats.undecodable_lines += 1
        if len(self.stats.undecodable_sample) < SAMPLE:
            self.stats.undecodable_sample.append(line)


def _is_utf8(path: Path) -> bool:
    """Is the whole file valid UTF-8? (ASCII blocks are skipped at memory speed)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    try:
        with open(path, "rb") as handle:
            while block := handle.read(STREAM_BLOCK):
                if block.isascii() and not decoder.getstate()[0]:
                    continue
                decoder.decode(block)
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        return False
    return True


_SURROGATE = re.compile("[\udc80-\udcff]")  # a byte that is not UTF-8, as surrogateescape has it


def _lines_with_surrogates(text: str) -> list[tuple[int, int]]:
    """(start, end) of each line (without its end) holding a byte that is not UTF-8."""
    spans: list[tuple[int, int]] = []
    for match in _SURROGATE.finditer(text):
        at = match.start()
        if spans and at < spans[-1][1]:
            continue  # the same line
        start = max(text.rfind("\n", 0, at), text.rfind("\r", 0, at)) + 1
        ends = [e for e in (text.find("\n", at), text.find("\r", at)) if e >= 0]
        spans.append((start, min(ends) if ends else len(text)))
    return spans


def _count_text_lines(text: str, start: int, stop: int) -> int:
    return (
        text.count("\n", start, stop)
        + text.count("\r", start, stop)
        - text.count("\r\n", start, stop)
    )


def _count_lines(block: bytes) -> int:
    return block.count(b"\n") + block.count(b"\r") - block.count(b"\r\n")


def line_breaks(text: str) -> int:
    """Line breaks in a text: \\n, \\r\\n or a lone \\r (as Arrow's CSV reader ends rows)."""
    return text.count("\n") + text.count("\r") - text.count("\r\n")


def utf8_copy(
    path: Path,
    encoding: str | None,
    fallback: str | None,
    stats: ReadStats,
    work_dir: Path | None,
) -> tuple[Path, bool]:
    """(a UTF-8 file with the table's text, whether it is a temporary copy in `work_dir`, made
    with `Utf8Stream`: the caller removes it)."""
    with open(path, "rb") as handle:
        sniffed, bom = sniff_encoding(handle.read(65536))
    named = codecs.lookup(encoding).name if encoding else None
    if not bom and sniffed == "utf-8" and named in (None, "utf-8") and _is_utf8(path):
        stats.encoding = "utf-8" if named else "utf-8 (auto)"
        return path, False
    folder = work_dir or Path(tempfile.gettempdir())
    folder.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(prefix=".utf8-", suffix=path.suffix, dir=folder)
    os.close(handle)
    copy = Path(name)
    try:
        with (
            Utf8Stream(path, encoding, fallback, stats) as source,
            open(copy, "wb") as out,
        ):
            shutil.copyfileobj(source, out, STREAM_BLOCK)
    except BaseException:
        copy.unlink(missing_ok=True)
        raise
    return copy, True
