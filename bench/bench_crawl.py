"""Crawl engine benchmark: throughput against its two ceilings, waste against breadth-first, memory.

    python -m bench.bench_crawl [--hosts 500] [--delay 1.0] [--workers 4] [--rounds 1]

On one generated virtual web (enrich_crawl.testing.synthweb) of `--hosts` sites, each with
`--records-per-host` organisations, crawled by `--workers` crawl processes at once (one per
partition, sharing one MongoDB-wire server and the per-host limiter, as production does):

1. politeness: robots.txt gives every host `Crawl-delay: --delay`; pages/s reached against the
   politeness ceiling (hosts / delay) and against the CPU ceiling, which is the same crawl with no
   delay at all (Crawl-delay capped to 0), measured in the same run (rounds interleave the two);
   target: >= 80% of min(ceilings). The no-delay crawl is also run without the shared limiter,
   which gives the limiter's overhead;
2. waste: pages fetched per resolved record by the goal-directed crawl against a plain breadth-first
   crawl of the same depth (the same spider with `strategy: bfs`), on a web where every record is
   its own site; target: at most half;
3. memory: peak RSS of one crawl process for N and 4N records (flat is the target).

Throughput comes from the virtual web's request log (requests / span); percentiles are over 1 s
bins of the steady part (10%..90% of the span). Everything lands in bench/results/crawl.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import resource
import shutil
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from enrich_crawl.testing.services import ephemeral_mongo
from enrich_crawl.testing.synthweb import (
    build_synth_web,
    politeness_violations,
    run_workers,
    seed_shards,
)
from enrich_crawl.virtualweb import requests_by_host, running_web

RESULTS = Path(__file__).resolve().parent / "results"
NO_DELAY = {"default_delay": 0.0, "max_delay": 0.0, "autothrottle": False}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    values = sorted(values)
    pick = lambda q: values[min(len(values) - 1, int(q * len(values)))]  # noqa: E731
    return {
        "p10": round(pick(0.10), 2),
        "p50": round(pick(0.50), 2),
        "p90": round(pick(0.90), 2),
        "mean": round(statistics.fmean(values), 2),
    }


def throughput(log: list[dict[str, Any]]) -> dict[str, Any]:
    times = sorted(e["t"] for e in log if e.get("method") == "GET")
    if len(times) < 2:
        return {"requests": len(times), "pages_per_second": 0.0}
    span = times[-1] - times[0]
    start, end = times[0] + 0.1 * span, times[0] + 0.9 * span
    bins = Counter(int(t - start) for t in times if start <= t < end)
    per_second = [bins.get(i, 0) for i in range(int(end - start))]
    return {
        "requests": len(times),
        "span_seconds": round(span, 2),
        "pages_per_second": round(len(times) / span, 2),
        "steady_pages_per_second": _percentiles([float(v) for v in per_second]),
    }


def _gaps(log: list[dict[str, Any]]) -> dict[str, float]:
    """Seconds between the answer of one request to a host and the next request to it."""
    gaps = []
    for entries in requests_by_host(log).values():
        for a, b in itertools.pairwise(entries):
            gaps.append(b["t"] - (a["t"] + a.get("dur", 0.0)))
    return _percentiles(gaps)


def crawl_once(
    label: str, web, prepared, server, mongo, work: Path, workers: int, overrides: dict
) -> dict[str, Any]:
    seen = len(server.read_log())
    cpu = _children_cpu()
    run = run_workers(
        web.dataset,
        web.mappings,
        work,
        proxy=server.proxy_url,
        shards=workers,
        mongo_uri=mongo.uri,
        mongo_db=f"bench_{label}_{int(time.time() * 1000)}",
        run_id=label,
        crawl_overrides=overrides,
        prepared=prepared,
        timeout=1800,
    )
    cpu = _children_cpu() - cpu
    log = server.read_log()[seen:]
    if set(run.returncodes.values()) != {0}:
        raise RuntimeError(f"{label}: a worker failed: {run.logs}")
    stats = list(run.stats.values())
    pages = sum(s["pages"] for s in stats)
    outcomes = Counter()
    for s in stats:
        outcomes.update(s["outcomes"])
    limiter = [s["delays"]["limiter"] for s in stats]
    result = {
        "label": label,
        **throughput(log),
        "pages": pages,
        "records": sum(outcomes.values()),
        "resolved": outcomes.get("resolved", 0),
        "pages_per_resolved_record": round(pages / max(outcomes.get("resolved", 0), 1), 3),
        "wall_seconds": round(run.seconds, 2),
        "worker_cpu_seconds": round(cpu, 2),
        "cpu_ms_per_page": round(1000 * cpu / max(pages, 1), 2),
        "peak_rss_mb": run.peak_rss_mb,
        "answer_to_next_request_seconds": _gaps(log),
        "limiter": {
            "acquired": sum(x.get("acquired", 0) for x in limiter),
            "kept": sum(x.get("kept", 0) for x in limiter),
            "waits": sum(x.get("waits", 0) for x in limiter),
            "db_seconds": round(sum(x.get("db_seconds", 0.0) for x in limiter), 3),
        },
    }
    if overrides.get("max_delay", 1.0) != 0.0:  # with no delay there is no spacing to check
        violations = politeness_violations(log, web)
        result["politeness_violations"] = {k: len(v) for k, v in violations.items()}
    print(
        f"  {label:>14}: {result['pages_per_second']:7.1f} pages/s "
        f"({result['requests']} requests in {result.get('span_seconds')} s), "
        f"{result['cpu_ms_per_page']} CPU ms/page, {result['pages_per_resolved_record']} "
        f"pages/resolved, violations {result.get('politeness_violations', '-')}",
        flush=True,
    )
    return result


def bench_throughput(args, base: Path, mongo) -> dict[str, Any]:
    web = build_synth_web(
        base / "throughput",
        hosts=args.hosts,
        records_per_host=args.records_per_host,
        crawl_delay=args.delay,
        default_delay=args.delay,
        variety=False,
        latency=args.latency,
    )
    prepared = seed_shards(web.dataset, base / "throughput" / "work", args.workers)
    runs: dict[str, list[dict[str, Any]]] = {
        "polite": [],
        "no_delay": [],
        "no_delay_no_limiter": [],
    }
    with running_web(web.root, log_path=base / "throughput" / "requests.jsonl") as server:
        for round_no in range(args.rounds):
            print(f"round {round_no + 1}/{args.rounds}", flush=True)
            for label, overrides in (
                ("polite", {}),
                ("no_delay", NO_DELAY),
                ("no_delay_no_limiter", {**NO_DELAY, "shared_limiter": False}),
            ):
                runs[label].append(
                    crawl_once(
                        label,
                        web,
                        prepared,
                        server,
                        mongo,
                        base / "throughput" / "work" / f"r{round_no}",
                        args.workers,
                        overrides,
                    )
                )
    polite = [r["pages_per_second"] for r in runs["polite"]]
    cpu = [r["pages_per_second"] for r in runs["no_delay"]]
    bare = [r["pages_per_second"] for r in runs["no_delay_no_limiter"]]
    politeness_ceiling = args.hosts / args.delay
    # ratios within each round (the machine is shared and noisy), then their median
    ratios = [p / min(politeness_ceiling, c) for p, c in zip(polite, cpu, strict=True)]
    overheads = [1 - c / b for c, b in zip(cpu, bare, strict=True)]
    return {
        "hosts": args.hosts,
        "records": web.records,
        "delay_seconds": args.delay,
        "latency_seconds": args.latency,
        "workers": args.workers,
        "politeness_ceiling_pages_per_second": politeness_ceiling,
        "cpu_ceiling_pages_per_second": cpu,
        "polite_pages_per_second": polite,
        "ratio_to_min_ceiling": [round(r, 3) for r in ratios],
        "ratio_to_min_ceiling_median": round(statistics.median(ratios), 3),
        "ratio_to_politeness_ceiling": [round(p / politeness_ceiling, 3) for p in polite],
        "target": 0.8,
        "target_met": statistics.median(ratios) >= 0.8,
        "limiter_overhead_fraction": [round(o, 3) for o in overheads],
        "runs": runs,
    }


def bench_waste(args, base: Path, mongo) -> dict[str, Any]:
    web = build_synth_web(
        base / "waste",
        hosts=args.bfs_hosts,
        records_per_host=1,
        crawl_delay=None,
        default_delay=0.0,
        variety=False,
    )
    prepared = seed_shards(web.dataset, base / "waste" / "work", args.workers)
    results = {}
    with running_web(web.root, log_path=base / "waste" / "requests.jsonl") as server:
        for strategy in ("goal", "bfs"):
            results[strategy] = crawl_once(
                strategy,
                web,
                prepared,
                server,
                mongo,
                base / "waste" / "work",
                args.workers,
                {**NO_DELAY, "strategy": strategy, "store_pages": False},
            )
    goal = results["goal"]["pages_per_resolved_record"]
    bfs = results["bfs"]["pages_per_resolved_record"]
    return {
        "records": web.records,
        "depth": 1,
        "goal_pages_per_resolved_record": goal,
        "bfs_pages_per_resolved_record": bfs,
        "ratio": round(goal / bfs, 3),
        "target": 0.5,
        "target_met": goal <= 0.5 * bfs,
        "runs": results,
    }


def bench_memory(args, base: Path, mongo) -> dict[str, Any]:
    out = {}
    for hosts in (args.memory_hosts, 4 * args.memory_hosts):
        web = build_synth_web(
            base / f"memory{hosts}",
            hosts=hosts,
            records_per_host=4,
            crawl_delay=None,
            default_delay=0.0,
            variety=False,
        )
        prepared = seed_shards(web.dataset, base / f"memory{hosts}" / "work", 1)
        with running_web(web.root, log_path=base / f"memory{hosts}" / "requests.jsonl") as server:
            result = crawl_once(
                f"memory_{web.records}",
                web,
                prepared,
                server,
                mongo,
                base / f"memory{hosts}" / "work",
                1,
                {**NO_DELAY, "store_pages": False},
            )
        out[str(web.records)] = {
            "records": web.records,
            "pages": result["pages"],
            "peak_rss_mb": result["peak_rss_mb"]["s00"],
        }
    small, large = (out[k]["peak_rss_mb"] for k in sorted(out, key=int))
    return {"by_records": out, "rss_ratio_4x_records": round(large / small, 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=500)
    parser.add_argument("--records-per-host", type=int, default=6)
    parser.add_argument("--delay", type=float, default=1.0)
    parser.add_argument("--latency", type=float, default=0.02, help="server latency (s)")
    parser.add_argument("--workers", type=int, default=4, help="crawl processes (partitions)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--bfs-hosts", type=int, default=100)
    parser.add_argument("--memory-hosts", type=int, default=250)
    parser.add_argument("--skip", nargs="*", default=[], choices=["throughput", "waste", "memory"])
    parser.add_argument("--out", type=Path, default=RESULTS / "crawl.json")
    args = parser.parse_args(argv)

    base = Path(tempfile.mkdtemp(prefix="bench-crawl-"))
    report: dict[str, Any] = {
        "benchmark": "crawl",
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"cpus": __import__("os").cpu_count(), "python": platform.python_version()},
        "args": {k: v for k, v in vars(args).items() if k != "out"},
    }
    try:
        with ephemeral_mongo() as mongo:
            if "throughput" not in args.skip:
                print("throughput vs ceilings", flush=True)
                report["throughput"] = bench_throughput(args, base, mongo)
            if "waste" not in args.skip:
                print("pages per resolved record: goal-directed vs breadth-first", flush=True)
                report["waste"] = bench_waste(args, base, mongo)
            if "memory" not in args.skip:
                print("peak RSS of one crawl process, N vs 4N records", flush=True)
                report["memory"] = bench_memory(args, base, mongo)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2), encoding="utf-8")
    summary = {
        "ratio_to_min_ceiling": report.get("throughput", {}).get("ratio_to_min_ceiling_median"),
        "goal_vs_bfs_pages": report.get("waste", {}).get("ratio"),
        "rss_ratio_4x_records": report.get("memory", {}).get("rss_ratio_4x_records"),
    }
    print(json.dumps(summary), flush=True)
    print(f"results in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
