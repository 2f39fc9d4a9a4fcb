"""A Celery worker machine lost mid-step (docs/crash-recovery.md): two `enrich-crawl worker`
processes share a PostgreSQL instance, Redis and the staging area; one is SIGKILLed with its
whole process tree while it crawls. The run retries the lost step on the survivor and finishes,
and the lost task, handed out again after the run ended, changes nothing."""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from pathlib import Path

import dagster as dg
import psutil
import pymongo
import pytest
import yaml

from enrich_crawl.testing.politeweb import build_polite_dataset
from enrich_crawl.testing.processes import crawl_workers
from enrich_crawl.virtualweb import read_log
from enrich_crawl_tests.conftest import REPO, product_env

pytestmark = pytest.mark.slow

CRAWL_DELAY = 0.5
RUN_BOUND = 420.0
WORKER = [sys.executable, "-m", "enrich_crawl.cli", "worker"]
CELERY_ARGS = ["--concurrency=1", "--without-gossip", "--without-mingle"]
EXECUTE = [
    sys.executable,
    "-m",
    "dagster",
    "job",
    "execute",
    "-m",
    "enrich_crawl.definitions",
]  # seconds the run may take in all (the lost worker is judged after 15 s)


def _start_worker(name: str, config: Path, env: dict, log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen(
            [*WORKER, "-y", str(config), "-n", name, "--", *CELERY_ARGS],
            env=env,
            cwd=str(log.parent),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _wait_ready(log: Path, process: subprocess.Popen, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, f"worker exited:\n{log.read_text()[-3000:]}"
        if " ready." in log.read_text(errors="replace"):
            return
        time.sleep(0.5)
    raise AssertionError(f"worker not ready:\n{log.read_text()[-3000:]}")


def _kill_group(process: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, sig)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=30)


def _digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha1(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.name.startswith(".")
    }


def _interval_violations(logs: list[Path], delay: float) -> list[tuple[str, float]]:
    """Requests to one host closer together than its Crawl-delay (server-side evidence)."""
    by_host: dict[str, list[float]] = defaultdict(list)
    for log in logs:
        for row in read_log(log):
            by_host[str(row.get("host"))].append(float(row["t"]))
    bad = []
    for host, times in by_host.items():
        times.sort()
        bad += [(host, b - a) for a, b in itertools.pairwise(times) if b - a < delay - 0.05]
    return bad


def _fleet_setup(tmp_path, postgres_server, redis_server, mongo_server, monkeypatch, shards: int):
    """A dataset, a PostgreSQL-backed instance, the executor's YAML and the environment every
    process of the fleet shares."""
    name = f"lost_{uuid.uuid4().hex[:6]}"
    # 8 s of crawling per shard: the victim is chosen after its 4th request, long before its end
    built = build_polite_dataset(
        tmp_path / "polite", shards=shards, records_per_host=16, crawl_delay=CRAWL_DELAY, name=name
    )
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
        MONGODB_DB=name,
        ENRICH_SHARDS=str(shards),
        ENRICH_EXECUTOR="celery",
        ENRICH_DATASET=str(built.spec),
        ENRICH_MAPPINGS=str(built.mappings),
        ENRICH_WORKER_LOST_SECONDS="15",
        ENRICH_WORKER_PING_SECONDS="3",
        ENRICH_CRAWL_RETRY_DELAY="1",
        **postgres_server.env,
    )
    for key, value in postgres_server.env.items():
        monkeypatch.setenv(key, value)
    with dg.DagsterInstance.from_config(str(home)):
        pass  # the tables, once: two workers starting on a fresh database would race
    return built, env, config, home


def _count_documents(mongo_server, db: str, name: str) -> list:
    client = pymongo.MongoClient(mongo_server.uri, serverSelectionTimeoutMS=5000)
    try:
        return [d["_id"] for d in client[db][name].find({}, {"_id": 1})]
    finally:
        client.close()


def test_a_worker_killed_mid_step_is_retried_on_the_survivor(
    postgres_server, redis_server, mongo_server, tmp_path, monkeypatch
):
    built, env, config, home = _fleet_setup(
        tmp_path, postgres_server, redis_server, mongo_server, monkeypatch, shards=4
    )
    name = db = built.name
    work = tmp_path / "work"
    workers: dict[str, tuple[subprocess.Popen, Path]] = {}
    run = None
    try:
        for worker in ("worker-a", "worker-b"):
            log = tmp_path / f"{worker}.log"
            workers[worker] = (_start_worker(worker, config, env, log), log)
        for process, log in workers.values():
            _wait_ready(log, process)
        # the documented command is the worker itself (exec), not a wrapper around it
        for process, _ in workers.values():
            assert "celery" in " ".join(psutil.Process(process.pid).cmdline())
        started = time.monotonic()
        run = subprocess.Popen(
            [*EXECUTE, "-j", "enrich_job", "-c", str(config)],
            env=env,
            cwd=tmp_path,
            stdout=open(tmp_path / "run.log", "wb"),  # noqa: SIM115 (closed with the process)
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

        def victim_crawl():
            a_tree = {p.pid for p in psutil.Process(workers["worker-a"][0].pid).children(True)}
            for crawl in crawl_workers():
                parent = crawl.process.ppid()
                log = work / name / "crawl" / str(crawl.partition) / "web-requests.jsonl"
                if crawl.dataset == name and parent in a_tree and len(read_log(log)) >= 4:
                    return crawl
            return None

        deadline = time.monotonic() + 240
        crawl = None
        while crawl is None and time.monotonic() < deadline:
            assert run.poll() is None, (tmp_path / "run.log").read_text()[-3000:]
            crawl = victim_crawl()
            time.sleep(0.3)
        assert crawl is not None, "worker-a never crawled"
        lost_shard = crawl.partition
        _kill_group(workers["worker-a"][0])  # the machine is gone: no clean-up of any kind
        run.wait(timeout=RUN_BOUND - (time.monotonic() - started))
        out = (tmp_path / "run.log").read_text(errors="replace")
        assert run.returncode == 0, out[-4000:]
        assert "celery worker celery@worker-a lost" in out, out[-3000:]
        assert time.monotonic() - started < RUN_BOUND

        with dg.DagsterInstance.from_config(str(home)) as instance:
            finished = instance.get_runs(limit=1)[0]
            assert finished.status == dg.DagsterRunStatus.SUCCESS
            # no pool slot held afterwards
            slots = instance.event_log_storage.get_concurrency_info("crawl").claimed_slots
            assert not [s for s in slots if s.run_id == finished.run_id], slots

        ids = _count_documents(mongo_server, db, name)
        assert len(ids) == len(set(ids)) == built.records
        logs = sorted((work / name / "crawl").glob("*/web-requests.jsonl"))
        assert not _interval_violations(logs, CRAWL_DELAY)

        # SIGTERM to the documented worker command is a warm shutdown of the worker itself:
        # it ends, with every process it started
        survivor = workers["worker-b"][0]
        tree = [psutil.Process(survivor.pid), *psutil.Process(survivor.pid).children(True)]
        survivor.send_signal(signal.SIGTERM)
        survivor.wait(timeout=60)
        _, left = psutil.wait_procs(tree, timeout=15)
        assert not left, f"left behind by the worker's warm shutdown: {left}"

        # the lost task is still unacknowledged in Redis; a worker started later (which never
        # heard of its revocation) gets it again, as Redis hands it out after its visibility
        # timeout: it finds the run ended and leaves every staging file alone
        log = tmp_path / "worker-c.log"
        workers["worker-c"] = (_start_worker("worker-c", config, env, log), log)
        _wait_ready(log, workers["worker-c"][0])
        before = _digest(work / name)
        from kombu import Connection

        with Connection(redis_server.url, transport_options={"visibility_timeout": 0}) as conn:
            channel = conn.default_channel
            unacked = channel.client.hlen(channel.unacked_key)
            assert unacked >= 1, "the lost worker's task should be unacknowledged"
            time.sleep(1.0)
            channel.qos.restore_visible(num=100)
        deadline = time.monotonic() + 60
        while "not run: run" not in log.read_text(errors="replace"):
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        time.sleep(2.0)
        assert _digest(work / name) == before, f"staging of {lost_shard} changed"
    finally:
        if run is not None and run.poll() is None:
            _kill_group(run)
        for process, _ in workers.values():
            _kill_group(process, signal.SIGTERM)
            _kill_group(process)
        for crawl in crawl_workers():
            if crawl.dataset == name:
                for process in crawl.tree():
                    with contextlib.suppress(psutil.Error):
                        process.kill()


def test_a_step_process_killed_under_a_living_worker_is_retried(
    postgres_server, redis_server, mongo_server, tmp_path, monkeypatch
):
    """The OOM killer takes the pool process running a step; the worker itself lives on."""
    built, env, config, _ = _fleet_setup(
        tmp_path, postgres_server, redis_server, mongo_server, monkeypatch, shards=2
    )
    work = tmp_path / "work"
    log = tmp_path / "worker.log"
    worker = _start_worker("worker-solo", config, env, log)
    run = None
    try:
        _wait_ready(log, worker)
        run = subprocess.Popen(
            [*EXECUTE, "-j", "enrich_job", "-c", str(config)],
            env=env,
            cwd=tmp_path,
            stdout=open(tmp_path / "run.log", "wb"),  # noqa: SIM115 (closed with the process)
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 240
        step = None
        while step is None and time.monotonic() < deadline:
            assert run.poll() is None, (tmp_path / "run.log").read_text()[-3000:]
            for crawl in crawl_workers():
                requests = work / built.name / "crawl" / str(crawl.partition)
                if (
                    crawl.dataset == built.name
                    and len(read_log(requests / "web-requests.jsonl")) >= 4
                ):
                    step = crawl.process.parent()
                    break
            time.sleep(0.3)
        assert step is not None and step.pid != worker.pid, "no step process to kill"
        step.kill()
        run.wait(timeout=RUN_BOUND)
        out = (tmp_path / "run.log").read_text(errors="replace")
        assert run.returncode == 0, out[-4000:]
        assert "died under its worker: Worker exited prematurely: signal 9" in out, out[-3000:]
        assert worker.poll() is None, "the worker itself should live on"
        ids = _count_documents(mongo_server, built.name, built.name)
        assert len(ids) == len(set(ids)) == built.records
    finally:
        if run is not None and run.poll() is None:
            _kill_group(run)
        _kill_group(worker, signal.SIGTERM)
        _kill_group(worker)
        for crawl in crawl_workers():
            if crawl.dataset == built.name:
                for process in crawl.tree():
                    with contextlib.suppress(psutil.Error):
                        process.kill()
