"""The whole end-to-end benchmark in one invocation (``python -m bench e2e``).

1. generate (or take from the cache) the web + dataset for (seed, hosts, records);
2. start one virtual web (the shared proxy every crawler goes through, one request log) and one
   ephemeral MongoDB;
3. run, one after the other on the same web and dataset:
   - the product: ``enrich-crawl run --dataset SPEC --mappings DIR`` (Dagster, partitions, MongoDB
     merge) with a fresh DAGSTER_HOME, its own MONGODB_DB, ENRICH_SHARDS=P, http(s)_proxy;
   - the seed-style baseline (P processes) and the plain Scrapy BFS (P processes), time-budgeted;
   - the CPU floor: the product's requests fetched again and parsed once with lxml (P processes);
   - the scaling series: the product with 1, 2, 4, 8 partitions on a CPU-bound subset (a copy of the
     web with Crawl-delay 0 and ``crawl.default_delay: 0``) and a politeness-bound subset (the
     records of the hosts with the most records);
   - the RSS check: the product on a 10x smaller subset, crawl worker peak RSS compared;
4. write ``bench/results/<date>[-quick].json``, ``.md`` (tables) and ``-scaling.png``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.e2e import generate as gen_mod
from bench.e2e.common import BFS_UA, FLOOR_UA, SEED_UA, read_results
from bench.e2e.measure import (
    HostRules,
    RunMetrics,
    accuracy,
    product_values,
    request_stats,
    run_measured,
    run_parallel,
    select_requests,
)
from enrich_crawl.config import DEFAULT_USER_AGENT

REPO = Path(__file__).resolve().parents[2]
PRODUCT_UA_PREFIX = DEFAULT_USER_AGENT.split(" ")[0]  # "enrich_crawl/0.1"
_INIT_INSTANCE = (
    "from enrich_crawl.home import ensure_dagster_home; ensure_dagster_home(); "
    "import dagster; instance = dagster.DagsterInstance.get(); instance.get_runs(limit=1); "
    "instance.get_backfills()"
)
MIN_SAMPLE = 5
DEFAULT_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "enrich_crawl"


@dataclass
class SuiteConfig:
    seed: int = 1
    hosts: int = 1000
    records: int = 20000
    processes: int = 8
    # the product's ENRICH_CRAWL_PROCESSES (None: its default, the machine's cores)
    crawl_processes: int | None = None
    baseline_budget: float = 900.0
    # the Scrapy BFS interleaves all its active records, so none finishes within a budget on
    # shared hosts: it crawls a sample (records per process) to the end, to count pages exactly
    bfs_records: int = 25
    bfs_budget: float = 3600.0
    parallel_baselines: bool = False
    # pages per resolved record against BFS: both crawl the same sample to the end on the web
    # without delays (BFS to depth 2 of every same-host link takes hours per record at 1 s/page)
    bfs_compare_records: int = 60
    # the CPU floor refetches an even sample of the product's requests (0: all of them). All by
    # default: the floor's processes start (imports, Scrapy) as the product's do, and a sample
    # spreads that fixed cost over fewer pages, which flatters the product's ratio
    floor_requests: int = 0
    scaling: tuple[int, ...] = (1, 2, 4, 8)
    scaling_cpu_records: int = 4000
    scaling_politeness_hosts: int = 20
    scaling_politeness_records: int = 1500
    rss_small_records: int = 2000
    skip: frozenset[str] = frozenset()
    plugins: tuple[str, ...] = ("pydocs",)
    cache_dir: Path = DEFAULT_CACHE / "bench-e2e"
    results_dir: Path = REPO / "bench" / "results"
    work_dir: Path | None = None
    run_timeout: float = 4 * 3600
    quick: bool = False


@dataclass
class SystemResult:
    name: str
    metrics: dict[str, Any]
    log: dict[str, Any]
    accuracy: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)

    def row(self) -> dict[str, Any]:
        """The headline figures."""
        wall = self.metrics.get("wall_s") or 0.0
        pages = self.log.get("pages", 0)
        resolved = self.accuracy.get("resolved_records", 0)
        cpu = self.metrics.get("cpu_s", 0.0)
        return {
            "system": self.name,
            "records": self.accuracy.get("records", 0),
            "resolvable": self.accuracy.get("resolvable_records", 0),
            "resolved": resolved,
            "resolved_per_hour": round(resolved / wall * 3600, 1) if wall else None,
            "wall_s": wall,
            "pages": pages,
            "pages_per_s": round(pages / wall, 2) if wall else None,
            "pages_per_resolved": round(pages / resolved, 2) if resolved else None,
            "cpu_s": cpu,
            "cpu_ms_per_page": round(cpu / pages * 1000, 2) if pages else None,
            "peak_rss_process_mb": self.metrics.get("peak_rss_max_mb"),
            "peak_rss_total_mb": self.metrics.get("peak_rss_total_mb"),
            "violations": self.log.get("violations"),
            "accuracy": self.accuracy.get("accuracy"),
            "precision": self.accuracy.get("precision"),
        }


class Suite:
    def __init__(self, cfg: SuiteConfig, *, log: Callable[[str], None] | None = None):
        self.cfg = cfg
        self.say = log or (lambda msg: print(f"[bench e2e] {msg}", file=sys.stderr, flush=True))
        self.work = cfg.work_dir or Path(tempfile.mkdtemp(prefix="bench-e2e-"))
        self.work.mkdir(parents=True, exist_ok=True)
        self.results: dict[str, Any] = {"config": _jsonable(dataclasses.asdict(cfg))}
        self.systems: list[SystemResult] = []
        self.gen: gen_mod.Generated | None = None
        self.hosts: dict[str, dict[str, Any]] = {}
        self._override_web_root: Path | None = None

    # -- set-up --------------------------------------------------------------------------------------

    def generate(self) -> gen_mod.Generated:
        cfg = self.cfg
        gcfg = gen_mod.GenConfig(
            seed=cfg.seed, hosts=cfg.hosts, records=cfg.records, plugins=cfg.plugins
        )
        self.gen = gen_mod.cached(gcfg, cfg.cache_dir, log=self.say)
        self.hosts = self.gen.hosts()
        self.results["dataset"] = {k: v for k, v in self.gen.manifest.items() if k != "config"}
        self.results["dataset"]["path"] = str(self.gen.root)
        return self.gen

    def run(self) -> dict[str, Any]:
        from enrich_crawl.testing.services import ephemeral_mongo
        from enrich_crawl.virtualweb import running_web

        started = time.monotonic()
        gen = self.generate()
        skip = self.cfg.skip
        self.say(f"work folder {self.work}")
        with (
            running_web(gen.web, log_path=self.work / "requests.jsonl") as web,
            ephemeral_mongo() as mongo,
        ):
            self.web, self.mongo = web, mongo
            product = None
            if "product" not in skip:
                product = self.product(gen.spec, gen.mappings, self.cfg.processes, "product")
                self.systems.append(product)
            compare = "bfs" not in skip and self.cfg.bfs_compare_records > 0
            if "seed" not in skip or ("bfs" not in skip and not compare):
                self.systems += self.baselines(with_bfs=not compare)
            if compare:
                self.results["bfs_compare"] = self._guarded("bfs compare", self.bfs_compare)
            if "floor" not in skip and product is not None:
                self.systems.append(self.floor(product))
            if "paced_floor" not in skip and product is not None:
                paced = self._guarded("paced floor", self.floor, product, paced=True)
                if paced is not None:
                    self.systems.append(paced)
            if "answer_paced_floor" not in skip and product is not None:
                answer_paced = self._guarded(
                    "answer-paced floor", self.floor, product, paced=True, from_answer=True
                )
                if answer_paced is not None:
                    self.systems.append(answer_paced)
            # a part that fails is reported as failed; the figures of the others are kept
            if "rss" not in skip and product is not None and self.cfg.rss_small_records:
                self.results["rss_check"] = self._guarded("rss check", self.rss_check, product)
            if "scaling" not in skip and self.cfg.scaling:
                self.results["scaling"] = self._guarded("scaling", self.scaling)
        for system in self.systems:  # the raw request entries stay out of the report
            system.log.pop("_entries", None)
        self.results["systems"] = [dataclasses.asdict(s) for s in self.systems]
        self.results["table"] = [s.row() for s in self.systems]
        self.results["checks"] = self.checks()
        self.results["seconds"] = round(time.monotonic() - started, 1)
        return self.results

    def _guarded(self, what: str, part: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return part(*args, **kwargs)
        except Exception as exc:
            import traceback

            self.say(f"{what} failed: {exc!r}")
            self.results.setdefault("failures", {})[what] = traceback.format_exc()[-3000:]
            return None

    # -- the product -----------------------------------------------------------------------------------

    def _product_env(self, label: str, shards: int) -> dict[str, str]:
        home = self.work / label / "dagster_home"
        home.mkdir(parents=True, exist_ok=True)
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("ENRICH_", "DAGSTER_")) and k.lower() != "no_proxy"
        }
        env.update(self.web.proxy_env())
        env.update(
            DAGSTER_HOME=str(home),
            MONGODB_URI=self.mongo.uri,
            MONGODB_DB=f"bench_{label}".replace("-", "_"),
            ENRICH_SHARDS=str(shards),
            ENRICH_MAX_PARALLEL=str(shards),
            PYTHONWARNINGS="ignore",
        )
        if self.cfg.crawl_processes is not None:
            env["ENRICH_CRAWL_PROCESSES"] = str(self.cfg.crawl_processes)
        return env

    def product(self, spec: Path, mappings: Path, shards: int, label: str) -> SystemResult:
        import yaml

        raw = yaml.safe_load(spec.read_text("utf-8"))
        env = self._product_env(label, shards)
        # the console script of this interpreter's environment (a venv's bin may not be on PATH)
        beside = Path(sys.executable).parent / "enrich-crawl"
        exe = str(beside) if beside.is_file() else shutil.which("enrich-crawl")
        cmd = [exe] if exe else [sys.executable, "-m", "enrich_crawl.cli"]
        cmd += ["run", "--dataset", str(spec), "--mappings", str(mappings)]
        # a fresh instance's SQLite schema is created before the measured run (its first use can
        # race: "table backfill_tags already exists"), and is not what the benchmark measures
        subprocess.run(
            [sys.executable, "-c", _INIT_INSTANCE],
            env=env,
            cwd=self.work / label,
            capture_output=True,
            timeout=300,
            check=False,
        )
        self.say(f"{label}: enrich-crawl run, {shards} partitions ...")
        db_cpu_before = self._db_cpu()
        metrics = run_measured(
            label, cmd, env=env, cwd=self.work / label, log_dir=self.work / "logs",
            timeout=self.cfg.run_timeout,
        )  # fmt: skip
        db_cpu = self._db_cpu() - db_cpu_before
        delay = float((raw.get("crawl") or {}).get("default_delay", 1.0))
        log = self._log_stats(metrics, PRODUCT_UA_PREFIX, delay, web_root=self._web_root(spec))
        truth = gen_mod.read_truth(spec.parent / "truth.jsonl")
        types = {f: (o or {}).get("type", "string") for f, o in raw["fields"].items()}
        try:
            values = product_values(self.mongo.uri, env["MONGODB_DB"], raw["name"])
        except Exception as exc:
            self.say(f"{label}: cannot read MongoDB results: {exc}")
            values = {}
        acc = accuracy(truth, values, types)
        result = SystemResult(
            label,
            metrics.to_dict(),
            log,
            acc,
            extra={
                "shards": shards,
                # crawl processes its shards were crawled in (the shards' stats.json say)
                "crawl_processes": _crawl_processes(self.work / label / "dagster_home"),
                # the MongoDB server's own CPU (nx-27017, Python/SQLite: far costlier than a real
                # mongod), outside the product's process tree; reported apart
                "db_server_cpu_s": round(db_cpu, 3),
                "summary": _tail(metrics.stdout_path, 25),
            },
        )
        if metrics.returncode != 0:
            result.extra["stderr_tail"] = _tail(metrics.stderr_path, 40)
        self._say_row(result)
        return result

    def _db_cpu(self) -> float:
        """CPU seconds (user+sys) the MongoDB server process has used so far."""
        import psutil

        proc = getattr(self.mongo, "_proc", None)
        try:
            times = psutil.Process(proc.pid).cpu_times()
        except (AttributeError, psutil.Error):
            return 0.0
        return times.user + times.system

    def _web_root(self, spec: Path) -> Path:
        return self._override_web_root or self.gen.web

    def _log_stats(
        self, metrics: RunMetrics, ua_prefix: str, default_delay: float, *, web_root: Path
    ) -> dict[str, Any]:
        from enrich_crawl.virtualweb import read_log

        entries = select_requests(
            read_log(self.web.log_path),
            ua_prefix=ua_prefix,
            t0=metrics.started_at - 1,
            t1=metrics.ended_at + 1,
        )
        stats = request_stats(entries, HostRules(web_root, self.hosts), default_delay=default_delay)
        stats["_entries"] = entries  # dropped before the report is written
        return stats

    # -- baselines -------------------------------------------------------------------------------------

    def baselines(self, *, with_bfs: bool = True) -> list[SystemResult]:
        gen, cfg, procs = self.gen, self.cfg, self.cfg.processes
        common = ["--spec", str(gen.spec), "--mappings", str(gen.mappings), "--shards", str(procs)]
        common += ["--proxy", self.web.proxy_url]
        out_dir = self.work / "baselines"
        seed_args = ["--ca", str(self.web.ca_path), "--budget", str(cfg.baseline_budget)]
        seed_args += ["--lock-dir", str(out_dir / "host-turns")]  # politeness across processes
        bfs_args = ["--budget", str(cfg.bfs_budget if cfg.bfs_records else cfg.baseline_budget)]
        bfs_args += ["--max-records", str(cfg.bfs_records)]
        systems = {
            "seed_baseline": ("bench.e2e.baseline_seed", SEED_UA, seed_args),
            "bfs_baseline": ("bench.e2e.baseline_bfs", BFS_UA, bfs_args),
        }
        if "seed" in cfg.skip:
            systems.pop("seed_baseline")
        if "bfs" in cfg.skip or not with_bfs:
            systems.pop("bfs_baseline")
        env = {
            k: v for k, v in os.environ.items() if k.lower() not in ("http_proxy", "https_proxy")
        }
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
        env["PYTHONWARNINGS"] = "ignore"

        def jobs(name: str) -> list[tuple[str, list[str]]]:
            module, _ua, extra = systems[name]
            return [
                (
                    f"{name}-{i}",
                    [
                        sys.executable,
                        "-m",
                        module,
                        *common,
                        "--shard",
                        str(i),
                        "--out",
                        str(out_dir / f"{name}-{i}.jsonl"),
                        *extra,
                    ],
                )
                for i in range(procs)
            ]

        measured: dict[str, RunMetrics] = {}
        longest = max(cfg.baseline_budget, cfg.bfs_budget if cfg.bfs_records else 0)
        timeout = longest * 2 + 600 if longest else cfg.run_timeout
        out_dir.mkdir(parents=True, exist_ok=True)
        if not systems:
            return []
        if cfg.parallel_baselines and len(systems) > 1:
            self.say(f"baselines (seed-style and Scrapy BFS at once), {procs} processes each ...")
            both = run_parallel(
                jobs("seed_baseline") + jobs("bfs_baseline"), log_dir=self.work / "logs",
                env=env, timeout=timeout,
            )  # fmt: skip
            # one tree: CPU and memory are split by role (psutil samples), time is shared
            for name, role in (
                ("seed_baseline", "seed_baseline"),
                ("bfs_baseline", "bfs_baseline"),
            ):
                m = dataclasses.replace(both, label=name)
                m.cpu_user_s = both.cpu_by_role_s.get(role, 0.0)
                m.cpu_sys_s = 0.0
                m.peak_rss_max_mb = both.peak_rss_by_role_mb.get(role, 0.0)
                m.peak_rss_total_mb = round(
                    sum(p["peak_rss_mb"] for p in both.processes if p["role"] == role), 1
                )
                measured[name] = m
        else:
            for name in systems:
                what = (
                    f"{cfg.bfs_records} records per process"
                    if name == "bfs_baseline" and cfg.bfs_records
                    else f"budget {cfg.baseline_budget:g} s"
                )
                self.say(f"{name}: {procs} processes, {what} ...")
                measured[name] = run_parallel(
                    jobs(name), log_dir=self.work / "logs", env=env, timeout=timeout
                )
        truth = gen.truth()
        import yaml

        raw = yaml.safe_load(gen.spec.read_text("utf-8"))
        types = {f: (o or {}).get("type", "string") for f, o in raw["fields"].items()}
        out = []
        for name, (_module, ua, _extra) in systems.items():
            metrics = measured[name]
            results = read_results([out_dir / f"{name}-{i}.jsonl" for i in range(procs)])
            log = self._log_stats(metrics, ua.split(" ")[0], 1.0, web_root=gen.web)
            acc = accuracy(
                truth,
                {rid: row["fields"] for rid, row in results.items()},
                types,
                attempted=set(results),
            )
            stats = [_last_json(self.work / "logs" / f"{name}-{i}.stdout") for i in range(procs)]
            result = SystemResult(
                name,
                metrics.to_dict(),
                log,
                acc,
                extra={
                    "processes": procs,
                    "budget_s": cfg.baseline_budget
                    if name == "seed_baseline" or not cfg.bfs_records
                    else cfg.bfs_budget,
                    "max_records_per_process": cfg.bfs_records if name == "bfs_baseline" else 0,
                    "records_total": sum(s.get("records_total", 0) for s in stats),
                    "budget_hit": any(s.get("budget_hit") for s in stats),
                    "pages_per_record_done": round(
                        sum(r.get("pages", 0) for r in results.values()) / len(results), 1
                    )
                    if results
                    else None,
                },
            )
            self._say_row(result)
            out.append(result)
        return out

    # -- pages per resolved record: product vs plain BFS, both to the end ------------------------------

    def bfs_compare(self) -> dict[str, Any]:
        """The product and the Scrapy BFS on the same sample of records, each crawled to the end, on
        the web without delays (pages per record do not depend on delays; BFS to depth 2 of every
        same-host link needs hours per record at 1 s a page). Both see the same web and records."""
        from enrich_crawl.virtualweb import running_web

        cfg, procs = self.cfg, self.cfg.processes
        ids = sorted(self.gen.truth())
        step = max(1, len(ids) // max(1, cfg.bfs_compare_records))
        sample = ids[::step][: cfg.bfs_compare_records]
        spec = gen_mod.subset(self.gen, "bfs_compare", sample, crawl={"default_delay": 0.0})
        nodelay = gen_mod.web_without_delays(self.gen)
        out_dir = self.work / "bfs_compare"
        out_dir.mkdir(parents=True, exist_ok=True)
        with running_web(nodelay, log_path=self.work / "requests-bfs_compare.jsonl") as web:
            saved = self.web
            self.web, self._override_web_root = web, nodelay
            try:
                product = self.product(spec, spec.parent / "mappings", procs, "bfs_compare_product")
                env = {
                    k: v
                    for k, v in os.environ.items()
                    if k.lower() not in ("http_proxy", "https_proxy")
                }
                env["PYTHONPATH"] = os.pathsep.join(
                    p for p in (str(REPO), env.get("PYTHONPATH")) if p
                )
                env["PYTHONWARNINGS"] = "ignore"
                jobs = [
                    (
                        f"bfs_compare_bfs-{i}",
                        [
                            sys.executable, "-m", "bench.e2e.baseline_bfs",
                            "--spec", str(spec), "--mappings", str(spec.parent / "mappings"),
                            "--shards", str(procs), "--shard", str(i),
                            "--proxy", web.proxy_url, "--default-delay", "0",
                            "--budget", str(cfg.bfs_budget), "--max-records", "0",
                            "--out", str(out_dir / f"bfs-{i}.jsonl"),
                        ],
                    )
                    for i in range(procs)
                ]  # fmt: skip
                self.say(f"bfs_compare: Scrapy BFS on {len(sample)} records to the end ...")
                metrics = run_parallel(
                    jobs, log_dir=self.work / "logs", env=env, timeout=cfg.bfs_budget * 2 + 600
                )
                log = self._log_stats(metrics, BFS_UA.split(" ")[0], 0.0, web_root=nodelay)
            finally:
                self.web, self._override_web_root = saved, None
        results = read_results([out_dir / f"bfs-{i}.jsonl" for i in range(procs)])
        import yaml

        raw = yaml.safe_load(spec.read_text("utf-8"))
        types = {f: (o or {}).get("type", "string") for f, o in raw["fields"].items()}
        truth = gen_mod.read_truth(spec.parent / "truth.jsonl")
        acc = accuracy(
            truth, {rid: row["fields"] for rid, row in results.items()}, types,
            attempted=set(results),
        )  # fmt: skip
        stats = [
            _last_json(self.work / "logs" / f"bfs_compare_bfs-{i}.stdout") for i in range(procs)
        ]
        bfs = SystemResult(
            "bfs_baseline",
            metrics.to_dict(),
            log,
            acc,
            extra={
                "sample": len(sample),
                "budget_hit": any(s.get("budget_hit") for s in stats),
                "web": "no delays",
            },
        )
        bfs.log.pop("_entries", None)
        product.log.pop("_entries", None)
        self._say_row(bfs)
        prow, brow = product.row(), bfs.row()
        return {
            "records": len(sample),
            "web": "no delays (Crawl-delay 0, default_delay 0)",
            "product": prow,
            "bfs": brow,
            "bfs_finished_records": len(results),
            "bfs_budget_hit": bfs.extra["budget_hit"],
            "product_accuracy": product.accuracy,
            "bfs_accuracy": acc,
            "pages_per_resolved_ratio": _ratio(
                prow["pages_per_resolved"], brow["pages_per_resolved"]
            ),
        }

    # -- CPU floor -------------------------------------------------------------------------------------

    def floor(
        self, product: SystemResult, *, paced: bool = False, from_answer: bool = False
    ) -> SystemResult:
        """The CPU floor on the product's requests (the check's floor), or with `paced` the same
        requests crawled at the pace of politeness by the same bare spider: one request at a time
        per host, each host's Crawl-delay (else the spec's default delay) between its sends, every
        host in one process; with `from_answer` too, each delay counted from the answer to the
        host's last request, as the product counts it and as the politeness audit checks it. The
        paced floors are audited like the product (their `violations`, information)."""
        everything = product.log["_entries"]
        step = (
            max(1, -(-len(everything) // self.cfg.floor_requests)) if self.cfg.floor_requests else 1
        )
        entries = everything[::step]  # an even sample over the run: the same mix of pages
        share = len(entries) / len(everything) if everything else 1.0
        procs = self.cfg.processes
        name = (
            "cpu_floor_answer_paced"
            if paced and from_answer
            else ("cpu_floor_paced" if paced else "cpu_floor")
        )
        url_files = []
        for i, urls in enumerate(split_requests(entries, procs, by_host=paced)):
            path = self.work / name / f"urls-{i}.txt"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("\n".join(urls) + "\n", encoding="utf-8")
            url_files.append(path)
        pace: list[str] = []
        default_delay = 0.0
        if paced:
            from enrich_crawl.dataset.spec import load_spec

            default_delay = load_spec(self.gen.spec).crawl.default_delay  # as the product reads it
            delays = self.gen.write_delays(self.work / name / "delays.json", default_delay)
            pace = ["--delays", str(delays)] + (["--from-answer"] if from_answer else [])
        env = {
            k: v for k, v in os.environ.items() if k.lower() not in ("http_proxy", "https_proxy")
        }
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
        env["PYTHONWARNINGS"] = "ignore"
        jobs = [
            (
                f"{name}-{i}",
                [
                    sys.executable,
                    "-m",
                    "bench.e2e.floor",
                    "--urls",
                    str(path),
                    "--proxy",
                    self.web.proxy_url,
                    *pace,
                ],
            )
            for i, path in enumerate(url_files)
        ]
        what = ("answer-paced" if from_answer else "paced") + " CPU floor" if paced else "CPU floor"
        self.say(f"{what}: {len(entries)} requests of the product, {procs} processes ...")
        metrics = run_parallel(
            jobs, log_dir=self.work / "logs", env=env, timeout=self.cfg.run_timeout
        )
        log = self._log_stats(metrics, FLOOR_UA.split(" ")[0], default_delay, web_root=self.gen.web)
        # per page of the product (robots.txt requests are refetched too, as the product made
        # them); with a sample, its share of the product's pages. The unpaced floor is impolite by
        # design (no verdict); a paced floor is audited as the product is, for information: one
        # paced from the sends answers again as soon as an answer slower than the delay is in
        pages = round(product.log["pages"] * share)
        log = {**log, "pages": pages}
        if not paced or share < 1.0:  # a sample's gaps are not the crawl's
            log["violations"] = None
        result = SystemResult(
            name,
            metrics.to_dict(),
            log,
            {},
            extra={"requests": len(entries), "product_requests": len(everything), "share": share},
        )
        self._say_row(result)
        return result

    # -- RSS flatness ----------------------------------------------------------------------------------

    def rss_check(self, product: SystemResult) -> dict[str, Any]:
        truth = self.gen.truth()
        small = sorted(truth)[: self.cfg.rss_small_records]
        spec = gen_mod.subset(self.gen, "rss", small)
        result = self.product(spec, spec.parent / "mappings", self.cfg.processes, "product_rss")
        big = product.metrics.get("peak_rss_by_role_mb", {}).get("crawl_worker")
        little = result.metrics.get("peak_rss_by_role_mb", {}).get("crawl_worker")
        return {
            "records_small": len(small),
            "records_large": product.accuracy.get("records"),
            "processes": self.cfg.processes,
            "crawl_worker_peak_rss_mb_small": little,
            "crawl_worker_peak_rss_mb_large": big,
            "ratio": round(big / little, 3) if big and little else None,
            "run": result.row(),
        }

    # -- scaling ---------------------------------------------------------------------------------------

    def scaling(self) -> dict[str, Any]:
        from enrich_crawl.virtualweb import running_web

        truth = self.gen.truth()
        ids = sorted(truth)
        out: dict[str, Any] = {}
        cpu_ids = ids[: self.cfg.scaling_cpu_records]
        cpu_spec = gen_mod.subset(self.gen, "cpu", cpu_ids, crawl={"default_delay": 0.0})
        by_host: dict[str, list[str]] = {}
        for rid, row in truth.items():
            if len(row["hosts"]) == 1:
                by_host.setdefault(row["hosts"][0], []).append(rid)
        top = sorted(by_host, key=lambda h: -len(by_host[h]))[: self.cfg.scaling_politeness_hosts]
        per_host = max(1, self.cfg.scaling_politeness_records // max(1, len(top)))
        pol_ids = [rid for h in top for rid in sorted(by_host[h])[:per_host]]
        pol_spec = gen_mod.subset(self.gen, "politeness", pol_ids)
        nodelay = gen_mod.web_without_delays(self.gen)
        for case, spec, web_root in (
            ("cpu_bound", cpu_spec, nodelay),
            ("politeness_bound", pol_spec, self.gen.web),
        ):
            series = []
            with running_web(web_root, log_path=self.work / f"requests-{case}.jsonl") as web:
                saved = self.web
                self.web, self._override_web_root = web, web_root
                try:
                    for shards in self.cfg.scaling:
                        label = f"scaling_{case}_{shards}"
                        res = self.product(spec, spec.parent / "mappings", shards, label)
                        log = res.log
                        window = log.get("crawl_window_s") or 0
                        series.append(
                            {
                                "partitions": shards,
                                "ok": res.metrics.get("returncode") == 0,
                                **res.row(),
                                "crawl_window_s": window,
                                "crawl_pages_per_s": round(log["pages"] / window, 2)
                                if window
                                else None,
                                "politeness_bound_s": log.get("politeness_bound_s"),
                                "politeness_efficiency": log.get("politeness_efficiency"),
                                "cpu_by_role_s": res.metrics.get("cpu_by_role_s"),
                            }
                        )
                finally:
                    self.web, self._override_web_root = saved, None
            out[case] = {
                "records": len(spec.parent.joinpath("truth.jsonl").read_text().splitlines()),
                "hosts": len(top) if case == "politeness_bound" else None,
                "series": series,
            }
        return out

    # -- verdicts --------------------------------------------------------------------------------------

    def checks(self) -> dict[str, Any]:
        return checks(self.systems, self.results)

    def _say_row(self, result: SystemResult) -> None:
        row = result.row()
        self.say(
            f"{row['system']}: {row['records']} records, {row['resolved']} resolved, "
            f"{row['pages']} pages in {row['wall_s']:.0f} s, {row['resolved_per_hour']} resolved/h, "
            f"cpu {row['cpu_ms_per_page']} ms/page, violations {row['violations']}, "
            f"accuracy {row['accuracy']}"
        )


def _entry_url(entry: dict[str, Any]) -> str:
    """The URL of a request of the virtual web's log."""
    return f"{'https' if entry.get('tls') else 'http'}://{entry['host']}{entry['path']}"


def split_requests(
    entries: list[dict[str, Any]], procs: int, *, by_host: bool = False
) -> list[list[str]]:
    """The URLs of logged requests for `procs` floor processes, in their order: dealt out one by
    one, or (`by_host`, the paced floor: a host's delay holds only within one process) whole
    hosts per process, the busiest host first onto the least loaded process."""
    urls_of: list[list[str]] = [[] for _ in range(max(1, procs))]
    if not by_host:
        for n, entry in enumerate(entries):
            urls_of[n % len(urls_of)].append(_entry_url(entry))
        return urls_of
    hosts: dict[str, list[str]] = {}
    for entry in entries:
        hosts.setdefault(entry["host"], []).append(_entry_url(entry))
    for urls in sorted(hosts.values(), key=len, reverse=True):
        min(urls_of, key=len).extend(urls)
    return urls_of


def checks(systems: list[SystemResult], results: dict[str, Any]) -> dict[str, Any]:
    """The verdicts of issue #9's "Must show" list, from the figures of one run."""
    rows = {s.name: s.row() for s in systems}
    product, seed, bfs, floor = (
        rows.get("product"),
        rows.get("seed_baseline"),
        rows.get("bfs_baseline"),
        rows.get("cpu_floor"),
    )
    product_run = next((s for s in systems if s.name == "product"), None)
    # the crawl workers' CPU alone (their role in the product's process tree)
    worker_cpu = (
        product_run.metrics.get("cpu_by_role_s", {}).get("crawl_worker") if product_run else None
    )
    verdicts: dict[str, Any] = {}

    def check(name: str, value: Any, target: str, ok: bool | None) -> None:
        verdicts[name] = {"value": value, "target": target, "ok": ok}

    if product:
        check("accuracy", product["accuracy"], ">= 0.98", _ge(product["accuracy"], 0.98))
        check("politeness_violations", product["violations"], "== 0", product["violations"] == 0)
    # a baseline that resolved fewer than MIN_SAMPLE records in its budget gives no rate
    if product and seed:
        ratio = _ratio(product["resolved_per_hour"], seed["resolved_per_hour"])
        enough = seed["resolved"] >= MIN_SAMPLE
        check(
            "resolved_per_hour_vs_seed",
            ratio,
            ">= 10" + ("" if enough else f" (seed resolved < {MIN_SAMPLE}: no verdict)"),
            _ge(ratio, 10) if enough else None,
        )
    compare = results.get("bfs_compare")
    if compare and compare.get("bfs") and compare.get("product"):
        # the same sample crawled to the end by both (on the web without delays)
        ratio = compare.get("pages_per_resolved_ratio")
        enough = (compare["bfs"].get("resolved") or 0) >= MIN_SAMPLE and not compare.get(
            "bfs_budget_hit"
        )
        check(
            "pages_per_resolved_vs_bfs",
            ratio,
            f"<= 0.5 (same {compare['records']} records, both to the end"
            + ("" if enough else f"; BFS unfinished or resolved < {MIN_SAMPLE}: no verdict")
            + ")",
            (ratio <= 0.5 if ratio is not None else None) if enough else None,
        )
    elif product and bfs:
        ratio = _ratio(product["pages_per_resolved"], bfs["pages_per_resolved"])
        enough = bfs["resolved"] >= MIN_SAMPLE
        check(
            "pages_per_resolved_vs_bfs",
            ratio,
            "<= 0.5" + ("" if enough else f" (BFS resolved < {MIN_SAMPLE}: no verdict)"),
            (ratio <= 0.5 if ratio is not None else None) if enough else None,
        )
    if product and floor:
        ratio = _ratio(product["cpu_ms_per_page"], floor["cpu_ms_per_page"])
        check("cpu_per_page_vs_floor", ratio, "<= 1.3", None if ratio is None else ratio <= 1.3)
        db_cpu = product_run.extra.get("db_server_cpu_s") if product_run else None
        if db_cpu is not None and product["pages"]:
            ms = (product["cpu_s"] + db_cpu) / product["pages"] * 1000
            check(
                "cpu_per_page_with_db_server_vs_floor",
                _ratio(ms, floor["cpu_ms_per_page"]),
                "(information: + nx-27017's own CPU)",
                None,
            )
        if worker_cpu and product["pages"]:
            ms = worker_cpu / product["pages"] * 1000
            check(
                "crawl_worker_cpu_per_page_vs_floor",
                _ratio(ms, floor["cpu_ms_per_page"]),
                "(information)",
                None,
            )
    paced = rows.get("cpu_floor_paced")
    if product and paced:
        # what crawling at the pace of politeness costs the same bare spider, beside the product
        # issue #21: the full pipeline <= 1.5x, the crawl workers alone <= 1.3x the paced floor
        full = _ratio(product["cpu_ms_per_page"], paced["cpu_ms_per_page"])
        check("cpu_per_page_vs_paced_floor", full, "<= 1.5", full is not None and full <= 1.5)
        if worker_cpu and product["pages"]:
            alone = _ratio(worker_cpu / product["pages"] * 1000, paced["cpu_ms_per_page"])
            check(
                "crawl_worker_cpu_per_page_vs_paced_floor",
                alone,
                "<= 1.3",
                alone is not None and alone <= 1.3,
            )
        if floor:
            check(
                "paced_floor_vs_floor",
                _ratio(paced["cpu_ms_per_page"], floor["cpu_ms_per_page"]),
                "(information: what politeness alone costs the floor)",
                None,
            )
    answer_paced = rows.get("cpu_floor_answer_paced")
    if product and answer_paced:
        # information: the bare spider held to the product's politeness rule (each host's delay
        # from the answer, as the audit checks it); the paced floor counts it from the send
        check(
            "cpu_per_page_vs_answer_paced_floor",
            _ratio(product["cpu_ms_per_page"], answer_paced["cpu_ms_per_page"]),
            "(information: the floor as polite as the product)",
            None,
        )
        if worker_cpu and product["pages"]:
            check(
                "crawl_worker_cpu_per_page_vs_answer_paced_floor",
                _ratio(worker_cpu / product["pages"] * 1000, answer_paced["cpu_ms_per_page"]),
                "(information: the floor as polite as the product)",
                None,
            )
    for name in ("cpu_floor_paced", "cpu_floor_answer_paced"):
        row = rows.get(name)
        if row and row.get("violations") is not None:
            check(
                f"{name.removeprefix('cpu_')}_politeness_violations",
                row["violations"],
                "(information: the audit of the product's politeness applied to the floor)",
                None,
            )
    scaling = (results.get("scaling") or {}).get("politeness_bound", {}).get("series", [])
    effs = [p["politeness_efficiency"] for p in scaling if p.get("politeness_efficiency")]
    if effs:
        check("politeness_efficiency_best", max(effs), ">= 0.8", max(effs) >= 0.8)
    rss = results.get("rss_check")
    if rss and rss.get("ratio"):
        check("crawl_worker_rss_large_over_small", rss["ratio"], "<= 1.2", rss["ratio"] <= 1.2)
    return verdicts


# --------------------------------------------------------------------------------------------------
# report


def rerender(json_path: Path) -> dict[str, Path]:
    """Write the .md (and the plot) of a results JSON again, with the current verdict rules."""
    results = json.loads(Path(json_path).read_text("utf-8"))
    systems = [SystemResult(**s) for s in results.get("systems", [])]
    results["checks"] = checks(systems, results)
    cfg = SuiteConfig(quick=bool(results.get("config", {}).get("quick")))
    cfg.results_dir = Path(json_path).parent
    return write_report(results, cfg, stamp=Path(json_path).stem)


def write_report(
    results: dict[str, Any], cfg: SuiteConfig, *, stamp: str | None = None
) -> dict[str, Path]:
    for system in results.get("systems", []):
        system["log"].pop("_entries", None)
    cfg.results_dir.mkdir(parents=True, exist_ok=True)
    stamp = stamp or dt.date.today().isoformat() + ("-quick" if cfg.quick else "")
    paths = {
        "json": cfg.results_dir / f"{stamp}.json",
        "md": cfg.results_dir / f"{stamp}.md",
    }
    if results.get("scaling"):
        paths["png"] = cfg.results_dir / f"{stamp}-scaling.png"
        plot_scaling(results["scaling"], paths["png"])
    paths["json"].write_text(json.dumps(results, indent=1, default=str) + "\n", encoding="utf-8")
    paths["md"].write_text(markdown(results, paths), encoding="utf-8")
    return paths


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _baselines_sentence(results: dict[str, Any], cfg: dict[str, Any]) -> str:
    """How the baselines ran, or that the run left them out (`--skip`)."""
    skip = set(cfg.get("skip") or ())
    if {"seed", "bfs"} <= skip:
        return "Seed-style baseline and Scrapy BFS left out of this run (--skip)."
    seed = (
        "Seed-style baseline left out of this run (--skip); "
        if "seed" in skip
        else f"Seed-style baseline time-budgeted to {cfg.get('baseline_budget')} s; "
    )
    if "bfs" in skip:
        return seed + "Scrapy BFS left out of this run (--skip)."
    return (
        seed
        + "Scrapy BFS "
        + (
            f"and the product both on the same {results['bfs_compare']['records']} records, "
            "crawled to the end on the web without delays (table below)"
            if results.get("bfs_compare")
            else f"on {cfg.get('bfs_records')} records per process, crawled to the end"
            if cfg.get("bfs_records")
            else f"time-budgeted to {cfg.get('baseline_budget')} s"
        )
        + "."
    )


def _crawl_processes(home: Path) -> int | None:
    """How many crawl processes a product run's shards were crawled in: the distinct
    `crawl_process` of their stats.json (the staging area under the run's home)."""
    found = set()
    for path in home.glob("storage/enrich_crawl/*/crawl/*/stats.json"):
        try:
            found.add(json.loads(path.read_text("utf-8")).get("crawl_process"))
        except (OSError, ValueError):
            continue
    found.discard(None)
    return len(found) or None


def _crawl_processes_note(results: dict[str, Any]) -> str:
    """How the product's shards were dealt into crawl processes, when it says."""
    for system in results.get("systems", []):
        extra = system.get("extra") or {}
        if system.get("name") == "product" and extra.get("crawl_processes"):
            return (
                f" (the product: {extra['shards']} shards in {extra['crawl_processes']} crawl "
                "processes)"
            )
    return ""


def markdown(results: dict[str, Any], paths: dict[str, Path]) -> str:
    data = results.get("dataset", {})
    cfg = results.get("config", {})
    lines = [
        f"# End-to-end benchmark ({dt.date.today().isoformat()}{', quick' if cfg.get('quick') else ''})",
        "",
        f"Web: {data.get('hosts')} hosts ({data.get('hosts_by_kind')}), dataset: "
        f"{data.get('records')} records, {data.get('missing_fields')} missing fields, "
        f"{data.get('findable_fields')} findable (by depth {data.get('findable_by_depth')}), "
        f"{data.get('resolvable_records')} resolvable records. Processes: {cfg.get('processes')}"
        f"{_crawl_processes_note(results)}. " + _baselines_sentence(results, cfg),
        "",
        "| system | records | resolved | resolved/h | pages | pages/s | pages/resolved | CPU s "
        "| CPU ms/page | peak RSS/process MB | peak RSS total MB | violations | accuracy | precision |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in results.get("table", []):
        lines.append(
            f"| {row['system']} | {_fmt(row['records'])} | {_fmt(row['resolved'])} "
            f"| {_fmt(row['resolved_per_hour'])} | {_fmt(row['pages'])} | {_fmt(row['pages_per_s'], 2)} "
            f"| {_fmt(row['pages_per_resolved'], 2)} | {_fmt(row['cpu_s'])} "
            f"| {_fmt(row['cpu_ms_per_page'], 2)} | {_fmt(row['peak_rss_process_mb'])} "
            f"| {_fmt(row['peak_rss_total_mb'])} | {_fmt(row['violations'])} "
            f"| {_fmt(row['accuracy'], 4)} | {_fmt(row['precision'], 4)} |"
        )
    lines += [
        "",
        "records: records attempted (the baselines stop at their budget); resolved: every findable "
        "missing field correct; CPU: user+sys of the whole process tree; cpu_floor: the product's "
        "requests fetched again by a bare Scrapy spider parsing each page once with lxml, per page of "
        "the product; cpu_floor_paced: the same spider on the same requests at the pace of "
        "politeness (one request at a time per host, each host's Crawl-delay between its sends); "
        "cpu_floor_answer_paced (information): the same, each delay counted from the answer to "
        "the host's last request, as the product counts it (the paced floors' violations: the "
        "product's politeness audit applied to them).",
        "",
    ]
    for s in results.get("systems", []):
        if s["name"] != "product":
            continue
        roles = s["metrics"].get("cpu_by_role_s") or {}
        db = s.get("extra", {}).get("db_server_cpu_s")
        pages = s["log"].get("pages") or 0
        lines += [
            "Product CPU by role (s): "
            + ", ".join(f"{k} {v:,.1f}" for k, v in sorted(roles.items(), key=lambda kv: -kv[1]))
            + (
                f"; the MongoDB server's own CPU (nx-27017, Python/SQLite, outside the product's "
                f"process tree, not counted above): {db:,.1f} s"
                + (f" = {db / pages * 1000:.2f} ms/page" if pages else "")
                if db is not None
                else ""
            )
            + ".",
            "",
        ]
    compare = results.get("bfs_compare")
    if compare:
        lines += [
            f"Pages per resolved record, the same {compare['records']} records crawled to the end "
            f"by both ({compare['web']}; BFS finished {compare['bfs_finished_records']} records"
            + (", **budget hit**" if compare.get("bfs_budget_hit") else "")
            + "):",
            "",
            "| system | records | resolved | pages | pages/resolved | CPU ms/page | accuracy |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for name in ("product", "bfs"):
            row = compare[name]
            lines.append(
                f"| {name} | {_fmt(row['records'])} | {_fmt(row['resolved'])} "
                f"| {_fmt(row['pages'])} | {_fmt(row['pages_per_resolved'], 2)} "
                f"| {_fmt(row['cpu_ms_per_page'], 2)} | {_fmt(row['accuracy'], 4)} |"
            )
        lines.append("")
    violations = [
        (s["name"], s["log"].get("violations_by_kind"))
        for s in results.get("systems", [])
        if s["log"].get("violations_by_kind") and s["log"].get("violations") is not None
    ]
    if violations:
        lines += ["Politeness violations by kind:", ""]
        lines += [f"- {name}: {kinds}" for name, kinds in violations]
        lines.append("")
    checks = results.get("checks", {})
    if checks:
        lines += ["| check (issue #9) | value | target | ok |", "|---|---:|---|---|"]
        for name, c in checks.items():
            ok = {True: "yes", False: "**no**", None: "-"}[c["ok"]]
            lines.append(f"| {name} | {_fmt(c['value'], 3)} | {c['target']} | {ok} |")
        lines.append("")
    for case, block in (results.get("scaling") or {}).items():
        lines += [
            f"Scaling, {case.replace('_', '-')} ({block['records']} records"
            + (f" on {block['hosts']} hosts" if block.get("hosts") else "")
            + "):",
            "",
            "| partitions | wall s | crawl pages/s | resolved/h | CPU ms/page | peak RSS total MB "
            "| politeness efficiency | violations | run ok |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        for p in block["series"]:
            lines.append(
                f"| {p['partitions']} | {_fmt(p['wall_s'])} | {_fmt(p['crawl_pages_per_s'], 2)} "
                f"| {_fmt(p['resolved_per_hour'])} | {_fmt(p['cpu_ms_per_page'], 2)} "
                f"| {_fmt(p['peak_rss_total_mb'])} | {_fmt(p['politeness_efficiency'], 3)} "
                f"| {_fmt(p['violations'])} | {'yes' if p.get('ok', True) else '**failed**'} |"
            )
        lines.append("")
    if "png" in paths:
        lines += [f"![scaling]({paths['png'].name})", ""]
    rss = results.get("rss_check")
    if rss:
        lines += [
            f"RSS check: crawl worker peak {_fmt(rss['crawl_worker_peak_rss_mb_small'])} MB at "
            f"{rss['records_small']} records vs {_fmt(rss['crawl_worker_peak_rss_mb_large'])} MB at "
            f"{rss['records_large']} records ({rss['processes']} processes): ratio "
            f"{_fmt(rss['ratio'], 3)}.",
            "",
        ]
    notes = list(results.get("run_notes") or []) + list(data.get("notes") or [])
    if notes:
        lines += ["Notes:", "", *[f"- {n}" for n in notes], ""]
    lines += [
        f"Reproduce: `python -m bench e2e{' --quick' if cfg.get('quick') else ''} "
        f"--seed {cfg.get('seed')} --hosts {cfg.get('hosts')} "
        f"--records {cfg.get('records')} --processes {cfg.get('processes')} "
        + (
            f"--crawl-processes {cfg['crawl_processes']} "
            if cfg.get("crawl_processes") is not None
            else ""
        )
        + f"--baseline-budget {cfg.get('baseline_budget'):g} "
        f"--bfs-compare-records {cfg.get('bfs_compare_records', 0)} "
        f"--bfs-budget {cfg.get('bfs_budget'):g} --floor-requests {cfg.get('floor_requests', 0)} "
        f"--rss-records {cfg.get('rss_small_records')} "
        f"--scaling {','.join(str(x) for x in cfg.get('scaling') or ()) or 0} "
        f"--scaling-cpu-records {cfg.get('scaling_cpu_records')} "
        f"--scaling-politeness-hosts {cfg.get('scaling_politeness_hosts')} "
        f"--scaling-politeness-records {cfg.get('scaling_politeness_records')}"
        f"{' --skip ' + ','.join(sorted(cfg['skip'])) if cfg.get('skip') else ''}`"
        f" ({results.get('seconds')} s).",
        "",
    ]
    return "\n".join(lines)


def plot_scaling(scaling: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    ticks: set[int] = set()
    for case, block in scaling.items():
        points = [p for p in block["series"] if p.get("ok", True)]  # failed runs: no point
        xs = [p["partitions"] for p in points]
        ticks.update(xs)
        pages = [p["crawl_pages_per_s"] or 0 for p in points]
        resolved = [p["resolved_per_hour"] or 0 for p in points]
        (line,) = left.plot(xs, pages, marker="o", label=case.replace("_", "-"))
        right.plot(xs, resolved, marker="o", label=case.replace("_", "-"), color=line.get_color())
        if case == "politeness_bound":
            ceiling = [
                (p["pages"] / p["politeness_bound_s"]) if p.get("politeness_bound_s") else None
                for p in points
            ]
            if any(ceiling):
                left.plot(
                    xs,
                    [c or 0 for c in ceiling],
                    linestyle="--",
                    color=line.get_color(),
                    label="politeness ceiling",
                )
    for axis, title in ((left, "crawl pages/s"), (right, "records resolved per hour")):
        axis.set_xscale("log", base=2)
        axis.set_xticks(sorted(ticks), [str(t) for t in sorted(ticks)])
        axis.set_ylim(bottom=0)
        axis.set_xlabel("partitions (shards), 2 cores")
        axis.set_title(title)
        axis.grid(alpha=0.3)
        axis.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------------------------------
# helpers


def _ge(value: Any, floor: float) -> bool | None:
    return None if value is None else value >= floor


def _ratio(a: Any, b: Any) -> float | None:
    if a is None or not b:
        return None
    return round(a / b, 3)


def _tail(path: str, lines: int) -> str:
    try:
        return "\n".join(Path(path).read_text("utf-8", errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _last_json(path: Path) -> dict[str, Any]:
    try:
        for line in reversed(path.read_text("utf-8").splitlines()):
            if line.startswith("{"):
                return json.loads(line)
    except (OSError, ValueError):
        pass
    return {}


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    return obj
