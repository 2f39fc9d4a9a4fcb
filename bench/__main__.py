"""Benchmarks: ``python -m bench <name> [options]``.

python -m bench e2e [--quick] [--hosts N --records N --processes P ...]
    the end-to-end benchmark of issue #9 (bench/e2e/): the product against the seed-style
    baseline and a plain Scrapy BFS on a generated web, a CPU floor, a scaling series and an RSS
    check; writes bench/results/<date>[-quick].json, .md and -scaling.png.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

QUICK = {
    "hosts": 100,
    "records": 300,
    "processes": 2,
    "baseline_budget": 60.0,
    "bfs_records": 0,
    "bfs_compare_records": 20,
    "bfs_budget": 600.0,
    "parallel_baselines": True,
    "scaling": (),
    "rss_small_records": 0,
    "scaling_cpu_records": 150,
    "scaling_politeness_hosts": 6,
    "scaling_politeness_records": 60,
}


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.replace(" ", "").split(",") if x and int(x) > 0)


def e2e_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="small sizes: a run of a few minutes")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--hosts", type=int, help="hosts of the web (default 1000; quick 100)")
    parser.add_argument("--records", type=int, help="records (default 20000; quick 300)")
    parser.add_argument(
        "--processes", type=int, help="partitions / processes of every system (default 8; quick 2)"
    )
    parser.add_argument(
        "--crawl-processes",
        type=int,
        help="the product's ENRICH_CRAWL_PROCESSES: crawl processes its partitions are dealt "
        "into (0 = one per partition; default: the product's own, the machine's cores)",
    )
    parser.add_argument(
        "--baseline-budget",
        type=float,
        help="seconds each baseline may crawl (default 900; quick 45; 0 = until done)",
    )
    parser.add_argument(
        "--bfs-records",
        type=int,
        help="records per process the Scrapy BFS crawls to the end (default 25; 0 = time budget)",
    )
    parser.add_argument("--bfs-budget", type=float, help="safety limit of that crawl (3600 s)")
    parser.add_argument(
        "--bfs-compare-records",
        type=int,
        help="records the product and the Scrapy BFS both crawl to the end on the web without "
        "delays, for pages per resolved record (default 60; quick 20; 0 = BFS as a baseline on "
        "the main web instead)",
    )
    parser.add_argument(
        "--floor-requests",
        type=int,
        help="requests of the product the CPU floor refetches, an even sample (default 0 = "
        "all of them)",
    )
    parallel = parser.add_mutually_exclusive_group()
    parallel.add_argument(
        "--parallel-baselines",
        dest="parallel_baselines",
        action="store_true",
        default=None,
        help="run the two baselines at the same time (default with --quick)",
    )
    parallel.add_argument("--sequential-baselines", dest="parallel_baselines", action="store_false")
    parser.add_argument(
        "--scaling", type=_ints, help="partition counts of the scaling series (default 1,2,4,8)"
    )
    parser.add_argument("--scaling-cpu-records", type=int, help="records of the CPU-bound case")
    parser.add_argument(
        "--scaling-politeness-hosts", type=int, help="hosts of the politeness-bound case"
    )
    parser.add_argument(
        "--scaling-politeness-records", type=int, help="records of the politeness-bound case"
    )
    parser.add_argument(
        "--rss-records", dest="rss_small_records", type=int,
        help="records of the small run of the RSS check (default 2000; 0 = skip)",
    )  # fmt: skip
    parser.add_argument(
        "--skip",
        default="",
        help="comma list of parts to leave out: product,seed,bfs,floor,paced_floor,answer_paced_floor,scaling,rss",
    )
    parser.add_argument("--no-plugins", action="store_true", help="leave out the Python docs host")
    parser.add_argument("--cache-dir", type=Path, help="where generated webs are kept")
    parser.add_argument("--results-dir", type=Path, help="default bench/results")
    parser.add_argument("--work-dir", type=Path, help="run folders and logs (default: a temp dir)")
    parser.add_argument(
        "--report", type=Path, help="only write the .md (and plot) of this results JSON again"
    )


def run_e2e(args: argparse.Namespace) -> int:
    from bench.e2e.suite import Suite, SuiteConfig, rerender, write_report

    if args.report:
        for kind, path in rerender(args.report).items():
            print(f"{kind}: {path}")
        return 0

    values = dict(QUICK) if args.quick else {}
    for name in (
        "hosts",
        "records",
        "processes",
        "crawl_processes",
        "baseline_budget",
        "bfs_records",
        "bfs_budget",
        "bfs_compare_records",
        "floor_requests",
        "parallel_baselines",
        "scaling",
        "scaling_cpu_records",
        "scaling_politeness_hosts",
        "scaling_politeness_records",
        "rss_small_records",
        "cache_dir",
        "results_dir",
        "work_dir",
    ):
        value = getattr(args, name)
        if value is not None:
            values[name] = value
    values["seed"] = args.seed
    values["quick"] = args.quick
    values["skip"] = frozenset(s for s in args.skip.replace(" ", "").split(",") if s)
    if args.no_plugins:
        values["plugins"] = ()
    cfg = SuiteConfig(**values)
    suite = Suite(cfg)
    results = suite.run()
    paths = write_report(results, cfg)
    print(paths["md"].read_text("utf-8"))
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    print(f"work folder (logs, run homes): {suite.work}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    e2e = sub.add_parser("e2e", help="end-to-end benchmark (issue #9)")
    e2e_parser(e2e)
    args = parser.parse_args(argv)
    if args.command == "e2e":
        return run_e2e(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
