"""MongoDB gone: before a run, the command fails at once naming it; lost in the middle of a crawl,
the run is stopped within a minute naming the database, and the next run (MongoDB back, same data)
fetches none of the pages the first one crawled (they were kept on disk and stored first). A real nx-27017 server of the test's own is stopped and started again (same port, same
data); the demo dataset crawls its virtual web."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from enrich_crawl.testing.services import MissingServiceBinary, ephemeral_mongo
from enrich_crawl.virtualweb import read_log
from enrich_crawl_tests.conftest import product_env

pytestmark = pytest.mark.slow


@pytest.fixture
def own_mongo(tmp_path):
    try:
        with ephemeral_mongo(data_dir=tmp_path / "mongo") as server:
            yield server
    except MissingServiceBinary as exc:
        pytest.skip(str(exc))


def _env(tmp_path: Path, server, db: str) -> dict[str, str]:
    return product_env(
        MONGODB_URI=server.uri,
        MONGODB_DB=db,
        XDG_DATA_HOME=str(tmp_path / "xdg"),
        ENRICH_SHARDS="2",
    )


def _fetched_pages(crawl_dir: Path) -> set[str]:
    """Pages the virtual web served with 200 (robots.txt aside), from its request logs."""
    return {
        f"{entry.get('host')}{entry.get('path')}"
        for log in crawl_dir.glob("*/web-requests.jsonl")
        for entry in read_log(log)
        if entry.get("status") == 200 and not str(entry.get("path", "")).startswith("/robots.txt")
    }


def test_mongodb_down_before_the_run_fails_at_once_naming_it(tmp_path, own_mongo):
    own_mongo.stop()
    db = f"down_{uuid.uuid4().hex[:6]}"
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "enrich_crawl.cli", "demo"],
        env=_env(tmp_path, own_mongo, db),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    seconds = time.monotonic() - started
    out = (result.stdout + result.stderr).strip().splitlines()
    assert result.returncode != 0
    assert seconds < 30, seconds
    assert len(out) <= 5 and "Traceback" not in result.stderr, out
    assert any("MongoDB" in line and db in line and "not reachable" in line for line in out), out


def test_mongodb_lost_mid_crawl_stops_the_run_and_the_next_run_refetches_nothing(
    tmp_path, own_mongo
):
    db = f"lost_{uuid.uuid4().hex[:6]}"
    env = _env(tmp_path, own_mongo, db)
    crawl_dir = tmp_path / "xdg" / "enrich_crawl" / "storage" / "enrich_crawl" / "demo_orgs"
    crawl_dir = crawl_dir / "crawl"
    first_out = tmp_path / "first.txt"
    with open(first_out, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "enrich_crawl.cli", "demo"],
            env=env,
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 180
        # the crawl has started and fetched pages: lose the database now
        while not _fetched_pages(crawl_dir) and time.monotonic() < deadline:
            assert proc.poll() is None, first_out.read_text()
            time.sleep(0.2)
        own_mongo.stop()
        stopped = time.monotonic()
        proc.wait(timeout=180)
        waited = time.monotonic() - stopped
    finally:
        if proc.poll() is None:
            proc.kill()
    text = first_out.read_text()
    assert proc.returncode != 0, text
    assert waited < 60, (waited, text)
    assert f"database {db}" in text and "lost mid-run" in text, text
    assert "Traceback" not in text, text
    crawled = _fetched_pages(crawl_dir)
    assert crawled

    own_mongo.start()
    again = subprocess.run(
        [sys.executable, "-m", "enrich_crawl.cli", "demo"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert "enrich_job succeeded" in again.stdout
    refetched = crawled & _fetched_pages(crawl_dir)
    assert not refetched, sorted(refetched)
