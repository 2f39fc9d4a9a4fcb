"""Two variants of the crawl worker in one fleet: an A/B of a few percent on a noisy machine.

Runs of the same fleet on this shared 2-core machine differ by up to a fifth in CPU per page, so
two runs one after the other cannot show a change of 5-10 %. Here the N workers of one polite fleet
run at once on N shards of the benchmark's records, one database, as in `bench.e2e.attribution
--workers N`, but each worker gets the environment of arm A or arm B (`--b-shards`): both arms share
the machine's load second by second. Each worker's CPU is its own (user+sys from wait4), its pages
its stats.json; an arm's CPU per page is its workers' CPU over their pages. `--swap` runs the
fleet a second time with the arms' shards exchanged, so that the shards' own differences cancel.

    python -m bench.e2e.split_ab --records 4000 --b-shards 0,2,4,6 --swap \\
        --a-env ENRICH_CRAWL_ALLOCATOR=system --b-env ENRICH_CRAWL_ALLOCATOR=auto --tag allocator

Writes `bench/results/split-ab-<date>-<tag>.json` with a check `arm_b_cpu_per_page_vs_arm_a`
(B's CPU per page over A's, < 1: B is cheaper; both runs and their mean).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.e2e import generate as gen_mod
from bench.e2e.attribution import add_web_options, write_worker_params
from enrich_crawl.dataset.shard import crawl_groups

REPO = Path(__file__).resolve().parents[2]


def _pairs(values: list[str]) -> dict[str, str]:
    out = {}
    for value in values:
        key, sep, val = value.partition("=")
        if not sep or not key:
            raise SystemExit(f"split_ab: expected KEY=VALUE, got {value!r}")
        out[key] = val
    return out


# how the shards of a fleet are crawled (`run_fleet`'s `layout`)
LAYOUTS = {
    "fleet": "all at once on one database (hosts shared through the limiter, as in production)",
    "separate": "all at once, each on its own database (no host shared: a diagnostic only, "
    "the hosts' delays hold within each worker but not across them)",
    "alone": "one after the other, each on its own database (no other worker on the machine)",
}


def run_fleet(
    gen: gen_mod.Generated,
    records: int,
    workers: int,
    b_shards: set[int],
    env_a: dict[str, str],
    env_b: dict[str, str],
    say: Any,
    layout: str = "fleet",
    processes: int | None = None,
) -> dict[str, Any]:
    """One fleet: each crawl process's arm, CPU (s), pages, seconds and peak RSS. `layout`
    (LAYOUTS): the workers at once on one database (`fleet`), at once each on its own
    (`separate`), or one after the other each on its own (`alone`). `processes`: the `workers`
    shards dealt out into that many crawl processes (several crawls in one process,
    `enrich_crawl.crawl.worker.run_crawls`); default one process per shard. A process's arm is
    its index's (`b_shards`)."""
    if layout not in LAYOUTS:
        raise SystemExit(f"split_ab: unknown layout {layout!r} (one of {', '.join(LAYOUTS)})")
    processes = min(processes or workers, workers)
    if processes < 1:
        raise SystemExit("split_ab: a fleet needs at least one crawl process")
    from enrich_crawl.dataset.load import prepare_dataset
    from enrich_crawl.dataset.spec import load_spec
    from enrich_crawl.staging import DatasetStage
    from enrich_crawl.testing.services import ephemeral_mongo
    from enrich_crawl.virtualweb import running_web

    truth = sorted(gen.truth())
    step = max(1, len(truth) // records)
    spec_path = gen_mod.subset(gen, f"attribution{records}", truth[::step][:records], crawl=None)
    spec = load_spec(spec_path)
    work = Path(tempfile.mkdtemp(prefix="bench-split-ab-"))
    shards = [f"s{n:02d}" for n in range(workers)]
    # the shards of each process, dealt out as the product deals them
    groups = crawl_groups(shards, processes)
    stage = DatasetStage(work / "stage", spec.name)
    prepare_dataset(spec, stage, shards)
    env = {k: v for k, v in os.environ.items() if k.lower() not in ("http_proxy", "https_proxy")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env["PYTHONWARNINGS"] = "ignore"
    rows: dict[str, dict[str, Any]] = {}
    with running_web(gen.web, log_path=work / "requests.jsonl") as web, ephemeral_mongo() as mongo:
        procs: dict[int, tuple[str, list[str]]] = {}
        # separate and alone: each process on its own database (its shards share it)
        databases = {
            shard: "split_ab" if layout == "fleet" else f"split_ab_{group[0]}"
            for group in groups
            for shard in group
        }

        def reap() -> None:
            while procs:
                pid, status, usage = os.wait4(-1, 0)
                if pid not in procs:
                    continue
                arm, group = procs.pop(pid)
                name = "+".join(group)
                if status:
                    raise SystemExit(f"split_ab: worker {name} failed (see {work / name}.log)")
                stats = [
                    json.loads((work / "crawl" / shard / "stats.json").read_text("utf-8"))
                    for shard in group
                ]
                rows[name] = {
                    "arm": arm,
                    "shards": group,
                    "cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
                    # times the worker slept waiting for something (its event loop had nothing
                    # to do) and times it was preempted while it had work
                    "voluntary_switches": usage.ru_nvcsw,
                    "involuntary_switches": usage.ru_nivcsw,
                    "pages": sum(s["pages"] for s in stats),
                    "seconds": max(s.get("seconds") or 0.0 for s in stats),
                    "database": databases[group[0]],
                    "peak_rss_mb": max(s["peak_rss_mb"] for s in stats),
                    "allocator": stats[0].get("allocator"),
                }

        arm_b = f", arm B on processes {sorted(b_shards)}" if b_shards else ""
        say(f"{workers} shards in {processes} processes on {records} records ({layout}){arm_b} ...")
        started = time.time()
        for i, group in enumerate(groups):
            argv = [sys.executable, "-m", "enrich_crawl.crawl.worker"]
            for shard in group:
                params_path = write_worker_params(
                    work / f"params-{shard}.json",
                    spec=spec,
                    spec_path=spec_path,
                    stage=stage,
                    shard=shard,
                    out_dir=work / "crawl" / shard,
                    run_id="split-ab",
                    proxy=web.proxy_url,
                    mongo_uri=mongo.uri,
                    mongo_db=databases[shard],
                )
                argv += ["--params", str(params_path)]
            arm = "B" if i in b_shards else "A"
            with open(work / f"{'+'.join(group)}.log", "w", encoding="utf-8") as log:
                proc = subprocess.Popen(
                    argv,
                    env={**env, **(env_b if arm == "B" else env_a)},
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            procs[proc.pid] = (arm, group)
            if layout == "alone":
                reap()
        reap()
    arms = {}
    for arm in "AB":
        mine = [r for r in rows.values() if r["arm"] == arm]
        cpu, pages = sum(r["cpu_s"] for r in mine), sum(r["pages"] for r in mine)
        arms[arm] = {
            "workers": len(mine),
            "cpu_s": round(cpu, 3),
            "pages": pages,
            "ms_per_page": round(1000 * cpu / max(pages, 1), 4),
            "peak_rss_mb": max((r["peak_rss_mb"] for r in mine), default=None),
        }
    return {
        "layout": layout,
        "processes": processes,
        "wall_s": round(time.time() - started, 1),
        "shards": rows,
        "arms": arms,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=4000)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--b-shards", default="0,2,4,6", help="shard numbers of arm B")
    parser.add_argument("--a-env", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--b-env", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--swap", action="store_true", help="a second fleet, arms exchanged")
    parser.add_argument("--tag", default="")
    add_web_options(parser)
    args = parser.parse_args(argv)

    say = lambda msg: print(f"[split_ab] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    gen = gen_mod.cached(
        gen_mod.GenConfig(seed=args.seed, hosts=args.hosts, records=args.web_records),
        args.cache_dir,
        log=say,
    )
    b_shards = {int(n) for n in args.b_shards.split(",") if n.strip()}
    env_a, env_b = _pairs(args.a_env), _pairs(args.b_env)
    layouts = [b_shards]
    if args.swap:
        layouts.append(set(range(args.workers)) - b_shards)
    fleets = []
    for layout in layouts:
        fleet = run_fleet(gen, args.records, args.workers, layout, env_a, env_b, say)
        fleet["b_over_a"] = round(
            fleet["arms"]["B"]["ms_per_page"] / fleet["arms"]["A"]["ms_per_page"], 4
        )
        say(f"A {fleet['arms']['A']['ms_per_page']} ms/page, B {fleet['arms']['B']['ms_per_page']}"
            f" ms/page: B/A {fleet['b_over_a']}")  # fmt: skip
        fleets.append(fleet)
    ratios = [f["b_over_a"] for f in fleets]
    mean = round(sum(ratios) / len(ratios), 4)
    results = {
        "date": dt.date.today().isoformat(),
        "records": args.records,
        "workers": args.workers,
        "env_a": env_a,
        "env_b": env_b,
        "fleets": fleets,
        "checks": {
            "arm_b_cpu_per_page_vs_arm_a": {
                "value": mean,
                "runs": ratios,
                "target": "< 1 in every run",
                "ok": all(r < 1 for r in ratios),
            }
        },
    }
    args.results_dir.mkdir(parents=True, exist_ok=True)
    name = f"split-ab-{results['date']}{'-' + args.tag if args.tag else ''}.json"
    path = args.results_dir / name
    path.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    say(f"B/A {ratios} (mean {mean}) -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
