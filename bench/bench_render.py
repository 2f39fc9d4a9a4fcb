"""Rendering benchmark: rendered pages/s and the memory of the browser, and the static path.

    python -m bench.bench_render [--pages 200] [--hosts 20] [--concurrency 4] [--sweep 1,2,4,8]
        [--rounds 3] [--static-pages 3000] [--baseline-dir DIR | --baseline-ref REF]

On a generated virtual web (enrich_crawl.testing.jsweb.build_bench_web): pages whose value a
script fetches from a JSON endpoint (`/item/N`, mapping `render: js`; each page also asks for a
stylesheet and an image, which are aborted) and the same content as static HTML (`/static/N`).
Every crawl is one real crawl worker process (`python -m enrich_crawl.crawl.worker`), no delay
between requests (the browser is what is measured, not politeness), no results database.

1. rendering: `--pages` pages on `--hosts` hosts at each concurrency of `--sweep` (one round),
   then `--rounds` rounds at `--concurrency`: rendered pages/s (overall, and steady: from page
   50 to the last), seconds per page (p50/p90/p99), peak memory of the whole process tree (the
   crawl, the Playwright driver and every Chromium process: summed RSS sampled every 0.1 s, and
   PSS, which counts shared pages once) and memory over the first 50 pages against the last 50
   (sampled by the worker every 5 rendered pages);
2. the static path: `--static-pages` static pages with a static mapping, in interleaved rounds of
   the same run: `static` (no mapping renders: the browser handler is not even installed) against
   `render_path` (the same crawl plus a `js` mapping that matches none of its pages: every page
   goes through the browser download handler and the spider's render checks, and no page is
   rendered): pages/s of each, their ratio, and which browser or driver processes appeared (none
   may, in either). Optionally also a baseline tree (`--baseline-dir`: a folder holding an
   `enrich_crawl` package; `--baseline-ref`: a git commit, extracted with `git archive`).

Verdicts: `memory_flat` (the mean PSS of the whole tree over the last 50 pages is within 10 % of
the first 50's, in every round) and `static_unaffected` (no browser process in any static crawl,
and static pages/s within 10 % of the render path's, medians of the rounds).

Results: bench/results/render.json (or --out).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from enrich_crawl.crawl.params import WorkerParams
from enrich_crawl.testing.jsweb import BENCH_MAPPING, BENCH_STATIC_MAPPING, build_bench_web
from enrich_crawl.testing.synthweb import seed_shards, write_dataset
from enrich_crawl.virtualweb import running_web

RESULTS = Path(__file__).resolve().parent / "results"
REPO = Path(__file__).resolve().parents[1]
UA = "enrich_crawl/0.1 (+https://example.org/render-bench.html)"
CRAWL = {
    "depth": 0,
    "default_delay": 0.0,
    "max_delay": 0.0,
    "autothrottle": False,
    "retries": 0,
    "download_timeout": 30,
    "render_timeout": 30,
    "store_pages": False,
    "shared_limiter": False,
}
BROWSER_PROCESSES = ("chromium", "chrome", "node", "headless_shell")
MEMORY_KEYS = ("rss_mb", "pss_mb", "crawl_pss_mb", "driver_pss_mb", "browser_pss_mb")
FLAT = 1.10  # last-50 memory over first-50 memory still called flat
SAME = 0.10  # static pages/s within this fraction of each other: unaffected


class TreeSampler:
    """Sums the RSS of a process and its descendants every `interval` seconds (PSS every 5th)."""

    def __init__(self, pid: int, interval: float = 0.1):
        self.pid = pid
        self.interval = interval
        self.peak_rss = 0.0
        self.peak_pss = 0.0
        self.peak_processes = 0
        self.names: set[str] = set()
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> TreeSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        started = time.monotonic()
        tick = 0
        while not self._stop.is_set():
            try:
                root = psutil.Process(self.pid)
                procs = [root, *root.children(recursive=True)]
            except psutil.Error:
                break
            rss = pss = 0
            for proc in procs:
                try:
                    rss += proc.memory_info().rss
                    self.names.add(proc.name())
                    if tick % 5 == 0:
                        pss += proc.memory_full_info().pss
                except psutil.Error:
                    continue
            mb = 1024 * 1024
            self.peak_rss = max(self.peak_rss, rss / mb)
            if tick % 5 == 0:
                self.peak_pss = max(self.peak_pss, pss / mb)
            self.peak_processes = max(self.peak_processes, len(procs))
            self.samples.append((round(time.monotonic() - started, 2), round(rss / mb, 1)))
            tick += 1
            self._stop.wait(self.interval)


def _summary(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    return {
        "median": round(statistics.median(values), 2),
        "min": round(min(values), 2),
        "max": round(max(values), 2),
    }


def _dataset(base: Path, name: str, rows: list[dict[str, str]], mapping: dict[str, Any]):
    dataset, folder = write_dataset(
        base / name,
        [{"id": r["id"], "url": r["url"]} for r in rows],
        fields={"value": {}},
        mappings={mapping["name"]: mapping},
        crawl=CRAWL,
        name=name,
    )
    prepared = seed_shards(dataset, base / name / "work", 1)
    return folder, prepared


def run_worker(
    base: Path,
    label: str,
    folder: Path,
    prepared: Any,
    proxy: str,
    *,
    render: dict[str, Any] | None = None,
    pythonpath: Path | None = None,
) -> dict[str, Any]:
    spec, stage, _keys = prepared
    out_dir = base / "runs" / label
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    params = WorkerParams(
        dataset=spec.name,
        partition="s00",
        seed_path=str(stage.seed_shard("s00")),
        out_dir=str(out_dir),
        mappings_dir=str(folder),
        field_types=spec.field_types(),
        crawl=spec.crawl.to_dict(),
        run_id=label,
        user_agent=UA,
        proxy=proxy,
        render=render or {},
        log_level="WARNING",
    )
    params_file = out_dir / "params.json"
    params_file.write_text(json.dumps(params.to_dict()), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k.lower() not in ("http_proxy", "https_proxy")}
    env.pop("MONGODB_URI", None)
    cwd = out_dir
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
        cwd = pythonpath
    started = time.monotonic()
    with open(out_dir / "worker.log", "w", encoding="utf-8") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "enrich_crawl.crawl.worker", "--params", str(params_file)],
            cwd=cwd,
            stdout=subprocess.DEVNULL,
            stderr=log,
            env=env,
        )
        with TreeSampler(proc.pid) as sampler:
            proc.wait(1800)
    wall = time.monotonic() - started
    if proc.returncode != 0:
        raise RuntimeError(
            f"{label}: worker failed:\n{(out_dir / 'worker.log').read_text()[-3000:]}"
        )
    stats = json.loads((out_dir / "stats.json").read_text(encoding="utf-8"))
    values = 0
    for line in (out_dir / "candidates.jsonl").read_text(encoding="utf-8").splitlines():
        values += bool(json.loads(line).get("value"))
    return {
        "stats": stats,
        "wall_seconds": round(wall, 2),
        "values": values,
        "peak_tree_rss_mb": round(sampler.peak_rss, 1),
        "peak_tree_pss_mb": round(sampler.peak_pss, 1),
        "peak_processes": sampler.peak_processes,
        "browser_processes": sorted(n for n in sampler.names if n.startswith(BROWSER_PROCESSES)),
    }


def render_figures(result: dict[str, Any], pages: int) -> dict[str, Any]:
    stats = result["stats"]
    browser = stats["render"]["browser"]
    samples = browser["memory"]
    first = [s for s in samples if 5 <= s["pages"] <= 50]
    last = [s for s in samples if s["pages"] > pages - 50]
    steady = [s for s in samples if s["pages"] >= 50]
    steady_rate = None
    if len(steady) >= 2 and steady[-1]["seconds"] > steady[0]["seconds"]:
        steady_rate = (steady[-1]["pages"] - steady[0]["pages"]) / (
            steady[-1]["seconds"] - steady[0]["seconds"]
        )

    def mean(rows: list[dict[str, float]], key: str) -> float | None:
        return round(statistics.fmean(r[key] for r in rows), 1) if rows else None

    return {
        "pages_rendered": stats["pages_rendered"],
        "values_found": result["values"],
        "crawl_seconds": stats["seconds"],
        "pages_per_second": round(stats["pages_rendered"] / stats["seconds"], 2),
        "steady_pages_per_second": round(steady_rate, 2) if steady_rate else None,
        "render_seconds": browser["render_seconds"],
        "peak_tree_rss_mb": result["peak_tree_rss_mb"],
        "peak_tree_pss_mb": result["peak_tree_pss_mb"],
        "peak_processes": result["peak_processes"],
        # means over the samples of pages 5-50 and of the last 50 pages, whole tree and by part
        "first_50": {key: mean(first, key) for key in MEMORY_KEYS if first and key in first[0]},
        "last_50": {key: mean(last, key) for key in MEMORY_KEYS if last and key in last[0]},
        "last_over_first_pss": round(mean(last, "pss_mb") / mean(first, "pss_mb"), 3)
        if first and last
        else None,
        "contexts_created": browser["contexts_created"],
        "contexts_recycled": browser["contexts_recycled"],
        "pages_opened": browser["pages_opened"],
        "pages_closed": browser["pages_closed"],
        "max_concurrent_pages": browser["max_concurrent_pages"],
        "subresources": browser["subresources"],
        "memory_samples": samples,
    }


def baseline_tree(args: argparse.Namespace, tmp: Path) -> tuple[Path | None, str]:
    if args.baseline_dir:
        path = Path(args.baseline_dir).resolve()
        if not (path / "enrich_crawl" / "crawl" / "worker.py").exists():
            raise SystemExit(f"--baseline-dir {path}: no enrich_crawl package there")
        return path, f"dir:{path}"
    if args.baseline_ref:
        target = tmp / "baseline"
        target.mkdir()
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", args.baseline_ref, "enrich_crawl"],
            check=True,
            capture_output=True,
        )
        subprocess.run(["tar", "-x", "-C", str(target)], input=archive.stdout, check=True)
        return target, f"ref:{args.baseline_ref}"
    return None, "none"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=200)
    parser.add_argument("--hosts", type=int, default=20)
    parser.add_argument("--concurrency", type=int, default=4, help="the chosen concurrency")
    parser.add_argument("--sweep", default="1,2,4,8", help="concurrencies tried once ('' = none)")
    parser.add_argument("--recycle-after", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--static-pages", type=int, default=3000)
    parser.add_argument("--static-rounds", type=int, help="rounds of the static comparison")
    parser.add_argument("--static-hosts", type=int, default=100)
    parser.add_argument("--baseline-dir", help="folder holding a baseline enrich_crawl package")
    parser.add_argument("--baseline-ref", help="git commit of the baseline (git archive)")
    parser.add_argument("--out", default=str(RESULTS / "render.json"))
    args = parser.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="bench-render-"))
    try:
        per_host = max(1, args.pages // args.hosts)
        static_per_host = max(per_host, args.static_pages // args.static_hosts)
        hosts = max(args.hosts, args.static_hosts)
        rows = build_bench_web(tmp / "web", hosts=hosts, pages_per_host=static_per_host)
        js_rows = [
            {"id": r["id"], "url": r["url"]}
            for r in rows
            if r["host"] < args.hosts and r["n"] < per_host
        ][: args.pages]
        static_rows = [{"id": r["id"], "url": r["static_url"]} for r in rows][: args.static_pages]
        js_folder, js_prepared = _dataset(tmp, "render", js_rows, BENCH_MAPPING)
        st_folder, st_prepared = _dataset(tmp, "static", static_rows, BENCH_STATIC_MAPPING)
        # the same static crawl with the render code path on: a js mapping no static page matches
        rp_folder = tmp / "render_path_mappings"
        shutil.copytree(st_folder, rp_folder)
        (rp_folder / "bench_js.json").write_text(json.dumps(BENCH_MAPPING), encoding="utf-8")
        baseline, baseline_label = baseline_tree(args, tmp)
        report: dict[str, Any] = {
            "benchmark": "render",
            "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
            "pages": len(js_rows),
            "hosts": args.hosts,
            "concurrency": args.concurrency,
            "recycle_after": args.recycle_after,
            "crawl": CRAWL,
        }
        with running_web(tmp / "web", log_path=tmp / "requests.jsonl") as server:
            proxy = server.proxy_url

            def render_run(concurrency: int, label: str) -> dict[str, Any]:
                result = run_worker(
                    tmp,
                    label,
                    js_folder,
                    js_prepared,
                    proxy,
                    render={
                        "concurrency": concurrency,
                        "recycle_after": args.recycle_after,
                        "memory_sample_every": 5,
                    },
                )
                figures = render_figures(result, len(js_rows))
                print(
                    f"render c={concurrency}: {figures['pages_per_second']} pages/s "
                    f"(steady {figures['steady_pages_per_second']}), peak tree RSS "
                    f"{figures['peak_tree_rss_mb']} MB, PSS first 50 "
                    f"{figures['first_50']['pss_mb']} -> last 50 {figures['last_50']['pss_mb']}",
                    flush=True,
                )
                return figures

            sweep = [int(c) for c in args.sweep.split(",") if c.strip()]
            report["sweep"] = {str(c): render_run(c, f"sweep-{c}") for c in sweep}
            for figures in report["sweep"].values():
                figures.pop("memory_samples", None)
            rounds = [render_run(args.concurrency, f"render-{i}") for i in range(args.rounds)]
            report["rendering"] = {
                "pages_per_second": _summary([r["pages_per_second"] for r in rounds]),
                "steady_pages_per_second": _summary(
                    [r["steady_pages_per_second"] for r in rounds if r["steady_pages_per_second"]]
                ),
                "render_seconds_p50": _summary([r["render_seconds"]["p50"] for r in rounds]),
                "render_seconds_p90": _summary([r["render_seconds"]["p90"] for r in rounds]),
                "peak_tree_rss_mb": _summary([r["peak_tree_rss_mb"] for r in rounds]),
                "peak_tree_pss_mb": _summary([r["peak_tree_pss_mb"] for r in rounds]),
                "first_50_pss_mb": _summary([r["first_50"]["pss_mb"] for r in rounds]),
                "last_50_pss_mb": _summary([r["last_50"]["pss_mb"] for r in rounds]),
                "last_over_first_pss": _summary([r["last_over_first_pss"] for r in rounds]),
                "first_50_rss_mb": _summary([r["first_50"]["rss_mb"] for r in rounds]),
                "last_50_rss_mb": _summary([r["last_50"]["rss_mb"] for r in rounds]),
                "rounds": rounds,
            }

            static: dict[str, list[dict[str, Any]]] = {
                "static": [],
                "render_path": [],
                "baseline": [],
            }
            static_rounds = args.rounds if args.static_rounds is None else args.static_rounds
            kinds = ["static", "render_path"] + (["baseline"] if baseline is not None else [])
            for i in range(static_rounds):
                order = kinds[i % len(kinds) :] + kinds[: i % len(kinds)]
                for which in order:
                    result = run_worker(
                        tmp,
                        f"static-{which}-{i}",
                        rp_folder if which == "render_path" else st_folder,
                        st_prepared,
                        proxy,
                        pythonpath=baseline if which == "baseline" else None,
                    )
                    stats = result["stats"]
                    row = {
                        "pages": stats["pages"],
                        "values_found": result["values"],
                        "crawl_seconds": stats["seconds"],
                        "pages_per_second": stats["pages_per_second"],
                        "wall_seconds": result["wall_seconds"],
                        "peak_tree_rss_mb": result["peak_tree_rss_mb"],
                        "browser_processes": result["browser_processes"],
                        "render": stats.get("render"),
                    }
                    static[which].append(row)
                    print(
                        f"static {which} round {i}: {row['pages_per_second']} pages/s", flush=True
                    )
        current = [r["pages_per_second"] for r in static["static"]]
        render_path = [r["pages_per_second"] for r in static["render_path"]]
        base = [r["pages_per_second"] for r in static["baseline"]]

        def ratio(a: list[float], b: list[float]) -> float | None:
            if not a or not b or not statistics.median(b):  # no static pages, or none crawled
                return None
            return round(statistics.median(a) / statistics.median(b), 3)

        seen = {
            which: sorted({p for r in rows for p in r["browser_processes"]})
            for which, rows in static.items()
        }
        report["static"] = {
            "pages": len(static_rows),
            "static_pages_per_second": _summary(current),
            "render_path_pages_per_second": _summary(render_path),
            "static_over_render_path": ratio(current, render_path),
            "pages_rendered": {
                which: sorted({r["render"]["rendered_js"] for r in rows if r.get("render")})
                for which, rows in static.items()
                if which != "baseline"
            },
            "browser_processes_seen": seen,
            "baseline": baseline_label,
            "baseline_pages_per_second": _summary(base),
            "static_over_baseline": ratio(current, base),
            "rounds": static,
        }
        flat = [r["last_over_first_pss"] for r in report["rendering"]["rounds"]]
        over = report["static"]["static_over_render_path"]
        report["verdicts"] = {
            # None: no rendering rounds in this run (--rounds 0)
            "memory_flat": all(x is not None and x <= FLAT for x in flat) if flat else None,
            # None: no static pages crawled (--static-pages 0)
            "static_unaffected": None
            if args.static_pages <= 0
            else not any(seen.values()) and over is not None and over >= 1 - SAME,
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2), encoding="utf-8")
    brief = {
        "rendering": {k: v for k, v in report["rendering"].items() if k != "rounds"},
        "static": {k: v for k, v in report["static"].items() if k != "rounds"},
        "verdicts": report["verdicts"],
    }
    print(json.dumps(brief, indent=1))
    print(f"written {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
