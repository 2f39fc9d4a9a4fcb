"""A new user's first hour, from a fresh clone, with nothing set but a private per-user data folder
(XDG_DATA_HOME): `enrich-crawl demo` from one folder, `enrich-crawl run` from another, then the UI
command the summary prints, from a third: the UI (driven in Chromium) lists both runs, the two
runs shared one embedded MongoDB, and the counts of the summary equal those of the UI and of
MongoDB. In the clone's root, `dagster dev` serves the definitions and `dagster job execute` runs
`enrich_job` on the same home.

The demo's run is also the walking skeleton's end-to-end proof (the documents equal the demo's
ground truth, every value carries its lineage), and `dagster job execute` re-runs the demo on the
same database: re-running duplicates no document and no history entry."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import dagster as dg
import pymongo
import pytest

from enrich_crawl.demo.check import compare, expected
from enrich_crawl_tests.conftest import REPO, product_env, wait_for_dagster_dev

pytestmark = [pytest.mark.slow]

CHROMIUM = os.environ.get("ENRICH_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run"]


def _free_port() -> int:
    from enrich_crawl.testing.services import free_port

    return free_port()


def _stop_group(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGINT)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=30)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=10)


class FirstHour:
    def __init__(self, root: Path, clone: Path, env: dict[str, str]):
        self.root = root
        self.clone = clone
        self.env = env
        self.home = root / "xdg" / "enrich_crawl"
        self.outputs: dict[str, subprocess.CompletedProcess] = {}
        self.demo_documents: dict[str, dict] = {}  # demo_orgs as the demo left it

    def cli(self, folder: Path, *args: str, timeout: float = 400) -> subprocess.CompletedProcess:
        folder.mkdir(parents=True, exist_ok=True)
        return subprocess.run(
            [sys.executable, "-m", "enrich_crawl.cli", *args],
            env=self.env,
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=timeout,
        )


def _demo_documents(demo_output: str) -> dict[str, dict]:
    """The demo's documents, read from the embedded MongoDB the demo's summary names."""
    port = re.search(r"mongodb://127\.0\.0\.1:(\d+)/", demo_output).group(1)
    client = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true")
    try:
        return {d["_id"]: d for d in client["enrich_crawl"]["demo_orgs"].find()}
    finally:
        client.close()


def _history_counts(documents: dict[str, dict]) -> dict[str, dict[str, int]]:
    return {
        rid: {k: len(v) for k, v in d.get("history", {}).items()} for rid, d in documents.items()
    }


def _run_id(output: str) -> str:
    match = re.search(r"enrich_job succeeded\S*\s+run ([0-9a-f-]{36})", output)
    assert match, output
    return match.group(1)


@pytest.fixture(scope="module")
def first_hour(tmp_path_factory):
    root = tmp_path_factory.mktemp("first_hour")
    clone = root / "clone"
    subprocess.run(
        ["git", "clone", "--quiet", str(REPO), str(clone)], check=True, capture_output=True
    )
    env = product_env(
        PYTHONPATH=str(clone),
        XDG_DATA_HOME=str(root / "xdg"),
        ENRICH_SHARDS="2",
    )
    hour = FirstHour(root, clone, env)
    try:
        hour.outputs["demo"] = hour.cli(root / "folder_a", "demo")
        if hour.outputs["demo"].returncode == 0:
            hour.demo_documents = _demo_documents(hour.outputs["demo"].stdout)
        # the user's own dataset, in a folder of its own (the demo's table and web, renamed)
        data = root / "folder_b"
        data.mkdir()
        demo = clone / "enrich_crawl" / "demo"
        shutil.copy(demo / "demo_orgs.csv", data / "orgs.csv")
        spec = (demo / "demo.yaml").read_text(encoding="utf-8")
        spec = spec.replace("name: demo_orgs", "name: my_orgs")
        spec = spec.replace("source: demo_orgs.csv", "source: orgs.csv")
        spec = spec.replace("virtual_web: web", f"virtual_web: {demo / 'web'}")
        (data / "orgs.yaml").write_text(spec, encoding="utf-8")
        hour.outputs["run"] = hour.cli(
            data, "run", "--dataset", "orgs.yaml", "--mappings", str(clone / "mappings")
        )
        yield hour
    finally:
        hour.cli(root, "mongo", "stop", timeout=60)


def test_both_runs_succeed_in_one_home_with_one_embedded_mongodb(first_hour):
    demo, run = first_hour.outputs["demo"], first_hour.outputs["run"]
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert run.returncode == 0, run.stdout + run.stderr
    # the same embedded server (same port) served both runs, its data in the home
    ports = {re.search(r"mongodb://127\.0\.0\.1:(\d+)/", o.stdout).group(1) for o in (demo, run)}
    assert len(ports) == 1
    assert (first_hour.home / "storage" / "enrich_crawl" / "mongo" / "embedded.json").exists()
    with dg.DagsterInstance.from_config(str(first_hour.home)) as instance:
        ids = {r.run_id for r in instance.get_runs()}
    assert {_run_id(demo.stdout), _run_id(run.stdout)} <= ids
    for folder in ("folder_a", "folder_b"):
        assert not (first_hour.root / folder / ".dagster_home").exists()


def test_the_demo_matches_its_ground_truth_and_every_value_has_its_lineage(first_hour):
    output = first_hour.outputs["demo"].stdout
    assert first_hour.outputs["demo"].returncode == 0, output + first_hour.outputs["demo"].stderr
    assert "enrich_job succeeded" in output
    for label in (
        "records",
        "fields resolved",
        "pages fetched",
        "pages/resolved",
        "errors by kind",
        "time",
    ):
        assert label in output, f"summary lacks {label!r}:\n{output}"
    docs = first_hour.demo_documents
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
            assert entry["partition"] in ("s00", "s01")
            assert entry["source_url"].startswith("http")
    assert filled > 200
    unresolved = [d for d in docs.values() if d["status"] == "unresolved"]
    assert unresolved and all(d["errors"] for d in unresolved)


def _summary_counts(output: str) -> dict:
    line = {m.group(1): m.group(2) for m in re.finditer(r"^  (\S.*?)\s{2,}(.*)$", output, re.M)}
    errors = dict(
        (kind, int(n))
        for kind, n in (part.rsplit(" ", 1) for part in line["errors by kind"].split(", "))
    )
    return {
        "fields_resolved": int(line["fields resolved"].split()[0]),
        "pages": int(line["pages fetched"]),
        "pages_per_resolved_record": float(line["pages/resolved"].split()[0]),
        "errors": errors,
    }


def test_the_summary_the_ui_and_mongodb_count_alike(first_hour):
    output = first_hour.outputs["demo"].stdout
    cli = _summary_counts(output)
    run_id = _run_id(output)
    with dg.DagsterInstance.from_config(str(first_hour.home)) as instance:
        records = instance.get_records_for_run(
            run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION
        ).records
        ui = next(
            {k: v.value for k, v in r.asset_materialization.metadata.items()}
            for r in records
            if r.asset_materialization.asset_key == dg.AssetKey("enriched_records")
        )
    errors_ui = {k.split("/", 1)[1]: v for k, v in ui.items() if k.startswith("errors/")}
    assert cli == {
        "fields_resolved": ui["fields_resolved"],
        "pages": ui["pages_fetched"],
        "pages_per_resolved_record": ui["pages_per_resolved_record"],
        "errors": errors_ui,
    }
    # MongoDB, counted here without the product's code
    port = re.search(r"mongodb://127\.0\.0\.1:(\d+)/", output).group(1)
    client = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true")
    try:
        docs = list(client["enrich_crawl"]["demo_orgs"].find())
    finally:
        client.close()
    lineage = sum(len(d.get("lineage") or {}) for d in docs)
    resolved = sum(1 for d in docs if d["status"] == "resolved")
    errors = Counter(e["reason"] for d in docs for e in d.get("errors") or [])
    stage = first_hour.home / "storage" / "enrich_crawl" / "demo_orgs" / "crawl"
    pages = sum(json.loads(p.read_text())["pages"] for p in stage.glob("*/stats.json"))
    assert cli["fields_resolved"] == lineage
    assert cli["errors"] == dict(errors)
    assert "invalid_url" in cli["errors"] and "not_on_page" in cli["errors"]
    assert cli["pages"] == pages
    assert cli["pages_per_resolved_record"] == round(pages / resolved, 2)


def test_the_ui_command_printed_lists_the_runs_of_every_folder(first_hour):
    from playwright.sync_api import sync_playwright

    output = first_hour.outputs["run"].stdout
    hint = re.search(r"Dagster UI\s+(.+?)\s{2,}\(", output).group(1)
    # the default home: nothing to set; the command as PATH finds it (or its path)
    assert hint.endswith("enrich-crawl ui") and "DAGSTER_HOME" not in hint, output
    port = _free_port()
    folder_c = first_hour.root / "folder_c"
    folder_c.mkdir()
    log_path = first_hour.root / "ui.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [*shlex.split(hint), "--port", str(port)],  # run as printed
            env=first_hour.env,
            cwd=folder_c,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_dagster_dev(process, url, log_path)
        wanted = [
            _run_id(first_hour.outputs["demo"].stdout)[:8],
            _run_id(first_hour.outputs["run"].stdout)[:8],
        ]
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1600, "height": 1000})
                page.goto(f"{url}/runs")
                for short_id in wanted:
                    page.get_by_text(short_id).first.wait_for(timeout=120_000)
                # the embedded default turns the "join the community" pop-up off
                assert page.get_by_text("Join the Dagster community").count() == 0
            finally:
                browser.close()
    finally:
        _stop_group(process)


def test_dagster_commands_in_the_project_root_use_the_same_home(first_hour):
    clone = first_hour.clone
    env = dict(first_hour.env)
    assert "DAGSTER_HOME" not in env and "DAGSTER_PG_HOST" not in env
    job = subprocess.run(
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
        ],
        env=env,
        cwd=clone,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    with dg.DagsterInstance.from_config(str(first_hour.home)) as instance:
        runs = instance.get_runs()
        merged = [
            {k: v.value for k, v in r.asset_materialization.metadata.items()}
            for r in instance.get_records_for_run(
                runs[0].run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION
            ).records
            if r.asset_materialization.asset_key == dg.AssetKey("enriched_records")
        ]
    assert sum(1 for r in runs if r.job_name == "enrich_job") >= 3  # demo, run, job execute
    assert runs[0].status == dg.DagsterRunStatus.SUCCESS
    # the job re-ran the demo (the default dataset) on the demo's database: re-running never
    # duplicates a document or a history entry, and the documents still equal the ground truth
    assert merged and all(
        (m["database"], m["collection"]) == ("enrich_crawl", "demo_orgs") for m in merged
    ), merged
    before = first_hour.demo_documents
    again = _demo_documents(first_hour.outputs["demo"].stdout)
    assert len(again) == len(before) == len(expected()["records"])
    assert _history_counts(again) == _history_counts(before)
    assert not compare(again)
    select = ["-m", "enrich_crawl.definitions", "--select", "seed_dataset"]
    materialize = subprocess.run(
        [sys.executable, "-m", "dagster", "asset", "materialize", *select],
        env=env,
        cwd=clone,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert materialize.returncode == 0, materialize.stdout[-3000:] + materialize.stderr[-3000:]
    with dg.DagsterInstance.from_config(str(first_hour.home)) as instance:
        latest = instance.get_runs(limit=1)[0]
        seeded = instance.get_latest_materialization_event(dg.AssetKey("seed_dataset"))
    assert latest.status == dg.DagsterRunStatus.SUCCESS and latest.run_id not in {
        r.run_id for r in runs
    }
    assert seeded.run_id == latest.run_id

    port = _free_port()
    log_path = first_hour.root / "dev.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "dagster", "dev", "-p", str(port)],
            env=env,
            cwd=clone,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_dagster_dev(process, url, log_path)
        query = "{ workspaceOrError { ... on Workspace { locationEntries { name \
            locationOrLoadError { __typename ... on RepositoryLocation { repositories { \
            jobs { name } } } } } } } }"
        import urllib.request

        deadline = time.monotonic() + 120
        while True:
            request = urllib.request.Request(
                f"{url}/graphql",
                data=json.dumps({"query": query}).encode(),
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=30) as response:
                entries = json.loads(response.read())["data"]["workspaceOrError"]
            locations = entries["locationEntries"]
            loaded = [e for e in locations if e["locationOrLoadError"]]
            if loaded or time.monotonic() > deadline:
                break
            time.sleep(2)
        assert loaded, entries
        location = loaded[0]["locationOrLoadError"]
        assert location["__typename"] == "RepositoryLocation", location
        jobs = {j["name"] for r in location["repositories"] for j in r["jobs"]}
        assert "enrich_job" in jobs
    finally:
        _stop_group(process)
    assert "PostProcessingError" not in log_path.read_text()
