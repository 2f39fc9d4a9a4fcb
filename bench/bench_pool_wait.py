"""CPU of a run that waits for the `crawl` pool while a live run holds it.

    python -m bench.bench_pool_wait [--seconds 30] [--rounds 3] [--baseline DIR]

One MongoDB-wire server, one instance whose `crawl` pool has a single slot, and a holder run: a
slow polite crawl (enrich_crawl.testing.politeweb, robots.txt Crawl-delay 1 s) that keeps the slot
for the whole benchmark. Per round, one waiting `enrich-crawl run` per variant is started at the
same time; once each says "waiting for the crawl pool", the CPU of its whole process tree (the CLI
process, which runs the multiprocess executor in its main thread, and its children: the
forkserver, the resource tracker, any step process) is measured over the same `--seconds` window,
then the waiters are stopped (SIGINT, as Ctrl-C) and the next round starts.

Variants: `current` (this checkout) and, with `--baseline DIR`, `baseline`: the same command with
the package imported from DIR (e.g. `git archive main | tar -x -C DIR`), so that the old and the new
code wait side by side, in the same window of the same (noisy, shared) machine.

Target (issue #22): a waiting run uses under 2 % of a core (`pool_wait_cpu_share` <= 0.02, the
median round of `current`). Writes bench/results/pool-wait.json and prints a table.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
TARGET_SHARE = 0.02
WAITING = b"waiting for the crawl pool"
INSTANCE_YAML = "telemetry:\n  enabled: false\nconcurrency:\n  pools:\n    default_limit: 1\n"
# a waiter needs its start-up (imports, the seed steps) and up to one progress line (10 s) before
# it says it waits; the holder must outlast every round by far
ROUND_OVERHEAD_SECONDS = 150


def _env(base: dict[str, str], **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in base.items()
        if k.lower() not in ("http_proxy", "https_proxy", "no_proxy", "all_proxy", "pythonpath")
    }
    env.update(extra)
    return env


class Run:
    """`enrich-crawl run` of a built dataset in its own session, output to a file; `code` is the
    folder the package is imported from (the working directory and PYTHONPATH)."""

    def __init__(self, built: Any, env: dict[str, str], code: Path, log: Path):
        self.log = log
        self._out = log.open("wb")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "enrich_crawl.cli",
                "run",
                "--dataset",
                str(built.spec),
                "--mappings",
                str(built.mappings),
            ],
            env={**env, "PYTHONPATH": str(code)},
            cwd=code,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def alive(self) -> bool:
        return self.process.poll() is None

    def says(self, text: bytes) -> bool:
        return text in self.log.read_bytes()

    def tail(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")[-3000:]

    def stop(self) -> None:
        """SIGINT to the whole group (Ctrl-C: the run frees its pending claims), then SIGKILL."""
        for sig, grace in ((signal.SIGINT, 60), (signal.SIGKILL, 30)):
            if not self.alive():
                break
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=grace)
        self._out.close()


def _thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) of each thread of `pid`, from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    found: dict[int, float] = {}
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
                fields = stat[stat.rindex(")") + 2 :].split()
                found[int(tid)] = (int(fields[11]) + int(fields[12])) / tick
    return found


def _tree_cpu(root: int) -> dict[str, float]:
    """CPU seconds of a process tree: the root's main thread, its other threads, its children."""
    main = _thread_cpu(root)
    children = 0.0
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(root).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                times = child.cpu_times()
                children += times.user + times.system
    return {
        "main_thread": main.get(root, 0.0),
        "other_threads": sum(v for tid, v in main.items() if tid != root),
        "children": children,
    }


def _measure(waiters: dict[str, Run], seconds: float) -> dict[str, dict[str, float]]:
    """CPU each waiter's tree used over the same `seconds` (children that ended meanwhile are not
    counted: a waiting run starts none)."""
    before = {name: _tree_cpu(run.process.pid) for name, run in waiters.items()}
    time.sleep(seconds)
    after = {name: _tree_cpu(run.process.pid) for name, run in waiters.items()}
    used = {}
    for name in waiters:
        parts = {k: round(max(after[name][k] - before[name][k], 0.0), 3) for k in after[name]}
        used[name] = {"cpu_seconds": round(sum(parts.values()), 3), **parts}
    return used


def _wait_for(what: str, predicate, runs: list[Run], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        for run in runs:
            if not run.alive():
                raise SystemExit(f"{run.log.name} ended before {what}:\n{run.tail()}")
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="window measured per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--baseline", type=Path, help="a checkout of other code to wait beside this one"
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="more checkouts to wait beside this one (repeatable)",
    )
    parser.add_argument("--results", type=Path, default=RESULTS / "pool-wait.json")
    args = parser.parse_args(argv)

    from enrich_crawl.testing.politeweb import build_polite_dataset
    from enrich_crawl.testing.services import ephemeral_mongo

    variants = {"current": REPO}
    if args.baseline:
        variants["baseline"] = args.baseline.resolve()
    for spec in args.variant:
        name, _, folder = spec.partition("=")
        variants[name] = Path(folder).resolve()
    for name, code in variants.items():
        if not (code / "enrich_crawl" / "cli.py").is_file():
            parser.error(f"{name}: {code} holds no enrich_crawl package")
    rounds: list[dict[str, Any]] = []
    load_before = os.getloadavg()
    with (
        tempfile.TemporaryDirectory(prefix="bench-pool-wait-") as tmp,
        ephemeral_mongo() as mongo,
    ):
        root = Path(tmp)
        home = root / "dagster_home"
        home.mkdir()
        (home / "dagster.yaml").write_text(INSTANCE_YAML, encoding="utf-8")
        work = root / "work"
        env = _env(
            os.environ,
            MONGODB_URI=mongo.uri,
            MONGODB_DB="bench_pool_wait",
            DAGSTER_HOME=str(home),
            ENRICH_WORK_DIR=str(work),
            ENRICH_SHARDS="1",
        )
        holder_pages = int(args.rounds * (args.seconds + ROUND_OVERHEAD_SECONDS)) + 60
        holder_data = build_polite_dataset(
            root / "holder",
            shards=1,
            records_per_host=holder_pages,
            crawl_delay=1.0,
            name=f"hold_{uuid.uuid4().hex[:6]}",
        )
        holder = Run(holder_data, env, REPO, root / "holder.log")
        try:
            requests = work / holder_data.name / "crawl" / "s00" / "web-requests.jsonl"
            _wait_for(
                "the holder crawls",
                lambda: requests.exists() and requests.stat().st_size > 0,
                [holder],
                timeout=300,
            )
            for round_ in range(args.rounds):
                waiters: dict[str, Run] = {}
                try:
                    for name, code in variants.items():
                        built = build_polite_dataset(
                            root / f"{name}-{round_}",
                            shards=1,
                            records_per_host=4,
                            crawl_delay=0.1,
                            name=f"wait_{name}_{round_}",
                        )
                        waiters[name] = Run(built, env, code, root / f"{name}-{round_}.log")
                    _wait_for(
                        "the waiters say they wait",
                        lambda waiting=waiters: all(r.says(WAITING) for r in waiting.values()),
                        [holder, *waiters.values()],
                        timeout=300,
                    )
                    used = _measure(waiters, args.seconds)
                    if not holder.alive() or not all(r.alive() for r in waiters.values()):
                        raise SystemExit("the holder or a waiter ended during the window")
                finally:
                    for run in waiters.values():
                        run.stop()
                rounds.append(used)
                print(
                    f"round {round_}: "
                    + ", ".join(f"{k} {v['cpu_seconds']:.3f} s" for k, v in used.items())
                    + f" of CPU in {args.seconds:.0f} s",
                    flush=True,
                )
        finally:
            holder.stop()

    summary: dict[str, Any] = {}
    for name in variants:
        cpu = [r[name]["cpu_seconds"] for r in rounds]
        median = statistics.median(cpu)
        summary[name] = {
            "cpu_seconds": {"median": median, "min": min(cpu), "max": max(cpu)},
            "cpu_share": round(median / args.seconds, 5),
            "median_round_parts": {
                part: statistics.median(r[name][part] for r in rounds)
                for part in ("main_thread", "other_threads", "children")
            },
        }
    share = summary["current"]["cpu_share"]
    checks = {"pool_wait_cpu_share": {"value": share, "target": TARGET_SHARE, "ok": share <= 0.02}}
    if "baseline" in summary:
        base = summary["baseline"]["cpu_seconds"]["median"]
        summary["current_over_baseline"] = (
            round(summary["current"]["cpu_seconds"]["median"] / base, 3) if base else None
        )
    results = {
        "benchmark": "pool_wait",
        "when": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
        },
        "params": {
            "seconds": args.seconds,
            "rounds": args.rounds,
            "variants": {
                k: "this checkout" if v == REPO else "another checkout" for k, v in variants.items()
            },
        },
        "rounds": rounds,
        "summary": summary,
        "checks": checks,
        "note": "cpu_seconds: user + system CPU of the waiting run's whole process tree over the "
        "window, which starts when the run first says it waits; variants wait side by side in "
        "the same window",
    }
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    print(json.dumps({"summary": summary, "checks": checks}, indent=1))
    print(f"results: {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
