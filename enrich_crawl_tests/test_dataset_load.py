"""`prepare_dataset` end to end on generated dirty tables: the vectorised loader produces exactly
what the row-at-a-time reference produces, finds every defect the generator planted, and writes
the staging files downstream stages read."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from enrich_crawl.dataset import synth
from enrich_crawl.dataset.load import SEED_SCHEMA, prepare_dataset, read_seed_shard
from enrich_crawl.dataset.shard import shard_for_urls, shard_keys
from enrich_crawl.dataset.spec import load_spec
from enrich_crawl.staging import DatasetStage
from enrich_crawl.testing.reference import reference_prepare

TODAY = dt.date(2026, 1, 1)
KEYS = shard_keys(5)
COMPARED = ("_id", "_row", "_urls", "_url_errors", "_missing", "_data", "_raw", "_cell_errors")


def _python_csv_rows(path: Path) -> tuple[list[str], list[tuple[int, dict[str, Any]]]]:
    """The file read with Python's csv module, each line decoded as UTF-8 or else cp1252 (the
    reference reading): (header, [(row number, row)]) without malformed or empty rows."""
    text = "".join(_decode(line) for line in path.read_bytes().splitlines(keepends=True))
    records = list(csv.reader(io.StringIO(text, newline="")))
    header, body = records[0], records[1:]
    rows = []
    for number, record in enumerate(body, start=1):
        if len(record) != len(header) or not any(cell.strip() for cell in record):
            continue
        rows.append((number, dict(zip(header, record, strict=True))))
    return header, rows


def _decode(line: bytes) -> str:
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError:
        return line.decode("cp1252")


def _load(spec_path: Path, tmp_path: Path, workers: int = 2) -> tuple[dict, DatasetStage]:
    spec = load_spec(spec_path)
    stage = DatasetStage(tmp_path / f"stage-{workers}", spec.name)
    manifest = prepare_dataset(spec, stage, KEYS, today=TODAY, workers=workers)
    return manifest, stage


def _records(stage: DatasetStage) -> dict[str, dict[str, Any]]:
    out = {}
    for key in KEYS:
        for record in read_seed_shard(stage.seed_shard(key)):
            record["_shard"] = key
            assert record["_id"] not in out
            out[record["_id"]] = record
    return out


def _rejected(stage: DatasetStage) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stage.rejected.read_text(encoding="utf-8").splitlines()]


def _compare_with_reference(spec_path, stage, manifest, columns, rows):
    spec = load_spec(spec_path)
    want = reference_prepare(spec, rows, columns, KEYS, TODAY)
    got = _records(stage)
    assert len(got) == len(want["records"]) == manifest["profile"]["usable"]
    for record in want["records"]:
        mine = got[record["_id"]]
        for key in COMPARED:
            assert mine[key] == record[key], (record["_id"], key, mine[key], record[key])
        assert mine["_shard"] == record["_shard"] == shard_for_urls(mine["_urls"], KEYS)
    rejected = [
        {k: e[k] for k in ("row", "id", "reason")}
        for e in _rejected(stage)
        if not e["reason"].startswith("malformed")
    ]
    assert rejected == want["rejected"]
    profile = manifest["profile"]
    reference = want["profile"]
    for key in (
        "usable",
        "missing_ids",
        "duplicate_ids",
        "invalid_urls",
        "records_without_urls",
        "records_to_enrich",
    ):
        assert profile[key] == reference[key], key
    assert profile["rows"] == reference["rows"] + profile["quarantined"]
    for name, counts in reference["fields"].items():
        mine = profile["fields"][name]
        assert {k: mine[k] for k in counts} == counts, name
        assert mine["type_error_sample"] == reference["type_error_samples"][name], name
    return got


def test_dirty_csv_matches_the_reference_and_the_ground_truth(tmp_path):
    source = tmp_path / "dirty.csv"
    truth = synth.write_dirty_csv(source, 6000, seed=3, dirt=6)
    spec_path = synth.write_spec(tmp_path, source.name)
    manifest, stage = _load(spec_path, tmp_path)
    columns, rows = _python_csv_rows(source)
    assert columns == synth.COLUMNS
    _compare_with_reference(spec_path, stage, manifest, columns, rows)

    profile = manifest["profile"]
    assert profile["rows"] == truth.rows
    assert profile["quarantined"] == len(truth.malformed) > 0
    malformed = [e for e in _rejected(stage) if e["reason"].startswith("malformed")]
    assert [e["row"] for e in malformed] == truth.malformed
    assert [e["line"] for e in malformed] == truth.malformed_lines
    lines = source.read_bytes().splitlines()
    for entry in malformed:  # the full text is kept, and it is the text at that line
        first_line = _decode(lines[entry["line"] - 1])
        assert entry["text"].startswith(first_line.rstrip("\r\n"))
        assert entry["reason"].startswith("malformed row: ")
    duplicates = [e for e in _rejected(stage) if e["reason"].startswith("duplicate")]
    assert [e["row"] for e in duplicates] == truth.duplicates
    for entry, source_row in zip(duplicates, truth.sources, strict=True):
        assert entry["reason"] == f"duplicate id (first at row {source_row})"
    assert [e["row"] for e in _rejected(stage) if e["reason"] == "missing id"] == truth.missing_ids
    assert profile["rejected"] == len(malformed) + len(duplicates) + len(truth.missing_ids)
    reading = profile["reading"]
    assert reading["fallback_encoding"] == "cp1252"
    assert truth.cp1252_lines and reading["decoded_lines"] >= len(truth.cp1252_lines)
    assert set(reading["decoded_sample"]) >= set(truth.cp1252_lines[:5])
    assert sum(manifest["shards"].values()) == profile["usable"]


def test_workers_do_not_change_the_result(tmp_path):
    source = tmp_path / "dirty.csv"
    synth.write_dirty_csv(source, 3000, seed=4, dirt=3)
    spec_path = synth.write_spec(tmp_path, source.name)
    one, stage_one = _load(spec_path, tmp_path, workers=1)
    two, stage_two = _load(spec_path, tmp_path, workers=2)
    for key in KEYS:
        assert pq.read_table(stage_one.seed_shard(key)).equals(
            pq.read_table(stage_two.seed_shard(key))
        )
    assert stage_one.rejected.read_bytes() == stage_two.rejected.read_bytes()
    assert one["profile"] == two["profile"]


def test_shards_keep_the_contract_schema_and_file_order(tmp_path):
    source = tmp_path / "dirty.csv"
    synth.write_dirty_csv(source, 2000, seed=5)
    manifest, stage = _load(synth.write_spec(tmp_path, source.name), tmp_path)
    assert set(manifest["shards"]) == set(KEYS)
    for key in KEYS:
        table = pq.read_table(stage.seed_shard(key))
        assert table.schema.equals(SEED_SCHEMA)
        rows = table.column("_row").to_pylist()
        assert rows == sorted(rows)
        assert table.num_rows == manifest["shards"][key]
    written = json.loads(stage.seed_manifest.read_text())
    assert written["profile"]["usable"] == manifest["profile"]["usable"]
    for key in ("dataset", "spec", "shards", "profile", "created_at", "seconds"):
        assert key in written


def test_shard_row_groups_are_bounded_and_read_back_in_order(tmp_path, monkeypatch):
    """A crawl decodes its shard one row group at a time: row groups stay small whatever the
    loader's batch, and the records come back complete and in file order."""
    from enrich_crawl.dataset import load

    monkeypatch.setattr(load, "SHARD_ROW_GROUP", 64)
    source = tmp_path / "dirty.csv"
    synth.write_dirty_csv(source, 1500, seed=6)
    manifest, stage = _load(synth.write_spec(tmp_path, source.name), tmp_path, workers=1)
    for key in KEYS:
        path = stage.seed_shard(key)
        meta = pq.ParquetFile(path).metadata
        assert manifest["shards"][key] > 64
        assert meta.num_row_groups >= manifest["shards"][key] // 64
        assert all(meta.row_group(i).num_rows <= 64 for i in range(meta.num_row_groups))
        rows = [record["_row"] for record in read_seed_shard(path)]
        assert rows == pq.read_table(path).column("_row").to_pylist() == sorted(rows)
        assert len(rows) == manifest["shards"][key]
        # a reader names the columns it needs (those the shard lacks are left out), decoded alike
        whole = list(read_seed_shard(path))
        some = list(read_seed_shard(path, ("_id", "_url_errors", "_no_such_column")))
        assert [set(r) for r in some] == [{"_id", "_url_errors"}] * len(whole)
        assert some == [{"_id": r["_id"], "_url_errors": r["_url_errors"]} for r in whole]


def test_dirty_parquet_matches_the_reference(tmp_path):
    source = tmp_path / "dirty.parquet"
    truth = synth.write_dirty_parquet(source, 4000, seed=6)
    spec_path = synth.write_spec(tmp_path, source.name)
    manifest, stage = _load(spec_path, tmp_path)
    table = pq.read_table(source)
    rows = list(enumerate(table.to_pylist(), start=1))
    _compare_with_reference(spec_path, stage, manifest, table.column_names, rows)
    assert manifest["profile"]["rows"] == truth.rows
    assert manifest["profile"]["duplicate_ids"] == len(truth.duplicates)
    assert manifest["profile"]["reading"]["format"] == "parquet"


def test_parquet_odd_column_types(tmp_path):
    """Dates, decimals, lists, float ids and unsigned integers go through the Python path."""
    import decimal

    table = pa.table(
        {
            "id": pa.array([1.0, 2.0, 2.0, None], pa.float64()),
            "when": pa.array([dt.date(2020, 1, 2), None, dt.date(2021, 5, 6), None]),
            "price": pa.array([decimal.Decimal("1.50"), None, None, None], pa.decimal128(5, 2)),
            "tags": pa.array([["a", " b"], [], None, ["x"]]),
            "big": pa.array([2**63 + 5, 1, None, 0], pa.uint64()),
            "url": pa.array(["a.com", None, "b.org", "c.net"]),
        }
    )
    source = tmp_path / "odd.parquet"
    pq.write_table(table, source)
    spec_path = tmp_path / "odd.yaml"
    spec_path.write_text(
        "name: odd\nsource: odd.parquet\nid: id\nurls: [url]\n"
        "fields: {when: {type: date}, tags: {type: list}, price: {type: number}, "
        "big: {type: integer}}\n"
    )
    manifest, stage = _load(spec_path, tmp_path)
    _compare_with_reference(
        spec_path, stage, manifest, table.column_names, list(enumerate(table.to_pylist(), 1))
    )
    records = _records(stage)
    assert records["1.0"]["_data"]["when"] == "2020-01-02"
    assert records["1.0"]["_data"]["tags"] == ["a", "b"]
    assert records["1.0"]["_data"]["big"] == 2**63 + 5
    assert manifest["profile"]["missing_ids"] == 1 and manifest["profile"]["duplicate_ids"] == 1


def test_dirty_jsonl_matches_the_reference(tmp_path):
    table, _ = synth.dirty_table(1500, seed=8)
    lines = []
    for i, row in enumerate(table.to_pylist()):
        if i % 7 == 0:  # mixed types in one column: numbers as numbers, lists as lists
            row["founded"] = int(row["founded"]) if row["founded"].strip().isdigit() else None
            row["tags"] = [t for t in row["tags"].split(",") if t]
        if i % 11 == 0:
            row["extra"] = {"nested": i}  # a key the first records do not have
        lines.append(json.dumps(row, ensure_ascii=False))
    lines.insert(10, "{not json")
    lines.insert(20, "[1, 2]")
    lines.insert(30, "")
    source = tmp_path / "dirty.jsonl"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    spec_path = synth.write_spec(tmp_path, source.name)
    manifest, stage = _load(spec_path, tmp_path)
    rows, columns = [], []
    number = 0
    for text in lines:
        if not text.strip():
            continue
        number += 1
        try:
            value = json.loads(text)
        except ValueError:
            continue
        if isinstance(value, dict):
            columns += [k for k in value if k not in columns]
            rows.append((number, value))
    _compare_with_reference(spec_path, stage, manifest, columns, rows)
    quarantined = [e for e in _rejected(stage) if e["reason"].startswith("malformed")]
    assert [(e["line"], e["text"]) for e in quarantined] == [(11, "{not json"), (21, "[1, 2]")]
    assert quarantined[0]["reason"].startswith("malformed line: not JSON")
    assert quarantined[1]["reason"] == "malformed line: not a JSON object"
    assert manifest["profile"]["reading"]["empty_rows"] == 1
    assert "extra" in manifest["columns"]


def test_stale_rule_and_refresh_fields_are_outdated(tmp_path):
    (tmp_path / "t.csv").write_text(
        "id,url,checked,a,b\n"
        "1,a.com,2025-12-30,x,2020-01-01\n"  # fresh: only the refresh field b
        "2,b.com,2020-01-01,x,2020-01-01\n"  # stale: a too
        "3,c.com,,x,\n"  # no check date: stale; b missing
        "4,d.com,not a date,,2020-01-01\n",  # unreadable: stale; a missing
        encoding="utf-8",
    )
    (tmp_path / "t.yaml").write_text(
        "name: t\nsource: t.csv\nid: id\nurls: [url]\n"
        "fields: {a: {}, b: {type: date, refresh: true}}\n"
        "stale: {column: checked, days: 30, fields: [a]}\n"
    )
    manifest, stage = _load(tmp_path / "t.yaml", tmp_path)
    records = _records(stage)
    assert records["1"]["_missing"] == ["b"]
    assert records["2"]["_missing"] == ["b", "a"]
    assert records["3"]["_missing"] == ["b", "a"]
    assert records["4"]["_missing"] == ["a", "b"]
    fields = manifest["profile"]["fields"]
    assert fields["a"] == {**fields["a"], "missing": 1, "outdated": 2}
    assert fields["b"] == {**fields["b"], "missing": 1, "outdated": 3}


@pytest.mark.parametrize("delimiter,suffix", [("\t", "tsv"), (";", "csv")])
def test_tsv_and_other_delimiters(tmp_path, delimiter, suffix):
    source = tmp_path / f"dirty.{suffix}"
    truth = synth.write_dirty_csv(source, 800, seed=9, delimiter=delimiter)
    spec_path = synth.write_spec(tmp_path, source.name)
    if delimiter == ";":
        spec_path.write_text(spec_path.read_text() + "format: {delimiter: ';'}\n")
    manifest, _ = _load(spec_path, tmp_path)
    assert manifest["profile"]["rows"] == truth.rows
    assert manifest["profile"]["quarantined"] == len(truth.malformed)
    assert manifest["columns"] == synth.COLUMNS


URL_CELLS = [
    # (cell, the URLs the record gets): commas and semicolons inside a URL belong to it
    (
        "http://www.time.com/time/health/article/0,8599,2011497,00.html",
        ["http://www.time.com/time/health/article/0,8599,2011497,00.html"],
    ),
    ("https://a.example/contact,fr,7,5.cfm", ["https://a.example/contact,fr,7,5.cfm"]),
    ("http://a.example/item;jsessionid=A1B2", ["http://a.example/item;jsessionid=A1B2"]),
    # ... and separate two URLs when the next one follows at once (scheme:// or www.)
    (
        "http://a.example/a,8,9.html,http://b.example/b;https://c.example/c",
        ["http://a.example/a,8,9.html", "http://b.example/b", "https://c.example/c"],
    ),
    ("http://a.example/x;www.b.example/y", ["http://a.example/x", "http://www.b.example/y"]),
    ("http://a.example/x ; WWW.b.example", ["http://a.example/x", "http://www.b.example/"]),
    ("a.example/p,q;r", ["http://a.example/p,q;r"]),  # no next URL: one URL
    # whitespace separates; list punctuation at the ends of a piece is not part of a URL
    ("a.example/x, b.example/y;", ["http://a.example/x", "http://b.example/y"]),
    ("http://a.example/x,,http://b.example/y", ["http://a.example/x", "http://b.example/y"]),
    (";, ;", []),
]


def test_url_cells_split_on_separators_only_and_as_the_reference_does(tmp_path):
    """How a URL cell splits, on real-world URLs (0,8599,...,00.html; ;jsessionid=), through the
    Arrow loader and the row-at-a-time reference alike."""
    lines = ["id,url,city"]
    for number, (cell, _) in enumerate(URL_CELLS, start=1):
        lines.append(f'{number},"{cell}",x')
    source = tmp_path / "cells.csv"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    spec_path = tmp_path / "cells.yaml"
    spec_path.write_text(
        "name: cells\nsource: cells.csv\nid: id\nurls: [url]\nfields:\n  city: {}\n",
        encoding="utf-8",
    )
    manifest, stage = _load(spec_path, tmp_path)
    columns, rows = _python_csv_rows(source)
    got = _compare_with_reference(spec_path, stage, manifest, columns, rows)
    for number, (cell, urls) in enumerate(URL_CELLS, start=1):
        assert got[str(number)]["_urls"] == urls, cell
        assert got[str(number)]["_url_errors"] == [], cell


def test_the_spec_is_parsed_once_per_content(tmp_path):
    """Every stage of a run loads the spec; the same file gives the same parsed spec, an edited
    file (even at once, same size) is read afresh, and a broken edit is an error every time."""
    from enrich_crawl.dataset.spec import SpecError

    (tmp_path / "t.csv").write_text("id,url,city\n1,http://a.test/,\n")
    spec_path = tmp_path / "t.yaml"
    text = "name: t1\nsource: t.csv\nid: id\nurls: [url]\nfields:\n  city: {type: string}\n"
    spec_path.write_text(text)
    first = load_spec(spec_path)
    assert load_spec(str(spec_path)) is first
    spec_path.write_text(text.replace("t1", "t2"))
    second = load_spec(spec_path)
    assert second is not first and second.name == "t2"
    spec_path.write_text(text.replace("name: t1", "nome: t1"))
    for _ in range(2):
        with pytest.raises(SpecError, match="nome"):
            load_spec(spec_path)
