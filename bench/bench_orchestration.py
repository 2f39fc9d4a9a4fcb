"""Orchestration overhead: the same crawl through enrich_job vs the bare crawl processes.

    python -m bench.bench_orchestration [--shards 16] [--records-per-host 60] [--delay 1.5]
                                        [--rounds 1] [--spawn]

One invocation, one politeness-bound virtual web (enrich_crawl.testing.politeweb: every shard has
the same hosts and pages behind a robots.txt Crawl-delay, so a shard's crawl lasts about
records_per_host x delay seconds whatever the machine), one MongoDB-wire server, and per round:

- bare: the seed prepared once, then the `shards` crawl processes started at once, exactly as
  crawl_shard starts them (`python -m enrich_crawl.crawl.worker --params FILE`, each with its
  shard's virtual web), timed from the first start to the last exit;
- dagster: `enrich_job` restricted to crawl_results (seed materialised beforehand, untimed), in a
  fresh Python process (`dagster job execute`-like: the definitions loaded, the run created, the
  multiprocess executor, one crawl step per shard in parallel through Pipes, the summary step),
  timed from the process start to its exit;
- and once, for information, the whole enrich_job (seed -> crawl -> resolve -> merge -> checks).

Overhead = (T_dagster - T_bare) / T_dagster, at the same concurrency (every shard at once: the
executor's max_concurrent and the `crawl` pool are set to the shard count). Each variant has its
own staging area and database, so neither reuses the other's pages. Target: <= 10 % at 16 shards.
Writes bench/results/orchestration-<timestamp>.json and prints a table.
"""

from __future__ import annotations

import argparse
import contextlib
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
INSTANCE_YAML = """\
telemetry:
  enabled: false
concurrency:
  pools:
    default_limit: {limit}
"""


def _env(base: dict[str, str], **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in base.items()
        if k.lower() not in ("http_proxy", "https_proxy", "no_proxy", "all_proxy")
    }
    env.update(extra)
    return env


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)

    def pick(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))], 3)

    return {"p50": pick(0.5), "p90": pick(0.9), "max": round(ordered[-1], 3)}


def run_bare(built, work: Path, mongo_uri: str, db: str, shards: list[str]) -> dict[str, Any]:
    """The crawl processes alone, as crawl_shard would start them."""
    from enrich_crawl import config
    from enrich_crawl.crawl.params import WorkerParams
    from enrich_crawl.dataset.load import prepare_dataset
    from enrich_crawl.dataset.spec import load_spec
    from enrich_crawl.staging import DatasetStage
    from enrich_crawl.virtualweb import running_web

    spec = load_spec(built.spec)
    stage = DatasetStage(work, spec.name)
    prepare_dataset(spec, stage, shards)
    params_files = []
    for key in shards:
        out_dir = stage.crawl_dir(key)
        out_dir.mkdir(parents=True, exist_ok=True)
        params = WorkerParams(
            dataset=spec.name,
            partition=key,
            seed_path=str(stage.seed_shard(key)),
            out_dir=str(out_dir),
            mappings_dir=str(built.mappings),
            field_types=spec.field_types(),
            crawl=spec.crawl.to_dict(),
            run_id="bare",
            user_agent=config.user_agent(),
            allow_private=False,
            chromium=config.chromium_path(),
            mongo_uri=mongo_uri,
            mongo_db=db,
            log_level="ERROR",
        )
        params_files.append((key, out_dir, params))
    with contextlib.ExitStack() as stack:
        # each crawl gets its own virtual web, as in crawl_shard; started before the clock (the
        # dagster side starts them inside its steps: this only makes the comparison stricter)
        paths = []
        for _key, out_dir, params in params_files:
            web = stack.enter_context(
                running_web(spec.virtual_web, log_path=out_dir / "web-requests.jsonl")
            )
            params.proxy = web.proxy_url
            path = out_dir / "params.json"
            path.write_text(json.dumps(params.to_dict()))
            paths.append(path)
        processes = []
        started = time.perf_counter()
        for path in paths:
            processes.append(
                subprocess.Popen(
                    [sys.executable, "-m", "enrich_crawl.crawl.worker", "--params", str(path)],
                    env=_env(os.environ, MONGODB_URI=mongo_uri),
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        codes = [p.wait() for p in processes]
        seconds = time.perf_counter() - started
    stats = [json.loads((stage.crawl_stats(key)).read_text()) for key in shards]
    return {
        "seconds": round(seconds, 3),
        "exit_codes": codes,
        "pages": sum(s["pages"] for s in stats),
        "shard_seconds": _percentiles([s["seconds"] for s in stats]),
    }


def _dagster_env(built, home: Path, work: Path, mongo_uri: str, db: str, shards: int, start):
    return _env(
        os.environ,
        DAGSTER_HOME=str(home),
        ENRICH_WORK_DIR=str(work),
        ENRICH_DATASET=str(built.spec),
        ENRICH_MAPPINGS=str(built.mappings),
        ENRICH_SHARDS=str(shards),
        ENRICH_MAX_PARALLEL=str(shards),
        MONGODB_URI=mongo_uri,
        MONGODB_DB=db,
        BENCH_START_METHOD=start,
    )


def _execute_in_subprocess(env: dict[str, str], selection: str) -> dict[str, Any]:
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "bench.bench_orchestration", "--execute", selection],
        env=env,
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - started
    if result.returncode != 0:
        raise RuntimeError(f"enrich_job ({selection}) failed:\n{result.stderr[-4000:]}")
    report = json.loads(result.stdout.strip().splitlines()[-1])
    report["seconds"] = round(seconds, 3)
    return report


def execute(selection: str) -> None:
    """In the child process: run enrich_job (`crawl` = crawl_results only, or `all`)."""
    import dagster as dg

    from enrich_crawl.definitions import enrich_job_def
    from enrich_crawl.defs.jobs import FORKSERVER

    start_method = {"spawn": {}} if os.environ.get("BENCH_START_METHOD") == "spawn" else FORKSERVER
    run_config = {"execution": {"config": {"start_method": start_method}}}
    with dg.DagsterInstance.get() as instance:
        if selection == "seed":
            keys = [dg.AssetKey("seed_dataset")]
        elif selection == "crawl":
            keys = [dg.AssetKey("crawl_results")]
        else:
            keys = None
        run = dg.execute_job(
            dg.reconstructable(enrich_job_def),
            instance=instance,
            run_config=run_config,
            asset_selection=keys,
        )
        if not run.success:
            sys.exit(1)
        record = instance.get_run_record_by_id(run.run_id)
        timeline: dict[str, list[float]] = {}
        for entry in instance.all_logs(run.run_id):
            kind = entry.dagster_event.event_type_value if entry.dagster_event else None
            if entry.step_key and kind in ("STEP_START", "STEP_SUCCESS"):
                at = round(entry.timestamp - record.start_time, 2)
                timeline.setdefault(entry.step_key, []).append(at)
        crawl = [t for key, ts in timeline.items() if "crawl_shard" in key for t in ts]
        print(
            json.dumps(
                {
                    "run_seconds": round(record.end_time - record.start_time, 3),
                    "crawl_steps_window": round(max(crawl) - min(crawl), 3) if crawl else None,
                    "steps": timeline,
                }
            )
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--hosts-per-shard", type=int, default=2)
    parser.add_argument("--records-per-host", type=int, default=60)
    parser.add_argument("--delay", type=float, default=1.5, help="robots.txt Crawl-delay (s)")
    parser.add_argument("--rounds", type=int, default=1, help="bare/dagster pairs (ABBA order)")
    parser.add_argument("--spawn", action="store_true", help="also measure spawn step processes")
    parser.add_argument("--no-full", action="store_true", help="skip the whole-chain run")
    parser.add_argument("--execute", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.execute:
        execute(args.execute)
        return 0

    from enrich_crawl.dataset.shard import shard_keys
    from enrich_crawl.testing.politeweb import build_polite_dataset
    from enrich_crawl.testing.services import ephemeral_mongo

    keys = shard_keys(args.shards)
    report: dict[str, Any] = {
        "benchmark": "orchestration",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "load_avg_start": os.getloadavg()},
        "params": vars(args) | {"execute": None},
        "rounds": [],
    }
    with tempfile.TemporaryDirectory(prefix="bench-orch-") as tmp, ephemeral_mongo() as mongo:
        root = Path(tmp)
        built = build_polite_dataset(
            root / "web",
            shards=args.shards,
            hosts_per_shard=args.hosts_per_shard,
            records_per_host=args.records_per_host,
            crawl_delay=args.delay,
            name="orch",
        )
        report["records"] = built.records
        expected = args.records_per_host * args.delay
        print(
            f"{args.shards} shards x {args.hosts_per_shard} hosts x {args.records_per_host} "
            f"pages at {args.delay:g} s: ~{expected:.0f} s per shard crawl",
            flush=True,
        )
        variants = ["forkserver"] + (["spawn"] if args.spawn else [])
        for n in range(args.rounds):
            order = ["bare", *variants] if n % 2 == 0 else [*variants[::-1], "bare"]
            measured: dict[str, Any] = {}
            for variant in order:
                tag = f"r{n}_{variant}"
                work = root / tag / "work"
                db = f"bench_{tag}"
                if variant == "bare":
                    measured["bare"] = run_bare(built, work, mongo.uri, db, keys)
                else:
                    home = root / tag / "home"
                    home.mkdir(parents=True)
                    (home / "dagster.yaml").write_text(INSTANCE_YAML.format(limit=args.shards))
                    env = _dagster_env(built, home, work, mongo.uri, db, args.shards, variant)
                    _execute_in_subprocess(env, "seed")  # untimed: the bare side seeds too
                    measured[variant] = _execute_in_subprocess(env, "crawl")
                print(f"round {n} {variant}: {measured[variant]['seconds']:.1f} s", flush=True)
            for variant in variants:
                t = measured[variant]["seconds"]
                measured[f"overhead_{variant}"] = round((t - measured["bare"]["seconds"]) / t, 4)
            report["rounds"].append(measured)
        if not args.no_full:
            home = root / "full" / "home"
            home.mkdir(parents=True)
            (home / "dagster.yaml").write_text(INSTANCE_YAML.format(limit=args.shards))
            env = _dagster_env(
                built, home, root / "full" / "work", mongo.uri, "bench_full", args.shards, ""
            )
            report["full_enrich_job"] = _execute_in_subprocess(env, "all")
            print(f"whole enrich_job: {report['full_enrich_job']['seconds']:.1f} s", flush=True)
    report["machine"]["load_avg_end"] = os.getloadavg()
    overheads = [r["overhead_forkserver"] for r in report["rounds"]]
    report["overhead"] = {
        "median": round(statistics.median(overheads), 4),
        "values": overheads,
        "target": 0.10,
        "met": statistics.median(overheads) <= 0.10,
    }
    RESULTS.mkdir(exist_ok=True)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = RESULTS / f"orchestration-{stamp}.json"
    out.write_text(json.dumps(report, indent=2))
    print("\n| round | bare s | enrich_job (crawl) s | overhead |")
    print("|---|---|---|---|")
    for n, r in enumerate(report["rounds"]):
        print(
            f"| {n} | {r['bare']['seconds']:.1f} | {r['forkserver']['seconds']:.1f} | "
            f"{r['overhead_forkserver']:.1%} |"
        )
    print(
        f"\noverhead (median) {report['overhead']['median']:.1%} at {args.shards} shards "
        f"(target <= 10 %): {'met' if report['overhead']['met'] else 'NOT met'}; {out}"
    )
    return 0 if report["overhead"]["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
