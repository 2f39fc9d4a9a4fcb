"""The life cycle of one partition's crawl: it finishes only when no record is still active, and
every record of the shard ends with a line in records.jsonl, whatever stopped the crawl."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from enrich_crawl.testing.synthweb import (
    crawl_through_pipes,
    read_outcomes,
    run_workers,
    write_dataset,
)
from enrich_crawl.virtualweb import running_web

MAPPING = {
    "name": "life",
    "url_patterns": [{"type": "regex", "pattern": r"^https?://l-[a-z0-9-]+\.test/"}],
    "fields": [
        {
            "name": "value",
            "processors": [
                {"type": "xpath", "parameters": {"expression": "//span[@id='v']/text()"}},
                {"type": "trim", "parameters": {}},
            ],
        }
    ],
}


def _host(root: Path, host: str, pages: dict[str, str], config: dict | None = None) -> None:
    folder = root / host
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "robots.txt").write_text("User-agent: *\nAllow: /\n", encoding="utf-8")
    for name, value in pages.items():
        (folder / name).write_text(
            f"<html><body><span id='v'>{value}</span></body></html>", encoding="utf-8"
        )
    if config is not None:
        (folder / "_web.json").write_text(json.dumps(config), encoding="utf-8")


def _stats(work: Path) -> dict:
    return json.loads((work / "run" / "s00" / "stats.json").read_text(encoding="utf-8"))


def test_a_request_lost_on_the_way_does_not_end_the_crawl_with_active_records(tmp_path):
    """Scrapy's URL length limit drops a request silently (a spider middleware): Scrapy then finds
    the crawl idle while the record still waits for that page. The spider sends it again once,
    straight to the engine (it would fail it with a reason were it lost again): the record ends
    with its value, never `unfinished`."""
    root = tmp_path / "web"
    _host(root, "l-ok.test", {"index.html": "fine"})
    long_url = "http://l-ok.test/?" + "&".join(f"k{i}=v{i}" for i in range(400))
    assert len(long_url) > 2083
    rows = [
        {"id": "ok", "url": "http://l-ok.test/index.html"},
        {"id": "long", "url": long_url},
    ]
    dataset, mappings = write_dataset(
        tmp_path, rows, fields={"value": {}}, mappings={"life": MAPPING}, crawl={"depth": 0}
    )
    work = tmp_path / "work"
    with running_web(root) as server:
        run = run_workers(dataset, mappings, work, proxy=server.proxy_url, shards=1, timeout=180)
    assert run.returncodes == {"s00": 0}, run.logs
    outcomes = read_outcomes(work)
    assert set(outcomes) == {"ok", "long"}
    assert outcomes["ok"]["outcome"] == "resolved"
    # sent again at idle straight to the engine (past the spider middlewares): fetched after all
    long = outcomes["long"]
    assert long["outcome"] == "resolved", long
    assert long["errors"] == [], long
    stats = _stats(work)
    assert stats["finish_reason"] == "finished"
    assert stats["records_active"] == 0
    assert stats["resent_at_idle"] == 1
    assert stats["outcomes"] == {"resolved": 2}


def test_a_time_budget_gives_every_record_a_line_even_those_never_started(tmp_path):
    """With at most 2 active records and a host that answers slowly, the budget stops the crawl
    long before the last records are fed: they still get a line (`not_started`, the reason)."""
    root = tmp_path / "web"
    records = 12
    _host(
        root,
        "l-slow.test",
        {f"r{i}.html": f"value {i}" for i in range(records)},
        {"latency": 1.0},
    )
    rows = [{"id": f"r{i:02d}", "url": f"http://l-slow.test/r{i}.html"} for i in range(records)]
    rows.append({"id": "done", "url": "http://l-slow.test/r0.html", "value": "known"})
    dataset, mappings = write_dataset(
        tmp_path,
        rows,
        fields={"value": {}},
        mappings={"life": MAPPING},
        crawl={"depth": 0, "default_delay": 0.1, "time_budget_seconds": 3},
    )
    work = tmp_path / "work"
    started = time.monotonic()
    with running_web(root) as server:
        run = run_workers(
            dataset,
            mappings,
            work,
            proxy=server.proxy_url,
            shards=1,
            timeout=180,
            max_active_records=2,
        )
    assert run.returncodes == {"s00": 0}, run.logs
    assert time.monotonic() - started < 120
    stats = _stats(work)
    assert stats["finish_reason"] == "closespider_timeout"
    outcomes = read_outcomes(work)
    assert set(outcomes) == {r["id"] for r in rows}, "every record has its line"
    lines = (work / "run" / "s00" / "records.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(lines) == len(rows), "one line per record, none twice"
    not_started = {rid: row for rid, row in outcomes.items() if row["outcome"] == "not_started"}
    assert len(not_started) >= 5, outcomes
    for row in not_started.values():
        assert row["pages"] == 0 and row["needed"] == ["value"]
        assert [e["reason"] for e in row["errors"]] == ["closespider_timeout"]
        assert row["errors"][0]["url"].startswith("http://l-slow.test/r")
    assert outcomes["done"]["outcome"] == "nothing_to_do"
    assert stats["records_not_started"] >= len(not_started)
    assert sum(stats["outcomes"].values()) == len(rows)
    assert stats["records_fed"] + stats["records_not_started"] == len(rows)


def test_the_crawls_warnings_and_errors_reach_the_dagster_run_log_bounded(tmp_path):
    """A crawl run through Dagster Pipes forwards its warnings and errors to the run's log (what
    the UI shows): at most 5 lines of one message, then a line with the counts of everything."""
    root = tmp_path / "web"
    _host(root, "l-ok.test", {"index.html": "fine"})
    long_url = "http://l-ok.test/?" + "&".join(f"k{i}=v{i}" for i in range(400))
    rows = [{"id": "ok", "url": "http://l-ok.test/index.html"}, {"id": "long", "url": long_url}]
    dataset, mappings = write_dataset(
        tmp_path, rows, fields={"value": {}}, mappings={"life": MAPPING}, crawl={"depth": 0}
    )
    for i in range(7):  # seven broken mappings: seven errors of one message
        (mappings / f"broken{i}.json").write_text('{"name": "broken"}', encoding="utf-8")
    with running_web(root) as server:
        _, out_dir, messages = crawl_through_pipes(
            dataset, mappings, tmp_path / "work", proxy=server.proxy_url, log_level="WARNING"
        )
    skipped = [m for m in messages if m.startswith("[") and "mapping skipped" in m]
    assert len(skipped) == 5, messages
    assert any("[enrich_crawl.crawl.feed]" in m and "crawl idle" in m for m in messages)
    (summary,) = [m for m in messages if m.startswith("crawl log:")]
    assert "7 error" in summary and "1 warning" in summary and "2 not forwarded" in summary
    assert json.loads((out_dir / "stats.json").read_text())["outcomes"] == {"resolved": 2}


# -- the Dagster instance ----------------------------------------------------------------------

FIRST_USE = """
from enrich_crawl.home import ensure_dagster_home, initialise_instance
home = ensure_dagster_home(initialise=False)
did = initialise_instance(home)
import dagster as dg
with dg.DagsterInstance.get() as instance:
    instance.get_runs(limit=1)
    instance.get_backfills()
    instance.all_asset_keys()
print("initialised" if did else "reused")
"""


def test_processes_starting_at_once_on_a_fresh_instance_do_not_race(tmp_path):
    """Three processes open a new SQLite instance at once (two `enrich-crawl run`, a run and its
    steps): without the one locked initialisation they race to create its tables ("table
    alembic_version already exists", "more than one head")."""
    home = tmp_path / "fresh_home"
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", FIRST_USE],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    results = [process.communicate(timeout=300) for process in processes]
    for process, (_out, err) in zip(processes, results, strict=True):
        assert process.returncode == 0, err[-3000:]
        assert "already exists" not in err and "head" not in err, err[-3000:]
    said = sorted(out.strip().splitlines()[-1] for out, _ in results)
    assert said == ["initialised", "reused", "reused"]
    assert (home / "dagster.yaml").exists()
