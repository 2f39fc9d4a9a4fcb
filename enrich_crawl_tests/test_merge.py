"""The merge policy (docs/results.md, issue #8), with pymongo against a real MongoDB-wire server:
document shape and lineage, idempotent re-runs, refresh semantics, kept and superseded values,
bounded history, status/missing, insert races, indexes."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from enrich_crawl.store.merge import HISTORY_LIMIT, Merger, MergeStats, build_document
from enrich_crawl.store.mongo import RECORD_INDEXES, ensure_indexes

FIELDS: dict[str, dict[str, Any]] = {
    "city": {"type": "string"},
    "founded": {"type": "integer"},
    "last_release": {"type": "date", "refresh": True},
}
SPEC_LINEAGE_KEYS = {
    "value",
    "previous",
    "source_url",
    "mapping",
    "depth",
    "fetched_at",
    "http_status",
    "run_id",
    "partition",
}
T0 = dt.datetime(2025, 1, 1, tzinfo=dt.timezone.utc)


def at(days: float) -> str:
    return (T0 + dt.timedelta(days=days)).isoformat()


def winner(value: Any, *, day: float = 0, url: str = "https://acme.example/about", **extra):
    return {
        "value": value,
        "source_url": url,
        "mapping": extra.pop("mapping", "orgsite"),
        "depth": extra.pop("depth", 1),
        "fetched_at": at(day),
        "http_status": 200,
        "content_hash": "c0ffee" * 6,
        "rendered": False,
        "candidates": extra.pop("candidates", 1),
        "conflicts": extra.pop("conflicts", 0),
        **extra,
    }


def line(rid: str = "R1", *, data: dict | None = None, found: dict | None = None, **extra):
    row = {"org_id": rid, "name": f"org {rid}", "city": None, "founded": None}
    row["last_release"] = "2024-01-01"  # present, but refresh: re-resolved
    row.update(data or {})
    return {
        "record": rid,
        "row": extra.pop("row", 2),
        "data": row,
        "raw": extra.pop("raw", {}),
        "fields": found or {},
        "errors": extra.pop("errors", []),
        "pages": extra.pop("pages", 1),
        **extra,
    }


def merge(collection, lines, *, run_id="run-1", partition="s00", **kwargs) -> MergeStats:
    merger = Merger(collection, fields=FIELDS, run_id=run_id, **kwargs)
    return merger.merge(lines, partition=partition)


@pytest.fixture
def records(mongo_client, mongo_db_name):
    yield mongo_client[mongo_db_name]["orgs"]
    mongo_client.drop_database(mongo_db_name)


def test_document_has_the_spec_shape_with_lineage_and_content_hash(records):
    stats = merge(
        records,
        [
            line(
                "R1",
                data={"last_release": "2024-01-01"},
                raw={"city": "N/A", "name": " org  R1 "},
                found={"city": winner("Springfield"), "founded": winner(1998, depth=0)},
                errors=[{"url": "http://10.0.0.1/", "reason": "private_address"}],
                row=7,
            )
        ],
    )
    assert (stats.inserted, stats.fields_filled, stats.records) == (1, 2, 1)
    doc = records.find_one({"_id": "R1"})
    assert set(doc) >= {
        "_id",
        "data",
        "original",
        "lineage",
        "status",
        "missing",
        "errors",
        "updated_at",
    }
    assert doc["data"]["city"] == "Springfield" and doc["data"]["founded"] == 1998
    assert doc["data"]["last_release"] == "2024-01-01"  # no newer value found: kept
    for name in ("city", "founded"):
        entry = doc["lineage"][name]
        assert set(entry) >= SPEC_LINEAGE_KEYS | {"content_hash"}
        assert entry["value"] == doc["data"][name]
        assert entry["previous"] is None
        assert entry["run_id"] == "run-1" and entry["partition"] == "s00"
        assert entry["content_hash"] == "c0ffee" * 6
        assert isinstance(entry["fetched_at"], dt.datetime)
        assert [h["value"] for h in doc["history"][name]] == [entry["value"]]
    assert doc["lineage"]["founded"]["depth"] == 0
    assert "last_release" not in doc["lineage"]
    # the value before enrichment and the raw value normalisation changed are both kept
    assert doc["original"] == {"city": "N/A", "founded": None, "name": " org  R1 "}
    assert doc["status"] == "resolved" and doc["missing"] == []
    assert doc["errors"] == [{"url": "http://10.0.0.1/", "reason": "private_address"}]
    assert doc["source_hosts"] == ["acme.example"]
    assert doc["row"] == 7
    assert isinstance(doc["updated_at"], dt.datetime)


def test_rerun_is_idempotent_nothing_written_history_unchanged(records):
    lines = [
        line(
            f"R{i}",
            row=i,
            found={"city": winner(f"City {i}")} if i % 3 else {},
            errors=[] if i % 3 else [{"url": f"https://r{i}.example/", "reason": "http_404"}],
        )
        for i in range(120)
    ]
    first = merge(records, lines, batch_size=50)
    assert first.inserted == 120 and first.unchanged == 0
    before = {d["_id"]: d for d in records.find()}

    # the merge re-run alone (same staged file, another run) and a re-crawl that found the same
    # values later: nothing changes, nothing is written, no history entry is added
    again = merge(records, lines, run_id="run-2", batch_size=50)
    recrawled = [
        {**ln, "fields": {n: {**w, "fetched_at": at(30)} for n, w in ln["fields"].items()}}
        for ln in lines
    ]
    third = merge(records, recrawled, run_id="run-3", batch_size=50)
    for stats in (again, third):
        assert (stats.records, stats.unchanged, stats.written) == (120, 120, 0)
    after = {d["_id"]: d for d in records.find()}
    assert records.count_documents({}) == 120
    assert after == before  # values, history lengths and entries, even updated_at
    assert {k: len(d["history"].get("city", [])) for k, d in after.items()} == {
        k: len(d["history"].get("city", [])) for k, d in before.items()
    }


def test_present_field_not_refresh_is_never_overwritten(records):
    merge(records, [line(data={"city": "Paris"}, found={"city": winner("Lyon", day=9)})])
    doc = records.find_one({"_id": "R1"})
    assert doc["data"]["city"] == "Paris"
    assert "city" not in doc["lineage"] and "city" not in doc.get("history", {})


def test_refresh_field_replaced_only_by_a_newer_different_value(records):
    stale = {"last_release": "2024-01-01"}

    def release(run: str, value: str, day: float) -> dict:
        merge(
            records, [line(data=stale, found={"last_release": winner(value, day=day)})], run_id=run
        )
        return records.find_one({"_id": "R1"})

    doc = release("run-1", "2025-03-03", day=10)
    entry = doc["lineage"]["last_release"]
    assert doc["data"]["last_release"] == entry["value"] == "2025-03-03"
    assert entry["previous"] == "2024-01-01"
    assert doc["original"]["last_release"] == "2024-01-01"

    # the merge re-run alone: the table's stale value does not come back
    doc = release("run-2", "2025-03-03", day=10)
    assert doc["data"]["last_release"] == "2025-03-03"
    assert doc["lineage"]["last_release"]["run_id"] == "run-1"

    # a newer, different value replaces it; previous is the value it replaced, original the first
    doc = release("run-3", "2025-06-01", day=20)
    entry = doc["lineage"]["last_release"]
    assert (entry["value"], entry["previous"], entry["run_id"]) == (
        "2025-06-01",
        "2025-03-03",
        "run-3",
    )
    assert doc["original"]["last_release"] == "2024-01-01"
    assert [h["value"] for h in doc["history"]["last_release"]] == ["2025-03-03", "2025-06-01"]

    # an older value (an old partition's staged results merged late) does not win
    doc = release("run-4", "2024-12-01", day=15)
    assert doc["data"]["last_release"] == "2025-06-01"
    # the same value fetched again later: nothing changes, no history entry
    doc = release("run-5", "2025-06-01", day=40)
    assert doc["lineage"]["last_release"]["run_id"] == "run-3"
    assert len(doc["history"]["last_release"]) == 2


def test_value_found_earlier_is_kept_when_a_run_finds_nothing(records):
    merge(records, [line(found={"city": winner("Springfield")})], run_id="run-1")
    stats = merge(records, [line(found={})], run_id="run-2")
    doc = records.find_one({"_id": "R1"})
    assert doc["data"]["city"] == "Springfield"
    assert doc["lineage"]["city"]["run_id"] == "run-1"
    assert stats.unchanged == 1 and stats.fields_kept == 1
    # a different value found later replaces it (a missing field is not locked)
    merge(records, [line(found={"city": winner("Shelbyville", day=5)})], run_id="run-3")
    doc = records.find_one({"_id": "R1"})
    assert doc["lineage"]["city"]["previous"] == "Springfield"
    assert doc["data"]["city"] == "Shelbyville"


def test_dataset_value_supersedes_an_earlier_enrichment(records):
    merge(records, [line(found={"city": winner("Springfield")})], run_id="run-1")
    stats = merge(records, [line(data={"city": "Paris"})], run_id="run-2")
    doc = records.find_one({"_id": "R1"})
    assert stats.fields_superseded == 1 and stats.updated == 1
    assert doc["data"]["city"] == "Paris" and "city" not in doc["lineage"]
    assert [h["value"] for h in doc["history"]["city"]] == ["Springfield"]  # the audit trail stays
    # the table loses the value again and the crawl finds the same one: filled, no new history
    merge(records, [line(found={"city": winner("Springfield", day=3)})], run_id="run-3")
    doc = records.find_one({"_id": "R1"})
    assert doc["data"]["city"] == "Springfield" and doc["lineage"]["city"]["run_id"] == "run-3"
    assert [h["value"] for h in doc["history"]["city"]] == ["Springfield"]


def test_history_is_bounded_and_appended_only_on_change(records):
    values = ["A", "B", "B", "C", "D", "E", "F", "G"]
    for day, value in enumerate(values):
        merge(records, [line(found={"city": winner(value, day=day)})], run_id=f"run-{day}")
    doc = records.find_one({"_id": "R1"})
    history = doc["history"]["city"]
    assert len(history) == HISTORY_LIMIT
    assert [h["value"] for h in history] == ["C", "D", "E", "F", "G"]
    assert [h["run_id"] for h in history] == ["run-3", "run-4", "run-5", "run-6", "run-7"]
    assert doc["lineage"]["city"]["previous"] == "F"


def test_status_and_missing_are_recomputed(records):
    merge(
        records,
        [
            line("ALL", found={"city": winner("X"), "founded": winner(1990)}),
            line("SOME", found={"city": winner("Y")}),
            line("NONE", errors=[{"url": "https://none.example/", "reason": "timeout"}]),
            line("FULL", data={"city": "Z", "founded": 1950}),
        ],
    )
    docs = {d["_id"]: d for d in records.find()}
    assert {k: (d["status"], d["missing"]) for k, d in docs.items()} == {
        "ALL": ("resolved", []),
        "SOME": ("partial", ["founded"]),
        "NONE": ("unresolved", ["city", "founded"]),
        "FULL": ("resolved", []),
    }
    assert docs["NONE"]["errors"][0]["reason"] == "timeout"
    # a later run fills the rest; its errors replace the earlier run's
    merge(records, [line("SOME", found={"founded": winner(2001)})], run_id="run-2")
    merge(records, [line("NONE", found={"city": winner("Q")})], run_id="run-2")
    docs = {d["_id"]: d for d in records.find()}
    assert (docs["SOME"]["status"], docs["SOME"]["missing"]) == ("resolved", [])
    assert (docs["NONE"]["status"], docs["NONE"]["missing"]) == ("partial", ["founded"])
    assert docs["NONE"]["errors"] == []


def test_conflict_counts_and_losing_values_reach_the_lineage(records):
    found = winner(
        "Springfield",
        candidates=3,
        conflicts=2,
        alternatives=[{"value": "Shelbyville", "source_url": "https://dir.example/", "depth": 1}],
    )
    stats = merge(records, [line(found={"city": found})])
    entry = records.find_one({"_id": "R1"})["lineage"]["city"]
    assert stats.conflicts == 2
    assert (entry["candidates"], entry["conflicts"]) == (3, 2)
    assert entry["alternatives"][0]["value"] == "Shelbyville"


def test_insert_race_is_merged_not_overwritten(records):
    # this merger saw an empty collection, so it plans plain inserts ...
    late = Merger(records, fields=FIELDS, run_id="run-late")
    assert late.fresh
    # ... but another run writes the record first
    merge(records, [line(found={"city": winner("Springfield", day=1)})], run_id="run-early")
    stats = late.merge([line(found={"city": winner("Shelbyville", day=2)})], partition="s00")
    assert stats.races == 1 and stats.updated == 1
    doc = records.find_one({"_id": "R1"})
    assert records.count_documents({}) == 1
    assert [h["value"] for h in doc["history"]["city"]] == ["Springfield", "Shelbyville"]
    assert doc["lineage"]["city"]["previous"] == "Springfield"


def test_duplicate_lines_first_wins(records):
    stats = merge(
        records, [line(found={"city": winner("First")}), line(found={"city": winner("Second")})]
    )
    assert stats.duplicate_lines == 1 and records.count_documents({}) == 1
    assert records.find_one({"_id": "R1"})["data"]["city"] == "First"


def test_build_document_without_server_reports_changes():
    doc, changed, changes = build_document(
        line(found={"city": winner("X")}),
        None,
        fields=FIELDS,
        run_id="r",
        partition="s00",
        now=T0,
    )
    assert changed and changes.filled == ["city"] and doc["status"] == "partial"
    again, changed, _ = build_document(
        line(found={"city": winner("X")}), doc, fields=FIELDS, run_id="r2", partition="s01", now=T0
    )
    assert not changed and again["lineage"] == doc["lineage"]


def test_indexes_are_created_once_matched_by_keys(records):
    records.insert_one({"_id": "x"})
    created = ensure_indexes(records)
    assert sorted(created) == sorted(name for name, _ in RECORD_INDEXES)
    assert ensure_indexes(records) == []
    keys = {tuple(info["key"]) for info in records.index_information().values()}
    for _, spec in RECORD_INDEXES:
        assert tuple(spec) in keys
