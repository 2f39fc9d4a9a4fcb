"""Loading a dirty table at scale: read, normalise, profile and shard (issue #7).

    python -m bench.bench_load [--sizes 100000,1000000,2000000] [--formats csv,parquet]
                               [--repeats 3] [--workers 1,2] [--baseline-rows 50000]
                               [--data-dir DIR]

Generated 15-column dirty tables (`enrich_crawl.dataset.synth`: padding, odd whitespace,
multi-line cells, NUL bytes, missing markers, messy URLs and numbers and dates, duplicate and
missing ids, ragged rows, cp1252 lines) are loaded with `prepare_dataset` into 8 shards. Every
load runs in a fresh process, so its peak RSS is its own; the cases are interleaved round by round
so that a busy neighbour on this shared machine weighs on all of them alike. Reported per case:
wall time of `prepare_dataset` (median, min, max), CPU time (user + sys: less sensitive to
neighbours), peak RSS (VmHWM), rows/s; the scaling from the smallest size to 1M rows (per-row
time ratio; 1.0 = linear), an extrapolation to 6 million rows (time per row of the largest size;
memory: its peak plus the growth per row between the two largest sizes), and the speed-up over
the row-at-a-time baseline (the walking skeleton's way: pandas' python CSV engine and Python per
row, measured on --baseline-rows rows). Results go to bench/results/bench_load.json.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
KEYS = 8
TODAY = dt.date(2026, 1, 1)
EXTRAPOLATE_TO = 6_000_000


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.replace("_", "").split(",") if x]


# -- data ---------------------------------------------------------------------------------------


def ensure_data(data_dir: Path, rows: int, fmt: str, seed: int = 1) -> Path:
    """The generated table and its spec (kept between runs: same rows and seed, same bytes)."""
    from enrich_crawl.dataset import synth

    data_dir.mkdir(parents=True, exist_ok=True)
    name = f"dirty_{rows}_{seed}"
    source = data_dir / f"{name}.{fmt}"
    truth_path = data_dir / f"{name}.{fmt}.truth.json"
    if not source.exists() or not truth_path.exists():
        tmp = source.with_name(source.name + ".tmp")
        if fmt == "csv":
            truth = synth.write_dirty_csv(tmp, rows, seed)
        else:
            truth = synth.write_dirty_parquet(tmp, rows, seed)
        tmp.replace(source)
        truth_path.write_text(json.dumps(truth.to_dict()))
    return synth.write_spec(data_dir, source.name, name=f"{name}_{fmt}")


# -- one measured load (child process) ------------------------------------------------------------


def _usage() -> tuple[float, int]:
    """(CPU seconds, peak RSS bytes) of this process. The peak is VmHWM: ru_maxrss would carry
    the peak of the parent (which generated the data) across fork and exec."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    peak = usage.ru_maxrss * 1024
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                peak = int(line.split()[1]) * 1024
    return usage.ru_utime + usage.ru_stime, peak


def run_one(spec_path: Path, workers: int, baseline: bool) -> dict[str, Any]:
    started = time.monotonic()
    # imported before the clock starts: the load is measured, not Python's imports
    import pandas  # noqa: F401 - the baseline's reader
    import pyarrow.compute  # noqa: F401

    from enrich_crawl.dataset.load import prepare_dataset
    from enrich_crawl.dataset.shard import shard_keys
    from enrich_crawl.dataset.spec import load_spec
    from enrich_crawl.staging import DatasetStage
    from enrich_crawl.testing.reference import clean_record  # noqa: F401

    spec = load_spec(spec_path)
    keys = shard_keys(KEYS)
    load_average = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench_load_") as work:
        stage = DatasetStage(Path(work), spec.name)
        cpu0, _ = _usage()
        tick = time.monotonic()
        if baseline:
            manifest = baseline_load(spec, stage, keys)
        else:
            manifest = prepare_dataset(spec, stage, keys, today=TODAY, workers=workers)
        wall = time.monotonic() - tick
        cpu1, rss = _usage()
        shard_bytes = sum(p.stat().st_size for p in stage.seed_dir.glob("shard=*.parquet"))
    profile = manifest["profile"]
    return {
        "wall_s": round(wall, 3),
        "cpu_s": round(cpu1 - cpu0, 3),
        "peak_rss_mb": round(rss / 2**20, 1),
        "process_s": round(time.monotonic() - started, 3),
        "rows": profile["rows"],
        "usable": profile["usable"],
        "rejected": profile["rejected"],
        "quarantined": profile.get("quarantined"),
        "timings": manifest.get("timings"),
        "shard_mb": round(shard_bytes / 2**20, 1),
        "source_mb": round(spec.source.stat().st_size / 2**20, 1),
        "load_average_at_start": round(load_average, 2),
    }


def baseline_load(spec, stage, keys) -> dict[str, Any]:
    """The walking skeleton's loader, for the speed-up: pandas' python CSV engine (the engine
    that reports bad lines) in chunks, then Python per row (`reference.clean_record`, the same
    semantics as the fast loader), then Arrow tables from Python rows per shard."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    from enrich_crawl.dataset.load import SEED_SCHEMA
    from enrich_crawl.staging import dumps
    from enrich_crawl.testing.reference import clean_record

    writers: dict[str, pq.ParquetWriter] = {}
    counts = dict.fromkeys(keys, 0)
    bad: list[list[str]] = []
    seen: dict[str, int] = {}
    row = rejected = 0
    reader = pd.read_csv(
        spec.source,
        dtype=str,
        keep_default_na=False,
        na_values=[],
        encoding="utf-8",
        encoding_errors="replace",
        engine="python",
        on_bad_lines=lambda fields: bad.append(fields),
        chunksize=50_000,
    )
    with reader:
        for chunk in reader:
            columns = [str(c) for c in chunk.columns]
            by_shard: dict[str, list[dict[str, Any]]] = {}
            for raw in chunk.to_dict(orient="records"):
                row += 1
                record, _ = clean_record(spec, raw, columns, row, keys, TODAY)
                rid = record["_id"]
                if rid is None or rid in seen:
                    rejected += 1
                    continue
                seen[rid] = row
                shard = record.pop("_shard")
                for key in ("_url_errors", "_data", "_raw", "_cell_errors"):
                    record[key] = dumps(record[key])
                record["_line"] = None
                by_shard.setdefault(shard, []).append(record)
            for shard, records in by_shard.items():
                if shard not in writers:
                    path = stage.seed_shard(shard)
                    path.parent.mkdir(parents=True, exist_ok=True)
                    writers[shard] = pq.ParquetWriter(path, SEED_SCHEMA, compression="zstd")
                writers[shard].write_table(pa.Table.from_pylist(records, schema=SEED_SCHEMA))
                counts[shard] += len(records)
    for writer in writers.values():
        writer.close()
    return {
        "profile": {"rows": row + len(bad), "usable": row - rejected, "rejected": rejected},
        "shards": counts,
    }


# -- the suite ----------------------------------------------------------------------------------


def _child(spec: Path, workers: int, baseline: bool = False) -> dict[str, Any]:
    command = [sys.executable, "-m", "bench.bench_load", "--one", str(spec)]
    command += ["--workers", str(workers)] + (["--baseline"] if baseline else [])
    done = subprocess.run(
        command, capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    walls = [r["wall_s"] for r in runs]
    cpus = [r["cpu_s"] for r in runs]
    rows = runs[0]["rows"]
    return {
        "rows": rows,
        "source_mb": runs[0]["source_mb"],
        "runs": len(runs),
        "wall_s": {
            "median": round(statistics.median(walls), 3),
            "min": min(walls),
            "max": max(walls),
        },
        "cpu_s": {"median": round(statistics.median(cpus), 3), "min": min(cpus)},
        "peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
        "rows_per_s": round(rows / statistics.median(walls)),
        "us_per_row_wall": round(statistics.median(walls) / rows * 1e6, 2),
        "us_per_row_cpu": round(statistics.median(cpus) / rows * 1e6, 2),
        "timings_median_run": sorted(runs, key=lambda r: r["wall_s"])[len(runs) // 2]["timings"],
        "usable": runs[0]["usable"],
        "rejected": runs[0]["rejected"],
        "quarantined": runs[0]["quarantined"],
        "shard_mb": runs[0]["shard_mb"],
        "all_runs": runs,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_load", description=__doc__)
    parser.add_argument("--sizes", type=_ints, default=[100_000, 1_000_000, 2_000_000])
    parser.add_argument("--formats", default="csv,parquet")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--workers", type=_ints, default=[1, 2], help="cleaning threads to compare, e.g. 1,2"
    )
    parser.add_argument(
        "--baseline-rows", type=int, default=50_000, help="rows of the baseline run (0: skip)"
    )
    parser.add_argument(
        "--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "enrich_crawl_bench_load"
    )
    parser.add_argument("--results", type=Path, default=RESULTS / "bench_load.json")
    parser.add_argument("--one", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--baseline", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.one:  # a child: one measured load, its result as the last line of stdout
        print(json.dumps(run_one(args.one, args.workers[0], args.baseline)))
        return 0

    formats = [f for f in args.formats.split(",") if f]
    sizes = sorted(args.sizes)
    print(f"generating data in {args.data_dir} ...", flush=True)
    specs = {(fmt, n): ensure_data(args.data_dir, n, fmt) for fmt in formats for n in sizes}
    baseline_spec = (
        ensure_data(args.data_dir, args.baseline_rows, "csv") if (args.baseline_rows) else None
    )
    cases = [(fmt, n, w) for fmt in formats for n in sizes for w in args.workers]
    runs: dict[tuple[str, int, int], list[dict[str, Any]]] = {case: [] for case in cases}
    baseline_runs: list[dict[str, Any]] = []
    small_csv: list[dict[str, Any]] = []
    load_before = os.getloadavg()
    started = time.monotonic()
    for round_ in range(args.repeats):
        order = cases if round_ % 2 == 0 else list(reversed(cases))
        for fmt, n, w in order:
            result = _child(specs[(fmt, n)], w)
            runs[(fmt, n, w)].append(result)
            print(
                f"round {round_} {fmt:7s} {n:>9,} rows workers={w}: wall {result['wall_s']:7.2f} s"
                f"  cpu {result['cpu_s']:7.2f} s  rss {result['peak_rss_mb']:7.1f} MB",
                flush=True,
            )
        if baseline_spec is not None and round_ < 2:
            # the fast loader on the very file the baseline reads, in the same round
            small_csv.append(_child(baseline_spec, max(args.workers)))
            baseline_runs.append(_child(baseline_spec, 1, baseline=True))
            print(
                f"round {round_} baseline {args.baseline_rows:,} rows: wall "
                f"{baseline_runs[-1]['wall_s']:.2f} s vs {small_csv[-1]['wall_s']:.2f} s",
                flush=True,
            )

    results: dict[str, Any] = {
        "benchmark": "load",
        "when": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
        },
        "columns": 15,
        "shards": KEYS,
        "repeats": args.repeats,
        "suite_s": round(time.monotonic() - started, 1),
        "cases": {},
        "scaling": {},
        "extrapolated_6m": {},
        "targets_1m": {"wall_s": 30, "peak_rss_mb": 2048},
        "note": "wall times depend on what else runs on the machine (see load averages); CPU "
        "time (user + sys) is the steadier measure of the work",
    }
    for (fmt, n, w), found in runs.items():
        results["cases"][f"{fmt}/{n}/workers={w}"] = _summary(found)
    scale_to = max([n for n in sizes if n <= 1_000_000] or sizes)
    for fmt in formats:
        for w in args.workers:
            case = results["cases"]
            small = case[f"{fmt}/{sizes[0]}/workers={w}"]
            large = case[f"{fmt}/{scale_to}/workers={w}"]
            per_row_wall = large["us_per_row_wall"] / small["us_per_row_wall"]
            per_row_cpu = large["us_per_row_cpu"] / small["us_per_row_cpu"]
            results["scaling"][f"{fmt}/workers={w}"] = {
                "from_rows": small["rows"],
                "to_rows": large["rows"],
                "wall_ratio": round(large["wall_s"]["median"] / small["wall_s"]["median"], 2),
                "per_row_wall_ratio": round(per_row_wall, 3),
                "per_row_cpu_ratio": round(per_row_cpu, 3),
                "linear_or_better": per_row_cpu <= 1.1,
            }
            # time: the per-row cost of the largest size; memory: the peak of the largest size
            # plus the growth per row between the two largest sizes (batches bound the rest)
            top = case[f"{fmt}/{sizes[-1]}/workers={w}"]
            below = case[f"{fmt}/{sizes[-2]}/workers={w}"] if len(sizes) > 1 else top
            rows_between = top["rows"] - below["rows"]
            grow = (top["peak_rss_mb"] - below["peak_rss_mb"]) / rows_between if rows_between else 0
            results["extrapolated_6m"][f"{fmt}/workers={w}"] = {
                "from_rows": top["rows"],
                "wall_s": round(top["us_per_row_wall"] * EXTRAPOLATE_TO / 1e6, 1),
                "cpu_s": round(top["us_per_row_cpu"] * EXTRAPOLATE_TO / 1e6, 1),
                "peak_rss_mb": round(
                    top["peak_rss_mb"] + max(grow, 0) * (EXTRAPOLATE_TO - top["rows"])
                ),
                "rss_growth_bytes_per_row": round(max(grow, 0) * 2**20, 1),
            }
    if baseline_runs:
        base = _summary(baseline_runs)
        fast = _summary(small_csv)
        results["baseline"] = {
            "rows": base["rows"],
            "row_at_a_time": {k: base[k] for k in ("wall_s", "cpu_s", "peak_rss_mb", "rows_per_s")},
            "vectorised": {k: fast[k] for k in ("wall_s", "cpu_s", "peak_rss_mb", "rows_per_s")},
            "speedup_wall": round(base["wall_s"]["median"] / fast["wall_s"]["median"], 1),
            "speedup_cpu": round(base["cpu_s"]["median"] / fast["cpu_s"]["median"], 1),
        }
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    brief = {k: v for k, v in results.items() if k != "cases"}
    brief["cases"] = {
        k: {x: v[x] for x in ("wall_s", "cpu_s", "peak_rss_mb", "rows_per_s")}
        for k, v in results["cases"].items()
    }
    print(json.dumps(brief, indent=2))
    print(f"results: {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
