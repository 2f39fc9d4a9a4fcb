"""Orchestration CPU: what `enrich-crawl run` spends around its crawl, two checkouts compared.

    python -m bench.bench_orchestration_cpu --before CHECKOUT [--after CHECKOUT] [--rounds 2]
                                            [--hosts 100 --records 300 --processes 2]

The end-to-end benchmark's quick case (`python -m bench e2e --quick`: 100 hosts, 300 records, 2
partitions; the generated web from its cache), run by `enrich-crawl run` of each checkout (the
console script of its own `.venv`, an editable install of that checkout), in turns within one
invocation (before, after, after, before, ...: the machine is shared and noisy), on one virtual
web and one MongoDB-wire server. Each run has a fresh Dagster home and its own database.

CPU (user+sys, psutil samples of the whole process tree every 0.1 s) by role:

- `cli`: the `enrich-crawl` process itself (preflight, and the run's orchestration: the executor's
  loop, the event log of the run, the progress display, the summary);
- `dagster`: every other process but the crawl workers (the step processes, the forkserver they
  are forked from, and whatever they start besides a crawl);
- `crawl_worker`: `python -m enrich_crawl.crawl.worker` (for scale: not orchestration).

The check `orchestration_cpu_vs_before`: median over the rounds of (cli + dagster) of the after
checkout over the before one; target <= 0.5. Writes bench/results/orchestration-cpu-<date>.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
REPO = Path(__file__).resolve().parent.parent
WORKER = "enrich_crawl.crawl.worker"
INIT_INSTANCE = (
    "from enrich_crawl.runner import ensure_dagster_home; ensure_dagster_home(); "
    "import dagster; instance = dagster.DagsterInstance.get(); instance.get_runs(limit=1); "
    "instance.get_backfills()"
)


def _roles(root_pid: int, procs: dict[Any, Any]) -> dict[str, float]:
    roles = {"cli": 0.0, "dagster": 0.0, "crawl_worker": 0.0}
    for info in procs.values():
        if info.pid == root_pid:
            role = "cli"
        elif WORKER in info.cmd:
            role = "crawl_worker"
        else:
            role = "dagster"
        roles[role] += info.cpu
    return {k: round(v, 3) for k, v in roles.items()}


def _short(cmd: str) -> str:
    """A process's command line without the folders of this machine."""
    return " ".join(part.rsplit("/", 1)[-1] for part in cmd.split(" "))[:120]


def run_once(
    checkout: Path, label: str, spec: Path, mappings: Path, env: dict[str, str], work: Path
) -> dict[str, Any]:
    """One `enrich-crawl run` of `checkout`, measured."""
    from bench.e2e.measure import TreeSampler

    home = work / label / "dagster_home"
    home.mkdir(parents=True, exist_ok=True)
    # the checkout's own code whatever its .venv's editable install points to (a snapshot of a
    # commit may borrow another checkout's .venv)
    env = {
        **env,
        "DAGSTER_HOME": str(home),
        "MONGODB_DB": label.replace("-", "_"),
        "PYTHONPATH": str(checkout),
    }
    python = checkout / ".venv" / "bin" / "python"
    exe = checkout / ".venv" / "bin" / "enrich-crawl"
    # the instance's schema is created before the measured run, as the e2e benchmark does
    subprocess.run(
        [str(python), "-c", INIT_INSTANCE], env=env, cwd=home, capture_output=True, check=False
    )
    out, err = work / f"{label}.stdout", work / f"{label}.stderr"
    started = time.monotonic()
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        proc = subprocess.Popen(
            [str(exe), "run", "--dataset", str(spec), "--mappings", str(mappings)],
            env=env,
            cwd=home,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
        )
        sampler = TreeSampler(proc.pid)
        sampler.start()
        try:
            code = proc.wait(timeout=1800)
        finally:
            sampler.stop()
    wall = time.monotonic() - started
    roles = _roles(proc.pid, sampler.procs)
    processes = sorted(
        (
            {"pid": p.pid, "cpu_s": round(p.cpu, 3), "cmd": _short(p.cmd)}
            for p in sampler.procs.values()
        ),
        key=lambda p: -p["cpu_s"],
    )
    return {
        "label": label,
        "returncode": code,
        "wall_s": round(wall, 2),
        "cpu_by_role_s": roles,
        "orchestration_cpu_s": round(roles["cli"] + roles["dagster"], 3),
        "processes": len(processes),
        "top_processes": processes[:12],
        # the summary's status line (no paths of this machine in the results)
        "status": _status_line(out.read_text("utf-8", "replace")),
        "stderr_tail": err.read_text("utf-8", "replace")[-600:] if code else "",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", required=True, help="checkout measured as 'before'")
    parser.add_argument("--after", default=str(REPO), help="checkout measured as 'after'")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--hosts", type=int, default=100)
    parser.add_argument("--records", type=int, default=300)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--out", help="results file (default bench/results/orchestration-cpu-<date>)"
    )
    args = parser.parse_args(argv)

    from bench.e2e import generate as gen_mod
    from bench.e2e.suite import DEFAULT_CACHE
    from enrich_crawl.testing.services import ephemeral_mongo
    from enrich_crawl.virtualweb import running_web

    checkouts = {"before": Path(args.before).resolve(), "after": Path(args.after).resolve()}
    for name, path in checkouts.items():
        if not (path / ".venv" / "bin" / "enrich-crawl").is_file():
            parser.error(f"--{name} {path}: no .venv/bin/enrich-crawl (run scripts/setup.sh there)")
    gen = gen_mod.cached(
        gen_mod.GenConfig(seed=args.seed, hosts=args.hosts, records=args.records),
        DEFAULT_CACHE / "bench-e2e",
        log=lambda msg: print(f"[orchestration-cpu] {msg}", file=sys.stderr, flush=True),
    )
    work = Path(tempfile.mkdtemp(prefix="bench-orch-cpu-"))
    base_env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ENRICH_", "DAGSTER_", "VIRTUAL_ENV")) and k.lower() != "no_proxy"
    }
    runs: list[dict[str, Any]] = []
    with (
        running_web(gen.web, log_path=work / "requests.jsonl") as web,
        ephemeral_mongo() as mongo,
    ):
        env = {
            **base_env,
            **web.proxy_env(),
            "MONGODB_URI": mongo.uri,
            "ENRICH_SHARDS": str(args.processes),
            "ENRICH_MAX_PARALLEL": str(args.processes),
            "PYTHONWARNINGS": "ignore",
        }
        for round_no in range(args.rounds):
            order = ["before", "after"] if round_no % 2 == 0 else ["after", "before"]
            for name in order:
                label = f"{name}-{round_no}"
                print(f"[orchestration-cpu] {label} ...", file=sys.stderr, flush=True)
                result = run_once(checkouts[name], label, gen.spec, gen.mappings, env, work)
                result["checkout"] = name
                runs.append(result)
                print(
                    f"[orchestration-cpu] {label}: exit {result['returncode']}, "
                    f"{result['wall_s']} s, CPU {result['cpu_by_role_s']}",
                    file=sys.stderr,
                    flush=True,
                )

    def median(name: str, role: str) -> float:
        values = [r["cpu_by_role_s"][role] for r in runs if r["checkout"] == name]
        return round(statistics.median(values), 3)

    figures = {
        name: {role: median(name, role) for role in ("cli", "dagster", "crawl_worker")}
        for name in checkouts
    }
    for entry in figures.values():
        entry["orchestration"] = round(entry["cli"] + entry["dagster"], 3)
    ratios = []
    for round_no in range(args.rounds):
        pair = {r["checkout"]: r for r in runs if r["label"].endswith(f"-{round_no}")}
        if pair["before"]["orchestration_cpu_s"]:
            ratios.append(
                pair["after"]["orchestration_cpu_s"] / pair["before"]["orchestration_cpu_s"]
            )
    ratio = round(statistics.median(ratios), 3) if ratios else None
    # exit 3: the run succeeded but a check of severity ERROR failed (the generated web's
    # mapping_agreement on both checkouts): the orchestration did all its work
    ok_runs = all(r["returncode"] in (0, 3) for r in runs)
    result = {
        "benchmark": "orchestration_cpu",
        "date": dt.date.today().isoformat(),
        "config": {k: v for k, v in vars(args).items() if k not in ("before", "after", "out")},
        "commits": {name: _commit(path) for name, path in checkouts.items()},
        "median_cpu_by_role_s": figures,
        "ratios_by_round": [round(r, 3) for r in ratios],
        "runs": runs,
        "checks": {
            "orchestration_cpu_vs_before": {
                "value": ratio,
                "target": "<= 0.5",
                "ok": bool(ratio is not None and ratio <= 0.5 and ok_runs),
            },
            "runs_succeeded": {
                "value": sum(r["returncode"] in (0, 3) for r in runs),
                "target": f"== {len(runs)}",
                "ok": ok_runs,
            },
        },
    }
    out = Path(args.out) if args.out else RESULTS / f"orchestration-cpu-{result['date']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(json.dumps({"median_cpu_by_role_s": figures, "checks": result["checks"]}, indent=1))
    print(f"wrote {out}; run folders in {work}")
    return 0 if result["checks"]["orchestration_cpu_vs_before"]["ok"] else 1


def _status_line(summary: str) -> str:
    return next((line.strip() for line in summary.splitlines() if "status" in line), "")


def _commit(path: Path) -> str:
    try:
        return subprocess.run(
            ["git", "-C", str(path), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


if __name__ == "__main__":
    sys.exit(main())
