"""Orchestration: shard partitions, the wiring of enrich_job (pool, retries, checks), the shards
dealt out into crawl processes, per-run time budgets, and a shard whose crawl keeps failing while
the other shards' results are still merged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid

import dagster as dg
import pytest

from enrich_crawl import config
from enrich_crawl.dataset.shard import (
    crawl_groups,
    group_key,
    registrable_domain,
    shard_for_urls,
    shard_keys,
)
from enrich_crawl.defs.crawl_ops import MIN_CRAWL_SECONDS, crawl_budget
from enrich_crawl.defs.partitions import SHARD_KEYS, shards_of_run
from enrich_crawl.defs.resources import CrawlerResource
from enrich_crawl.testing.politeweb import build_polite_dataset
from enrich_crawl.testing.processes import crawl_workers
from enrich_crawl_tests.conftest import REPO, product_env, run_cli, start_cli_run

# -- partition mapping -------------------------------------------------------------------------


def test_same_registrable_domain_same_partition():
    keys = shard_keys(8)
    a = shard_for_urls(["https://www.docs.python.org/3/library/os.html"], keys)
    b = shard_for_urls(["http://python.org/about/", "https://other.example/"], keys)
    c = shard_for_urls(["https://bugs.PYTHON.org:8443/issue1"], keys)
    assert registrable_domain("www.docs.python.org") == "python.org"
    assert a == b == c
    # the first URL decides: a record is crawled where its site's other records are
    assert shard_for_urls(["https://other.example/", "https://python.org/"], keys) == (
        shard_for_urls(["http://www.other.example/x"], keys)
    )


def test_partition_of_a_domain_is_stable_across_processes_and_hash_seeds():
    urls = [f"http://www.site{i}.co.uk/page" for i in range(200)]
    here = [shard_for_urls([u], shard_keys(16)) for u in urls]
    assert len(set(here)) > 8, "the hash should spread domains over the shards"
    code = (
        "import json, sys; from enrich_crawl.dataset.shard import shard_for_urls, shard_keys; "
        "urls = json.loads(sys.argv[1]); "
        "print(json.dumps([shard_for_urls([u], shard_keys(16)) for u in urls]))"
    )
    for seed in ("1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", code, json.dumps(urls)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert json.loads(out) == here


def test_shard_count_follows_enrich_shards():
    code = "from enrich_crawl.defs.partitions import SHARD_KEYS; print(','.join(SHARD_KEYS))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "ENRICH_SHARDS": "16"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert out.split(",") == [f"s{i:02d}" for i in range(16)]


def test_shards_of_run_from_partition_tags():
    assert shards_of_run({"dagster/partition": SHARD_KEYS[-1]}) == [SHARD_KEYS[-1]]
    assert shards_of_run({}) == SHARD_KEYS
    ranged = {
        "dagster/asset_partition_range_start": SHARD_KEYS[0],
        "dagster/asset_partition_range_end": SHARD_KEYS[1],
    }
    assert shards_of_run(ranged) == SHARD_KEYS[:2]


# -- crawl processes ---------------------------------------------------------------------------


def test_shards_are_dealt_out_into_crawl_processes_as_evenly_as_can_be():
    keys = shard_keys(8)
    assert crawl_groups(keys, 2) == [keys[:4], keys[4:]]
    assert crawl_groups(keys, 3) == [keys[:3], keys[3:6], keys[6:]]
    assert crawl_groups(keys, 8) == [[k] for k in keys] == crawl_groups(keys, 50)
    assert crawl_groups(keys[:1], 4) == [keys[:1]]
    for n in range(1, 10):  # every shard once, in order, none empty
        groups = crawl_groups(keys, n)
        assert [k for g in groups for k in g] == keys and all(groups)
    assert group_key(["s03"]) == "s03" and group_key(keys[:4]) == "s00_s03"


def test_crawl_processes_default_to_the_cores_and_to_one_per_shard_with_celery(monkeypatch):
    monkeypatch.delenv("ENRICH_CRAWL_PROCESSES", raising=False)
    monkeypatch.delenv("ENRICH_EXECUTOR", raising=False)
    cores = os.cpu_count() or 1
    assert config.crawl_processes(64) == min(cores, 64)
    assert config.crawl_processes(1) == 1
    monkeypatch.setenv("ENRICH_EXECUTOR", "celery")
    assert config.crawl_processes(8) == 8
    monkeypatch.setenv("ENRICH_CRAWL_PROCESSES", "3")
    assert config.crawl_processes(8) == 3 and config.crawl_processes(2) == 2
    monkeypatch.setenv("ENRICH_CRAWL_PROCESSES", "0")
    assert config.crawl_processes(8) == 8
    for bad in ("-1", "two"):
        monkeypatch.setenv("ENRICH_CRAWL_PROCESSES", bad)
        with pytest.raises(ValueError, match="ENRICH_CRAWL_PROCESSES"):
            config.crawl_processes(8)
    # the resource's field wins over the environment
    assert CrawlerResource(crawl_processes=2).processes_for(8) == 2
    assert CrawlerResource(crawl_processes=0).processes_for(8) == 8
    with pytest.raises(ValueError, match="crawl processes"):
        CrawlerResource(crawl_processes=-2).processes_for(8)


# -- wiring ------------------------------------------------------------------------------------


def test_enrich_job_crawl_steps_are_pooled_retried_and_checked():
    from enrich_crawl.definitions import defs

    job = defs.resolve_job_def("enrich_job")
    crawl = job.graph.node_dict["crawl_results"].definition.node_dict["crawl_shard"].definition
    assert crawl.pool == "crawl"
    assert crawl.retry_policy is not None and crawl.retry_policy.max_retries >= 1
    checks = {key.name for key in job.asset_layer.asset_graph.asset_check_keys}
    assert {
        "seed_profile",
        "seed_data_quality",
        "every_shard_crawled",
        "no_robots_violations",
        "resolution_rate",
        "documents_match_records",
        "values_have_lineage",
    } <= checks
    assert defs.resolve_job_def("register_datasets").partitions_def.name == "datasets"


def test_crawl_budget_is_the_tighter_of_partition_and_run():
    assert crawl_budget(None, None, 0.0, 100.0) is None
    assert crawl_budget(300.0, None, 0.0, 100.0) == 300.0
    assert crawl_budget(None, 600.0, 1000.0, 1100.0) == 500.0
    assert crawl_budget(60.0, 600.0, 1000.0, 1100.0) == 60.0
    # a shard that starts after the run's budget is spent still ends cleanly, with its reasons
    assert crawl_budget(None, 600.0, 1000.0, 2000.0) == MIN_CRAWL_SECONDS


# -- runs --------------------------------------------------------------------------------------


def _documents(mongo_client, db, name):
    return {d["_id"]: d for d in mongo_client[db][name].find()}


@pytest.mark.slow
def test_run_time_budget_stops_the_crawl_cleanly_and_merges_what_it_found(
    mongo_server, mongo_client, mongo_db_name, dagster_home, tmp_path
):
    name = f"budget_{uuid.uuid4().hex[:6]}"
    built = build_polite_dataset(
        tmp_path / "polite", shards=2, records_per_host=60, crawl_delay=1.0, name=name
    )
    budget = 30
    env = product_env(
        MONGODB_URI=mongo_server.uri,
        MONGODB_DB=mongo_db_name,
        DAGSTER_HOME=str(dagster_home),
        ENRICH_WORK_DIR=str(tmp_path / "work"),
        ENRICH_SHARDS="2",
        ENRICH_RUN_TIME_BUDGET=str(budget),
    )
    started = time.monotonic()
    result = run_cli(
        ["run", "--dataset", str(built.spec), "--mappings", str(built.mappings)], env, cwd=REPO
    )
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stdout + result.stderr
    # unbudgeted, each shard's crawl needs 60 pages at 1 s each
    docs = _documents(mongo_client, mongo_db_name, name)
    assert set(docs) == set(built.expected), "every record is merged, crawled or not"
    resolved = {rid: d["data"]["city"] for rid, d in docs.items() if d["data"].get("city")}
    assert resolved, "what the crawl found before the budget ran out is merged"
    assert all(built.expected[rid] == city for rid, city in resolved.items())
    stopped = [d for d in docs.values() if d["status"] == "unresolved"]
    assert stopped, f"the budget should have stopped the crawls (run took {elapsed:.0f} s)"
    assert all(any(e["reason"] == "closespider_timeout" for e in d["errors"]) for d in stopped), (
        "records the budget cut off say so"
    )
    for key in ("s00", "s01"):
        stats = json.loads((tmp_path / "work" / name / "crawl" / key / "stats.json").read_text())
        assert stats["finish_reason"] == "closespider_timeout"
    with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
        (run,) = instance.get_runs(limit=1)
        assert run.status == dg.DagsterRunStatus.SUCCESS


@pytest.mark.slow
def test_four_shards_in_two_crawl_processes_keep_their_own_partitions_and_lineage(
    mongo_server, mongo_client, mongo_db_name, dagster_home, tmp_path
):
    """ENRICH_CRAWL_PROCESSES=2 with 4 shards: two crawl steps of two shards each, one crawl
    process per step; every shard is still its own partition (materialisation, statistics,
    lineage) and the run's checks pass."""
    name = f"grouped_{uuid.uuid4().hex[:6]}"
    built = build_polite_dataset(
        tmp_path / "polite", shards=4, records_per_host=3, crawl_delay=0.2, name=name
    )
    env = product_env(
        MONGODB_URI=mongo_server.uri,
        MONGODB_DB=mongo_db_name,
        DAGSTER_HOME=str(dagster_home),
        ENRICH_WORK_DIR=str(tmp_path / "work"),
        ENRICH_SHARDS="4",
        ENRICH_CRAWL_PROCESSES="2",
    )
    result = run_cli(
        ["run", "--dataset", str(built.spec), "--mappings", str(built.mappings)], env, cwd=REPO
    )
    assert result.returncode == 0, result.stdout + result.stderr
    docs = _documents(mongo_client, mongo_db_name, name)
    assert set(docs) == set(built.expected)
    for shard, hosts in built.hosts_by_shard.items():
        for rid in (f"{host.split('.')[0]}-{n:03d}" for host in hosts for n in range(3)):
            assert docs[rid]["data"]["city"] == built.expected[rid]
            assert docs[rid]["lineage"]["city"]["partition"] == shard, rid
    for shard in ("s00", "s01", "s02", "s03"):
        stats = json.loads((tmp_path / "work" / name / "crawl" / shard / "stats.json").read_text())
        assert stats["partition"] == shard and stats["finish_reason"] == "finished"
    with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
        (run,) = instance.get_runs(limit=1)
        assert run.status == dg.DagsterRunStatus.SUCCESS
        started = {
            e.step_key
            for e in instance.all_logs(run.run_id, of_type=dg.DagsterEventType.STEP_START)
            if e.step_key and ".crawl_shard[" in e.step_key
        }
        assert started == {
            "crawl_results.crawl_shard[s00_s01]",
            "crawl_results.crawl_shard[s02_s03]",
        }
        crawl = {
            e.partition_key: e.asset_materialization.metadata
            for e in instance.fetch_materializations(dg.AssetKey("crawl_results"), limit=10).records
        }
        assert set(crawl) == {"s00", "s01", "s02", "s03"}
        assert all(m["crawl_failed"].value == 0 and m["pages"].value > 0 for m in crawl.values())
        verdict = {
            e.dagster_event.event_specific_data.check_name: e.dagster_event.event_specific_data.passed
            for e in instance.all_logs(
                run.run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION
            )
        }
        assert verdict["every_shard_crawled"] and verdict["no_robots_violations"]
        # one crawl process per step, crawling both of its shards
        launched = [
            e.user_message
            for e in instance.all_logs(run.run_id)
            if "started (pid" in (e.user_message or "")
        ]
    assert sorted(m.split(" started")[0] for m in launched) == [
        "crawl of shards s00, s01",
        "crawl of shards s02, s03",
    ], launched


@pytest.mark.slow
def test_a_shard_that_keeps_failing_does_not_lose_the_other_shards(
    mongo_server, mongo_client, mongo_db_name, dagster_home, tmp_path
):
    """The crawl of s01 is killed at every attempt: its step gives up after its retries, s00 is
    still resolved and merged in the same run, and the run fails naming s01."""
    name = f"tolerant_{uuid.uuid4().hex[:6]}"
    built = build_polite_dataset(
        tmp_path / "polite", shards=2, records_per_host=6, crawl_delay=0.5, name=name
    )
    env = product_env(
        MONGODB_URI=mongo_server.uri,
        MONGODB_DB=mongo_db_name,
        DAGSTER_HOME=str(dagster_home),
        ENRICH_WORK_DIR=str(tmp_path / "work"),
        ENRICH_SHARDS="2",
        ENRICH_CRAWL_PROCESSES="0",  # one process per shard, whatever the cores: s01 is killed
        ENRICH_CRAWL_RETRIES="1",
        ENRICH_CRAWL_RETRY_DELAY="1",
    )
    process = start_cli_run(built, env, merge_stderr=False)
    killed: set[int] = set()
    stop = threading.Event()

    def kill_s01() -> None:
        while not stop.is_set():
            for worker in crawl_workers():
                ours = worker.dataset == name and worker.partition == "s01"
                if ours and worker.process.pid not in killed:
                    killed.add(worker.process.pid)
                    worker.process.kill()
            time.sleep(0.2)

    killer = threading.Thread(target=kill_s01, daemon=True)
    killer.start()
    try:
        out, err = process.communicate(timeout=480)
    finally:
        stop.set()
        killer.join(timeout=5)
        if process.poll() is None:
            process.kill()
    assert process.returncode != 0, out + err
    assert len(killed) == 2, f"one crawl per attempt (1 retry), killed {len(killed)}"
    assert "every_shard_crawled" in out + err and "s01" in out + err

    docs = _documents(mongo_client, mongo_db_name, name)
    s00 = {
        f"{host.split('.')[0]}-{n:03d}" for host in built.hosts_by_shard["s00"] for n in range(6)
    }
    assert s00 <= set(docs), "the healthy shard was merged in the same run"
    assert all(docs[rid]["data"]["city"] == built.expected[rid] for rid in s00)
    assert all(docs[rid]["lineage"]["city"]["partition"] == "s00" for rid in s00)

    with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
        (run,) = instance.get_runs(limit=1)
        assert run.status == dg.DagsterRunStatus.FAILURE
        crawl = {
            e.partition_key: e.asset_materialization.metadata
            for e in instance.fetch_materializations(dg.AssetKey("crawl_results"), limit=10).records
        }
        assert crawl["s00"]["crawl_failed"].value == 0
        assert crawl["s01"]["crawl_failed"].value == 1
        evaluations = [
            e.dagster_event.event_specific_data
            for e in instance.all_logs(
                run.run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION
            )
        ]
        verdict = {e.check_name: e.passed for e in evaluations}
        assert verdict["every_shard_crawled"] is False
        merged = instance.fetch_materializations(dg.AssetKey("enriched_records"), limit=10)
        assert {r.partition_key for r in merged.records} >= {"s00"}
