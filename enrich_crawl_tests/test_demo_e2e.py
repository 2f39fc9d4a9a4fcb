"""The walking skeleton end to end: `enrich-crawl run` on the bundled demo, through Dagster, the
crawl worker processes, the demo's virtual web and a real MongoDB-wire server."""

from __future__ import annotations

import dagster as dg

from enrich_crawl.demo import DEMO_SPEC
from enrich_crawl.demo.check import compare, expected
from enrich_crawl_tests.conftest import REPO, product_env, run_cli


def _documents(client, db):
    return {d["_id"]: d for d in client[db]["demo_orgs"].find()}


def test_demo_run_matches_ground_truth_and_is_idempotent(
    mongo_server, mongo_client, mongo_db_name, dagster_home, tmp_path
):
    env = product_env(
        MONGODB_URI=mongo_server.uri,
        MONGODB_DB=mongo_db_name,
        DAGSTER_HOME=str(dagster_home),
        ENRICH_SHARDS="3",
    )
    first = run_cli(["run", "--dataset", str(DEMO_SPEC)], env, cwd=REPO)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "enrich_job succeeded" in first.stdout
    for label in (
        "records",
        "fields resolved",
        "pages fetched",
        "pages/resolved",
        "errors by kind",
        "time",
    ):
        assert label in first.stdout, f"summary lacks {label!r}:\n{first.stdout}"

    docs = _documents(mongo_client, mongo_db_name)
    problems = compare(docs)
    assert not problems, "\n".join(problems)

    # every value the crawl filled carries its lineage (docs/results.md)
    filled = 0
    for doc in docs.values():
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
        for name, entry in doc["lineage"].items():
            filled += 1
            assert doc["data"][name] == entry["value"]
            for key in (
                "value",
                "previous",
                "source_url",
                "mapping",
                "depth",
                "fetched_at",
                "http_status",
                "run_id",
                "partition",
            ):
                assert key in entry, f"{doc['_id']}.lineage.{name} lacks {key}"
            assert entry["partition"] in ("s0", "s1", "s2", "s00", "s01", "s02")
            assert entry["source_url"].startswith("http")
    assert filled > 200
    unresolved = [d for d in docs.values() if d["status"] == "unresolved"]
    assert unresolved and all(d["errors"] for d in unresolved)

    # re-running never duplicates a document or a history entry
    history = {rid: {k: len(v) for k, v in d.get("history", {}).items()} for rid, d in docs.items()}
    second = run_cli(["run", "--dataset", str(DEMO_SPEC)], env, cwd=REPO)
    assert second.returncode == 0, second.stdout + second.stderr
    again = _documents(mongo_client, mongo_db_name)
    assert len(again) == len(docs) == len(expected()["records"])
    assert {
        rid: {k: len(v) for k, v in d.get("history", {}).items()} for rid, d in again.items()
    } == history
    assert not compare(again)

    # both runs are in the instance
    with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
        runs = instance.get_runs()
        assert len(runs) == 2
        assert all(run.status == dg.DagsterRunStatus.SUCCESS for run in runs)
        assert {run.job_name for run in runs} == {"enrich_job"}
