"""The enriched dataset back to a table: CSV that the dataset loader reads back to the same values,
typed Parquet, lineage columns optional; the `enrich-crawl export` command and the export asset."""

from __future__ import annotations

import csv

import dagster as dg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from enrich_crawl.dataset.load import prepare_dataset, read_seed_shard
from enrich_crawl.dataset.spec import load_spec
from enrich_crawl.defs.export import enriched_export
from enrich_crawl.defs.resources import DatasetResource, MongoResource, StagingResource
from enrich_crawl.export import export_dataset
from enrich_crawl.staging import DatasetStage
from enrich_crawl.store.merge import Merger
from enrich_crawl_tests.conftest import REPO, product_env, run_cli
from enrich_crawl_tests.test_merge import winner

SPEC = """\
name: export_orgs
source: {source}
id: org_id
urls: [website]
fields:
  city: {{}}
  founded: {{type: integer}}
  tags: {{type: list}}
  open_source: {{type: boolean}}
  last_release: {{type: date, refresh: true}}
"""
TYPES = {
    "city": "string",
    "founded": "integer",
    "tags": "list",
    "open_source": "boolean",
    "last_release": "date",
}


def _line(rid: str, row: int, data: dict, found: dict) -> dict:
    base = {"org_id": rid, "website": f"https://{rid.lower()}.example/", "name": f"Org {rid}"}
    base.update({name: None for name in TYPES})
    base["last_release"] = "2024-01-01"
    base.update(data)
    return {"record": rid, "row": row, "data": base, "raw": {}, "fields": found, "errors": []}


@pytest.fixture
def merged(mongo_client, mongo_db_name):
    collection = mongo_client[mongo_db_name]["export_orgs"]
    lines = [
        # staged in another order than the table's: the export follows the table (row)
        _line("R3", 4, {"city": "Paris"}, {}),
        _line(
            "R1",
            2,
            {"open_source": True},
            {
                "city": winner("Zürich, Altstadt"),
                "founded": winner(1952),
                "tags": winner(["coffee", "roastery"]),
                "last_release": winner("2025-03-03"),
            },
        ),
        _line("R2", 3, {"founded": 2001}, {"open_source": winner(False)}),
    ]
    fields = {name: {"type": t, "refresh": name == "last_release"} for name, t in TYPES.items()}
    Merger(collection, fields=fields, run_id="run-1").merge(lines, partition="s00")
    yield collection
    mongo_client.drop_database(mongo_db_name)


def test_csv_round_trips_through_the_dataset_loader(merged, tmp_path):
    out = tmp_path / "orgs.enriched.csv"
    result = export_dataset(merged, out, field_types=TYPES)
    assert result.rows == 3 and result.format == "csv"
    with open(out, encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [r["org_id"] for r in rows] == ["R1", "R2", "R3"]
    assert list(rows[0]) == ["org_id", "website", "name", *TYPES]
    assert rows[0]["tags"] == "coffee; roastery" and rows[0]["open_source"] == "true"
    assert rows[2]["founded"] == "" and not any(c.startswith("_") for c in rows[0])

    # the exported table is a dataset again, with the same values
    (tmp_path / "again.yaml").write_text(SPEC.format(source=out.name), encoding="utf-8")
    spec = load_spec(tmp_path / "again.yaml")
    stage = DatasetStage(tmp_path / "work", "export_orgs")
    prepare_dataset(spec, stage, ["s00"])
    reloaded = {r["_id"]: r["_data"] for r in read_seed_shard(stage.seed_shard("s00"))}
    for doc in merged.find():
        assert reloaded[doc["_id"]] == doc["data"]


def test_parquet_with_lineage_is_typed(merged, tmp_path):
    out = tmp_path / "orgs.parquet"
    result = export_dataset(merged, out, field_types=TYPES, lineage=True)
    table = pq.read_table(out)
    assert table.num_rows == result.rows == 3
    schema = table.schema
    assert schema.field("founded").type == pa.int64()
    assert schema.field("open_source").type == pa.bool_()
    assert schema.field("tags").type == pa.list_(pa.string())
    assert schema.field("last_release").type == pa.date32()
    assert schema.field("city__fetched_at").type == pa.timestamp("ms", tz="UTC")
    assert schema.field("founded__depth").type == pa.int64()
    assert schema.field("_missing").type == pa.list_(pa.string())
    rows = table.to_pylist()
    first = rows[0]
    assert first["org_id"] == "R1" and first["_status"] == "resolved"
    assert first["city__source_url"] == "https://acme.example/about"
    assert first["city__run_id"] == "run-1" and first["city__partition"] == "s00"
    assert first["city__content_hash"] == "c0ffee" * 6
    assert first["last_release__previous"].isoformat() == "2024-01-01"
    assert rows[2]["_status"] == "unresolved" and rows[2]["city__source_url"] is None
    assert set(rows[2]["_missing"]) == {"founded", "tags", "open_source"}


def test_status_filter(merged, tmp_path):
    result = export_dataset(
        merged, tmp_path / "x.jsonl", field_types=TYPES, statuses=["unresolved"]
    )
    assert result.rows == 1 and result.status == {"unresolved": 1}


def test_export_command(merged, mongo_server, tmp_path):
    (tmp_path / "orgs.csv").write_text("org_id,website\n", encoding="utf-8")
    (tmp_path / "orgs.yaml").write_text(SPEC.format(source="orgs.csv"), encoding="utf-8")
    env = product_env(
        MONGODB_URI=mongo_server.uri,
        MONGODB_DB=merged.database.name,
        DAGSTER_HOME=str(tmp_path / "home"),
    )
    out = tmp_path / "out.parquet"
    done = run_cli(
        ["export", "--dataset", str(tmp_path / "orgs.yaml"), "--out", str(out), "--lineage"],
        env,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    assert "wrote 3 records" in done.stdout and str(out) in done.stdout
    assert "city__source_url" in pq.read_schema(out).names

    empty = product_env(
        MONGODB_URI=mongo_server.uri, MONGODB_DB="nothing_here", DAGSTER_HOME=str(tmp_path / "h")
    )
    done = run_cli(["export", "--dataset", str(tmp_path / "orgs.yaml")], empty, cwd=tmp_path)
    assert done.returncode == 1 and "run the job first" in done.stderr


def test_export_asset(merged, mongo_server, tmp_path):
    (tmp_path / "orgs.csv").write_text("org_id,website\n", encoding="utf-8")
    (tmp_path / "orgs.yaml").write_text(SPEC.format(source="orgs.csv"), encoding="utf-8")
    result = dg.materialize(
        [enriched_export],
        resources={
            "dataset": DatasetResource(spec=str(tmp_path / "orgs.yaml")),
            "staging": StagingResource(root=str(tmp_path / "work")),
            "mongo": MongoResource(uri=mongo_server.uri, database=merged.database.name),
        },
        run_config={"ops": {"enriched_export": {"config": {"format": "csv", "lineage": True}}}},
    )
    assert result.success
    metadata = result.asset_materializations_for_node("enriched_export")[0].metadata
    path = metadata["path"].value
    assert path.endswith("work/export_orgs/export/export_orgs.csv")
    assert metadata["rows"].value == 3
    with open(path, encoding="utf-8") as handle:
        assert "city__mapping" in handle.readline()
