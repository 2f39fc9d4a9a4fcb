"""Is a crawl worker's CPU per page set by the fleet around it, or by its own pace?

The same shards of the benchmark's records crawled in several layouts (split_ab.LAYOUTS), in one
interleaved series so that the machine's drift hits them alike:

- `fleet`: the N workers at once on one database, as in production (hosts shared through the
  limiter: a worker waits while another one holds a host);
- `separate`: the N workers at once, each on its own database (nothing shared: what the fleet
  costs beyond the same processes side by side);
- `alone`: the N workers one after the other (nobody else on the machine);
- any of them with another number of workers (`fleet:2`): the same records in fewer, busier
  processes;
- any of them with the shards dealt into fewer crawl processes (`fleet:8/2`: the 8 shards'
  crawls, one Scrapy crawler each, in 2 processes; enrich_crawl.crawl.worker.run_crawls).

Each run's CPU per page (user+sys of each worker from wait4, over the pages of its stats.json)
and each worker's pace (pages per second of its own crawl) are reported. The workers run without
Dagster, on the benchmark's web with its delays.

    python -m bench.e2e.layouts --records 4000 --series fleet:8,alone:8,separate:8,fleet:2,fleet:8

Writes bench/results/layouts-<date>[-tag].{json,md}; its checks are information (each layout's
CPU per page over the fleet's, in the same series).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
from typing import Any

from bench.e2e import generate as gen_mod
from bench.e2e.attribution import add_web_options
from bench.e2e.split_ab import LAYOUTS, run_fleet


def parse_series(text: str) -> list[tuple[str, int, int]]:
    """`fleet:8,alone:8,fleet:8/2` -> [("fleet", 8, 8), ("alone", 8, 8), ("fleet", 8, 2)]:
    (layout, shards, crawl processes); a layout without a number: 8 shards, one process each."""
    series = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        layout, _, count = item.partition(":")
        count, _, procs = count.partition("/")
        if layout not in LAYOUTS:
            raise SystemExit(f"layouts: unknown layout {layout!r} in --series (one of "
                             f"{', '.join(LAYOUTS)})")  # fmt: skip
        for number in (count, procs):
            if number and not (number.isdigit() and int(number) > 0):
                raise SystemExit(
                    f"layouts: {item!r}: the numbers of workers and processes must be positive "
                    "integers"
                )
        workers = int(count or 8)
        series.append((layout, workers, min(int(procs or workers), workers)))
    if not series:
        raise SystemExit("layouts: --series names no run")
    return series


def run_key(layout: str, workers: int, processes: int) -> str:
    """`fleet:8`, or `fleet:8/2` when the shards share processes."""
    return f"{layout}:{workers}" + (f"/{processes}" if processes != workers else "")


def summarize(
    layout: str, workers: int, fleet: dict[str, Any], processes: int | None = None
) -> dict[str, Any]:
    """One run's figures: CPU per page over all its workers (run_fleet's arm A, which holds
    every worker when no shard is in arm B), and their pace."""
    every = fleet["arms"]["A"]
    assert every["workers"] == len(fleet["shards"]), "layouts runs every worker in arm A"
    pages = every["pages"]
    crawl_seconds = sum(r.get("seconds") or 0.0 for r in fleet["shards"].values())
    return {
        "layout": layout,
        "workers": workers,
        "processes": processes or workers,
        "wall_s": fleet["wall_s"],
        "cpu_s": every["cpu_s"],
        "pages": pages,
        "ms_per_page": every["ms_per_page"],
        # pages a crawl process crawls in a second of its own crawl, over all of them
        "pages_per_worker_second": round(pages / crawl_seconds, 2) if crawl_seconds else None,
        "shards": fleet["shards"],
    }


def _name(key: str) -> str:
    """A run key as part of a check's name: `fleet:8/2` -> `fleet_8_in_2`."""
    return key.replace("/", "_in_").replace(":", "_")


def checks(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each other layout's CPU per page over the production fleet's (the first `fleet` run's
    number of workers), medians over the series' runs of each."""
    by_key: dict[str, list[float]] = {}
    for run in runs:
        key = run_key(run["layout"], run["workers"], run.get("processes") or run["workers"])
        by_key.setdefault(key, []).append(run["ms_per_page"])
    fleets = [k for k in by_key if k.startswith("fleet:")]
    if not fleets:
        return {}
    # the production fleet: one process per shard, when the series has it
    base_key = next((k for k in fleets if "/" not in k), fleets[0])
    base = statistics.median(by_key[base_key])
    out = {}
    for key, values in by_key.items():
        if key == base_key:
            continue
        name = f"cpu_per_page_{_name(key)}_vs_{_name(base_key)}"
        out[name] = {
            "value": round(statistics.median(values) / base, 3),
            "runs": values,
            "base_runs": by_key[base_key],
            "target": "(information)",
            "ok": None,
        }
    return out


def _switches(run: dict[str, Any]) -> str:
    """A run's context switches per page (wait4's, all its processes), or "-" when not kept."""
    rows = list(run.get("shards", {}).values())
    if not rows or run["pages"] <= 0 or any("voluntary_switches" not in r for r in rows):
        return "-"
    voluntary = sum(r["voluntary_switches"] for r in rows) / run["pages"]
    involuntary = sum(r["involuntary_switches"] for r in rows) / run["pages"]
    return f"{voluntary:.2f}, {involuntary:.2f}"


def markdown(results: dict[str, Any]) -> str:
    lines = [
        f"# Crawl workers in several layouts ({results['name']})",
        "",
        f"{results['records']} records of the end-to-end benchmark's web with its delays, the "
        "crawl workers without Dagster, in this order (one series):",
        "",
        "| run | layout | workers | processes | CPU s | pages | ms/page | pages per "
        "process-second | context switches per page (voluntary, involuntary) | wall s |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for n, run in enumerate(results["runs"], 1):
        lines.append(
            f"| {n} | {run['layout']} | {run['workers']} | {run.get('processes', run['workers'])} "
            f"| {run['cpu_s']} | {run['pages']:,} | "
            f"{run['ms_per_page']} | {run['pages_per_worker_second']} | {_switches(run)} | "
            f"{run['wall_s']} |"
        )
    lines += ["", "Layouts: " + "; ".join(f"`{k}` {v}" for k, v in LAYOUTS.items()) + ".", ""]
    for name, check in results["checks"].items():
        lines.append(f"- `{name}`: {check['value']} (runs {check['runs']} against "
                     f"{check['base_runs']} ms/page)")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=4000)
    parser.add_argument(
        "--series",
        default="fleet:8,alone:8,separate:8,fleet:8",
        help="the runs in order, LAYOUT[:WORKERS[/PROCESSES]] separated by commas (layouts: "
        + ", ".join(LAYOUTS)
        + ")",
    )
    parser.add_argument("--tag", default="")
    add_web_options(parser)
    args = parser.parse_args(argv)
    series = parse_series(args.series)

    say = lambda msg: print(f"[layouts] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    gen = gen_mod.cached(
        gen_mod.GenConfig(seed=args.seed, hosts=args.hosts, records=args.web_records),
        args.cache_dir,
        log=say,
    )
    runs = []
    for layout, workers, processes in series:
        fleet = run_fleet(
            gen, args.records, workers, set(), {}, {}, say, layout=layout, processes=processes
        )
        run = summarize(layout, workers, fleet, processes)
        say(f"{run_key(layout, workers, processes)}: {run['ms_per_page']} ms/page, "
            f"{run['pages_per_worker_second']} pages per process-second")  # fmt: skip
        runs.append(run)
    date = dt.date.today().isoformat()
    name = f"layouts-{date}{'-' + args.tag if args.tag else ''}"
    results = {
        "name": name,
        "date": date,
        "records": args.records,
        "series": [run_key(*run) for run in series],
        "runs": runs,
        "checks": checks(runs),
    }
    args.results_dir.mkdir(parents=True, exist_ok=True)
    path = args.results_dir / f"{name}.json"
    path.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    (args.results_dir / f"{name}.md").write_text(markdown(results), encoding="utf-8")
    say(f"-> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
