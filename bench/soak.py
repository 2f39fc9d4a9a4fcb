"""Soak: the nightly job run N times in a row on a virtual web, with faults injected at random.

    python -m bench.soak --runs 20 --seed 1 [--hosts-per-shard 2] [--records-per-host 6]

Not part of CI: a documented command (docs/reliability.md). One MongoDB-wire server (nx-27017,
data on disk so that it can be restarted), one local Dagster instance, one generated dataset whose
virtual web (enrich_crawl.testing.politeweb) the crawl steps serve. Every run is `enrich-crawl run`
(enrich_job: seed -> crawl -> resolve -> merge -> checks), as the nightly schedule launches it; the
recrawl TTL is tiny, so every run crawls again, and a few pages change between runs (history).

Before each run, faults are drawn with a seeded RNG (`--seed`):

- `worker_sigkill`: the crawl process of a random shard is SIGKILLed mid-crawl (the step is retried,
  ENRICH_CRAWL_RETRIES=2, and resumes from the crawled-page store);
- `mongo_restart_between`: MongoDB stopped and started again before the run;
- `mongo_restart_mid`: MongoDB stopped for 2 s during the run;
- `host_5xx`, `host_flaky`, `host_slow`, `host_timeout`: one host answers 503 to every record page,
  503 to the first two requests of each page, 1.5 s late, or never (download timeout);
- `robots_5xx`, `robots_html`: one host's robots.txt answers 503 (disallow for now), or an HTML
  page (no rules).

After each run (and after one fault-free re-run when a run failed): every usable record has exactly
one document, no record lost a value it had, no history entry is repeated. Peak RSS per run: the
largest crawl process (its own statistics) and the whole process tree of the run (sampled).
Writes bench/results/soak-<timestamp>.json and prints one line per run.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

RESULTS = Path(__file__).resolve().parent / "results"
REPO = Path(__file__).resolve().parents[1]
FAULTS = (
    "worker_sigkill",
    "mongo_restart_between",
    "mongo_restart_mid",
    "host_5xx",
    "host_flaky",
    "host_slow",
    "host_timeout",
    "robots_5xx",
    "robots_html",
)
CRAWL_EXTRA = (
    "  download_timeout: 3\n  retries: 1\n  retry_backoff: 0.3\n  retry_backoff_max: 1\n"
    "  recrawl_ttl_hours: 0.0001\n  robots_ttl_hours: 0.0001\n"
)


def _env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k.lower() not in ("http_proxy", "https_proxy", "no_proxy", "all_proxy")
    }
    for key in ("MONGODB_URI", "MONGODB_DB", "ENRICH_DATASET", "ENRICH_MAPPINGS"):
        env.pop(key, None)
    env.update(extra)
    return env


def _tree_rss(root: psutil.Process) -> int:
    total = 0
    with contextlib.suppress(psutil.Error):
        for process in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                total += process.memory_info().rss
    return total


class Soak:
    def __init__(self, args: argparse.Namespace, base: Path, mongo: Any):
        from enrich_crawl.testing.politeweb import build_polite_dataset

        self.args = args
        self.base = base
        self.mongo = mongo
        self.rng = random.Random(args.seed)
        self.name = "soak"
        self.built = build_polite_dataset(
            base / "data",
            shards=args.shards,
            hosts_per_shard=args.hosts_per_shard,
            records_per_host=args.records_per_host,
            crawl_delay=0.2,
            name=self.name,
            latency=0.02,
        )
        spec = self.built.spec.read_text("utf-8")
        self.built.spec.write_text(spec.replace("  depth: 0\n", "  depth: 0\n" + CRAWL_EXTRA))
        self.web = self.built.root / "web"
        self.hosts = [h for hosts in self.built.hosts_by_shard.values() for h in hosts]
        self.home = base / "dagster_home"
        self.home.mkdir()
        (self.home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n", "utf-8")
        self.work = base / "work"
        self.db = "soak"
        self.env = _env(
            MONGODB_URI=mongo.uri,
            MONGODB_DB=self.db,
            DAGSTER_HOME=str(self.home),
            ENRICH_WORK_DIR=str(self.work),
            ENRICH_SHARDS=str(args.shards),
            ENRICH_CRAWL_RETRIES="2",
            ENRICH_CRAWL_RETRY_DELAY="1",
        )
        # record id -> every value its page has had; values each record had after a run
        self.page_values = {rid: {city} for rid, city in self.built.expected.items()}
        self.had_value: set[str] = set()

    # -- faults

    def _host_config(self, host: str, config: dict[str, Any] | None) -> None:
        path = self.web / host / "_web.json"
        if config:
            path.write_text(json.dumps(config), encoding="utf-8")
        else:
            path.unlink(missing_ok=True)

    def _robots(self, host: str, html: bool) -> None:
        path = self.web / host / "robots.txt"
        if html:
            path.write_text("<!doctype html><html><body>Disallow: /</body></html>", "utf-8")
        else:
            path.write_text("User-agent: *\nCrawl-delay: 0.2\nDisallow: /private/\n", "utf-8")

    def draw_faults(self) -> list[str]:
        count = self.rng.choice((1, 1, 2, 3))
        return sorted(self.rng.sample(FAULTS, count))

    def prepare(self, faults: list[str]) -> dict[str, str]:
        """Set the web's faults for this run; returns {fault: host} for host faults."""
        for host in self.hosts:
            self._host_config(host, None)
            self._robots(host, html=False)
        where: dict[str, str] = {}
        configs = {
            "host_5xx": {"status": {"^/rec-": 503}},
            "host_flaky": {"fail_first": {"^/rec-": 2}},
            "host_slow": {"latency": 1.5},
            "host_timeout": {"hang": ["^/rec-"]},
            "robots_5xx": {"status": {"robots": 503}},
        }
        for fault in faults:
            if fault in configs or fault == "robots_html":
                host = self.rng.choice(self.hosts)
                where[fault] = host
                if fault == "robots_html":
                    self._robots(host, html=True)
                else:
                    self._host_config(host, configs[fault])
        # the web changes a little between nights: a few pages get a new value
        for rid in self.rng.sample(sorted(self.page_values), 2):
            host = f"{rid.rsplit('-', 1)[0]}.test"
            n = int(rid.rsplit("-", 1)[1])
            city = f"City{self.rng.randrange(10**6)}"
            (self.web / host / f"rec-{n}.html").write_text(
                f"<html><body><h1>{rid}</h1><p class='city'> {city} </p></body></html>", "utf-8"
            )
            self.page_values[rid].add(city)
        if "mongo_restart_between" in faults:
            self.mongo.stop()
            time.sleep(1.0)
            self.mongo.start()
        return where

    def _killer(self, cli: subprocess.Popen, done: threading.Event, log: list[str]) -> None:
        from enrich_crawl.testing.processes import crawl_workers

        shard = self.rng.choice(sorted(self.built.hosts_by_shard))
        stats_dir = self.work / self.name / "crawl" / shard
        deadline = time.monotonic() + 240
        while not done.is_set() and time.monotonic() < deadline:
            requests = stats_dir / "web-requests.jsonl"
            fetched = 0
            if requests.exists():
                fetched = requests.read_text("utf-8", errors="replace").count('"/rec-')
            workers = [
                w for w in crawl_workers() if w.dataset == self.name and w.partition == shard
            ]
            if workers and fetched >= 2:
                with contextlib.suppress(psutil.Error):
                    workers[0].process.send_signal(signal.SIGKILL)
                    log.append(f"worker_sigkill {shard} after {fetched} pages")
                return
            time.sleep(0.2)
        log.append(f"worker_sigkill {shard}: no crawl to kill")

    def _mongo_blip(self, done: threading.Event, log: list[str]) -> None:
        # wait for the crawls to start, then take MongoDB away for 2 s
        deadline = time.monotonic() + 240
        while not done.is_set() and time.monotonic() < deadline:
            if list((self.work / self.name / "crawl").glob("*/web-requests.jsonl")):
                break
            time.sleep(0.2)
        if done.is_set():
            log.append("mongo_restart_mid: the run ended first")
            return
        time.sleep(self.rng.uniform(0.5, 4.0))
        self.mongo.stop()
        time.sleep(2.0)
        self.mongo.start()
        log.append("mongo_restart_mid done")

    # -- one run

    def run_once(self, faults: list[str]) -> dict[str, Any]:
        for path in (self.work / self.name / "crawl").glob("*/web-requests.jsonl"):
            path.unlink()
        cli = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "enrich_crawl.cli",
                "run",
                "--dataset",
                str(self.built.spec),
                "--mappings",
                str(self.built.mappings),
            ],
            env=self.env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        done = threading.Event()
        notes: list[str] = []
        helpers = []
        if "worker_sigkill" in faults:
            helpers.append(threading.Thread(target=self._killer, args=(cli, done, notes)))
        if "mongo_restart_mid" in faults:
            helpers.append(threading.Thread(target=self._mongo_blip, args=(done, notes)))
        for helper in helpers:
            helper.start()
        root = psutil.Process(cli.pid)
        peak_tree = 0
        started = time.monotonic()
        output: list[str] = []
        reader = threading.Thread(target=lambda: output.append(cli.stdout.read()), daemon=True)
        reader.start()
        while cli.poll() is None:
            peak_tree = max(peak_tree, _tree_rss(root))
            if time.monotonic() - started > self.args.run_timeout:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(cli.pid, signal.SIGKILL)
                notes.append("run killed: over the time limit (hung)")
            time.sleep(0.25)
        done.set()
        for helper in helpers:
            helper.join(timeout=30)
        reader.join(timeout=30)
        text = "".join(output)
        crawl_peak = 0.0
        pages = 0
        for stats_file in (self.work / self.name / "crawl").glob("*/stats.json"):
            with contextlib.suppress(OSError, ValueError):
                stats = json.loads(stats_file.read_text("utf-8"))
                crawl_peak = max(crawl_peak, float(stats.get("peak_rss_mb") or 0.0))
                pages += int(stats.get("pages") or 0)
        return {
            "ok": cli.returncode == 0,
            "returncode": cli.returncode,
            "seconds": round(time.monotonic() - started, 1),
            "pages": pages,
            "peak_rss_mb_run_tree": round(peak_tree / 2**20, 1),
            "peak_rss_mb_crawl_process": round(crawl_peak, 1),
            "notes": notes,
            "failure": "" if cli.returncode == 0 else text[-1500:],
        }

    # -- the invariants

    def check(self) -> dict[str, Any]:
        import pymongo

        client = pymongo.MongoClient(self.mongo.uri, serverSelectionTimeoutMS=10000)
        try:
            docs = list(client[self.db][self.name].find())
        finally:
            client.close()
        ids = [d["_id"] for d in docs]
        expected = set(self.page_values)
        lost = sorted(expected - set(ids))
        lost_values = []
        wrong_values = []
        duplicate_history = 0
        for doc in docs:
            city = (doc.get("data") or {}).get("city")
            if city is None and doc["_id"] in self.had_value:
                lost_values.append(doc["_id"])
            if city is not None:
                self.had_value.add(doc["_id"])
                if city not in self.page_values.get(doc["_id"], set()):
                    wrong_values.append(doc["_id"])
            entries = (doc.get("history") or {}).get("city") or []
            keys = [json.dumps([e.get("value"), str(e.get("fetched_at"))]) for e in entries]
            duplicate_history += len(keys) - len(set(keys))
            duplicate_history += sum(
                1 for a, b in itertools.pairwise(entries) if a["value"] == b["value"]
            )
        return {
            "documents": len(docs),
            "records_lost": len(lost) + len(lost_values),
            "lost": lost[:10] + lost_values[:10],
            "duplicates": (len(ids) - len(set(ids))) + duplicate_history,
            "wrong_values": wrong_values[:10],
            "resolved": sum(1 for d in docs if d.get("status") == "resolved"),
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--hosts-per-shard", type=int, default=2)
    parser.add_argument("--records-per-host", type=int, default=6)
    parser.add_argument("--run-timeout", type=float, default=600.0, help="a run over this hangs")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)

    from enrich_crawl.testing.services import ephemeral_mongo

    RESULTS.mkdir(exist_ok=True)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    out = args.out or RESULTS / f"soak-{stamp}.json"
    report: dict[str, Any] = {
        "command": "python -m bench.soak " + " ".join(argv if argv is not None else sys.argv[1:]),
        "started": stamp,
        "machine": {"cpus": os.cpu_count(), "load_average_at_start": os.getloadavg()},
        "runs": [],
    }
    with tempfile.TemporaryDirectory(prefix="enrich-soak-") as tmp:
        base = Path(tmp)
        with ephemeral_mongo(data_dir=base / "mongo") as mongo:
            soak = Soak(args, base, mongo)
            report["dataset"] = {
                "records": soak.built.records,
                "shards": args.shards,
                "hosts": len(soak.hosts),
            }
            for number in range(1, args.runs + 1):
                faults = soak.draw_faults()
                where = soak.prepare(faults)
                result = soak.run_once(faults)
                recovery = None
                if not result["ok"]:
                    # what an operator (or the next night) does: run again, without new faults
                    for host in soak.hosts:
                        soak._host_config(host, None)
                        soak._robots(host, html=False)
                    recovery = soak.run_once([])
                checked = soak.check()
                entry = {
                    "run": number,
                    "faults": faults,
                    "fault_hosts": where,
                    **result,
                    "recovery_run": recovery,
                    **checked,
                }
                report["runs"].append(entry)
                print(
                    f"run {number:2d} {'ok ' if result['ok'] else 'FAILED'} "
                    f"{result['seconds']:6.1f}s faults={','.join(faults)} "
                    f"{'recovered ' + str(recovery['ok']) + ' ' if recovery else ''}"
                    f"docs={checked['documents']} lost={checked['records_lost']} "
                    f"dups={checked['duplicates']} resolved={checked['resolved']} "
                    f"rss tree={result['peak_rss_mb_run_tree']}MB "
                    f"crawl={result['peak_rss_mb_crawl_process']}MB",
                    flush=True,
                )
                out.write_text(json.dumps(report, indent=2), encoding="utf-8")
    runs = report["runs"]
    injected: dict[str, int] = {}
    for entry in runs:
        for fault in entry["faults"]:
            injected[fault] = injected.get(fault, 0) + 1
    tree = [r["peak_rss_mb_run_tree"] for r in runs]
    report["summary"] = {
        "runs": len(runs),
        "runs_failed_then_recovered": sum(1 for r in runs if not r["ok"]),
        "recoveries_failed": sum(
            1 for r in runs if r["recovery_run"] is not None and not r["recovery_run"]["ok"]
        ),
        "faults_injected": sum(injected.values()),
        "faults_by_kind": dict(sorted(injected.items())),
        "records": report["dataset"]["records"],
        "records_lost": sum(r["records_lost"] for r in runs),
        "duplicates": sum(r["duplicates"] for r in runs),
        "wrong_values": sum(len(r["wrong_values"]) for r in runs),
        "peak_rss_mb_run_tree": tree,
        "peak_rss_mb_crawl_process": [r["peak_rss_mb_crawl_process"] for r in runs],
        "peak_rss_mb_run_tree_first_last": [tree[0], tree[-1]] if tree else [],
        "seconds_per_run_median": sorted(r["seconds"] for r in runs)[len(runs) // 2] if runs else 0,
    }
    report["finished"] = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    out.write_text(json.dumps(report, indent=2), encoding="utf-8")
    print(json.dumps(report["summary"], indent=2))
    print(f"report: {out}")
    ok = report["summary"]["records_lost"] == 0 and report["summary"]["duplicates"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
