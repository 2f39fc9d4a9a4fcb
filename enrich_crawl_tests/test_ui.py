"""The Dagster UI, driven in Chromium with Playwright: `dagster dev` (started in its own session on a
temporary instance, stopped by its process group id) shows the asset chain; materialising one
partition from the UI succeeds and its metadata appears; the Terminate button stops a running crawl
and its whole process tree. Screenshots go to test-artifacts/ (kept by CI, ignored by git)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import dagster as dg
import pytest

from enrich_crawl.home import instance_yaml
from enrich_crawl.testing.politeweb import build_polite_dataset
from enrich_crawl.testing.processes import alive, crawl_workers
from enrich_crawl.testing.services import free_port
from enrich_crawl_tests.conftest import REPO, product_env, wait_for_dagster_dev

pytestmark = [pytest.mark.slow, pytest.mark.browser]

CHROMIUM = os.environ.get("ENRICH_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ARTIFACTS = REPO / "test-artifacts"
LOCATION = "enrich_crawl.definitions"


class DagsterDev:
    def __init__(self, url: str, home: Path, work: Path, name: str, process: subprocess.Popen):
        self.url = url
        self.home = home
        self.work = work
        self.name = name
        self.process = process

    def runs(self) -> list[dg.DagsterRun]:
        with dg.DagsterInstance.from_config(str(self.home)) as instance:
            return list(instance.get_runs())

    def wait_run(self, predicate, timeout: float = 420.0) -> dg.DagsterRun:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for run in self.runs():
                if predicate(run):
                    return run
            time.sleep(1.0)
        raise AssertionError(f"no run matched within {timeout:.0f} s: {self.runs()}")


def _stop_group(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGINT)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=30)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=10)


@pytest.fixture(scope="module")
def dagster_dev(tmp_path_factory, mongo_server):
    root = tmp_path_factory.mktemp("ui")
    name = f"ui_{uuid.uuid4().hex[:6]}"
    # s00 crawls in seconds; s01 needs a minute (a crawl to terminate)
    built = build_polite_dataset(
        root / "polite",
        shards=2,
        records_per_host=3,
        crawl_delay=1.0,
        name=name,
        records_by_shard={"s01": 60},
    )
    home = root / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text(instance_yaml(home))  # the local default instance
    port = free_port()
    env = product_env(
        DAGSTER_HOME=str(home),
        ENRICH_WORK_DIR=str(root / "work"),
        ENRICH_DATASET=str(built.spec),
        ENRICH_MAPPINGS=str(built.mappings),
        ENRICH_SHARDS="2",
        ENRICH_CRAWL_PROCESSES="0",  # one process per shard, whatever the cores
        MONGODB_URI=mongo_server.uri,
        MONGODB_DB=f"t_{name}",
    )
    log = open(root / "dagster-dev.log", "wb")  # noqa: SIM115 - closed below
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dagster",
            "dev",
            "-w",
            str(REPO / "workspace.yaml"),
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
        ],
        env=env,
        cwd=root,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # `dagster dev` ignores SIGINT when started in the background
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_dagster_dev(process, url, root / "dagster-dev.log")
        yield DagsterDev(url, home, root / "work", name, process)
    finally:
        _stop_group(process)
        log.close()


@pytest.fixture
def page(request):
    """A Chromium page; when its test fails, what the page showed goes to
    test-artifacts/ui-failed-<test>.png."""
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            page.set_default_timeout(60_000)
            yield page
            report = getattr(request.node, "rep_call", None)
            if report is not None and report.failed:
                with contextlib.suppress(Exception):
                    page.screenshot(path=str(ARTIFACTS / f"ui-failed-{request.node.name}.png"))
        finally:
            browser.close()


def _dismiss_welcome(page) -> None:
    skip = page.get_by_role("button", name="Skip")
    with contextlib.suppress(Exception):
        skip.click(timeout=5000)


def _open_group(page, dev: DagsterDev) -> None:
    page.goto(f"{dev.url}/locations/{LOCATION}/asset-groups/enrich/lineage")
    page.get_by_text("enriched_records", exact=True).first.wait_for(timeout=180_000)
    _dismiss_welcome(page)


def _launch_partition(page, key: str) -> None:
    """Materialize all… -> Custom partition selection -> `key` -> Launch 1 run.

    The picker is clicked again while the list does not show `key`: once in CI (a loaded machine)
    the list never showed it, most likely because the dialog was still loading its partitions
    when the picker was first clicked, so that the click was lost or opened an empty list (a
    click then closes it, the next opens it again)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    page.get_by_text("Materialize all").click()
    picker = page.get_by_text("Select a partition or create one")
    option = page.get_by_text(key, exact=True).first
    for attempt in range(5):
        picker.click()
        try:
            option.wait_for(state="visible", timeout=10_000 * (attempt + 1))
            break
        except PlaywrightTimeout:  # click the picker again
            if attempt == 4:
                raise
    option.click()
    page.keyboard.press("Escape")
    page.get_by_role("button", name="Launch 1 run").click()


def test_asset_graph_shows_the_chain_and_one_partition_materialises(dagster_dev, page):
    dev = dagster_dev
    _open_group(page, dev)
    chain = ["seed_dataset", "crawl_results", "resolved_fields", "enriched_records"]
    boxes = [page.get_by_text(name, exact=True).first.bounding_box() for name in chain]
    assert all(boxes), "every asset of the chain is drawn"
    xs = [box["x"] for box in boxes]
    assert xs == sorted(xs), f"the graph reads left to right in dependency order: {xs}"
    page.screenshot(path=str(ARTIFACTS / "ui-asset-graph.png"))

    _launch_partition(page, "s00")
    run = dev.wait_run(lambda r: r.tags.get("dagster/partition") == "s00" and r.is_finished)
    assert run.status == dg.DagsterRunStatus.SUCCESS, f"run {run.run_id} ended {run.status}"

    page.goto(f"{dev.url}/assets/crawl_results?view=partitions&partition=s00")
    for label in ("records_done", "pages", "crawl_failed", "per_shard", "finish_reason"):
        page.get_by_text(label, exact=True).first.wait_for()
    page.screenshot(path=str(ARTIFACTS / "ui-crawl-results-s00.png"), full_page=True)
    page.goto(f"{dev.url}/assets/enriched_records?view=partitions&partition=s00")
    for label in ("records_merged", "documents_in_collection", "preview"):
        page.get_by_text(label, exact=True).first.wait_for()
    page.screenshot(path=str(ARTIFACTS / "ui-enriched-records-s00.png"), full_page=True)


def test_terminate_button_stops_a_running_crawl(dagster_dev, page):
    dev = dagster_dev
    _open_group(page, dev)
    _launch_partition(page, "s01")
    run = dev.wait_run(lambda r: r.tags.get("dagster/partition") == "s01", timeout=120)
    # wait for a crawl in full swing (its web has served pages), not one still importing Scrapy
    log = dev.work / dev.name / "crawl" / "s01" / "web-requests.jsonl"
    deadline = time.monotonic() + 300
    workers = []
    while time.monotonic() < deadline:
        workers = [w for w in crawl_workers() if w.dataset == dev.name and w.partition == "s01"]
        if workers and log.exists() and len(log.read_text().splitlines()) >= 3:
            break
        time.sleep(0.5)
    assert workers, "the crawl of s01 did not start"
    tree = [p for w in workers for p in w.tree()]

    page.goto(f"{dev.url}/runs/{run.run_id}")
    page.get_by_role("button", name="Terminate").first.click()
    dialog = page.get_by_role("dialog")
    dialog.get_by_role("button", name="Terminate").click()
    page.screenshot(path=str(ARTIFACTS / "ui-terminate.png"))

    finished = dev.wait_run(lambda r: r.run_id == run.run_id and r.is_finished, timeout=120)
    assert finished.status in (dg.DagsterRunStatus.CANCELED, dg.DagsterRunStatus.FAILURE)
    page.goto(f"{dev.url}/runs/{run.run_id}")
    label = "Canceled" if finished.status == dg.DagsterRunStatus.CANCELED else "Failure"
    page.get_by_text(label).first.wait_for()
    page.screenshot(path=str(ARTIFACTS / "ui-terminated.png"))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and alive(tree):
        time.sleep(0.5)
    assert not alive(tree), f"crawl processes left after Terminate: {alive(tree)}"
    assert not [w for w in crawl_workers() if w.dataset == dev.name]
