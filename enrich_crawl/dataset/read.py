"""Readers: a dirty table streamed as Arrow batches of raw values, with nothing lost on the way.

- CSV/TSV: Arrow's CSV reader (C++; serial, so its invalid-row handler knows row numbers). A file
  that is UTF-8 throughout (checked first, ASCII blocks at memory speed) is read as it is; any
  other is first copied to UTF-8 line by line (`Utf8Stream`): lines that are UTF-8 stay so, the
  others are decoded with a legacy encoding guessed from them (cp1252, cp1251, ...), so a file
  that mixes both is read correctly, and every such line is counted with its number. Malformed
  rows (wrong number of fields, a quote never closed) are quarantined with their row number,
  physical line and full text; every cell is read as the exact string in the file (no type or NA
  inference). The header is read with Python's csv module.
- JSONL: one JSON object per line; a line that is not one is quarantined with its line number.
- Parquet: row groups streamed; column types kept.

Each batch carries the 1-based row number of each record (the n-th record after the header, the
quarantined ones counted too, so numbers match the file) and its physical line.
"""

from __future__ import annotations

import codecs
import csv
import io
import json
import os
import re
import shutil
import tempfile
import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from enrich_crawl.dataset.cells import clean_cell, raw_value
from enrich_crawl.dataset.spec import DatasetSpec

try:  # several times faster than json for JSONL; optional, results are the same
    import orjson
except ImportError:  # pragma: no cover - depends on the environment
    orjson = None

STREAM_BLOCK = 4 << 20
CSV_BLOCK = 8 << 20
BATCH_ROWS = 65_536  # JSONL and Parquet batches
SAMPLE = 20
_LINE_BREAK = r"\r\n|\r|\n"
STRING = pa.string()


class ReadError(ValueError):
    """The table cannot be read at all; the message names the file and where it went wrong."""


@dataclass
class ReadStats:
    """What reading found, for the profile."""

    format: str = ""
    encoding: str = ""
    fallback_encoding: str | None = None
    decoded_lines: int = 0  # lines that were not UTF-8 and were decoded with the fallback
    decoded_sample: list[int] = field(default_factory=list)
    undecodable_lines: int = 0  # lines with bytes no decoder accepted (replaced by U+FFFD)
    undecodable_sample: list[int] = field(default_factory=list)
    empty_rows: int = 0  # blank lines / rows without any value: no record, nothing lost
    multiline_cells: int = 0  # quoted cells holding line breaks
    # cells whose lines look like whole rows: an unbalanced quote may have merged rows into one
    suspect_rows: int = 0
    suspect_sample: list[int] = field(default_factory=list)
    quarantined: int = 0
    header_fixes: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "encoding": self.encoding,
            "fallback_encoding": self.fallback_encoding,
            "decoded_lines": self.decoded_lines,
            "decoded_sample": self.decoded_sample,
            "undecodable_lines": self.undecodable_lines,
            "undecodable_sample": self.undecodable_sample,
            "empty_rows": self.empty_rows,
            "multiline_cells": self.multiline_cells,
            "suspect_rows": self.suspect_rows,
            "suspect_sample": self.suspect_sample,
            "quarantined": self.quarantined,
            "header_fixes": self.header_fixes,
        }


@dataclass
class RawBatch:
    table: pa.Table  # the raw values, one column per table column
    rows: np.ndarray  # 1-based record number of each row
    lines: np.ndarray | None  # physical line where each record starts (None: not a text file)
    quarantined: list[dict[str, Any]]  # malformed records up to this batch's last row


# -- encodings -------------------------------------------------------------------------------


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


# -- header -----------------------------------------------------------------------------------


def fix_header(raw_names: list[str], stats: ReadStats) -> list[str]:
    """Column names cleaned like cells; blank ones named `column_<n>`, repeated ones `name.<k>`."""
    names: list[str] = []
    seen: set[str] = set()
    for i, raw in enumerate(raw_names):
        name = clean_cell(raw) or f"column_{i + 1}"
        base, k = name, 0
        while name in seen:
            k += 1
            name = f"{base}.{k}"
        seen.add(name)
        names.append(name)
        if name != raw:
            stats.header_fixes.append({"column": i + 1, "raw": raw, "name": name})
    return names


# -- CSV / TSV ---------------------------------------------------------------------------------


class CsvReader:
    """CSV/TSV as raw string batches. Arrow reads the file itself when it is UTF-8 (checked in a
    first pass), else a UTF-8 copy made line by line in `work_dir` (and removed afterwards):
    Arrow never calls back into Python for its input, so an aborted read leaves no thread
    behind."""

    def __init__(self, spec: DatasetSpec, path: Path | None = None, work_dir: Path | None = None):
        self.path = path or spec.source
        self.work_dir = work_dir
        fmt = spec.format
        self.delimiter = fmt.get("delimiter") or ("\t" if spec.source_format == "tsv" else ",")
        quote = fmt.get("quote_char", '"')
        self.quote = quote if quote else False
        self.encoding = fmt.get("encoding")
        self.fallback = fmt.get("fallback_encoding")
        self.stats = ReadStats(format=spec.source_format)
        self.columns: list[str] = []
        self._lock = threading.Lock()
        self._reported: list[dict[str, Any]] = []  # filled by Arrow's parser (any thread)
        self._skipped: list[dict[str, Any]] = []  # malformed rows not yet placed in the batches
        self._last_row = 0
        self._read_header()

    def _parse_options(self) -> pacsv.ParseOptions:
        return pacsv.ParseOptions(
            delimiter=self.delimiter,
            quote_char=self.quote,
            double_quote=True,
            escape_char=False,
            newlines_in_values=True,
            ignore_empty_lines=False,
            invalid_row_handler=self._on_invalid_row,
        )

    def _read_header(self) -> None:
        """The first record, read with Python's csv module from the decoded first lines."""
        stream = Utf8Stream(self.path, self.encoding, self.fallback, ReadStats())
        try:
            lines = (
                line.decode("utf-8") for line in io.BufferedReader(stream, buffer_size=1 << 16)
            )
            reader = csv.reader(
                lines,
                delimiter=self.delimiter,
                quotechar=self.quote or '"',
                quoting=csv.QUOTE_MINIMAL if self.quote else csv.QUOTE_NONE,
                doublequote=True,
                strict=False,
            )
            self._raw_names = next(reader, [])
        except csv.Error as exc:
            raise ReadError(f"{self.path}: cannot read the header: {exc}") from exc
        finally:
            stream.close()
        self.columns = fix_header(self._raw_names, self.stats)
        # a line inside a cell holding as many delimiters as a row: rows merged by a stray quote
        delimiter = re.escape(self.delimiter)
        others = f"[^\r\n{delimiter}]*"
        self._row_like = (
            f"[\r\n]{others}" + f"(?:{delimiter}{others}){{{max(len(self.columns) - 1, 1)}}}"
        )

    def _utf8_source(self) -> tuple[Path, bool]:
        """(a UTF-8 file with the table's text, whether it is a temporary copy)."""
        with open(self.path, "rb") as handle:
            sniffed, bom = sniff_encoding(handle.read(65536))
        named = codecs.lookup(self.encoding).name if self.encoding else None
        if not bom and sniffed == "utf-8" and named in (None, "utf-8") and _is_utf8(self.path):
            self.stats.encoding = "utf-8" if named else "utf-8 (auto)"
            return self.path, False
        folder = self.work_dir or Path(tempfile.gettempdir())
        folder.mkdir(parents=True, exist_ok=True)
        handle, name = tempfile.mkstemp(prefix=".utf8-", suffix=self.path.suffix, dir=folder)
        os.close(handle)
        copy = Path(name)
        try:
            with (
                Utf8Stream(self.path, self.encoding, self.fallback, self.stats) as source,
                open(copy, "wb") as out,
            ):
                shutil.copyfileobj(source, out, STREAM_BLOCK)
        except BaseException:
            copy.unlink(missing_ok=True)
            raise
        return copy, True

    def batches(self) -> Iterator[RawBatch]:
        if not self.columns:
            return
        generic = [f"c{i}" for i in range(len(self.columns))]
        source, temporary = self._utf8_source()
        reader = None
        try:
            reader = pacsv.open_csv(
                str(source),
                read_options=pacsv.ReadOptions(
                    use_threads=False, block_size=CSV_BLOCK, column_names=generic
                ),
                parse_options=self._parse_options(),
                convert_options=pacsv.ConvertOptions(
                    column_types=dict.fromkeys(generic, STRING),
                    strings_can_be_null=False,
                    quoted_strings_can_be_null=False,
                    null_values=[],
                    check_utf8=False,  # checked (or made so) above
                ),
            )
            yield from self._batches(reader)
        except pa.ArrowInvalid as exc:
            where = f"after row {self._last_row}" if self._last_row else "in the first rows"
            raise ReadError(
                f"{self.path}: CSV parse error {where}: {exc}. A quote that is opened and never "
                f"closed makes the rest of the file one value: check the quoting {where}."
            ) from exc
        finally:
            if reader is not None:
                reader.close()
            if temporary:
                source.unlink(missing_ok=True)

    def _on_invalid_row(self, row: Any) -> str:
        # Arrow parses ahead in its own thread: the handler may run while a batch is processed
        entry = {"number": row.number, "text": row.text or "", "actual": row.actual_columns}
        with self._lock:
            self._reported.append(entry)
        return "skip"

    def _take_reported(self) -> list[dict[str, Any]]:
        with self._lock:
            reported, self._reported = self._reported, []
        return reported

    def _batches(self, reader: pacsv.CSVStreamingReader) -> Iterator[RawBatch]:
        ordinal = 1  # record number in the file, the header being 1
        line = 1  # physical line where record `ordinal` starts
        while True:
            try:
                batch = reader.read_next_batch()
            except StopIteration:
                break
            n = batch.num_rows
            self._skipped.extend(self._take_reported())
            skipped = sorted(self._skipped, key=lambda e: e["number"])
            numbers = np.array([e["number"] for e in skipped], dtype=np.int64)
            rel = numbers - ordinal
            gaps = rel - np.arange(len(rel))
            good = ordinal + np.arange(n) + np.searchsorted(gaps, np.arange(n), side="right")
            last = int(good[-1]) if n else ordinal - 1
            used = numbers <= last
            # physical lines: a record spans 1 + the line breaks inside its values
            spans = np.ones(last - ordinal + 1, dtype=np.int64)
            suspect = np.zeros(n, dtype=bool)
            if n:
                breaks = np.zeros(n, dtype=np.int64)
                for column in batch.columns:
                    if (
                        pc.any(pc.match_substring(column, "\n")).as_py()
                        or pc.any(pc.match_substring(column, "\r")).as_py()
                    ):
                        counts = pc.count_substring_regex(column, _LINE_BREAK).to_numpy()
                        breaks += counts
                        self.stats.multiline_cells += int((counts > 0).sum())
                        suspect |= np.asarray(
                            pc.match_substring_regex(column, self._row_like).to_numpy(
                                zero_copy_only=False
                            ),
                            dtype=bool,
                        )
                spans[good - ordinal] += breaks
            for entry, number in zip(skipped, numbers, strict=True):
                if number <= last:
                    spans[number - ordinal] += line_breaks(entry["text"])
            starts = line + np.concatenate([[0], np.cumsum(spans)[:-1]])
            quarantined = []
            for entry, number in zip(skipped, numbers, strict=True):
                if number > last or number == 1:  # later, or the header (read on its own)
                    continue
                text = entry["text"]
                if not text.strip():
                    self.stats.empty_rows += 1
                    continue
                self.stats.quarantined += 1
                quarantined.append(
                    {
                        "row": int(number) - 1,
                        "line": int(starts[number - ordinal]),
                        "reason": f"malformed row: {entry['actual']} fields, "
                        f"expected {len(self.columns)}",
                        "text": text,
                        "text_length": len(text),
                    }
                )
            self._skipped = [e for e, u in zip(skipped, used, strict=True) if not u]
            lines = starts[good - ordinal] if n else np.zeros(0, dtype=np.int64)
            if suspect.any():
                self.stats.suspect_rows += int(suspect.sum())
                room = SAMPLE - len(self.stats.suspect_sample)
                self.stats.suspect_sample += lines[suspect][:room].tolist()
            line = int(starts[-1] + spans[-1]) if len(spans) else line
            ordinal = last + 1
            table = pa.Table.from_batches([batch])
            rows = good - 1  # the header is record 1: data rows count from 1
            if n and good[0] == 1:  # the header, read on its own
                table, rows, lines = table.slice(1), rows[1:], lines[1:]
            table = table.rename_columns(self.columns)
            table, rows, lines = self._drop_empty(table, rows, lines)
            self._last_row = int(rows[-1]) if len(rows) else self._last_row
            yield RawBatch(table, rows, lines, quarantined)
        # malformed rows after the last good one
        self._skipped.extend(self._take_reported())
        quarantined = []
        for entry in sorted(self._skipped, key=lambda e: e["number"]):
            text = entry["text"]
            span = 1 + line_breaks(text)
            if entry["number"] == 1:
                pass  # the header, read on its own
            elif not text.strip():
                self.stats.empty_rows += 1
            else:
                self.stats.quarantined += 1
                quarantined.append(
                    {
                        "row": int(entry["number"]) - 1,
                        "line": line,
                        "reason": f"malformed row: {entry['actual']} fields, "
                        f"expected {len(self.columns)}",
                        "text": text,
                        "text_length": len(text),
                    }
                )
            line += span
        self._skipped = []
        if quarantined:
            empty = pa.table({c: pa.array([], STRING) for c in self.columns})
            yield RawBatch(empty, np.zeros(0, np.int64), np.zeros(0, np.int64), quarantined)

    def _drop_empty(
        self, table: pa.Table, rows: np.ndarray, lines: np.ndarray
    ) -> tuple[pa.Table, np.ndarray, np.ndarray]:
        """Rows without any value (blank lines, `,,,`) are no records: counted, not kept."""
        if not table.num_rows:
            return table, rows, lines
        empty = np.ones(table.num_rows, dtype=bool)
        for column in table.columns:
            empty &= np.asarray(
                pc.equal(pc.utf8_trim_whitespace(column), "").to_numpy(zero_copy_only=False),
                dtype=bool,
            )
            if not empty.any():
                return table, rows, lines
        self.stats.empty_rows += int(empty.sum())
        keep = ~empty
        return table.filter(pa.array(keep)), rows[keep], lines[keep]


# -- JSONL -------------------------------------------------------------------------------------


def _loads(line: bytes) -> Any:
    if orjson is not None:
        try:
            return orjson.loads(line)
        except orjson.JSONDecodeError:
            pass  # json accepts a little more (NaN, huge integers): same result when both parse
    return json.loads(line)


class JsonlReader:
    def __init__(self, spec: DatasetSpec, path: Path | None = None):
        self.path = path or spec.source
        self.encoding = spec.format.get("encoding")
        self.fallback = spec.format.get("fallback_encoding")
        self.stats = ReadStats(format="jsonl")
        self.columns: list[str] = []
        self._index: dict[str, int] = {}
        # the columns are the keys of the records, in order of first appearance; the first batch
        # is read here so that the columns are known before the table is cleaned
        self._stream = Utf8Stream(self.path, self.encoding, self.fallback, self.stats)
        self._text = io.BufferedReader(self._stream, buffer_size=1 << 20)
        self._line = 0
        self._row = 0
        self._first = self._next_batch()

    def _next_batch(self) -> RawBatch | None:
        records: list[dict[str, Any]] = []
        rows: list[int] = []
        lines: list[int] = []
        quarantined: list[dict[str, Any]] = []
        for raw in self._text:
            self._line += 1
            if not raw.strip():
                self.stats.empty_rows += 1
                continue
            self._row += 1
            try:
                value = _loads(raw)
            except ValueError as exc:
                value, reason = None, f"malformed line: not JSON: {exc}"
            else:
                reason = None if isinstance(value, dict) else "malformed line: not a JSON object"
            if reason is not None:
                self.stats.quarantined += 1
                text = raw.decode("utf-8", "replace").rstrip("\r\n")
                quarantined.append(
                    {
                        "row": self._row,
                        "line": self._line,
                        "reason": reason,
                        "text": text,
                        "text_length": len(text),
                    }
                )
                continue
            if not value:
                self.stats.empty_rows += 1
                continue
            for key in value:
                if key not in self._index:
                    self._index[key] = len(self.columns)
                    self.columns.append(key)
            records.append(value)
            rows.append(self._row)
            lines.append(self._line)
            if len(records) >= BATCH_ROWS:
                break
        if not records and not quarantined:
            return None
        columns = {name: _jsonl_column([r.get(name) for r in records]) for name in self.columns}
        table = pa.table(columns) if records else pa.table({})
        return RawBatch(
            table, np.array(rows, dtype=np.int64), np.array(lines, dtype=np.int64), quarantined
        )

    def batches(self) -> Iterator[RawBatch]:
        try:
            batch = self._first
            while batch is not None:
                yield batch
                batch = self._next_batch()
        finally:
            self._text.close()


def _jsonl_column(values: list[Any]) -> pa.Array:
    """A JSONL column as Arrow: strings, integers, floats or booleans when the values agree, else
    an object column."""
    kinds = {type(v) for v in values if v is not None}
    try:
        if kinds <= {str}:
            return pa.array(values, STRING)
        if kinds == {bool}:
            return pa.array(values, pa.bool_())
        if kinds == {int}:
            return pa.array(values, pa.int64())
        if kinds == {float}:
            return pa.array(values, pa.float64())
    except (pa.ArrowException, OverflowError, UnicodeEncodeError):
        pass  # huge integers, lone surrogates: keep the Python values
    return object_array(values)


# A column Arrow cannot type (mixed or nested values, decimals, dates) travels as the JSON text of
# its Python values in a large_string column (string columns are always plain `string`); the
# cleaner decodes it and treats it value by value.
OBJECT = pa.large_string()


def object_array(values: list[Any]) -> pa.Array:
    return pa.array(
        [None if v is None else json.dumps(v, ensure_ascii=False, default=str) for v in values],
        OBJECT,
    )


def is_object_array(array: pa.Array | pa.ChunkedArray) -> bool:
    return array.type == OBJECT


def object_values(array: pa.Array | pa.ChunkedArray) -> list[Any]:
    return [None if v is None else json.loads(v) for v in array.to_pylist()]


# -- Parquet -----------------------------------------------------------------------------------


class ParquetReader:
    def __init__(self, spec: DatasetSpec, path: Path | None = None):
        self.path = path or spec.source
        self.stats = ReadStats(format="parquet", encoding="utf-8")
        try:
            self._file = pq.ParquetFile(self.path)
        except (pa.ArrowException, OSError) as exc:
            raise ReadError(f"{self.path}: not a readable Parquet file: {exc}") from exc
        raw = list(self._file.schema_arrow.names)
        self.columns = fix_header(raw, self.stats)

    def batches(self) -> Iterator[RawBatch]:
        row = 0
        for batch in self._file.iter_batches(batch_size=BATCH_ROWS):
            n = batch.num_rows
            arrays = [_parquet_column(column) for column in batch.columns]
            table = pa.Table.from_arrays(arrays, names=self.columns)
            rows = np.arange(row + 1, row + n + 1, dtype=np.int64)
            row += n
            yield RawBatch(table, rows, None, [])


def _parquet_column(array: pa.Array) -> pa.Array:
    kind = array.type
    if pa.types.is_dictionary(kind):
        array = array.dictionary_decode()
        kind = array.type
    if pa.types.is_string(kind):
        return array
    if pa.types.is_large_string(kind) or pa.types.is_string_view(kind):
        return pc.cast(array, STRING)
    if pa.types.is_boolean(kind) or pa.types.is_integer(kind) or pa.types.is_floating(kind):
        if pa.types.is_unsigned_integer(kind) and kind.bit_width == 64:
            return object_array(array.to_pylist())  # may not fit in int64
        return array if kind in (pa.bool_(), pa.int64(), pa.float64()) else _widen(array)
    return object_array([raw_value(v) for v in array.to_pylist()])


def _widen(array: pa.Array) -> pa.Array:
    if pa.types.is_floating(array.type):
        return pc.cast(array, pa.float64())
    return pc.cast(array, pa.int64())


def open_reader(
    spec: DatasetSpec, work_dir: Path | None = None
) -> CsvReader | JsonlReader | ParquetReader:
    """The reader of the spec's table; `work_dir` holds a transcoded copy if one is needed."""
    fmt = spec.source_format
    if fmt in ("csv", "tsv"):
        return CsvReader(spec, work_dir=work_dir)
    if fmt == "jsonl":
        return JsonlReader(spec)
    return ParquetReader(spec)
