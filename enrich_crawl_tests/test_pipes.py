"""Terminating a run stops its crawls: the crawl worker processes (run through Dagster Pipes, each
in its own session) and everything they started are gone, whether the run is terminated the way
the UI does it or interrupted with Ctrl-C on the command line."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid

import dagster as dg
import psutil
import pytest

from enrich_crawl.testing.politeweb import build_polite_dataset
from enrich_crawl.testing.processes import CrawlWorker, alive, crawl_workers
from enrich_crawl_tests.conftest import LoggedRun, product_env, start_cli_run

pytestmark = pytest.mark.slow

GONE_WITHIN = 60.0  # seconds: SIGINT, Scrapy's clean stop (20 s grace at most), then SIGKILL


def _workers(name: str) -> list[CrawlWorker]:
    return [w for w in crawl_workers() if w.dataset == name]


def _wait_for_crawls(name: str, work, cli: subprocess.Popen, timeout: float = 240.0):
    """Both shards' crawls are fetching pages (their virtual web has served a page after
    robots.txt): the run is in the middle of its crawls."""

    def fetching(key: str) -> bool:
        log = work / name / "crawl" / key / "web-requests.jsonl"
        return log.exists() and len(log.read_text().splitlines()) >= 2

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert cli.poll() is None, "the run ended before its crawls could be terminated"
        workers = _workers(name)
        if len(workers) >= 2 and fetching("s00") and fetching("s01"):
            return workers
        time.sleep(0.3)
    raise AssertionError(f"the crawls of {name} did not start within {timeout:.0f} s")


def _snapshot(workers: list[CrawlWorker]) -> list[psutil.Process]:
    """Each crawl's whole tree, and the step process that launched it."""
    processes: dict[int, psutil.Process] = {}
    for worker in workers:
        for process in worker.tree():
            processes[process.pid] = process
        with contextlib.suppress(psutil.Error):
            parent = worker.process.parent()
            if parent is not None:
                processes[parent.pid] = parent
    return list(processes.values())


def _assert_all_gone(name: str, processes: list[psutil.Process]) -> None:
    deadline = time.monotonic() + GONE_WITHIN
    while time.monotonic() < deadline and (alive(processes) or _workers(name)):
        time.sleep(0.2)
    left = [f"{p.pid} {' '.join(p.cmdline()[:4])}" for p in alive(processes)]
    assert not left, f"orphans after termination: {left}"
    assert not _workers(name), "a crawl worker of the run is still running"


def _cleanup(name: str, cli: subprocess.Popen) -> None:
    for worker in _workers(name):
        for process in worker.tree():
            with contextlib.suppress(psutil.Error):
                process.kill()
    if cli.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(cli.pid, signal.SIGKILL)
        cli.wait(timeout=30)


@pytest.fixture
def long_crawl(tmp_path, mongo_server, mongo_db_name, dagster_home):
    """A dataset whose two shards each need about a minute of polite crawling."""
    name = f"stop_{uuid.uuid4().hex[:6]}"
    built = build_polite_dataset(
        tmp_path / "polite", shards=2, records_per_host=60, crawl_delay=1.0, name=name
    )
    env = product_env(
        MONGODB_URI=mongo_server.uri,
        MONGODB_DB=mongo_db_name,
        DAGSTER_HOME=str(dagster_home),
        ENRICH_WORK_DIR=str(tmp_path / "work"),
        ENRICH_SHARDS="2",
    )
    return name, built, env, tmp_path / "work"


def test_terminating_a_run_as_the_ui_does_stops_every_crawl_process(long_crawl, dagster_home):
    name, built, env, work = long_crawl
    cli = start_cli_run(built, env)
    try:
        workers = _wait_for_crawls(name, work, cli)
        processes = _snapshot(workers)
        assert len(processes) >= 4
        with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
            (run,) = instance.get_runs(
                filters=dg.RunsFilter(tags={"enrich_crawl/dataset": name}), limit=1
            )
            # what the UI's Terminate button does (GraphQL terminateRun)
            instance.run_coordinator.cancel_run(run.run_id)
            _assert_all_gone(name, processes)
            out, _ = cli.communicate(timeout=120)
            assert cli.returncode != 0, out
            assert "FAILED" in out
            status = instance.get_run_by_id(run.run_id).status
            assert status in (dg.DagsterRunStatus.CANCELED, dg.DagsterRunStatus.FAILURE)
    finally:
        _cleanup(name, cli)


def test_ctrl_c_on_dagster_job_execute_stops_every_crawl_process(long_crawl, tmp_path):
    name, built, env, work = long_crawl
    config = tmp_path / "run_config.yaml"
    config.write_text(
        json.dumps(
            {
                "resources": {
                    "dataset": {
                        "config": {"spec": str(built.spec), "mappings": str(built.mappings)}
                    }
                }
            }
        )
    )
    cli = LoggedRun(
        [
            sys.executable,
            "-m",
            "dagster",
            "job",
            "execute",
            "-m",
            "enrich_crawl.definitions",
            "-j",
            "enrich_job",
            "-c",
            str(config),
        ],
        env=env,
        cwd=tmp_path,
        merge_stderr=True,
        text=True,
        start_new_session=True,
    )
    try:
        workers = _wait_for_crawls(name, work, cli)
        processes = _snapshot(workers)
        # Ctrl-C in a terminal: SIGINT to the foreground process group (the crawl workers run
        # in their own sessions: only the steps' termination handling can reach them)
        os.killpg(cli.pid, signal.SIGINT)
        _assert_all_gone(name, processes)
        out, _ = cli.communicate(timeout=120)
        assert cli.returncode != 0, out[-3000:]
        # the crawls stopped cleanly (SIGINT first): statistics written, before the end
        files = [work / name / "crawl" / key / "stats.json" for key in ("s00", "s01")]
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not all(f.exists() for f in files):
            time.sleep(0.2)
        stats = [json.loads(f.read_text()) for f in files if f.exists()]
        assert len(stats) == 2 and all(s["pages"] < 60 for s in stats), out[-3000:]
    finally:
        _cleanup(name, cli)
