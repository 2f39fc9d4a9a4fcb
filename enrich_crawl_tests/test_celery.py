"""Several machines: enrich_job on dagster-celery, Redis as the broker, two Celery worker processes
sharing one PostgreSQL-backed Dagster instance and one staging area. The crawl steps run on both
workers, and the results in MongoDB are the same as those of a local (multiprocess) run. The local
run is `dagster job execute` of the bundled demo on the production instance configuration
(dagster.yaml: dagster-postgres) against a real PostgreSQL."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import psutil
import pytest
import yaml

from enrich_crawl_tests.conftest import REPO, product_env

pytestmark = pytest.mark.slow

# When two pages of equal rank (mapping priority, depth) give the same value, which of them the
# lineage names depends on which was fetched last (enrich_crawl.resolve): that differs between any
# two runs, local or not, so the source of a value is not compared; the value and the partition are.
LINEAGE_KEYS = ("value", "partition")


def comparable(doc: dict) -> dict:
    """A document without what differs between two runs of the same crawl (times, run ids, which
    of several equal pages is named as the source)."""
    return {
        "data": doc["data"],
        "status": doc["status"],
        "missing": sorted(doc["missing"]),
        "errors": sorted((e["url"], e["reason"]) for e in doc["errors"]),
        "lineage": {
            name: {k: entry.get(k) for k in LINEAGE_KEYS}
            for name, entry in sorted(doc["lineage"].items())
        },
    }


def _execute(env: dict, cwd: Path, config: Path | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "dagster", "job", "execute"]
    command += ["-m", "enrich_crawl.definitions", "-j", "enrich_job"]
    if config is not None:
        command += ["-c", str(config)]
    return subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=900)


def _start_worker(name: str, config: Path, env: dict, log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen(
            [
                # the one installed beside this Python (a venv's bin is not always on PATH)
                str(Path(sys.executable).parent / "dagster-celery"),
                "worker",
                "start",
                "-A",
                "dagster_celery.app",
                "-y",
                str(config),
                "-n",
                name,
                "--",
                "--concurrency=1",
                "--without-gossip",
                "--without-mingle",
            ],
            env=env,
            cwd=str(log.parent),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _stop(process: subprocess.Popen) -> None:
    """The worker's whole process group, by its id: TERM (warm shutdown), then KILL."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=20)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=10)


def _wait_ready(log: Path, process: subprocess.Popen, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, f"celery worker exited:\n{log.read_text()[-3000:]}"
        if " ready." in log.read_text(errors="replace"):
            return
        time.sleep(0.5)
    raise AssertionError(f"celery worker not ready in {timeout:.0f} s:\n{log.read_text()[-3000:]}")


def _tree_pids(process: subprocess.Popen) -> set[int]:
    try:
        root = psutil.Process(process.pid)
        return {root.pid, *(p.pid for p in root.children(recursive=True))}
    except psutil.Error:
        return set()


def test_enrich_job_on_two_celery_workers_matches_a_local_run(
    postgres_server, redis_server, mongo_server, mongo_client, tmp_path, monkeypatch
):
    shards = "4"
    # -- the local run: multiprocess executor, its own staging and database, on the production
    # instance configuration (the repository's dagster.yaml: dagster-postgres) against a real
    # PostgreSQL; ENRICH_DATASET unset: enrich_job runs the bundled demo dataset
    local_home = tmp_path / "local_home"
    local_home.mkdir()
    shutil.copy(REPO / "dagster.yaml", local_home / "dagster.yaml")
    local_env = product_env(
        DAGSTER_HOME=str(local_home),
        ENRICH_WORK_DIR=str(tmp_path / "local_work"),
        MONGODB_URI=mongo_server.uri,
        MONGODB_DB="celery_local",
        ENRICH_SHARDS=shards,
        **postgres_server.env,
    )

    # -- the distributed run: one PostgreSQL instance and one staging area shared by the
    # orchestrating process and both workers (on several machines: the same dagster.yaml and
    # DAGSTER_PG_*, and a shared volume for DAGSTER_HOME/storage and ENRICH_WORK_DIR)
    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    config = tmp_path / "celery.yaml"
    config.write_text(
        yaml.safe_dump(
            {"execution": {"config": {"broker": redis_server.url, "backend": redis_server.url}}}
        )
    )
    env = product_env(
        DAGSTER_HOME=str(home),
        ENRICH_WORK_DIR=str(tmp_path / "work"),
        MONGODB_URI=mongo_server.uri,
        MONGODB_DB="celery_distributed",
        ENRICH_SHARDS=shards,
        ENRICH_EXECUTOR="celery",
        **postgres_server.env,
    )
    for key, value in postgres_server.env.items():
        monkeypatch.setenv(key, value)
    # create the instance's tables once: two workers starting on a fresh database would race
    with dg.DagsterInstance.from_config(str(home)):
        pass
    workers = {}
    try:
        for name in ("worker-a", "worker-b"):
            log = tmp_path / f"{name}.log"
            workers[name] = (_start_worker(name, config, env, log), log)
        # the local run while the workers start (they only take tasks from the distributed run)
        local = _execute(local_env, tmp_path)
        assert local.returncode == 0, local.stdout[-3000:] + local.stderr[-3000:]
        with dg.DagsterInstance.from_config(str(local_home)) as instance:
            (local_run,) = instance.get_runs(limit=1)
            materialized = instance.get_records_for_run(
                local_run.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION
            ).records
        assert local_run.job_name == "enrich_job"
        assert local_run.status == dg.DagsterRunStatus.SUCCESS
        # seed_dataset once, and every partitioned asset once per shard
        assert len(materialized) >= 1 + 3 * int(shards), len(materialized)
        for process, log in workers.values():
            _wait_ready(log, process)
        distributed = _execute(env, tmp_path, config)
        assert distributed.returncode == 0, (
            distributed.stdout[-3000:]
            + distributed.stderr[-3000:]
            + "".join(log.read_text()[-2000:] for _, log in workers.values())
        )
        trees = {name: _tree_pids(process) for name, (process, _) in workers.items()}
    finally:
        for process, _ in workers.values():
            _stop(process)

    # every crawl step ran in a Celery worker, and both workers crawled
    with dg.DagsterInstance.from_config(str(home)) as instance:
        (run,) = instance.get_runs(limit=1)
        assert run.status == dg.DagsterRunStatus.SUCCESS
        records = instance.fetch_materializations(dg.AssetKey("crawl_results"), limit=100)
        # this run's only: the PostgreSQL server (and its instance database) is the session's,
        # and other tests' runs materialise crawl_results in it too
        nodes = {
            r.partition_key: r.asset_materialization.metadata["node"].value
            for r in records.records
            if r.run_id == run.run_id
        }
    assert len(nodes) == int(shards)
    ran_on = {
        next((name for name, pids in trees.items() if int(node.rsplit(":", 1)[1]) in pids), None)
        for node in nodes.values()
    }
    assert None not in ran_on, f"a crawl step ran outside the workers: {nodes} {trees}"
    assert ran_on == {"worker-a", "worker-b"}, f"crawl steps by worker: {nodes}"

    # the same results as the local run
    local_docs = {d["_id"]: comparable(d) for d in mongo_client["celery_local"]["demo_orgs"].find()}
    distributed_docs = {
        d["_id"]: comparable(d) for d in mongo_client["celery_distributed"]["demo_orgs"].find()
    }
    assert len(local_docs) == 46
    assert set(distributed_docs) == set(local_docs)
    differences = [
        (rid, key, local_docs[rid][key], distributed_docs[rid][key])
        for rid in sorted(local_docs)
        for key in local_docs[rid]
        if local_docs[rid][key] != distributed_docs[rid][key]
    ]
    assert not differences, "\n".join(map(repr, differences))
