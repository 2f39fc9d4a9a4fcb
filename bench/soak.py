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
  page (no rules);
- `run_sigkill`: the whole `enrich-crawl run` (its process group) SIGKILLed mid-crawl, as an OOM
  kill or a reboot would; the run fails and the re-run must complete with no manual step (it
  closes the dead run and frees its pool slots, enrich_crawl/recovery.py);
- `celery_worker_sigkill`: the run goes to two Celery workers (`enrich-crawl worker`, Redis,
  a PostgreSQL instance, all started by the soak the first time) and one worker is SIGKILLed
  with its whole process tree mid-step: the run must finish on the survivor (a new worker
  replaces the lost one before the next such run).

`--faults a,b` draws only from those faults.

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
    "run_sigkill",
    "celery_worker_sigkill",
)
WORKER = [sys.executable, "-m", "enrich_crawl.cli", "worker"]
WORKER_ARGS = ["--concurrency=1", "--without-gossip", "--without-mingle"]
# faults that replace the run's process or executor: at most one of them per run
WHOLE_RUN_FAULTS = ("run_sigkill", "celery_worker_sigkill")
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
        self._stack = contextlib.ExitStack()
        self._fleet: dict[str, Any] | None = None
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
        choices = self.args.faults or FAULTS
        count = min(self.rng.choice((1, 1, 2, 3)), len(choices))
        faults = self.rng.sample(choices, count)
        whole = [f for f in faults if f in WHOLE_RUN_FAULTS]
        return sorted(f for f in faults if f not in whole[1:])

    # -- the Celery fleet (started the first time a run needs it)

    def fleet(self) -> dict[str, Any]:
        if self._fleet is not None:
            return self._fleet
        import shutil

        import yaml

        from enrich_crawl.testing.services import ephemeral_postgres, ephemeral_redis

        redis = self._stack.enter_context(ephemeral_redis())
        postgres = self._stack.enter_context(ephemeral_postgres())
        home = self.base / "celery_home"
        home.mkdir()
        shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
        config = self.base / "celery.yaml"
        config.write_text(
            yaml.safe_dump({"execution": {"config": {"broker": redis.url, "backend": redis.url}}})
        )
        env = {
            **self.env,
            **postgres.env,
            "DAGSTER_HOME": str(home),
            "ENRICH_EXECUTOR": "celery",
            "ENRICH_DATASET": str(self.built.spec),
            "ENRICH_MAPPINGS": str(self.built.mappings),
            "ENRICH_WORKER_LOST_SECONDS": "20",
            "ENRICH_WORKER_PING_SECONDS": "5",
        }
        # the instance's tables once, before two workers race to create them
        subprocess.run(
            [sys.executable, "-c", "import dagster as dg; dg.DagsterInstance.get().get_runs()"],
            env=env,
            check=True,
            timeout=120,
        )
        self._fleet = {"env": env, "config": config, "workers": {}, "started": 0}
        return self._fleet

    def ensure_workers(self) -> None:
        fleet = self.fleet()
        for name in list(fleet["workers"]):
            if fleet["workers"][name].poll() is not None:
                del fleet["workers"][name]
        while len(fleet["workers"]) < 2:
            fleet["started"] += 1
            name = f"soak-{fleet['started']}"
            log = self.base / f"{name}.log"
            with open(log, "wb") as out:
                process = subprocess.Popen(
                    [*WORKER, "-y", str(fleet["config"]), "-n", name, "--", *WORKER_ARGS],
                    env=fleet["env"],
                    cwd=self.base,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            deadline = time.monotonic() + 180
            while " ready." not in log.read_text(errors="replace"):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"celery worker {name} did not start: {log}")
                time.sleep(0.5)
            fleet["workers"][name] = process

    def stop_workers(self) -> None:
        if self._fleet is None:
            return
        for process in self._fleet["workers"].values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)  # warm shutdown
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=60)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)

    def _first_crawl(self, done: threading.Event, parents: set[int] | None = None):
        """A crawl process of this dataset that has fetched a few pages (under `parents`)."""
        from enrich_crawl.testing.processes import crawl_workers

        deadline = time.monotonic() + 240
        while not done.is_set() and time.monotonic() < deadline:
            for worker in crawl_workers():
                if worker.dataset != self.name:
                    continue
                with contextlib.suppress(psutil.Error):
                    if parents is not None and worker.process.ppid() not in parents:
                        continue
                requests = self.work / self.name / "crawl" / str(worker.partition)
                requests = requests / "web-requests.jsonl"
                if (
                    requests.exists()
                    and requests.read_text("utf-8", "replace").count('"/rec-') >= 2
                ):
                    return worker
            time.sleep(0.2)
        return None

    def _run_killer(self, cli: subprocess.Popen, done: threading.Event, log: list[str]) -> None:
        crawl = self._first_crawl(done)
        if crawl is None:
            log.append("run_sigkill: no crawl to kill")
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(cli.pid, signal.SIGKILL)
        log.append(f"run_sigkill while {crawl.partition} crawled")

    def _celery_killer(self, done: threading.Event, log: list[str]) -> None:
        workers = dict(self.fleet()["workers"])
        name = self.rng.choice(sorted(workers))
        with contextlib.suppress(psutil.Error):
            tree = {p.pid for p in psutil.Process(workers[name].pid).children(recursive=True)}
            crawl = self._first_crawl(done, tree | {workers[name].pid})
            if crawl is None:
                log.append(f"celery_worker_sigkill {name}: no crawl to kill")
                return
            with contextlib.suppress(ProcessLookupError):
                os.killpg(workers[name].pid, signal.SIGKILL)
            log.append(f"celery_worker_sigkill {name} while it crawled {crawl.partition}")

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
        command = [sys.executable, "-m", "enrich_crawl.cli", "run", "--dataset"]
        command += [str(self.built.spec), "--mappings", str(self.built.mappings)]
        env = self.env
        if "celery_worker_sigkill" in faults:
            self.ensure_workers()
            command = [sys.executable, "-m", "dagster", "job", "execute", "-m"]
            command += ["enrich_crawl.definitions", "-j", "enrich_job"]
            command += ["-c", str(self.fleet()["config"])]
            env = self.fleet()["env"]
        cli = subprocess.Popen(
            command,
            env=env,
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
        if "run_sigkill" in faults:
            helpers.append(threading.Thread(target=self._run_killer, args=(cli, done, notes)))
        if "celery_worker_sigkill" in faults:
            helpers.append(threading.Thread(target=self._celery_killer, args=(done, notes)))
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
    parser.add_argument(
        "--faults",
        type=lambda text: [f for f in text.split(",") if f],
        default=None,
        help=f"draw only from these faults (comma-separated): {','.join(FAULTS)}",
    )
    args = parser.parse_args(argv)
    unknown = sorted(set(args.faults or ()) - set(FAULTS))
    if unknown:
        parser.error(f"unknown fault(s) {', '.join(unknown)}; known: {', '.join(FAULTS)}")

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
            try:
                soak_runs(soak, args, report, out)
            finally:
                soak.stop_workers()
                soak._stack.close()
    return summarize(report, out)


def soak_runs(soak: Soak, args: argparse.Namespace, report: dict[str, Any], out: Path) -> None:
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
            f"crawl={result['peak_rss_mb_crawl_process']}MB"
            + (f" ({'; '.join(result['notes'])})" if result["notes"] else ""),
            flush=True,
        )
        out.write_text(json.dumps(report, indent=2), encoding="utf-8")


def summarize(report: dict[str, Any], out: Path) -> int:
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
    summary = report["summary"]
    killed = [
        note
        for r in runs
        for note in r["notes"]
        if note.startswith(("run_sigkill while", "celery_worker_sigkill soak-"))
    ]
    report["checks"] = {
        name: {"value": value, "target": 0, "ok": value == 0}
        for name, value in (
            ("records_lost", summary["records_lost"]),
            ("duplicates", summary["duplicates"]),
            ("wrong_values", summary["wrong_values"]),
            ("recoveries_failed", summary["recoveries_failed"]),
        )
    }
    # the whole-run faults really happened (a draw whose run ended first proves nothing)
    report["checks"]["whole_run_faults_injected"] = {
        "value": len(killed),
        "target": "= runs drawn with run_sigkill or celery_worker_sigkill",
        "ok": len(killed) == sum(1 for r in runs if set(r["faults"]) & set(WHOLE_RUN_FAULTS)),
    }
    report["finished"] = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    out.write_text(json.dumps(report, indent=2), encoding="utf-8")
    print(json.dumps({"summary": summary, "checks": report["checks"]}, indent=2))
    print(f"report: {out}")
    return 0 if all(check["ok"] for check in report["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
