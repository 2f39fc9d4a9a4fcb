"""Where a crawl worker's CPU goes, page for page, against the CPU floor on the same requests.

The end-to-end benchmark says how much CPU a page costs the product and the floor (a bare Scrapy
spider parsing each page once with lxml); this says where the difference goes. One crawl worker
(no Dagster: `python -m enrich_crawl.crawl.worker --params`) crawls N records of the benchmark's
dataset, then the floor spider refetches exactly the requests it made. Each runs twice on the same
work: plainly, for its CPU (user+sys of the process), and under cProfile, for where it goes (each
function's own time, grouped into components by the module it belongs to; a C function's time goes
to the component of its callers). cProfile slows pure-Python code more than C, so the shares are
approximate: each component's ms/page is its share of the profiled run times the plain run's CPU
per page.

    python -m bench.e2e.attribution [--records 400] [--polite] [--family pydocs] [--seed 1 ...]

By default the web has no delays (`Crawl-delay: 0`, `crawl.default_delay: 0`: the crawl is
CPU-bound and short); `--polite` crawls the benchmark's web with its delays (as long as the
politeness takes). Writes bench/results/attribution-<date>[-polite].json and prints a markdown
table.
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import os
import pstats
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench.e2e import generate as gen_mod
from bench.e2e import mongo_commands
from bench.e2e.agents import FLOOR_UA
from bench.e2e.suite import split_requests

REPO = Path(__file__).resolve().parents[2]
PRODUCT_UA_PREFIX = "enrich_crawl/"

# (component, pattern on "<module path>:<function>") in order: the first match wins
COMPONENTS: list[tuple[str, str]] = [
    (
        "imports and set-up",
        r"<frozen |:<module>$|marshal\.loads|_imp\.|builtins\.compile"
        r"|__build_class__|jsonschema/|referencing/|tldextract/|enrich_crawl/extract/schema\.py"
        r"|enrich_crawl/extract/regex_safety\.py",
    ),
    (
        # freeing a tree is part of parsing it: the floor frees each one in its callback, the
        # product when its page cache lets the parsed form go
        "HTML parse and free (lxml)",
        r"lxml/html/__init__\.py:document_fromstring|enrich_crawl/extract/page\.py:tree"
        r"|pagecache\.py:strip_parsed|bench/e2e/floor\.py:parse|lxml/",
    ),
    ("extraction (mappings)", r"enrich_crawl/extract/|cssselect/|jsonpath|/regex/|_regex\."),
    (
        "politeness (robots, limiter, scheduler, URL policy)",
        r"enrich_crawl/crawl/(robots|host_limiter|downloader|scheduler|policy|dns_resolver)\.py"
        r"|enrich_crawl/crawl/middlewares/|protego",
    ),
    (
        "crawl state (MongoDB client, compression)",
        r"enrich_crawl/crawl/state\.py|pymongo/|bson/|lz4|zstandard|_cmessage|_cbson",
    ),
    (
        "frontier, page cache, outputs",
        r"enrich_crawl/crawl/(spider|feed|sources|extraction|rendering|outcomes|report|tally"
        r"|frontier|pagecache|errors|render)\.py|enrich_crawl/(urls|staging)\.py"
        r"|json/|_json\.|hashlib|sqlite3",
    ),
    ("seed shard read", r"pyarrow|enrich_crawl/dataset/"),
    ("floor callback", r"bench/e2e/floor\.py"),
    ("Scrapy", r"scrapy/|pydispatch/|w3lib/|itemadapter|parsel/|queuelib/"),
    (
        "Twisted, asyncio, sockets",
        r"twisted/|asyncio/|selectors\.py|socket|OpenSSL/|_ssl\.|ssl\.py|zope/|_contextvars",
    ),
]
WAITING = re.compile(r"'poll' of 'select\.epoll'|'select' of|sleep|acquire' of '_thread")


def _key(func: tuple[str, int, str]) -> str:
    path, _line, name = func
    path = re.sub(r".*site-packages/", "", path)
    path = re.sub(r".*/lib/python3\.\d+/", "", path)
    path = path.replace(str(REPO) + "/", "")
    return f"{path}:{name}"


def _component(key: str) -> str | None:
    for name, pattern in COMPONENTS:
        if re.search(pattern, key):
            return name
    return None


def attribute(profile: Path) -> tuple[Counter[str], float]:
    """Own time by component (seconds) of a cProfile file, and the time spent waiting."""
    stats = pstats.Stats(str(profile)).stats  # type: ignore[attr-defined]
    own: Counter[str] = Counter()
    waiting = 0.0
    # a function of no component (a builtin, the standard library) is charged to its callers'
    # components, in proportion to the time each caller spent in it; callers of no component
    # pass their share up, three levels at most; what is still unplaced then is "other"
    unresolved: dict[tuple, float] = {}
    for func, (_cc, _nc, tottime, _ct, _callers) in stats.items():
        key = _key(func)
        if WAITING.search(key):
            waiting += tottime
            continue
        name = _component(key)
        if name is not None:
            own[name] += tottime
        else:
            unresolved[func] = tottime
    for _round in range(3):
        left: dict[tuple, float] = {}
        for func, seconds in unresolved.items():
            callers = stats[func][4]
            total = sum(c[2] for c in callers.values()) or sum(c[1] for c in callers.values())
            if not callers or not total:
                own["other"] += seconds
                continue
            for caller, c in callers.items():
                share = seconds * ((c[2] if any(x[2] for x in callers.values()) else c[1]) / total)
                name = _component(_key(caller))
                if name is not None:
                    own[name] += share
                else:
                    left[caller] = left.get(caller, 0.0) + share
        unresolved = left
    for seconds in unresolved.values():
        own["other"] += seconds
    return own, waiting


def _cpu_of_children() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run(
    cmd: list[str], env: dict[str, str], log: Path, samples: PhaseSamples | None = None
) -> float:
    """CPU seconds (user+sys) of a command run to its end."""
    return _run_all([cmd], env, [log], samples)


def _log_entry(url: str) -> dict[str, Any]:
    """A refetched URL as the virtual web's log has it (what suite.split_requests reads)."""
    parts = urlsplit(url)
    path = parts.path or "/"
    return {
        "host": parts.netloc,
        "path": f"{path}?{parts.query}" if parts.query else path,
        "tls": parts.scheme == "https",
    }


def _run_all(
    cmds: list[list[str]],
    env: dict[str, str],
    logs: list[Path],
    samples: PhaseSamples | None = None,
) -> float:
    """CPU seconds (user+sys) of commands run at once, each to its end; with `samples`, also the
    processes' CPU together and the machine's load while they run (`--phases`)."""
    before = _cpu_of_children()
    procs = []
    for cmd, log in zip(cmds, logs, strict=True):
        with open(log, "w", encoding="utf-8") as out:
            procs.append(subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT))
    if samples is not None:
        samples.rows.extend(_sample_while_running(procs, samples.period))
    codes = [proc.wait() for proc in procs]
    if any(codes):
        raise subprocess.CalledProcessError(max(codes), cmds[codes.index(max(codes))])
    return _cpu_of_children() - before


PHASE_SAMPLE_S = 2.0  # --phases: how often the processes' CPU and the machine's load are read


def _sample_while_running(procs: list[subprocess.Popen], period: float) -> list[dict[str, float]]:
    """The processes' CPU seconds together (user+sys from /proc, through psutil; a process that
    has exited counts with its last reading, so the CPU of its last `period` may be missing) and
    the machine's busy share since the sample before, every `period` until all have exited."""
    import psutil

    handles = [psutil.Process(proc.pid) for proc in procs]
    last = [0.0] * len(procs)
    psutil.cpu_percent(None)
    samples: list[dict[str, float]] = []
    while True:
        alive = [proc.poll() is None for proc in procs]
        for i, handle in enumerate(handles):
            if alive[i]:
                try:
                    times = handle.cpu_times()
                    last[i] = times.user + times.system
                except psutil.Error:
                    pass
        samples.append(
            {
                "t": time.time(),
                "cpu_s": round(sum(last), 3),
                "machine_busy": round(psutil.cpu_percent(None) / 100, 3),
            }
        )
        if not any(alive):
            return samples
        time.sleep(period)


@dataclass
class PhaseSamples:
    """What `_run_all` reads while a run's processes run (`--phases`), every `period` seconds."""

    period: float
    rows: list[dict[str, float]] = field(default_factory=list)


def _phase_samples(args: argparse.Namespace, profiled: bool) -> PhaseSamples | None:
    """Samples for a plain run with `--phases`: every quarter window, at most PHASE_SAMPLE_S."""
    if not args.phases or profiled:
        return None
    return PhaseSamples(min(PHASE_SAMPLE_S, args.phases / 4))


def _times(served: list[dict[str, Any]], ua: str, t0: float, t1: float) -> list[float]:
    """Times of the requests of User-Agent `ua` the web served from `t0` (less a second) to `t1`."""
    return [e["t"] for e in served if e.get("ua", "") == ua and t0 - 1 <= e["t"] <= t1]


def phases(
    samples: list[dict[str, float]], request_times: list[float], window: float
) -> list[dict[str, Any]]:
    """CPU per request of a run, window by window from its start: the CPU its processes used in
    each window (`samples`), the requests the web served them in it (their log times), and the
    machine's mean busy share (what else ran counts there too)."""
    if not samples:
        return []
    start = samples[0]["t"]
    rows: dict[int, dict[str, Any]] = {}

    def row(t: float) -> dict[str, Any]:
        n = max(0, int((t - start) // window))
        return rows.setdefault(n, {"cpu_s": 0.0, "requests": 0, "busy": []})

    for before, after in itertools.pairwise(samples):
        entry = row(after["t"])
        entry["cpu_s"] += after["cpu_s"] - before["cpu_s"]
        entry["busy"].append(after["machine_busy"])
    for t in request_times:
        row(t)["requests"] += 1
    out = []
    for n in sorted(rows):
        entry = rows[n]
        out.append(
            {
                "from_s": round(n * window),
                "cpu_s": round(entry["cpu_s"], 3),
                "requests": entry["requests"],
                "ms_per_request": round(1000 * entry["cpu_s"] / entry["requests"], 3)
                if entry["requests"]
                else None,
                "machine_busy": round(statistics.mean(entry["busy"]), 3) if entry["busy"] else None,
            }
        )
    return out


def add_web_options(parser: argparse.ArgumentParser) -> None:
    """The options naming the benchmark's generated web (its cache) and the results folder."""
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--hosts", type=int, default=1000, help="hosts of the generated web")
    parser.add_argument(
        "--web-records", type=int, default=20000, help="records of the generated dataset"
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
        / "enrich_crawl"
        / "bench-e2e",
    )
    parser.add_argument("--results-dir", type=Path, default=REPO / "bench" / "results")


def write_worker_params(
    path: Path,
    *,
    spec: Any,
    spec_path: Path,
    stage: Any,
    shard: str,
    out_dir: Path,
    run_id: str,
    proxy: str,
    mongo_uri: str,
    mongo_db: str,
) -> Path:
    """The params file of one crawl worker (`python -m enrich_crawl.crawl.worker --params`, no
    Dagster) crawling shard `shard` of the benchmark subset `spec` (loaded from `spec_path`),
    staged in `stage`."""
    from enrich_crawl import config
    from enrich_crawl.crawl.params import WorkerParams

    params = WorkerParams(
        dataset=spec.name,
        partition=shard,
        seed_path=str(stage.seed_shard(shard)),
        out_dir=str(out_dir),
        mappings_dir=str(spec_path.parent / "mappings"),
        field_types=spec.field_types(),
        crawl=spec.crawl.to_dict(),
        run_id=run_id,
        user_agent=config.user_agent(),
        proxy=proxy,
        mongo_uri=mongo_uri,
        mongo_db=mongo_db,
        log_level="WARNING",
    )
    path.write_text(json.dumps(params.to_dict()), encoding="utf-8")
    return path


def run(args: argparse.Namespace, gen: gen_mod.Generated | None = None) -> dict[str, Any]:
    """Both systems, plain and profiled, on `args.records` records of `gen` (default: the
    benchmark's generated web for `args.seed`, `args.hosts`, `args.web_records`)."""
    from bench.e2e.measure import HostRules, request_stats, select_requests
    from enrich_crawl.dataset.load import prepare_dataset
    from enrich_crawl.dataset.spec import load_spec
    from enrich_crawl.staging import DatasetStage
    from enrich_crawl.testing.services import ephemeral_mongo
    from enrich_crawl.virtualweb import read_log, running_web

    say = lambda msg: print(f"[attribution] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    if gen is None:
        gen = gen_mod.cached(
            gen_mod.GenConfig(seed=args.seed, hosts=args.hosts, records=args.web_records),
            args.cache_dir,
            log=say,
        )
    truth = sorted(
        rid for rid, row in gen.truth().items() if args.family in (None, row.get("family"))
    )
    if not truth:
        raise SystemExit(f"attribution: no record of family {args.family!r} in {gen.truth_path}")
    work = Path(tempfile.mkdtemp(prefix="bench-attribution-"))
    step = max(1, len(truth) // args.records)
    spec_path = gen_mod.subset(
        gen,
        f"attribution{args.records}{'-' + args.family if args.family else ''}",
        truth[::step][: args.records],
        crawl=None if args.polite else {"default_delay": 0},
    )
    spec = load_spec(spec_path)
    stage = DatasetStage(work / "stage", spec.name)
    prepare_dataset(spec, stage, ["s00"])
    web_root = gen.web if args.polite else gen_mod.web_without_delays(gen)
    env = {k: v for k, v in os.environ.items() if k.lower() not in ("http_proxy", "https_proxy")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env["PYTHONWARNINGS"] = "ignore"
    results: dict[str, Any] = {
        "records": min(args.records, len(truth)),
        "family": args.family,
        "polite": args.polite,
        "rounds": args.rounds,
        "runs": {},
    }

    shards = [f"s{n:02d}" for n in range(args.workers)]
    if args.workers > 1:  # the fleet: one worker per shard, all at once, one database
        stage = DatasetStage(work / "stage-fleet", spec.name)
        prepare_dataset(spec, stage, shards)

    def crawl(tag: str, web: Any, profiled: bool) -> dict[str, Any]:
        # plain runs count their MongoDB commands (pymongo command monitoring in each worker)
        counts_dir = work / f"mongo-commands-{tag}"
        runner = (
            ["-m", "cProfile", "-o", str(work / f"product-{tag}.prof")]
            if profiled
            else ["-m", "bench.e2e.mongo_commands", str(counts_dir)]
        )
        with ephemeral_mongo() as mongo:  # a fresh database: nothing reused from a run before
            commands = []
            for shard in shards:
                params_path = write_worker_params(
                    work / f"params-{tag}-{shard}.json",
                    spec=spec,
                    spec_path=spec_path,
                    stage=stage,
                    shard=shard,
                    out_dir=work / f"crawl-{tag}" / shard,
                    run_id=f"attribution-{tag}",
                    proxy=web.proxy_url,
                    mongo_uri=mongo.uri,
                    mongo_db="attribution",
                )
                module = ["-m"] if profiled else []
                commands.append(
                    [sys.executable, *runner, *module, "enrich_crawl.crawl.worker",
                     "--params", str(params_path)]
                )  # fmt: skip
            say(f"crawl worker ({tag}) x{len(shards)} on {args.records} records ...")
            started = time.time()
            samples = _phase_samples(args, profiled)
            logs = [work / f"product-{tag}-{s}.log" for s in shards]
            cpu = _run_all(commands, env, logs, samples)
            ended = time.time()
        pages = 0
        outcomes: Counter[str] = Counter()
        for shard in shards:
            stats = json.loads((work / f"crawl-{tag}" / shard / "stats.json").read_text("utf-8"))
            pages += stats["pages"]
            outcomes.update(stats.get("outcomes") or {})
        served = [
            e
            for e in read_log(web.log_path)
            if e.get("ua", "").startswith(PRODUCT_UA_PREFIX) and started - 1 <= e["t"] <= ended
        ]
        requests = [
            f"{'https' if e.get('tls') else 'http'}://{e['host']}{e['path']}" for e in served
        ]
        run = {
            "cpu_s": round(cpu, 3),
            "pages": pages,
            "requests": requests,
            "wall_s": round(ended - started, 1),
            "outcomes": dict(outcomes),
            "started": started,
            "ended": ended,
        }
        if samples is not None:
            run["phases"] = phases(samples.rows, [e["t"] for e in served], args.phases)
        if not profiled:
            by_name = mongo_commands.read(counts_dir)
            run["mongodb_commands"] = dict(sorted(by_name.items()))
            run["mongodb_commands_per_page"] = round(
                mongo_commands.application_commands(by_name) / max(pages, 1), 4
            )
        return run

    # with --polite, a polite bare crawler too (information): the floor paced by each host's
    # Crawl-delay (else the spec's default delay), one request at a time per host
    delays_file = gen.write_delays(work / "delays.json", spec.crawl.default_delay)
    audit_delay = spec.crawl.default_delay
    # --phases: each floor run of the round -> (its start, end, samples), set against the log when
    # the round reads it for the audit
    floor_runs: dict[str, tuple[float, float, PhaseSamples]] = {}

    def floor(
        tag: str,
        web: Any,
        url_file: Path,
        profiled: bool,
        paced: bool = False,
        from_answer: bool = False,
    ) -> float:
        prof = ["-m", "cProfile", "-o", str(work / f"floor-{tag}.prof")] if profiled else []
        pace = ["--delays", str(delays_file)] if paced else []
        pace += ["--from-answer"] if paced and from_answer else []
        name = f"{'answer-' if from_answer else ''}{'paced ' if paced else ''}floor"
        say(f"{name} ({tag}) ...")
        procs = 1 if profiled else args.floor_processes
        samples = _phase_samples(args, profiled)
        started = time.time()
        if procs == 1:
            cpu = _run(
                [sys.executable, *prof, "-m", "bench.e2e.floor", "--urls", str(url_file),
                 "--proxy", web.proxy_url, *pace],
                env, work / f"{name.replace(' ', '-')}-{tag}.log", samples,
            )  # fmt: skip
        else:
            cpu = _run_split(name, tag, web, url_file, procs, pace, paced, samples)
        if samples is not None:
            floor_runs[name] = (started, time.time(), samples)
        return cpu

    def _run_split(
        name: str,
        tag: str,
        web: Any,
        url_file: Path,
        procs: int,
        pace: list[str],
        paced: bool,
        samples: PhaseSamples | None,
    ) -> float:
        # split as the end-to-end benchmark splits its floors (suite.split_requests): paced, whole
        # hosts per process (a host's delay holds within one process), else dealt out one by one
        entries = [_log_entry(url) for url in url_file.read_text("utf-8").split()]
        cmds, logs = [], []
        for i, urls in enumerate(split_requests(entries, procs, by_host=paced)):
            part = url_file.with_name(f"{url_file.stem}-{name.replace(' ', '-')}-{i}.txt")
            part.write_text("\n".join(urls) + "\n", encoding="utf-8")
            cmds.append(
                [sys.executable, "-m", "bench.e2e.floor", "--urls", str(part),
                 "--proxy", web.proxy_url, *pace]
            )  # fmt: skip
            logs.append(work / f"{name.replace(' ', '-')}-{tag}-{i}.log")
        return _run_all(cmds, env, logs, samples)

    with running_web(web_root, log_path=work / "requests.jsonl") as web:
        # plain runs in interleaved rounds (the machine's noise hits both alike), each floor
        # refetching exactly the requests of the crawl before it; then one profiled run each
        rounds = []
        for n in range(args.rounds):
            product = crawl(f"plain{n}", web, profiled=False)
            url_file = work / f"urls-{n}.txt"
            url_file.write_text("\n".join(product["requests"]) + "\n", encoding="utf-8")
            floor_cpu = floor(f"plain{n}", web, url_file, profiled=False)
            rounds.append(
                {
                    **{k: v for k, v in product.items() if k != "requests"},
                    "requests": len(product["requests"]),
                    "floor_cpu_s": round(floor_cpu, 3),
                    "ratio": round(product["cpu_s"] / floor_cpu, 3),
                }
            )
            if args.polite:
                paced_cpu = floor(f"plain{n}", web, url_file, profiled=False, paced=True)
                rounds[-1]["paced_floor_cpu_s"] = round(paced_cpu, 3)
                rounds[-1]["ratio_to_paced_floor"] = round(product["cpu_s"] / paced_cpu, 3)
                # the same, each host's delay counted from the answer as the product counts it
                answer_cpu = floor(
                    f"plain{n}", web, url_file, profiled=False, paced=True, from_answer=True
                )
                rounds[-1]["answer_paced_floor_cpu_s"] = round(answer_cpu, 3)
                rounds[-1]["ratio_to_answer_paced_floor"] = round(product["cpu_s"] / answer_cpu, 3)
            served = read_log(web.log_path)
            entries = select_requests(
                served,
                ua_prefix=PRODUCT_UA_PREFIX,
                t0=product["started"] - 1,
                t1=product["ended"] + 1,
            )
            audit = request_stats(
                entries, HostRules(web_root, gen.hosts()), default_delay=audit_delay
            )
            if floor_runs:  # --phases: this round's floors (the product's are in its run)
                rounds[-1]["floor_phases"] = {
                    name: phases(samples.rows, _times(served, FLOOR_UA, t0, t1), args.phases)
                    for name, (t0, t1, samples) in floor_runs.items()
                }
                floor_runs.clear()
            rounds[-1]["politeness_violations"] = audit["violations"]
            rounds[-1]["violations_by_kind"] = audit["violations_by_kind"]
            rounds[-1]["min_gap_over_delay"] = audit["min_gap_over_delay"]
        if args.profile:
            profiled = crawl("profiled", web, profiled=True)
            floor("profiled", web, work / "urls-0.txt", profiled=True)
    results["rounds_detail"] = rounds
    median = statistics.median
    pages = rounds[0]["pages"]
    results["runs"]["product_plain"] = {
        "pages": pages,
        "requests": rounds[0]["requests"],
        "cpu_s": median(r["cpu_s"] for r in rounds),
        "ms_per_page_by_round": [round(1000 * r["cpu_s"] / r["pages"], 3) for r in rounds],
    }
    results["runs"]["floor_plain"] = {
        "requests": rounds[0]["requests"],
        "cpu_s": median(r["floor_cpu_s"] for r in rounds),
        "ms_per_page_by_round": [round(1000 * r["floor_cpu_s"] / r["pages"], 3) for r in rounds],
    }
    if args.polite:
        results["paced_floor_ms_per_page"] = round(
            median(1000 * r["paced_floor_cpu_s"] / r["pages"] for r in rounds), 3
        )
        results["ratio_to_paced_floor"] = round(
            median(r["ratio_to_paced_floor"] for r in rounds), 3
        )
        results["answer_paced_floor_ms_per_page"] = round(
            median(1000 * r["answer_paced_floor_cpu_s"] / r["pages"] for r in rounds), 3
        )
        results["ratio_to_answer_paced_floor"] = round(
            median(r["ratio_to_answer_paced_floor"] for r in rounds), 3
        )
    results["ratio_by_round"] = [r["ratio"] for r in rounds]
    results["workers"] = args.workers
    results["floor_processes"] = args.floor_processes
    results["mongodb_commands_per_page"] = median(r["mongodb_commands_per_page"] for r in rounds)
    results["mongodb_commands_by_round"] = [r["mongodb_commands"] for r in rounds]
    results["politeness_violations"] = sum(r["politeness_violations"] for r in rounds)
    rows: dict[str, dict[str, float]] = {}
    for system in ("product", "floor"):
        plain_ms = median(results["runs"][f"{system}_plain"]["ms_per_page_by_round"])
        results[f"{system}_ms_per_page"] = round(plain_ms, 3)
        if not args.profile:
            continue
        results["runs"]["product_profiled"] = {k: v for k, v in profiled.items() if k != "requests"}
        own, waiting = attribute(work / f"{system}-profiled.prof")
        busy = sum(own.values())
        results[f"{system}_profiled_busy_s"] = round(busy, 3)
        results[f"{system}_profiled_waiting_s"] = round(waiting, 3)
        for name, seconds in own.items():
            rows.setdefault(name, {"product": 0.0, "floor": 0.0})[system] = round(
                plain_ms * seconds / busy, 3
            )
    results["components_ms_per_page"] = rows
    # the median of the paired ratios: each round's product and floor ran back to back
    results["ratio"] = round(median(results["ratio_by_round"]), 3)
    results["checks"] = checks(results, args)
    results["work_dir"] = str(work)
    if not args.keep:
        shutil.rmtree(work / "stage", ignore_errors=True)
    return results


def checks(results: dict[str, Any], args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The run's checks: politeness, MongoDB commands per page (`--commands-target`) and, for one
    polite worker, its CPU per page against the paced floor (issue #21: <= 1.3)."""
    out: dict[str, dict[str, Any]] = {
        "politeness_violations": {
            "value": results["politeness_violations"],
            "target": "== 0",
            "ok": results["politeness_violations"] == 0,
        }
    }
    value = results["mongodb_commands_per_page"]
    name = "fleet" if args.workers > 1 else "crawl_worker"
    out[f"{name}_mongodb_commands_per_page"] = {
        "value": value,
        "target": f"<= {args.commands_target}"
        if args.commands_target is not None
        else "(information)",
        "ok": value <= args.commands_target if args.commands_target is not None else None,
    }
    if "ratio_to_paced_floor" in results:
        ratio = results["ratio_to_paced_floor"]
        check = "crawl_worker" if args.workers == 1 else "fleet"
        out[f"{check}_cpu_per_page_vs_paced_floor"] = {
            "value": ratio,
            # several workers: as many process start-ups against one floor process, information
            "target": "<= 1.3" if args.workers == 1 else "(information)",
            "ok": ratio <= 1.3 if args.workers == 1 else None,
        }
    return out


def _floor_split(processes: int) -> str:
    if processes <= 1:
        return ""
    return f" ({processes} processes each floor, split as the end-to-end benchmark splits them)"


def phase_table(round_: dict[str, Any]) -> list[str]:
    """Markdown of a round's phases (`--phases`): each run's CPU per request window by window,
    with the requests served in the window and the machine's mean load."""
    runs = {"product": round_.get("phases") or [], **(round_.get("floor_phases") or {})}
    if not runs["product"]:
        return []
    starts = sorted({row["from_s"] for rows in runs.values() for row in rows})
    lines = [
        "CPU per request window by window from each run's start (`--phases`; in brackets the "
        "requests served in the window and the machine's mean load, everything on it counted):",
        "",
        "| from s | " + " | ".join(f"{name} ms/request" for name in runs) + " |",
        "|---:|" + "---:|" * len(runs),
    ]

    def cell(row: dict[str, Any] | None) -> str:
        if row is None:
            return ""
        ms = "-" if row["ms_per_request"] is None else f"{row['ms_per_request']:.2f}"
        busy = "" if row["machine_busy"] is None else f", {row['machine_busy']:.0%}"
        return f"{ms} ({row['requests']:,}{busy})"

    by_start = {name: {row["from_s"]: row for row in rows} for name, rows in runs.items()}
    for start in starts:
        cells = [cell(by_start[name].get(start)) for name in runs]
        lines.append(f"| {start} | " + " | ".join(cells) + " |")
    totals = []
    for rows in runs.values():
        cpu, requests = sum(r["cpu_s"] for r in rows), sum(r["requests"] for r in rows)
        totals.append(f"**{1000 * cpu / requests:.2f}** ({requests:,})" if requests else "")
    lines.append("| all | " + " | ".join(totals) + " |")
    return lines


def markdown(results: dict[str, Any]) -> str:
    rows = results["components_ms_per_page"]
    order = [name for name, _ in COMPONENTS] + ["other"]
    lines = [
        f"{results.get('workers', 1)} crawl worker(s) at once on {results['records']} records"
        f"{' of the family ' + results['family'] if results.get('family') else ''} "
        f"({'the web with its delays' if results['polite'] else 'the web without delays'}), "
        f"{results['runs']['product_plain']['pages']:,} pages; the floor on the same "
        f"{results['runs']['floor_plain']['requests']:,} requests"
        f"{_floor_split(results.get('floor_processes', 1))}. CPU per page (plain runs): "
        f"product {results['product_ms_per_page']:.2f} ms, floor {results['floor_ms_per_page']:.2f}"
        f" ms (medians of {results['rounds']} interleaved rounds); product/floor "
        f"{results['ratio']:.2f} (median of the rounds' ratios "
        f"{', '.join(f'{r:.2f}' for r in results['ratio_by_round'])}).",
        "",
        "| component | product ms/page | floor ms/page | difference |",
        "|---|---:|---:|---:|",
    ]
    for name in order:
        if name not in rows:
            continue
        product, floor = rows[name]["product"], rows[name]["floor"]
        lines.append(f"| {name} | {product:.2f} | {floor:.2f} | {product - floor:+.2f} |")
    lines.append(
        f"| **total** | **{results['product_ms_per_page']:.2f}** | "
        f"**{results['floor_ms_per_page']:.2f}** | "
        f"**{results['product_ms_per_page'] - results['floor_ms_per_page']:+.2f}** |"
    )
    lines += [
        "",
        f"MongoDB commands per page (pymongo command monitoring, client monitoring excluded): "
        f"{results['mongodb_commands_per_page']:.3f}; politeness violations "
        f"{results['politeness_violations']}.",
    ]
    if "paced_floor_ms_per_page" in results:
        lines += [
            "",
            f"A polite bare crawler (the floor paced like the product: one request at a time per "
            f"host, each host's delay between its sends) costs "
            f"{results['paced_floor_ms_per_page']:.2f} ms/page on the same requests: the "
            f"product is {results['ratio_to_paced_floor']:.2f}x of it (information; the check's "
            "floor is the unpaced one).",
        ]
    if "answer_paced_floor_ms_per_page" in results:
        lines += [
            "",
            f"The same bare crawler counting each host's delay from the answer to its last "
            f"request, as the product does (Scrapy's slots count it from the send): "
            f"{results['answer_paced_floor_ms_per_page']:.2f} ms/page; the product is "
            f"{results['ratio_to_answer_paced_floor']:.2f}x of it (information).",
        ]
    for n, round_ in enumerate(results.get("rounds_detail") or []):
        table = phase_table(round_)
        if table:
            lines += ["", f"Round {n + 1}. " + table[0], *table[1:]]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=400)
    parser.add_argument("--polite", action="store_true", help="the web with its delays")
    parser.add_argument(
        "--rounds", type=int, default=3, help="plain runs of each system, interleaved (median)"
    )
    parser.add_argument(
        "--family",
        help="only records of this family of the generated dataset (its truth.jsonl: directory, "
        "shared, brand, site, pydocs = the Python docs host)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="crawl workers at once on shards of the records, one database (the fleet; >1: no "
        "profiled run)",
    )
    parser.add_argument(
        "--floor-processes",
        type=int,
        default=1,
        help="floor processes of each plain floor run, split as the end-to-end benchmark splits "
        "them (paced: whole hosts per process, the busiest onto the least loaded); 1: one process",
    )
    parser.add_argument(
        "--no-profile", dest="profile", action="store_false", help="plain runs only"
    )
    parser.add_argument(
        "--phases",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="also CPU per request of each plain run window by window (this many seconds each), "
        "with the machine's load: how the cost moves from the crawl's busy start to its tail",
    )
    parser.add_argument(
        "--commands-target", type=float, help="the check of MongoDB commands per page (<=)"
    )
    parser.add_argument("--tag", help="a suffix of the results' file names (before, after ...)")
    add_web_options(parser)
    parser.add_argument("--keep", action="store_true", help="keep the seed shard in the work dir")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.workers > 1:
        args.profile = False  # one profile per process: the attribution is one worker's
    results = run(args)
    args.results_dir.mkdir(parents=True, exist_ok=True)
    name = (
        f"attribution-{dt.date.today().isoformat()}{'-polite' if args.polite else ''}"
        f"{'-' + args.family if args.family else ''}"
        f"{f'-fleet{args.workers}' if args.workers > 1 else ''}{'-' + args.tag if args.tag else ''}"
    )
    (args.results_dir / f"{name}.json").write_text(json.dumps(results, indent=1), "utf-8")
    text = markdown(results)
    (args.results_dir / f"{name}.md").write_text(f"# CPU attribution ({name})\n\n{text}\n", "utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
