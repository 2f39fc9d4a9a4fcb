"""A generated virtual web of many organisation sites, its dataset and mappings, and a runner that
crawls it with several crawl worker processes at once (one per partition), as production does.

Used by the crawl tests (politeness across workers) and by `bench.bench_crawl`.

Each host `siteNNN.example` publishes `records_per_host` organisations: `/org/<id>/` (the home page:
description), `/org/<id>/about.html` (city, founded), `/org/<id>/contact.html` (e-mail) and
`/api/<id>.json` (employees), all linked from the home page with class `profile` (the mapping's
url_parsers follow those), next to noise links a breadth-first crawl would follow: news pages, a
privacy page, a page under `/private/` that robots.txt disallows, and links into other hosts (which
usually belong to other partitions). Optionally, every home page also links to a record page on one
of a few shared `registryN.example` hosts, which every partition then crawls at the same time.

robots.txt varies by host: with or without `Crawl-delay`, with `Disallow: /private/`, missing (404).
"""

from __future__ import annotations

import csv
import itertools
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_UA = (
    "enrich_crawl/0.1 (+https://github.com/enrich-crawl/enrich_crawl/blob/main/docs/CRAWLER.md)"
)

FIELDS = {
    "description": {},
    "city": {},
    "founded": {"type": "integer"},
    "email": {},
    "employees": {"type": "integer"},
}

MAPPINGS = {
    "synth_org": {
        "name": "synth_org",
        "url_patterns": [
            {
                "type": "regex",
                "pattern": r"^https?://site\d+\.example/org/[^/]+/"
                r"(?:about\.html|contact\.html)?(?:#.*)?$",
            }
        ],
        "url_parsers": [
            {
                "description": "profile links",
                "processors": [
                    {"type": "xpath", "parameters": {"expression": "//a[@class='profile']/@href"}}
                ],
            }
        ],
        "fields": [
            {
                "name": "description",
                "processors": [
                    {
                        "type": "xpath",
                        "parameters": {"expression": "//meta[@name='description']/@content"},
                    }
                ],
            },
            {
                "name": "city",
                "processors": [
                    {"type": "xpath", "parameters": {"expression": "//span[@class='city']/text()"}}
                ],
            },
            {
                "name": "founded",
                "processors": [
                    {
                        "type": "xpath",
                        "parameters": {"expression": "//span[@class='founded']/text()"},
                    },
                    {"type": "number", "parameters": {}},
                ],
            },
            {
                "name": "email",
                "processors": [
                    {"type": "xpath", "parameters": {"expression": "//a[@class='email']/@href"}},
                    {"type": "replace", "parameters": {"pattern": "^mailto:", "replacement": ""}},
                ],
            },
        ],
    },
    "synth_api": {
        "name": "synth_api",
        "url_patterns": [
            {
                "type": "regex",
                "pattern": r"^https?://(?:site|registry)\d+\.example/api/[^/]+\.json$",
            }
        ],
        "fields": [
            {
                "name": "employees",
                "processors": [{"type": "jsonpath", "parameters": {"expression": "$.employees"}}],
            }
        ],
    },
}


@dataclass
class SynthWeb:
    root: Path  # the virtual web folder
    dataset: Path  # the dataset spec (YAML)
    mappings: Path  # the mappings folder
    hosts: list[str]
    records: int
    crawl_delays: dict[str, float]  # host -> Crawl-delay of its robots.txt (when it has one)
    disallowed: dict[str, list[str]]  # host -> disallowed path prefixes
    default_delay: float


def _robots(i: int, crawl_delay: float | None, variety: bool) -> tuple[str | None, float | None]:
    """robots.txt text (None: no file, 404) and its Crawl-delay."""
    if variety and i % 10 == 7:
        return None, None
    lines = [
        "# generated",
        "User-agent: badbot",
        "Disallow: /",
        "",
        "User-agent: *",
        "Disallow: /private/",
    ]
    if crawl_delay is not None:
        lines.append(f"Crawl-delay: {crawl_delay:g}")
    return "\n".join(lines) + "\n", crawl_delay


def build_synth_web(
    base: Path,
    *,
    hosts: int = 50,
    records_per_host: int = 2,
    crawl_delay: float | None = 0.2,
    default_delay: float = 0.3,
    variety: bool = True,
    registries: int = 0,
    registry_delay: float = 0.2,
    noise_links: int = 8,
    latency: float = 0.0,
    depth: int = 1,
    extra_crawl: dict[str, Any] | None = None,
) -> SynthWeb:
    """Write the web, dataset and mappings under `base`; returns what tests assert against.

    `variety`: every 10th host without robots.txt (default delay), every 5th with a different
    Crawl-delay (0.1 s more), so the delays in force differ between hosts.
    """
    root = base / "web"
    root.mkdir(parents=True, exist_ok=True)
    names = [f"site{i:03d}.example" for i in range(hosts)]
    registry_names = [f"registry{k}.example" for k in range(registries)]
    crawl_delays: dict[str, float] = {}
    disallowed: dict[str, list[str]] = {}
    rows = []
    for i, host in enumerate(names):
        host_dir = root / host
        (host_dir / "news").mkdir(parents=True, exist_ok=True)
        (host_dir / "private").mkdir(exist_ok=True)
        delay = crawl_delay
        if variety and delay is not None and i % 5 == 3:
            delay = round(delay + 0.1, 3)
        text, used = _robots(i, delay, variety)
        if text is not None:
            (host_dir / "robots.txt").write_text(text, encoding="utf-8")
            disallowed[host] = ["/private/"]
            if used is not None:
                crawl_delays[host] = used
        for k in range(noise_links):
            (host_dir / "news" / f"{k}.html").write_text(
                f"<html><body><h1>News {k} of {host}</h1></body></html>", encoding="utf-8"
            )
        (host_dir / "privacy.html").write_text("<html><body>privacy</body></html>", "utf-8")
        (host_dir / "private" / "secret.html").write_text("<html>secret</html>", "utf-8")
        (host_dir / "api").mkdir(exist_ok=True)
        for j in range(records_per_host):
            rid = f"R{i:03d}-{j}"
            org = host_dir / "org" / rid
            org.mkdir(parents=True, exist_ok=True)
            other = names[(i + 1 + j) % hosts]
            noise = "".join(f'<a href="/news/{k}.html">news {k}</a>' for k in range(noise_links))
            registry = ""
            if registry_names:
                reg = registry_names[(i + j) % len(registry_names)]
                registry = f'<a class="profile" href="http://{reg}/api/{rid}.json">registry</a>'
                reg_dir = root / reg / "api"
                reg_dir.mkdir(parents=True, exist_ok=True)
                (reg_dir / f"{rid}.json").write_text(
                    json.dumps({"id": rid, "employees": 10 + i + j}), "utf-8"
                )
            else:
                (host_dir / "api" / f"{rid}.json").write_text(
                    json.dumps({"id": rid, "employees": 10 + i + j}), "utf-8"
                )
                registry = f'<a class="profile" href="/api/{rid}.json">data</a>'
            (org / "index.html").write_text(
                f"""<!doctype html><html><head><title>{rid}</title>
<meta name="description" content="Organisation {rid} on {host}"></head><body>
<nav>{noise}<a href="/privacy.html">privacy</a><a href="/private/secret.html">intranet</a>
<a href="http://{other}/org/R{(i + 1 + j) % hosts:03d}-0/">partner</a>
<a href="http://{other}/news/0.html">partner news</a></nav>
<a class="profile" href="about.html">About</a> <a class="profile" href="contact.html">Contact</a>
{registry}
</body></html>""",
                encoding="utf-8",
            )
            (org / "about.html").write_text(
                f"""<html><body><span class="city">City{i}</span>
<span class="founded">{1900 + (i * 7 + j) % 120}</span>{noise}</body></html>""",
                encoding="utf-8",
            )
            (org / "contact.html").write_text(
                f"""<html><body><a class="email" href="mailto:info-{j}@{host}">mail</a>
{noise}</body></html>""",
                encoding="utf-8",
            )
            rows.append({"id": rid, "url": f"http://{host}/org/{rid}/", "name": f"Org {rid}"})
    for reg in registry_names:
        (root / reg).mkdir(parents=True, exist_ok=True)
        (root / reg / "robots.txt").write_text(
            f"User-agent: *\nDisallow: /private/\nCrawl-delay: {registry_delay:g}\n", "utf-8"
        )
        crawl_delays[reg] = registry_delay
        disallowed[reg] = ["/private/"]
    if latency:
        (root / "_web.json").write_text(json.dumps({"latency": latency}), encoding="utf-8")
    mappings = base / "mappings"
    mappings.mkdir(exist_ok=True)
    for name, mapping in MAPPINGS.items():
        (mappings / f"{name}.json").write_text(json.dumps(mapping, indent=2), encoding="utf-8")
    table = base / "synth.csv"
    with open(table, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=["id", "url", "name", *FIELDS])
        writer.writeheader()
        for row in rows:
            writer.writerow({**row, **dict.fromkeys(FIELDS, "")})
    crawl = {"depth": depth, "default_delay": default_delay, **(extra_crawl or {})}
    spec = {
        "name": "synth",
        "source": table.name,
        "id": "id",
        "urls": ["url"],
        "fields": FIELDS,
        "crawl": crawl,
    }
    dataset = base / "synth.yaml"
    dataset.write_text(json.dumps(spec, indent=2), encoding="utf-8")  # JSON is YAML
    return SynthWeb(
        root=root,
        dataset=dataset,
        mappings=mappings,
        hosts=names + registry_names,
        records=len(rows),
        crawl_delays=crawl_delays,
        disallowed=disallowed,
        default_delay=default_delay,
    )


def write_dataset(
    base: Path,
    rows: list[dict[str, str]],
    *,
    fields: dict[str, dict[str, Any]],
    mappings: dict[str, dict[str, Any]],
    crawl: dict[str, Any] | None = None,
    name: str = "edge",
) -> tuple[Path, Path]:
    """A dataset (`id`, `url` columns + empty `fields`) and a mappings folder; (spec, mappings)."""
    base.mkdir(parents=True, exist_ok=True)
    folder = base / f"{name}_mappings"
    folder.mkdir(exist_ok=True)
    for mapping_name, mapping in mappings.items():
        (folder / f"{mapping_name}.json").write_text(json.dumps(mapping, indent=2), "utf-8")
    table = base / f"{name}.csv"
    with open(table, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=["id", "url", *fields])
        writer.writeheader()
        for row in rows:
            writer.writerow({**dict.fromkeys(fields, ""), **row})
    spec = {
        "name": name,
        "source": table.name,
        "id": "id",
        "urls": ["url"],
        "fields": fields,
        "crawl": crawl or {},
    }
    path = base / f"{name}.yaml"
    path.write_text(json.dumps(spec, indent=2), encoding="utf-8")
    return path, folder


def read_outcomes(work: Path, run_id: str = "run") -> dict[str, dict[str, Any]]:
    """records.jsonl lines of every partition of a run, by record id."""
    out = {}
    for path in sorted((work / run_id).glob("*/records.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                row = json.loads(line)
                out[row["record"]] = row
    return out


def read_candidates(work: Path, run_id: str = "run") -> dict[str, dict[str, Any]]:
    """{record: {field: value}} from candidates.jsonl of every partition (first value wins)."""
    out: dict[str, dict[str, Any]] = {}
    for path in sorted((work / run_id).glob("*/candidates.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                row = json.loads(line)
                out.setdefault(row["record"], {}).setdefault(row["field"], row["value"])
    return out


@dataclass
class WorkerRun:
    shards: list[str]
    stats: dict[str, dict[str, Any]] = field(default_factory=dict)
    returncodes: dict[str, int] = field(default_factory=dict)
    logs: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    peak_rss_mb: dict[str, float] = field(default_factory=dict)


def seed_shards(dataset: Path, work: Path, shards: int) -> tuple[Any, Any, list[str]]:
    """Load, clean and shard the dataset as `seed_dataset` does; (spec, stage, shard keys)."""
    from enrich_crawl.dataset.load import prepare_dataset
    from enrich_crawl.dataset.shard import shard_keys
    from enrich_crawl.dataset.spec import load_spec
    from enrich_crawl.staging import DatasetStage

    spec = load_spec(dataset)
    stage = DatasetStage(work, spec.name)
    keys = shard_keys(shards)
    prepare_dataset(spec, stage, keys)
    return spec, stage, keys


def crawl_through_pipes(
    dataset: Path, mappings: Path, work: Path, *, proxy: str, log_level: str
) -> tuple[str, Path, list[str]]:
    """Crawl the dataset as one shard the way Dagster launches a crawl: an asset materialised on
    an ephemeral instance runs the worker through Pipes (CrawlProcessClient); (the shard's key,
    its crawl folder, the messages of the run's log). Raises when the materialisation fails."""
    import dagster as dg

    from enrich_crawl.crawl.params import WorkerParams
    from enrich_crawl.defs.pipes import CrawlProcessClient

    spec, stage, keys = seed_shards(dataset, work, 1)
    out_dir = work / "run" / keys[0]

    # no annotations: this module's are strings, which Dagster resolves in the module's globals
    @dg.asset(required_resource_keys={"crawl_process"})
    def crawled(context):
        params = WorkerParams(
            dataset=spec.name,
            partition=keys[0],
            seed_path=str(stage.seed_shard(keys[0])),
            out_dir=str(out_dir),
            mappings_dir=str(mappings),
            field_types=spec.field_types(),
            crawl=spec.crawl.to_dict(),
            proxy=proxy,  # as the crawler resource passes http_proxy
            log_level=log_level,
        )
        stats = context.resources.crawl_process.run_crawl(context=context, params=params)
        return dg.Output(stats)  # a Pipes session wants explicit outputs

    with dg.DagsterInstance.ephemeral() as instance:
        result = dg.materialize(
            [crawled], instance=instance, resources={"crawl_process": CrawlProcessClient()}
        )
        if not result.success:
            raise RuntimeError(f"the crawl through Pipes failed: {result.all_events[-5:]}")
        messages = [e.user_message for e in instance.all_logs(result.run_id)]
    return keys[0], out_dir, messages


def run_workers(
    dataset: Path,
    mappings: Path,
    work: Path,
    *,
    proxy: str,
    shards: int = 4,
    mongo_uri: str | None = None,
    mongo_db: str = "enrich_crawl",
    crawl_overrides: dict[str, Any] | None = None,
    run_id: str = "run",
    timeout: float = 600.0,
    prepared: tuple[Any, Any, list[str]] | None = None,
    user_agent: str = DEFAULT_UA,
    log_level: str = "WARNING",
    allow_private: bool = False,
    max_active_records: int = 2000,
    processes: int | None = None,
) -> WorkerRun:
    """Crawl every shard of the dataset at once, one `python -m enrich_crawl.crawl.worker
    --params FILE` process per shard (what Dagster launches through Pipes), or the shards dealt
    out into `processes` processes as the crawl steps deal them (`--params` repeated; a shard's
    return code and log are its process's)."""
    from enrich_crawl.crawl.params import WorkerParams
    from enrich_crawl.dataset.shard import crawl_groups

    spec, stage, keys = prepared or seed_shards(dataset, work, shards)
    crawl = {**spec.crawl.to_dict(), **(crawl_overrides or {})}
    run = WorkerRun(shards=list(keys))
    procs: dict[str, tuple[subprocess.Popen, Path]] = {}
    started = time.monotonic()
    env = {k: v for k, v in os.environ.items() if k.lower() not in ("http_proxy", "https_proxy")}
    env.pop("MONGODB_URI", None)
    params_files: dict[str, Path] = {}
    for key in keys:
        out_dir = work / run_id / key
        out_dir.mkdir(parents=True, exist_ok=True)
        params = WorkerParams(
            dataset=spec.name,
            partition=key,
            seed_path=str(stage.seed_shard(key)),
            out_dir=str(out_dir),
            mappings_dir=str(mappings),
            field_types=spec.field_types(),
            crawl=crawl,
            run_id=run_id,
            user_agent=user_agent,
            proxy=proxy or None,
            allow_private=allow_private,
            mongo_uri=mongo_uri,
            mongo_db=mongo_db,
            progress_interval=5.0,
            log_level=log_level,
            max_active_records=max_active_records,
        )
        params_files[key] = out_dir / "params.json"
        params_files[key].write_text(json.dumps(params.to_dict()), encoding="utf-8")
    for group in crawl_groups(list(keys), processes or len(keys)):
        argv = [sys.executable, "-m", "enrich_crawl.crawl.worker"]
        for key in group:
            argv += ["--params", str(params_files[key])]
        log_path = work / run_id / group[0] / "worker.log"
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.DEVNULL,
            stderr=open(log_path, "w", encoding="utf-8"),  # noqa: SIM115
            env=env,
        )
        for key in group:
            procs[key] = (proc, log_path)
    deadline = time.monotonic() + timeout
    for key, (proc, log_path) in procs.items():
        try:
            proc.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        run.returncodes[key] = proc.returncode
        run.logs[key] = log_path.read_text(encoding="utf-8", errors="replace")
        stats_file = work / run_id / key / "stats.json"
        if stats_file.exists():
            run.stats[key] = json.loads(stats_file.read_text(encoding="utf-8"))
            run.peak_rss_mb[key] = run.stats[key].get("peak_rss_mb", 0.0)
    run.seconds = time.monotonic() - started
    return run


def politeness_violations(
    log: list[dict[str, Any]], web: SynthWeb, *, tolerance: float = 0.0
) -> dict[str, list[str]]:
    """What a request log shows against robots.txt and the delays, by kind of violation."""
    from enrich_crawl.virtualweb import requests_by_host

    problems: dict[str, list[str]] = {"disallowed": [], "robots_not_first": [], "too_close": []}
    for host, entries in requests_by_host(log).items():
        if host not in web.hosts:
            continue
        for prefix in web.disallowed.get(host, []):
            for e in entries:
                if e["path"].startswith(prefix):
                    problems["disallowed"].append(f"{host}{e['path']}")
        first_robots = next((n for n, e in enumerate(entries) if e["path"] == "/robots.txt"), None)
        if first_robots != 0:
            first = entries[0]["path"] if entries else None
            problems["robots_not_first"].append(f"{host}: first request {first}")
        delay = web.crawl_delays.get(host, web.default_delay)
        for a, b in itertools.pairwise(entries):
            gap = b["t"] - a["t"]
            if gap < delay - tolerance:
                problems["too_close"].append(
                    f"{host}: {a['path']} then {b['path']} {gap:.3f}s apart (delay {delay}s)"
                )
    return problems
