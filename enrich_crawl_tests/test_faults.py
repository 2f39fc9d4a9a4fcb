"""Faults a nightly crawler meets, injected into real runs (`enrich-crawl run`, real services, the
virtual web): a crawl process SIGKILLed mid-partition, the step process that runs it SIGKILLed,
and the Dagster instance's PostgreSQL restarted while a run is going on.

Covered elsewhere, not repeated here (see docs/reliability.md): a run terminated from the UI or by
Ctrl-C (test_pipes.py, test_ui.py), MongoDB stopped at or during the merge (test_merge_outage.py),
a browser crash or hung page (test_render.py), a shard that keeps failing (test_orchestration.py).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import psutil
import pymongo
import pytest

from enrich_crawl.testing.politeweb import build_polite_dataset
from enrich_crawl.testing.processes import alive, crawl_workers
from enrich_crawl.virtualweb import read_log
from enrich_crawl_tests.conftest import REPO, load_json, product_env, start_cli_run

pytestmark = pytest.mark.slow

FLUSH_MARGIN = 5.0  # seconds: pages are persisted in batches every 0.5 s (a loaded machine lags)
RUN_BOUND = 300.0  # seconds a run may take, at most, once the fault was injected


def _run_env(mongo_server, mongo_db_name, home: Path, work: Path, **extra: str) -> dict[str, str]:
    return product_env(
        MONGODB_URI=mongo_server.uri,
        MONGODB_DB=mongo_db_name,
        DAGSTER_HOME=str(home),
        ENRICH_WORK_DIR=str(work),
        ENRICH_SHARDS="2",
        ENRICH_CRAWL_PROCESSES="0",  # one process per shard, whatever the cores: s00 is killed
        **extra,
    )


def _wait_for_s00_crawl(name: str, work: Path, cli: subprocess.Popen, pages: int):
    """The crawl worker of shard s00 once its web has served `pages` record pages."""
    log = work / name / "crawl" / "s00" / "web-requests.jsonl"

    def crawled() -> list | None:
        fetched = _pages_fetched(read_log(log)) if log.exists() else []
        workers = [w for w in crawl_workers() if w.dataset == name and w.partition == "s00"]
        return workers if len(fetched) >= pages and workers else None

    (worker,) = _wait_until(f"the crawl of s00 fetched {pages} pages", crawled, cli)
    return worker


def _finish(cli: subprocess.Popen, timeout: float = RUN_BOUND) -> str:
    try:
        out, _ = cli.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_session(cli)
        out, _ = cli.communicate(timeout=30)
        hung = f"the run hung (still running after {timeout:.0f} s):\n{out[-3000:]}"
        raise AssertionError(hung) from None
    return out


def _kill_session(cli: subprocess.Popen) -> None:
    if cli.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(cli.pid, signal.SIGKILL)


def _cleanup(name: str, cli: subprocess.Popen) -> None:
    for worker in crawl_workers():
        if worker.dataset == name:
            for process in worker.tree():
                with contextlib.suppress(psutil.Error):
                    process.kill()
    _kill_session(cli)
    with contextlib.suppress(subprocess.TimeoutExpired):
        cli.wait(timeout=30)


def _pages_fetched(log: list[dict]) -> list[dict]:
    return [e for e in log if e.get("status") == 200 and e["path"].startswith("/rec-")]


def _wait_until(what: str, predicate, cli: subprocess.Popen, timeout: float = 240.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert cli.poll() is None, f"the run ended before {what}: {cli.communicate()[0][-3000:]}"
        found = predicate()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


# -- a crawl process killed mid-partition ---------------------------------------------------------


def test_a_crawl_killed_mid_partition_fails_its_step_and_the_rerun_resumes_without_refetching(
    tmp_path, mongo_server, mongo_db_name, dagster_home
):
    name = f"kill_{uuid.uuid4().hex[:6]}"
    built = build_polite_dataset(
        tmp_path / "polite", shards=2, records_per_host=16, crawl_delay=0.3, name=name
    )
    # the shared per-host limiter stays on: the re-run takes back the hosts the killed crawl held
    work = tmp_path / "work"
    # ENRICH_CRAWL_RETRIES=0: the kill fails the step at once (retries: the soak)
    env = _run_env(mongo_server, mongo_db_name, dagster_home, work, ENRICH_CRAWL_RETRIES="0")
    s00_log = work / name / "crawl" / "s00" / "web-requests.jsonl"

    cli = start_cli_run(built, env)
    try:
        worker = _wait_for_s00_crawl(name, work, cli, pages=8)  # half-way
        killed_at = time.time()
        worker.process.send_signal(signal.SIGKILL)
        out = _finish(cli)
    finally:
        _cleanup(name, cli)

    # the run failed, clearly: the shard, the kill, and the command that re-runs it
    assert cli.returncode != 0, out[-3000:]
    summary = out.split("enrich_job FAILED", 1)[-1]
    assert "enrich_job FAILED" in out, out[-3000:]
    # the summary names the shard, the kill, and the command that re-runs the shard alone
    assert "crawl process of shard s00 exited with code -9" in summary, summary
    assert "--partition s00" in summary and "Traceback" not in summary
    first = read_log(s00_log)
    fetched_first = {e["path"] for e in _pages_fetched(first)}
    assert len(fetched_first) < 16, "the kill came too late to cut the crawl"
    # what the killed crawl had persisted: its pages in the crawled-page store, and the values it
    # had found (staged as it went, resolved and merged by the failed run)
    (host,) = built.hosts_by_shard["s00"]
    client = pymongo.MongoClient(mongo_server.uri, serverSelectionTimeoutMS=5000)
    try:
        stored = {
            urlsplit(doc.get("url") or doc["_id"]).path
            for doc in client[mongo_db_name]["_crawl_pages"].find({}, {"url": 1})
            if urlsplit(doc.get("url") or doc["_id"]).hostname == host
        }
        merged = {
            f"/rec-{int(doc['_id'].rsplit('-', 1)[1])}.html"
            for doc in client[mongo_db_name][name].find({"status": "resolved"}, {"_id": 1})
            if doc["_id"].startswith(host.split(".")[0])
        }
    finally:
        client.close()
    persisted = (stored | merged) & fetched_first
    assert len(persisted) >= 3, (stored, merged, fetched_first)
    # persisted as the crawl goes, not at its end: what was fetched well before the kill is kept
    early = {e["path"] for e in _pages_fetched(first) if e["t"] < killed_at - FLUSH_MARGIN}
    assert early <= persisted, sorted(early - persisted)

    # the re-run resumes: pages fetched (and persisted) before the kill are not fetched again
    cli = start_cli_run(built, env)
    try:
        out = _finish(cli)
    finally:
        _cleanup(name, cli)
    assert cli.returncode == 0, out[-3000:]
    second = _pages_fetched(read_log(s00_log))
    refetched = persisted & {e["path"] for e in second}
    assert not refetched, f"fetched again although fetched before the kill: {sorted(refetched)}"
    all_pages = fetched_first | {e["path"] for e in second}
    assert len(all_pages) == 16  # and every page of the shard was fetched by one run or the other
    # how: the records the killed crawl had resolved were merged by the failed run (fresh now),
    # the pages it had fetched for the others are re-extracted from the crawled-page store
    stats = load_json(work / name / "crawl" / "s00" / "stats.json")
    resumed = stats["pages_reused"] + stats["outcomes"].get("fresh", 0)
    assert resumed >= len(persisted), stats
    # s01 was crawled and merged by the failed run: its records are fresh, nothing is fetched
    assert not _pages_fetched(read_log(work / name / "crawl" / "s01" / "web-requests.jsonl"))

    client = pymongo.MongoClient(mongo_server.uri, serverSelectionTimeoutMS=5000)
    try:
        docs = list(client[mongo_db_name][name].find())
    finally:
        client.close()
    ids = [d["_id"] for d in docs]
    assert len(ids) == len(set(ids)) == built.records
    for doc in docs:
        assert doc["data"]["city"] == built.expected[doc["_id"]], doc
        assert doc["lineage"]["city"]["value"] == doc["data"]["city"]
        assert len(doc["history"]["city"]) == 1, doc["history"]


# -- the step process itself killed ---------------------------------------------------------------

ORPHAN_GONE_WITHIN = 15.0  # seconds: the kernel's parent-death signal, then Scrapy's exit


def test_a_step_process_killed_abruptly_leaves_no_crawl_behind_and_the_run_ends(
    tmp_path, mongo_server, mongo_db_name, dagster_home
):
    name = f"step_{uuid.uuid4().hex[:6]}"
    # 6 s of crawling per shard: s00 is still crawling when its step is killed (after 2 pages),
    # and the run waits on s01's crawl to its end
    built = build_polite_dataset(
        tmp_path / "polite", shards=2, records_per_host=12, crawl_delay=0.5, name=name
    )
    work = tmp_path / "work"
    env = _run_env(mongo_server, mongo_db_name, dagster_home, work, ENRICH_CRAWL_RETRIES="0")
    cli = start_cli_run(built, env)
    try:
        worker = _wait_for_s00_crawl(name, work, cli, pages=2)
        tree = worker.tree()
        step = worker.process.parent()
        assert step is not None and step.pid != cli.pid
        # no clean-up code of the step runs: only the kernel can stop its crawl (PDEATHSIG)
        step.send_signal(signal.SIGKILL)
        deadline = time.monotonic() + ORPHAN_GONE_WITHIN
        while time.monotonic() < deadline and alive(tree):
            time.sleep(0.2)
        left = [f"{p.pid} {' '.join(p.cmdline()[:4])}" for p in alive(tree)]
        assert not left, f"orphaned by the killed step: {left}"
        out = _finish(cli)
    finally:
        _cleanup(name, cli)
    # the run ends, failed, naming the step whose process died
    assert cli.returncode != 0, out[-3000:]
    assert "enrich_job FAILED" in out and "s00" in out.split("enrich_job FAILED", 1)[-1]


# -- the Dagster instance's PostgreSQL restarted during a run -------------------------------------


def test_postgres_restarted_during_a_run_fails_or_completes_it_never_hangs(
    tmp_path, postgres_server, mongo_server, mongo_db_name
):
    name = f"pg_{uuid.uuid4().hex[:6]}"
    built = build_polite_dataset(
        tmp_path / "polite", shards=2, records_per_host=20, crawl_delay=0.5, name=name
    )
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")  # the production instance
    work = tmp_path / "work"
    env = _run_env(
        mongo_server, mongo_db_name, home, work, ENRICH_CRAWL_RETRY_DELAY="1", **postgres_server.env
    )
    cli = start_cli_run(built, env)
    try:

        def crawling():
            logs = [work / name / "crawl" / key / "web-requests.jsonl" for key in ("s00", "s01")]
            return all(p.exists() and len(_pages_fetched(read_log(p))) >= 3 for p in logs)

        _wait_until("both crawls fetched pages", crawling, cli)
        postgres_server.stop()
        time.sleep(3.0)
        postgres_server.start()
        out = _finish(cli)
    finally:
        _cleanup(name, cli)
        postgres_server.start()  # whatever happened, the session's server runs again

    with postgres_server.connect() as conn, conn.cursor() as cursor:
        cursor.execute(
            "select r.status from runs r join run_tags t on t.run_id = r.run_id "
            "where t.key = 'enrich_crawl/dataset' and t.value = %s",
            (name,),
        )
        statuses = [row[0] for row in cursor.fetchall()]
    # the run ended, and the instance says how: never left STARTED
    assert statuses, out[-3000:]
    assert statuses[-1] in ("SUCCESS", "FAILURE"), (statuses, out[-3000:])
    if cli.returncode == 0:
        assert statuses[-1] == "SUCCESS"
        client = pymongo.MongoClient(mongo_server.uri, serverSelectionTimeoutMS=5000)
        try:
            count = client[mongo_db_name][name].count_documents({})
        finally:
            client.close()
        assert count == built.records
    else:
        assert statuses[-1] == "FAILURE", statuses
        assert "Traceback" not in out.split("enrich_job FAILED", 1)[-1]
    assert Path(work / name / "seed" / "manifest.json").exists()
