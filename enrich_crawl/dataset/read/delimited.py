"""CSV/TSV through Arrow's CSV reader (C++; serial, so its invalid-row handler knows row numbers),
on the file or on its UTF-8 copy. Malformed rows (wrong number of fields, a quote never closed) are
quarantined with their row number, physical line and full text; every cell is read as the exact
string in the file (no type or NA inference). The header is read with Python's csv module."""

from __future__ import annotations

import csv
import io
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from enrich_crawl.dataset.read.batch import (
    SAMPLE,
    STRING,
    RawBatch,
    ReadError,
    ReadStats,
    fix_header,
    quarantine_entry,
)
from enrich_crawl.dataset.read.encoding import (
    Utf8Stream,
    line_breaks,
    utf8_copy,
)
from enrich_crawl.dataset.spec import DatasetSpec

CSV_BLOCK = 8 << 20
_LINE_BREAK = r"\r\n|\r|\n"


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

    def batches(self) -> Iterator[RawBatch]:
        if not self.columns:
            return
        generic = [f"c{i}" for i in range(len(self.columns))]
        source, temporary = utf8_copy(
            self.path, self.encoding, self.fallback, self.stats, self.work_dir
        )
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

    def _malformed(self, entry: dict[str, Any]) -> str:
        return f"malformed row: {entry['actual']} fields, expected {len(self.columns)}"

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
                    quarantine_entry(
                        int(number) - 1,
                        int(starts[number - ordinal]),
                        self._malformed(entry),
                        text,
                    )
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
                    quarantine_entry(int(entry["number"]) - 1, line, self._malformed(entry), text)
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
