"""Dirty inputs one defect at a time: what is read, what is quarantined (with its line), what is
reported, and the errors that stop a load (naming the file and the reason)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from enrich_crawl.dataset import synth
from enrich_crawl.dataset.load import DatasetError, prepare_dataset, read_seed_shard
from enrich_crawl.dataset.profile import ui_metadata
from enrich_crawl.dataset.shard import shard_keys
from enrich_crawl.dataset.spec import SpecError, load_spec
from enrich_crawl.staging import DatasetStage

KEYS = shard_keys(3)
SPEC = """\
name: t
source: {source}
id: id
urls: [url]
fields:
  city: {{}}
  n: {{type: integer}}
missing_values: ["N/A", "-"]
{extra}"""


def _dataset(tmp_path: Path, content: bytes | str, suffix: str = "csv", extra: str = "") -> Path:
    source = tmp_path / f"t.{suffix}"
    if isinstance(content, str):
        content = content.encode("utf-8")
    source.write_bytes(content)
    spec = tmp_path / "t.yaml"
    spec.write_text(SPEC.format(source=source.name, extra=extra), encoding="utf-8")
    return spec


def _load(spec_path: Path, tmp_path: Path):
    stage = DatasetStage(tmp_path / "stage", "t")
    manifest = prepare_dataset(load_spec(spec_path), stage, KEYS, today=dt.date(2026, 1, 1))
    records = {r["_id"]: r for key in KEYS for r in read_seed_shard(stage.seed_shard(key))}
    rejected = [json.loads(x) for x in stage.rejected.read_text(encoding="utf-8").splitlines()]
    return manifest, records, rejected


def test_mixed_encodings_are_read_line_by_line(tmp_path):
    content = (
        b"id,url,city,n\n"
        + "1,a.com,Zürich,1\n".encode()
        + "2,b.com,Zürich,2\n".encode("cp1252")  # a cp1252 line in a UTF-8 file
        + "3,c.com,São Paulo,3\n".encode()
        + "4,d.com,Kraków €,4\n".encode("cp1252")
    )
    manifest, records, rejected = _load(_dataset(tmp_path, content), tmp_path)
    assert [records[i]["_data"]["city"] for i in "1234"] == [
        "Zürich",
        "Zürich",
        "São Paulo",
        "Kraków €",
    ]
    reading = manifest["profile"]["reading"]
    assert reading["decoded_lines"] == 2
    assert reading["decoded_sample"] == [3, 5]
    assert reading["fallback_encoding"] == "cp1252"
    assert rejected == []
    assert not list(tmp_path.rglob(".utf8-*"))  # the UTF-8 copy Arrow read is gone


@pytest.mark.parametrize(
    "encoding,bom",
    [("utf-16", b""), ("utf-8-sig", b""), ("utf-16-be", b"\xfe\xff"), ("cp1252", b"")],
)
def test_whole_file_encodings(tmp_path, encoding, bom):
    text = "id,url,city,n\n1,a.com,Zürich,1\n2,b.com,Köln,2\n"
    _, records, _ = _load(_dataset(tmp_path, bom + text.encode(encoding)), tmp_path)
    assert records["1"]["_data"]["city"] == "Zürich"
    assert records["2"]["_data"]["city"] == "Köln"
    assert records["1"]["_data"]["id"] == "1"  # no BOM glued to the first column name


def test_named_encoding_reports_undecodable_lines(tmp_path):
    content = "id,url,city,n\n1,a.com,Zürich,1\n".encode() + b"2,b.com,K\xff\xfeln,2\n"
    spec = _dataset(tmp_path, content, extra="format: {encoding: utf-8}\n")
    manifest, records, _ = _load(spec, tmp_path)
    # named UTF-8: no fallback guess; the bad bytes are replaced and the line reported
    assert manifest["profile"]["reading"]["undecodable_lines"] == 1
    assert manifest["profile"]["reading"]["undecodable_sample"] == [3]
    assert records["2"]["_data"]["city"] == "K\ufffd\ufffdln"


def test_ragged_rows_are_quarantined_with_line_numbers(tmp_path):
    content = (
        'id,url,city,n\n1,a.com,"Multi\nline city",1\n'
        "2,b.com,Paris\n"  # one field short: line 4
        '3,c.com,"x",3,extra\n'  # one field too many: line 5
        "4,d.com,Lyon,4\n"
    )
    manifest, records, rejected = _load(_dataset(tmp_path, content), tmp_path)
    assert sorted(records) == ["1", "4"]
    assert records["4"]["_line"] == 6 and records["4"]["_row"] == 4
    assert [(e["row"], e["line"], e["text"], e["reason"]) for e in rejected] == [
        (2, 4, "2,b.com,Paris", "malformed row: 3 fields, expected 4"),
        (3, 5, '3,c.com,"x",3,extra', "malformed row: 5 fields, expected 4"),
    ]
    profile = manifest["profile"]
    assert profile["rows"] == 4 and profile["quarantined"] == 2 and profile["rejected"] == 2


def test_embedded_newlines_and_crlf_keep_line_numbers(tmp_path):
    content = (
        'id,url,city,n\r\n1,a.com,"one\r\ntwo\r\nthree",1\r\n2,b.com,"a\nb",2\r\n3,c.com,x\r\n'
    )
    _, records, rejected = _load(_dataset(tmp_path, content), tmp_path)
    assert records["1"]["_data"]["city"] == "one two three"
    assert records["1"]["_raw"]["city"] == "one\r\ntwo\r\nthree"  # the original is kept
    assert [records["1"]["_line"], records["2"]["_line"]] == [2, 5]
    assert [(e["row"], e["line"]) for e in rejected] == [(3, 7)]


def test_unbalanced_quote_merges_rows_nothing_lost_and_flagged(tmp_path):
    content = 'id,url,city,n\n1,a.com,"Paris,1\n2,b.com,Lyon,2\n3,c.com,"Nice",3\n4,d.com,x,4\n'
    manifest, records, rejected = _load(_dataset(tmp_path, content), tmp_path)
    # CSV cannot tell: the stray quote makes rows 2 and 3 part of row 1's city (as any CSV
    # reader would); their text is kept and the row is flagged for a person to look at
    assert sorted(records) == ["1", "4"] and rejected == []
    assert "2,b.com,Lyon,2" in records["1"]["_data"]["city"]
    assert "2,b.com,Lyon,2\n3,c.com," in records["1"]["_raw"]["city"]
    reading = manifest["profile"]["reading"]
    assert reading["suspect_rows"] == 1 and reading["suspect_sample"] == [2]
    assert records["4"]["_line"] == 5


def test_duplicate_ids_first_wins(tmp_path):
    content = "id,url,city,n\nA,a.com,one,1\nB,b.com,two,2\n A ,c.com,three,3\nA,d.com,four,4\n"
    manifest, records, rejected = _load(_dataset(tmp_path, content), tmp_path)
    assert records["A"]["_data"]["city"] == "one"
    assert [(e["row"], e["id"], e["reason"]) for e in rejected] == [
        (3, "A", "duplicate id (first at row 1)"),
        (4, "A", "duplicate id (first at row 1)"),
    ]
    assert rejected[0]["data"]["city"] == "three"  # the rejected record itself is kept
    assert manifest["profile"]["duplicate_ids"] == 2


def test_missing_ids_are_rejected(tmp_path):
    content = "id,url,city,n\n,a.com,one,1\nN/A,b.com,two,2\n2,c.com,three,3\n"
    _, records, rejected = _load(_dataset(tmp_path, content), tmp_path)
    assert list(records) == ["2"]
    assert [(e["row"], e["reason"]) for e in rejected] == [(1, "missing id"), (2, "missing id")]


def test_empty_file_gives_an_empty_dataset(tmp_path):
    manifest, records, rejected = _load(_dataset(tmp_path, b""), tmp_path)
    assert records == {} and rejected == []
    assert manifest["profile"]["rows"] == 0
    assert manifest["shards"] == dict.fromkeys(KEYS, 0)
    for key in KEYS:
        assert (
            pq.read_table(tmp_path / "stage" / "t" / "seed" / f"shard={key}.parquet").num_rows == 0
        )


def test_header_only_and_blank_lines(tmp_path):
    manifest, records, _ = _load(_dataset(tmp_path, "id,url,city,n\n"), tmp_path)
    assert manifest["profile"]["rows"] == 0 and records == {}
    content = "id,url,city,n\n\n1,a.com,x,1\n   \n,,,\n2,b.com,y,2\n"
    manifest, records, rejected = _load(_dataset(tmp_path, content), tmp_path)
    assert sorted(records) == ["1", "2"] and rejected == []
    assert manifest["profile"]["reading"]["empty_rows"] == 3
    assert records["2"]["_line"] == 6


def test_missing_id_column_is_a_clear_error(tmp_path):
    spec = _dataset(tmp_path, "ID,url,city,n\n1,a.com,x,1\n")
    with pytest.raises(DatasetError) as error:
        _load(spec, tmp_path)
    message = str(error.value)
    assert "t.csv" in message and "'id'" in message and "did you mean 'ID'" in message
    assert "'url'" in message  # the table's columns are listed


def test_missing_url_column_is_a_clear_error(tmp_path):
    spec = _dataset(tmp_path, "id,website,city,n\n1,a.com,x,1\n")
    with pytest.raises(DatasetError, match=r"urls column 'url' .* is not in the table"):
        _load(spec, tmp_path)


def test_missing_source_is_a_clear_error(tmp_path):
    spec = _dataset(tmp_path, "id\n")
    (tmp_path / "t.csv").unlink()
    with pytest.raises(DatasetError, match=r"t\.csv: source table not found"):
        _load(spec, tmp_path)


def test_nul_bytes_and_odd_whitespace_are_cleaned_and_kept_raw(tmp_path):
    content = "id,url,city,n\n1,a.com,Pa\x00ris\u00a0 \t Nord,1\n2\x00,b.com,\x00,2\n"
    _, records, _ = _load(_dataset(tmp_path, content), tmp_path)
    assert records["1"]["_data"]["city"] == "Paris Nord"
    assert records["1"]["_raw"]["city"] == "Pa\x00ris\u00a0 \t Nord"
    assert records["2"]["_data"]["city"] is None  # only junk: missing
    assert "city" in records["2"]["_missing"]


def test_urls_split_normalised_and_invalid_ones_reported(tmp_path):
    content = (
        "id,url,city,n\n"
        '1,"HTTP://Example.COM ; www.example.org/a, ftp://x.org/f not-a-url",x,1\n'
        "2,-,x,2\n"
    )
    manifest, records, _ = _load(_dataset(tmp_path, content), tmp_path)
    assert records["1"]["_urls"] == ["http://example.com/", "http://www.example.org/a"]
    assert [(e["url"], e["reason"]) for e in records["1"]["_url_errors"]] == [
        ("ftp://x.org/f", "invalid_url"),
        ("not-a-url", "invalid_url"),
    ]
    assert records["2"]["_urls"] == [] and records["2"]["_url_errors"] == []  # a marker: no URL
    assert manifest["profile"]["invalid_urls"] == 2
    assert manifest["profile"]["records_without_urls"] == 1


def test_a_record_with_fields_to_fill_and_no_url_says_so(tmp_path):
    """Blank or marker-only URL cells: the record's reason is `no_url` (it would otherwise end
    `unresolved` with no reason); a record with nothing to fill needs no URL and gets none."""
    content = "id,url,city,n\n1,,,1\n2,N/A,x,2\n3,  -  ,,\n"
    manifest, records, _ = _load(_dataset(tmp_path, content), tmp_path)
    no_url = [{"url": "", "reason": "no_url", "detail": "no URL in column 'url'"}]
    assert records["1"]["_url_errors"] == no_url and records["1"]["_missing"] == ["city"]
    assert records["2"]["_url_errors"] == [] and records["2"]["_missing"] == []
    assert records["3"]["_url_errors"] == no_url
    assert manifest["profile"]["invalid_urls"] == 0  # not an invalid URL: no URL at all
    assert manifest["profile"]["records_without_urls"] == 3


def test_a_single_label_host_in_a_cell_is_an_invalid_url(tmp_path):
    """`http://exa mple.com/page` splits on its space; `http://exa` names no public web site:
    refused with its reason at load, never looked up."""
    content = 'id,url,city,n\n1,"http://exa mple.com/page",,1\n'
    manifest, records, _ = _load(_dataset(tmp_path, content), tmp_path)
    assert records["1"]["_urls"] == ["http://mple.com/page"]
    (error,) = records["1"]["_url_errors"]
    assert (error["url"], error["reason"]) == ("http://exa", "invalid_url")
    assert error["detail"].startswith("single-label host 'exa'")
    assert manifest["profile"]["invalid_urls"] == 1


def test_a_field_that_nearly_names_a_column_is_a_new_column_with_a_warning(tmp_path, caplog):
    """`fields: {sumary: {}}` on a table with `summary` is most likely a typo, but a field that
    is not a column is a legitimate new column to fill (the spec contract never required fields to
    be columns): the load goes on, and the log and the seed metadata name the spec, the field and
    the column it is close to; `new: true` says the new column is meant (no warning)."""
    (tmp_path / "t.csv").write_text("id,url,summary\n1,http://a.example/,\n", encoding="utf-8")
    spec = tmp_path / "t.yaml"
    head = "name: t\nsource: t.csv\nid: id\nurls: [url]\nfields:\n"
    spec.write_text(head + "  sumary: {}\n", encoding="utf-8")
    with caplog.at_level("WARNING", logger="enrich_crawl.dataset.load"):
        manifest, records, _ = _load(spec, tmp_path)
    assert manifest["profile"]["near_miss_fields"] == {"sumary": "summary"}
    assert records["1"]["_missing"] == ["sumary"]
    (warning,) = [r.getMessage() for r in caplog.records if "sumary" in r.getMessage()]
    assert warning.startswith(f"{spec}: fields.sumary: 'sumary' is not a column of t.csv")
    assert "did you mean 'summary'?" in warning and "`sumary: {new: true}`" in warning
    assert "did you mean 'summary'?" in ui_metadata(manifest)["markdown"]["new_columns"]

    caplog.clear()
    spec.write_text(head + "  sumary: {new: true}\n  category: {}\n", encoding="utf-8")
    with caplog.at_level("WARNING", logger="enrich_crawl.dataset.load"):
        manifest, records, _ = _load(spec, tmp_path)
    # declared new, and a name far from every column: new columns to fill, no warning
    assert not [r for r in caplog.records if "is not a column" in r.getMessage()]
    assert manifest["profile"]["near_miss_fields"] == {}
    assert manifest["profile"]["new_columns"] == ["sumary", "category"]
    assert records["1"]["_missing"] == ["sumary", "category"]
    assert manifest["spec"]["fields"]["sumary"] == {"type": "string", "refresh": False, "new": True}
    shown = ui_metadata(manifest)
    assert shown["numbers"]["new_columns"] == 2 and "| sumary |" in shown["markdown"]["new_columns"]


def test_type_errors_are_recorded_per_cell(tmp_path):
    content = 'id,url,city,n\n1,a.com,x,"1,200"\n2,b.com,x,many\n3,c.com,x,12.5\n4,d.com,x,7\n'
    manifest, records, _ = _load(_dataset(tmp_path, content), tmp_path)
    assert records["1"]["_data"]["n"] == 1200 and records["1"]["_raw"]["n"] == "1,200"
    assert records["4"]["_data"]["n"] == 7 and "n" not in records["4"]["_raw"]
    assert records["2"]["_data"]["n"] is None and "n" in records["2"]["_missing"]
    assert records["2"]["_cell_errors"] == [
        {"field": "n", "value": "many", "reason": "no number in 'many'"}
    ]
    assert records["2"]["_raw"]["n"] == "many"
    field = manifest["profile"]["fields"]["n"]
    assert field["type_errors"] == 2
    assert [s["row"] for s in field["type_error_sample"]] == [2, 3]


def test_header_names_are_cleaned_and_made_unique(tmp_path):
    content = "id, url ,city,city,,n\n1,a.com,x,y,z,1\n"
    manifest, records, _ = _load(_dataset(tmp_path, content), tmp_path)
    assert manifest["columns"] == ["id", "url", "city", "city.1", "column_5", "n"]
    fixes = manifest["profile"]["reading"]["header_fixes"]
    assert [f["name"] for f in fixes] == ["url", "city.1", "column_5"]
    assert records["1"]["_data"]["city.1"] == "y"


def test_fields_absent_from_the_table_are_added(tmp_path):
    manifest, records, _ = _load(_dataset(tmp_path, "id,url,n\n1,a.com,1\n"), tmp_path)
    assert manifest["profile"]["new_columns"] == ["city"]
    assert records["1"]["_data"]["city"] is None and records["1"]["_missing"] == ["city"]


def test_file_of_100_megabytes(tmp_path):
    """A 100 MB dirty CSV: every row accounted for, in bounded batches."""
    source = tmp_path / "big.csv"
    truth = synth.write_dirty_csv(source, 540_000, seed=11)
    assert source.stat().st_size >= 100_000_000
    spec_path = synth.write_spec(tmp_path, source.name)
    stage = DatasetStage(tmp_path / "stage", "dirty")
    manifest = prepare_dataset(load_spec(spec_path), stage, shard_keys(8))
    profile = manifest["profile"]
    assert profile["rows"] == truth.rows
    assert profile["quarantined"] == len(truth.malformed)
    assert profile["duplicate_ids"] == len(truth.duplicates)
    assert profile["missing_ids"] == len(truth.missing_ids)
    assert profile["usable"] + profile["rejected"] == truth.rows
    assert sum(manifest["shards"].values()) == profile["usable"]
    rejected = stage.rejected.read_text(encoding="utf-8").splitlines()
    assert len(rejected) == profile["rejected"]
    row_groups = pq.ParquetFile(stage.seed_shard("s00")).metadata
    assert row_groups.num_row_groups > 5  # written batch by batch, not all at once
    assert row_groups.num_rows == manifest["shards"]["s00"]


# -- the spec ---------------------------------------------------------------------------------


def _spec_error(tmp_path: Path, text: str) -> str:
    path = tmp_path / "s.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(SpecError) as error:
        load_spec(path)
    assert str(path) in str(error.value)
    return str(error.value)


BASE = "name: s\nsource: s.csv\nid: id\nurls: [url]\nfields: {a: {}}\n"


@pytest.mark.parametrize(
    "text,expected",
    [
        ("name: s\nsource: s.csv\nfields: {a: {}}\n", "id: required key missing"),
        (BASE.replace("id: id\n", "id: 5\n"), "id: expected the name"),
        (BASE + "colour: red\n", "colour: unknown key"),
        (BASE.replace("{a: {}}", "{a: {type: text}}"), "fields.a.type: unknown type 'text'"),
        (BASE.replace("{a: {}}", "{a: {refresh: maybe}}"), "fields.a.refresh: expected true"),
        (BASE.replace("{a: {}}", "{a: {typ: string}}"), "fields.a.typ: unknown option"),
        (BASE.replace("{a: {}}", "{id: {}}"), "the id column cannot be a field"),
        (BASE.replace("s.csv", "s.xlsx"), "unsupported format '.xlsx'"),
        (BASE.replace("[url]", "[url, url]"), "urls: column 'url' is listed twice"),
        (BASE + "stale: {column: c, days: -1}\n", "stale.days: expected a number"),
        (BASE + "stale: {column: c, days: 3, fields: [b]}\n", "'b' is not one of the fields"),
        (BASE + "stale: {column: c, days: 3, every: 2}\n", "stale.every: unknown option"),
        (BASE + "format: {delimiter: '::'}\n", "format.delimiter: expected one character"),
        (BASE + "format: {encoding: klingon}\n", "format.encoding: unknown encoding"),
        (BASE + "format: {sheet: 2}\n", "format.sheet: unknown option"),
        (BASE + "missing_values: N/A\n", "missing_values: expected a list"),
    ],
)
def test_spec_errors_name_the_file_and_the_key(tmp_path, text, expected):
    assert expected in _spec_error(tmp_path, text)


def test_spec_format_options_are_accepted(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(
        BASE + "format: {delimiter: ';', quote_char: false, encoding: latin-1}\n",
        encoding="utf-8",
    )
    spec = load_spec(path)
    assert spec.format == {"delimiter": ";", "quote_char": False, "encoding": "latin-1"}
    assert spec.to_dict()["format"] == spec.format


def test_jsonl_mixed_encodings_and_bad_lines(tmp_path):
    content = (
        '{"id": "1", "url": "a.com", "city": "Zürich", "n": 5}\n'.encode()
        + '{"id": "2", "url": "b.com", "city": "Köln", "n": "6"}\n'.encode("cp1252")
        + b'{"id": "3", "url": \n'
        + b"\n"
        + b'{"id": "4", "url": ["c.com", "d.org"], "city": null, "n": 7.0}\n'
    )
    manifest, records, rejected = _load(_dataset(tmp_path, content, suffix="jsonl"), tmp_path)
    assert records["2"]["_data"]["city"] == "Köln" and records["2"]["_data"]["n"] == 6
    assert records["4"]["_urls"] == ["http://c.com/", "http://d.org/"]
    assert records["4"]["_data"]["n"] == 7 and records["4"]["_line"] == 5
    assert [(e["row"], e["line"], e["text"]) for e in rejected] == [(3, 3, '{"id": "3", "url": ')]
    assert manifest["profile"]["reading"]["decoded_lines"] == 1
    assert manifest["profile"]["reading"]["empty_rows"] == 1


def test_jsonl_without_the_id_key_is_a_clear_error(tmp_path):
    spec = _dataset(tmp_path, '{"key": "1", "url": "a.com"}\n', suffix="jsonl")
    with pytest.raises(DatasetError, match=r"the id column 'id' .* not in the table"):
        _load(spec, tmp_path)


def test_empty_jsonl_and_parquet(tmp_path):
    manifest, records, _ = _load(_dataset(tmp_path, b"", suffix="jsonl"), tmp_path)
    assert manifest["profile"]["rows"] == 0 and records == {}
    import pyarrow as pa

    table = pa.table({"id": pa.array([], pa.string()), "url": pa.array([], pa.string())})
    spec = _dataset(tmp_path, b"", suffix="parquet")
    pq.write_table(table, tmp_path / "t.parquet")
    manifest, records, _ = _load(spec, tmp_path)
    assert manifest["profile"]["rows"] == 0 and manifest["profile"]["new_columns"] == ["city", "n"]


def test_an_unreadable_table_is_a_clear_error_and_leaves_no_shards(tmp_path):
    spec = _dataset(tmp_path, b"PAR1 this is not parquet", suffix="parquet")
    with pytest.raises(DatasetError, match=r"t\.parquet: .*Parquet"):
        _load(spec, tmp_path)
    assert not list((tmp_path / "stage").rglob("shard=*.parquet"))


def test_a_quote_never_closed_quarantines_the_rest_of_the_file(tmp_path):
    content = 'id,url,city,n\n1,a.com,x,1\n2,b.com,"never closed,2\n3,c.com,y,3\n4,d.com,z,4\n'
    _, records, rejected = _load(_dataset(tmp_path, content), tmp_path)
    assert list(records) == ["1"]
    [entry] = rejected
    assert (entry["row"], entry["line"]) == (2, 3)
    assert "3,c.com,y,3\n4,d.com,z,4" in entry["text"]  # the swallowed lines are kept


def test_a_quote_never_closed_in_a_big_file_is_a_clear_error(tmp_path, monkeypatch):
    from enrich_crawl.dataset.read import delimited

    monkeypatch.setattr(delimited, "CSV_BLOCK", 1 << 16)
    rows = ["id,url,city,n"] + [f"{i},x{i}.com,city {i},{i}" for i in range(1, 20_000)]
    rows[5000] = '5000,a.com,"opened,1'
    spec = _dataset(tmp_path, "\n".join(rows) + "\n")
    with pytest.raises(DatasetError, match=r"t\.csv: CSV parse error after row \d+: .*quote"):
        _load(spec, tmp_path)
    assert not list((tmp_path / "stage").rglob("shard=*.parquet"))
    assert not list((tmp_path / "stage").rglob(".utf8-*"))
