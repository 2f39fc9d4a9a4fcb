"""Smoke tests of the end-to-end benchmark code (bench/e2e) at tiny scale, so it keeps working.

Not a benchmark: no timing is asserted. The generator is checked for determinism and for the
consistency of its web, mappings and ground truth (every findable field is extracted by the mappings
along its route); the baselines and the floor run on a tiny web through the virtual web; the
politeness and accuracy scoring run on hand-made inputs.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.e2e import generate as gen_mod
from bench.e2e.common import Extractor, load_records, read_results
from bench.e2e.measure import HostRules, accuracy, request_stats, run_measured
from enrich_crawl.extract import MappingSet, Page
from enrich_crawl.virtualweb import read_log, running_web
from enrich_crawl_tests.conftest import product_env, run_cli

REPO = Path(__file__).resolve().parents[1]
TINY = gen_mod.GenConfig(seed=7, hosts=14, records=40, plugins=())


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> gen_mod.Generated:
    out = tmp_path_factory.mktemp("bench") / "tiny"
    gen = gen_mod.generate(TINY, out, log=lambda _msg: None)
    # no latency: the baselines' crawls take seconds, not minutes
    config = json.loads((gen.web / "_web.json").read_text())
    config["latency"] = 0
    for host in config["hosts"].values():
        host.pop("latency", None)
        host.pop("slow", None)
        host.pop("hang", None)
    (gen.web / "_web.json").write_text(json.dumps(config))
    return gen


def test_generator_is_deterministic(tiny, tmp_path):
    again = gen_mod.generate(TINY, tmp_path / "again", log=lambda _msg: None)
    assert (again.dataset_dir / "records.csv").read_bytes() == (
        tiny.dataset_dir / "records.csv"
    ).read_bytes()
    assert again.truth_path.read_bytes() == tiny.truth_path.read_bytes()
    assert again.manifest["files"] == tiny.manifest["files"]


def test_generated_dataset_shape(tiny):
    manifest = tiny.manifest
    assert manifest["records"] == 40
    assert manifest["hosts"] == 14
    assert set(manifest["hosts_by_kind"]) == {"site", "shared", "directory"}
    assert set(manifest["findable_by_depth"]) == {"0", "1", "2"}
    assert manifest["unfindable_reasons"]  # faults and robots rules hide some fields
    records, types = load_records(tiny.spec)
    assert len(records) == 40 and set(types) == set(gen_mod.FIELDS)
    truth = tiny.truth()
    for record in records:
        assert sorted(record.missing) == sorted(truth[record.id]["missing"])
    assert MappingSet.load(tiny.mappings, strict=True)
    spec = tiny.spec.read_text()
    assert "virtual_web" not in spec.split("# No virtual_web")[1].split("\n", 1)[1]
    pages = list((tiny.web).glob("*/index.html"))
    assert pages and all(15_000 < p.stat().st_size < 80_000 for p in pages)
    links = Page("http://x.example/", pages[0].read_bytes(), content_type="text/html").tree.xpath(
        "//a/@href"
    )
    assert len(links) >= 50


def _page_from_disk(gen: gen_mod.Generated, url: str) -> Page | None:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    path = parts.path if not parts.path.endswith("/") else parts.path + "index.html"
    file = gen.web / parts.hostname / path.lstrip("/")
    if not file.is_file():
        return None
    return Page(url, file.read_bytes(), content_type="text/html")


def test_the_benchmark_mappings_are_ordinary_mapping_files(tiny):
    """bench/e2e/mappings/ holds the org-site and directory mappings as files that `enrich-crawl
    mapping check` validates; every generated dataset carries them as they are (less `$schema`)."""
    proc = run_cli(["mapping", "check", "--json", str(gen_mod.MAPPINGS_DIR)], product_env(), REPO)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["errors"] == []
    assert {m["name"] for m in report["valid"]} == {"bench_orgsite", "bench_directory"}
    for path in gen_mod.MAPPINGS_DIR.glob("*.json"):
        source = json.loads(path.read_text(encoding="utf-8"))
        assert (
            path.parent / source.pop("$schema")
        ).resolve() == REPO / "mappings" / "mapping.schema.json"
        assert json.loads((tiny.mappings / path.name).read_text(encoding="utf-8")) == source


def test_truth_matches_what_the_mappings_extract(tiny):
    """Walk each record's mapping links from its seeds on the files themselves (no robots, no
    network): every findable field must be extracted with its true value within depth 2."""
    records, types = load_records(tiny.spec)
    extractor = Extractor(tiny.mappings, types)
    truth = tiny.truth()
    from enrich_crawl.extract import run_mapping
    from enrich_crawl.urls import fragment_of, without_fragment

    checked = 0
    for record in records:
        found: dict[str, object] = {}
        frontier = [(url, 0) for url in record.urls]
        seen = set()
        while frontier:
            url, depth = frontier.pop(0)
            key = without_fragment(url)
            if (key, fragment_of(url)) in seen:
                continue
            seen.add((key, fragment_of(url)))
            page = _page_from_disk(tiny, key)
            if page is None:
                continue
            for name, value in extractor.extract(
                page, fragment=fragment_of(url), record_id=record.id, wanted=record.missing
            ).items():
                found.setdefault(name, value)
            if depth < 2:
                for mapping in extractor.mappings.matching(key):
                    result = run_mapping(
                        mapping, page, fragment=fragment_of(url), record_id=record.id
                    )
                    frontier += [(link, depth + 1) for link in result.links]
        row = truth[record.id]
        for field, findable in row["findable"].items():
            if findable:
                assert found.get(field) == row["truth"][field], (record.id, field)
                checked += 1
    assert checked > 40


def test_paced_floor_delays_are_what_the_robots_txt_publishes(tiny, tmp_path):
    """The paced floors' delays file gives each host the delay the politeness audit holds the
    product to: the Crawl-delay its robots.txt publishes, else the spec's default, also where the
    model drew a delay for a host that serves no robots.txt or one that cannot be read."""
    from bench.e2e.agents import FLOOR_UA

    delays = json.loads(tiny.write_delays(tmp_path / "delays.json", 1.5).read_text())
    hosts = tiny.hosts()
    rules = HostRules(tiny.web, hosts)
    unpublished = [
        h for h, info in hosts.items()
        if info.get("robots", "ok") != "ok" and info.get("crawl_delay") not in (None, 1.5)
    ]  # fmt: skip
    assert unpublished, "the tiny web has no host whose drawn delay it does not publish"
    for host in hosts:
        assert delays["hosts"][host] == rules.rules(host).delay(FLOOR_UA, 1.5), host
    assert delays["default"] == 1.5


def test_web_without_delays_and_subsets(tiny):
    nodelay = gen_mod.web_without_delays(tiny)
    robots = [p for p in nodelay.glob("*/robots.txt")]
    assert robots and all("Crawl-delay: 0" in p.read_text() for p in robots)
    assert (nodelay / "_web.json").exists()
    some = sorted(tiny.truth())[:5]
    spec = gen_mod.subset(tiny, "five", some, crawl={"default_delay": 0.0})
    records, _ = load_records(spec)
    assert [r.id for r in records] == [r for r in sorted(some)] or len(records) == 5
    assert "default_delay: 0.0" in spec.read_text()


def test_baselines_and_floor_run_politely(tiny, tmp_path):
    """Both baselines and the floor on 4 records of the tiny web, through the virtual web."""
    nodelay = gen_mod.web_without_delays(tiny)
    truth = tiny.truth()
    sample = [r for r in sorted(truth) if truth[r]["family"] in ("site", "directory")][:4]
    spec = gen_mod.subset(tiny, "smoke", sample, crawl={"default_delay": 0.0})
    mappings = spec.parent / "mappings"
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "PYTHONWARNINGS": "ignore"}
    with running_web(nodelay, log_path=tmp_path / "requests.jsonl") as web:
        outs = {}
        for module in ("baseline_seed", "baseline_bfs"):
            out = tmp_path / f"{module}.jsonl"
            cmd = [sys.executable, "-m", f"bench.e2e.{module}", "--spec", str(spec)]
            cmd += ["--mappings", str(mappings), "--shard", "0", "--shards", "1", "--out", str(out)]
            cmd += ["--proxy", web.proxy_url, "--default-delay", "0", "--budget", "40"]
            metrics = run_measured(module, cmd, env=env, log_dir=tmp_path, timeout=90)
            assert metrics.returncode == 0, Path(metrics.stderr_path).read_text()[-2000:]
            assert metrics.cpu_s > 0 and metrics.peak_rss_max_mb > 10
            outs[module] = read_results([out])
        urls = tmp_path / "urls.txt"
        urls.write_text("".join(f"http://{h}/robots.txt\n" for h in tiny.hosts())[:2000])
        floor = run_measured(
            "floor",
            [
                sys.executable,
                "-m",
                "bench.e2e.floor",
                "--urls",
                str(urls),
                "--proxy",
                web.proxy_url,
            ],
            env=env,
            log_dir=tmp_path,
            timeout=60,
        )
        assert floor.returncode == 0
        assert json.loads(Path(floor.stdout_path).read_text().splitlines()[-1])["pages"] > 0
        entries = read_log(web.log_path)
    rules = HostRules(nodelay, tiny.hosts())
    types = {f: t for f, t in gen_mod.FIELDS.items()}
    for module, results in outs.items():
        assert set(results) == set(sample), module
        mine = [e for e in entries if e["ua"].startswith(f"enrich_crawl-bench-{module[9:]}")]
        stats = request_stats(mine, rules, default_delay=0.0)
        assert stats["pages"] > 0
        assert stats["violations_by_kind"]["disallowed"] == 0, stats["violation_examples"]
        assert stats["violations_by_kind"]["before_robots"] == 0, stats["violation_examples"]
        assert stats["violations_by_kind"]["overlapping"] == 0, (
            module,
            stats["violation_examples"],
        )
        got = {r: v["fields"] for r, v in results.items()}
        score = accuracy(truth, got, types, attempted=set(results))
        assert score["accuracy"] == 1.0 and score["precision"] == 1.0, (module, score)


def test_request_stats_finds_violations(tmp_path):
    web = tmp_path / "web"
    (web / "a.example").mkdir(parents=True)
    (web / "a.example" / "robots.txt").write_text(
        "User-agent: *\nCrawl-delay: 2\nDisallow: /private/\n"
    )
    hosts = {"a.example": {"robots": "ok"}, "b.example": {"robots": "error"}}

    def req(t, host, path, dur=0.1):
        return {"t": t, "host": host, "path": path, "ua": "bot/1", "status": 200, "dur": dur}

    entries = [
        req(0.0, "a.example", "/robots.txt"),
        req(2.5, "a.example", "/"),
        req(3.0, "a.example", "/about.html"),  # 0.4 s after the previous answer: too close
        req(6.0, "a.example", "/private/x.html", dur=3.0),  # disallowed
        req(7.0, "a.example", "/y.html"),  # arrives while the previous is answered: overlaps
        req(11.5, "a.example", "/z.html", dur=1.5),  # answered at 13.0
        # 2.1 s after the previous arrival but 0.6 s after its answer: too close
        req(13.6, "a.example", "/w.html"),
        req(10.0, "b.example", "/"),  # before robots.txt; 5xx robots: disallowed
    ]
    stats = request_stats(entries, HostRules(web, hosts), default_delay=1.0)
    kinds = stats["violations_by_kind"]
    assert stats["pages"] == 7 and stats["robots_requests"] == 1
    assert kinds == {
        "disallowed": 2,
        "before_robots": 1,
        "too_close": 2,
        "too_close_after_robots": 0,
        "overlapping": 1,
    }


def test_accuracy_scores_records():
    truth = {
        "A": {
            "missing": ["city", "founded", "ceo"],
            "truth": {"city": "Lyon", "founded": 1999, "ceo": "X"},
            "findable": {"city": True, "founded": True, "ceo": False},
        },
        "B": {
            "missing": ["city"],
            "truth": {"city": "Porto"},
            "findable": {"city": True},
        },
    }
    values = {"A": {"city": " Lyon ", "founded": 1999.0}, "B": {"city": "Braga"}}
    score = accuracy(truth, values, {"city": "string", "founded": "integer", "ceo": "string"})
    assert score["resolvable_records"] == 2 and score["resolved_records"] == 1
    assert score["fields"]["correct"] == 2 and score["fields"]["wrong"] == 1
    assert score["accuracy"] == pytest.approx(2 / 3, abs=1e-3)


def test_bench_cli_parses():
    result = subprocess.run(
        [sys.executable, "-m", "bench", "e2e", "--help"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert result.returncode == 0 and "--quick" in result.stdout


def test_checks_hold_the_product_to_the_paced_floor_and_show_the_answer_paced_one():
    """The verdicts of one run: issue #21's checks against the paced floor (delays from the
    send), the floor as polite as the product (delays from the answer) beside them as
    information, and each audited paced floor's own politeness violations."""
    from bench.e2e.suite import SystemResult, checks

    def system(name, cpu_s, violations, roles=None):
        log = {"pages": 1000, "violations": violations}
        metrics = {"cpu_s": cpu_s, "wall_s": 100.0, "cpu_by_role_s": roles or {}}
        return SystemResult(name, metrics, log, {"accuracy": 1.0, "resolved_records": 300})

    verdicts = checks(
        [
            system("product", 9.0, 0, {"crawl_worker": 8.0, "dagster": 1.0}),
            system("cpu_floor", 4.0, None),
            system("cpu_floor_paced", 5.0, 412),
            system("cpu_floor_answer_paced", 6.0, 0),
        ],
        {},
    )
    assert verdicts["cpu_per_page_vs_paced_floor"] == {"value": 1.8, "target": "<= 1.5", "ok": False}
    assert verdicts["crawl_worker_cpu_per_page_vs_paced_floor"]["value"] == 1.6
    assert verdicts["cpu_per_page_vs_answer_paced_floor"]["value"] == 1.5
    assert verdicts["crawl_worker_cpu_per_page_vs_answer_paced_floor"]["value"] == 1.333
    assert verdicts["cpu_per_page_vs_answer_paced_floor"]["ok"] is None  # information only
    assert verdicts["floor_paced_politeness_violations"]["value"] == 412
    assert verdicts["floor_answer_paced_politeness_violations"]["value"] == 0
    # a floor left unaudited (unpaced, or a sample of the requests) gets no politeness figure
    unaudited = checks([system("product", 9.0, 0), system("cpu_floor_paced", 5.0, None)], {})
    assert "cpu_per_page_vs_paced_floor" in unaudited
    assert "floor_paced_politeness_violations" not in unaudited


def test_cpu_attribution_splits_a_real_crawl_and_the_floor_into_components(tiny):
    """bench.e2e.attribution on the tiny web: a real crawl worker and the floor, plain and under
    cProfile; the product's components add up to its CPU per page, and only the product spends
    on extraction and on its crawl state. `--family` takes one family's records (here the
    tiny dataset's largest); an unknown family is refused, by name."""
    from collections import Counter

    from bench.e2e import attribution

    with pytest.raises(SystemExit, match=r"no record of family 'nosuch'.*truth\.jsonl"):
        attribution.run(attribution.parse_args(["--family", "nosuch"]), gen=tiny)
    family = Counter(row["family"] for row in tiny.truth().values()).most_common(1)[0][0]
    args = attribution.parse_args(["--records", "12", "--rounds", "2", "--family", family])
    results = attribution.run(args, gen=tiny)
    assert results["family"] == family
    crawled = tiny.root / "subsets" / f"attribution12-{family}" / "truth.jsonl"
    families = {row["family"] for row in gen_mod.read_truth(crawled).values()}
    assert families == {family}
    assert f"of the family {family}" in attribution.markdown(results)
    runs = results["runs"]
    assert runs["product_plain"]["pages"] > 0
    assert runs["floor_plain"]["requests"] == runs["product_plain"]["requests"] > 0
    rows = results["components_ms_per_page"]
    assert rows["extraction (mappings)"]["product"] > 0
    # the floor extracts nothing: at most the class bodies of a selector library Scrapy imports
    assert rows["extraction (mappings)"]["floor"] < 0.1 * rows["extraction (mappings)"]["product"]
    assert rows["crawl state (MongoDB client, compression)"]["product"] > 0
    assert rows["Scrapy"]["floor"] > 0
    product_total = sum(r["product"] for r in rows.values())
    assert product_total == pytest.approx(results["product_ms_per_page"], rel=0.02)
    assert len(results["ratio_by_round"]) == 2
    assert results["ratio"] == pytest.approx(sum(results["ratio_by_round"]) / 2, abs=0.001)
    table = attribution.markdown(results)
    assert "| extraction (mappings) |" in table and "**total**" in table
    # every plain run counted the worker's MongoDB commands (pymongo command monitoring)
    for counts in results["mongodb_commands_by_round"]:
        assert counts.get("update _crawl_hosts", 0) > 0 and counts.get("find _crawl_robots", 0) > 0
    assert 0 < results["mongodb_commands_per_page"] < 5
    checks = results["checks"]
    assert (
        checks["crawl_worker_mongodb_commands_per_page"]["value"]
        == (results["mongodb_commands_per_page"])
    )
    assert checks["politeness_violations"] == {"value": 0, "target": "== 0", "ok": True}


@pytest.mark.parametrize("from_answer", [False, True], ids=["from-send", "from-answer"])
def test_paced_floor_keeps_one_request_per_host_and_the_delay_between_sends(tmp_path, from_answer):
    """`bench.e2e.floor --delays`: the polite bare crawler of the attribution. Its requests, as
    the virtual web logged them, never overlap on a host and leave each host's delay between
    sends (the host with no entry gets the default), and they reuse their connections to the
    proxy as the product does: Scrapy alone keeps one idle connection per pool key, every
    plain-http request through a proxy shares the proxy's key, and with answers slower than the
    delays (several hosts in flight at once) most requests would open a connection of their own.
    With `--from-answer` the delay lies between each answer and the next send, as the product's
    politeness counts it (the answers here take 0.25 s, longer than every delay: counted from the
    send, no gap would be left after an answer)."""
    root = tmp_path / "web"
    root.mkdir()
    (root / "_web.json").write_text(json.dumps({"latency": 0.25}))
    hosts = [f"paced-{n}.example" for n in range(4)]
    pages = {h: [f"p{n}.html" for n in range(6)] for h in hosts}
    for host in hosts:
        (root / host).mkdir()
        (root / host / "robots.txt").write_text("User-agent: *\nAllow: /\n")
        for name in pages[host]:
            (root / host / name).write_text(f"<html><body><h1>{host} {name}</h1></body></html>")
    urls = [f"http://{h}/{name}" for h in hosts for name in pages[h]]
    delays = {"default": 0.1, "hosts": {hosts[0]: 0.4, hosts[1]: 0.05}}
    (tmp_path / "delays.json").write_text(json.dumps(delays))
    (tmp_path / "urls.txt").write_text("\n".join(urls) + "\n")
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "PYTHONWARNINGS": "ignore"}
    with running_web(root, log_path=tmp_path / "requests.jsonl") as web:
        done = subprocess.run(
            [sys.executable, "-m", "bench.e2e.floor", "--urls", str(tmp_path / "urls.txt"),
             "--proxy", web.proxy_url, "--delays", str(tmp_path / "delays.json"),
             *(["--from-answer"] if from_answer else [])],
            env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        assert json.loads(done.stdout.splitlines()[-1])["pages"] == len(urls)
        entries = [
            e for e in read_log(web.log_path) if e["ua"].startswith("enrich_crawl-bench-floor")
        ]
    for host in hosts:
        mine = sorted((e for e in entries if e["host"] == host), key=lambda e: e["t"])
        assert len(mine) == len(pages[host])
        delay = delays["hosts"].get(host, delays["default"])
        for a, b in itertools.pairwise(mine):
            assert b["t"] >= a["t"] + a["dur"] - 0.05, (host, "overlapping")
            assert b["t"] - a["t"] >= delay - 0.05, (host, b["t"] - a["t"], delay)
            if from_answer:
                gap = b["t"] - (a["t"] + a["dur"])
                assert gap >= delay - 0.05, (host, "after the answer", gap, delay)
    # one request in flight per host: never more connections than hosts
    assert len({e["conn"] for e in entries}) <= len(hosts), sorted(
        (e["t"], e["host"], e["conn"]) for e in entries
    )


def test_floor_requests_split_whole_hosts_for_the_paced_floor():
    """The paced floor's processes each get whole hosts (a host's delay holds only within one
    process), spread by load; the plain floor deals the requests out one by one. Every request
    is kept, once, in its order within its host."""
    from bench.e2e.suite import split_requests

    sizes = {"big.example": 9, "mid.example": 5, "a.example": 3, "b.example": 2, "c.example": 2}
    entries = [
        {"host": host, "path": f"/{n}", "tls": host == "mid.example"}
        for n in range(9)
        for host, size in sizes.items()
        if n < size
    ]
    paced = split_requests(entries, 3, by_host=True)
    plain = split_requests(entries, 3)
    everything = sorted(url for urls in paced for url in urls)
    assert everything == sorted(url for urls in plain for url in urls)
    assert len(everything) == len(entries) == sum(sizes.values())
    assert "https://mid.example/0" in everything
    owners = {
        host: {i for i, urls in enumerate(paced) for u in urls if f"//{host}/" in u}
        for host in sizes
    }
    assert all(len(o) == 1 for o in owners.values()), owners
    # the busiest host alone; the others around it: 9 | 5+2 | 3+2
    assert sorted(len(urls) for urls in paced) == [5, 7, 9]
    for urls in paced:
        for host in sizes:
            mine = [u for u in urls if f"//{host}/" in u]
            assert mine == sorted(mine, key=lambda u: int(u.rsplit("/", 1)[1]))
    assert [len(urls) for urls in plain] == [7, 7, 7]
    assert len({u.split("/")[2] for u in plain[0]}) > 1  # hosts spread over processes


def test_cpu_attribution_splits_the_floor_as_the_end_to_end_benchmark_does(tiny):
    """`--floor-processes N`: each plain floor run is N processes at once, the crawl's requests
    dealt out as the end-to-end benchmark deals them (suite.split_requests); together they
    refetch exactly the requests of the crawl, and the CPU counted is theirs together."""
    from bench.e2e import attribution

    options = ["--records", "12", "--rounds", "1", "--workers", "2", "--floor-processes", "2"]
    args = attribution.parse_args([*options, "--phases", "1"])
    results = attribution.run(args, gen=tiny)
    work = Path(results["work_dir"])
    crawled = (work / "urls-0.txt").read_text("utf-8").split()
    parts = sorted(work.glob("urls-0-floor-*.txt"))
    assert len(parts) == 2
    refetched = [url for part in parts for url in part.read_text("utf-8").split()]
    assert all(part.read_text("utf-8").split() for part in parts)  # both processes had work
    assert sorted(refetched) == sorted(crawled) and crawled
    # each floor process ran on its own part: its summary line counts that part's URLs
    for i, part in enumerate(parts):
        summary = json.loads((work / f"floor-plain0-{i}.log").read_text("utf-8").splitlines()[-1])
        assert summary["urls"] == len(part.read_text("utf-8").split()), (i, summary)
    assert results["runs"]["floor_plain"]["cpu_s"] > 0
    assert results["runs"]["floor_plain"]["requests"] == len(crawled)
    assert results["floor_processes"] == 2
    assert "2 processes each floor" in attribution.markdown(results)
    # --phases: both runs read while they ran, window by window; every request of each run falls
    # in one of its windows, and its windows hold the CPU /proc showed of its processes
    round_ = results["rounds_detail"][0]
    product_phases, floor_phases = round_["phases"], round_["floor_phases"]["floor"]
    assert sum(row["requests"] for row in product_phases) == round_["requests"]
    assert sum(row["requests"] for row in floor_phases) == len(crawled)
    for rows, cpu in ((product_phases, round_["cpu_s"]), (floor_phases, round_["floor_cpu_s"])):
        assert 0 < sum(row["cpu_s"] for row in rows) <= cpu + 0.05, (rows, cpu)
    # the windows count from the run's start (1 s each): none beyond the product's wall time
    assert max(row["from_s"] for row in product_phases) <= round_["wall_s"] + 1
    assert "product ms/request | floor ms/request" in attribution.markdown(results)


def test_phases_put_cpu_and_requests_in_their_windows():
    """`attribution.phases`: the CPU between two readings goes to the window of the later one,
    each request to the window of its time; a window without requests has no CPU per request."""
    from bench.e2e import attribution

    samples = [
        {"t": 100.0, "cpu_s": 0.0, "machine_busy": 0.0},
        {"t": 105.0, "cpu_s": 1.0, "machine_busy": 1.0},
        {"t": 110.0, "cpu_s": 1.5, "machine_busy": 0.5},  # second window (10 s windows)
        {"t": 125.0, "cpu_s": 1.6, "machine_busy": 0.1},  # third window, no requests
    ]
    rows = attribution.phases(samples, [100.5, 101.0, 109.9, 110.2, 119.0], window=10)
    assert [(r["from_s"], r["cpu_s"], r["requests"]) for r in rows] == [
        (0, 1.0, 3),
        (10, 0.5, 2),
        (20, 0.1, 0),
    ]
    assert rows[0]["ms_per_request"] == round(1000 / 3, 3) and rows[2]["ms_per_request"] is None
    assert rows[0]["machine_busy"] == 1.0 and rows[1]["machine_busy"] == 0.5
    table = attribution.phase_table({"phases": rows, "floor_phases": {"paced floor": rows[:1]}})
    assert table[-1].startswith("| all | **")
    assert "| 20 | - (0, 10%) |  |" in table, table


def test_loop_turns_counts_the_turns_and_what_starts_them(tmp_path):
    """bench/e2e/loopturns: a process started with it on PYTHONPATH writes its event loop's turns
    at exit, each turn under the callback that started it: a chain of three timers, each set by
    the one before (so each runs in a turn of its own, however loaded the machine), starts three
    turns; a task's step is named by the innermost coroutine it waits in."""
    program = (
        "import asyncio\n"
        "def tick(left):\n"
        "    if left: asyncio.get_running_loop().call_later(0.01, tick, left - 1)\n"
        "async def main():\n"
        "    asyncio.get_running_loop().call_later(0.01, tick, 2)\n"
        "    await asyncio.sleep(1.0)\n"
        "asyncio.run(main())\n"
    )
    env = {
        **os.environ,
        "LOOPTURNS_OUT": str(tmp_path / "turns"),
        "PYTHONPATH": os.pathsep.join([str(REPO / "bench" / "e2e" / "loopturns"), str(REPO)]),
    }
    subprocess.run([sys.executable, "-c", program], env=env, check=True, timeout=60)
    (written,) = tmp_path.glob("turns.*.json")
    turns = json.loads(written.read_text("utf-8"))
    started = {(kind, label): n for kind, label, n in turns["first"]}
    assert started[("timer/ready", "__main__:tick")] == 3
    # the task's first step, then its wake-up inside asyncio.sleep (the coroutine it waits in)
    assert dict(turns["all"])["task:main"] == 1 and dict(turns["all"])["task:sleep"] == 1
    assert turns["iterations"] == sum(turns["kinds"].values()) >= 5


def test_split_ab_runs_two_arms_of_workers_in_one_fleet(tiny):
    """bench.e2e.split_ab: the workers of one fleet in two arms by environment; each arm's CPU
    and pages are its own workers' (here: the allocator, which stats.json names)."""
    from bench.e2e import split_ab

    fleet = split_ab.run_fleet(
        tiny,
        12,
        2,
        {1},
        {"ENRICH_CRAWL_ALLOCATOR": "system"},
        {"ENRICH_CRAWL_ALLOCATOR": "auto"},
        lambda _msg: None,
    )
    shards = fleet["shards"]
    assert {s: r["arm"] for s, r in shards.items()} == {"s00": "A", "s01": "B"}
    assert shards["s00"]["allocator"] == "system" and shards["s01"]["allocator"] == "jemalloc"
    for arm in ("A", "B"):
        totals = fleet["arms"][arm]
        assert totals["workers"] == 1 and totals["pages"] > 0 and totals["cpu_s"] > 0
        mine = [r for r in shards.values() if r["arm"] == arm]
        assert totals["ms_per_page"] == round(1000 * mine[0]["cpu_s"] / mine[0]["pages"], 4)


def test_layouts_crawl_the_same_shards_together_apart_and_one_after_the_other(tiny):
    """bench.e2e.layouts: `fleet` shares one database, `separate` and `alone` give each worker
    its own, and `alone` runs them one after the other; each run's CPU per page is its workers'
    CPU over their pages."""
    from bench.e2e import layouts, split_ab

    assert layouts.parse_series("fleet:8, alone:2,separate,fleet:8/2") == [
        ("fleet", 8, 8), ("alone", 2, 2), ("separate", 8, 8), ("fleet", 8, 2)
    ]  # fmt: skip
    for bad in ("crowd:8", "fleet:0", "fleet:x", " , ", "fleet:8/0", "fleet:8/x"):
        with pytest.raises(SystemExit):
            layouts.parse_series(bad)
    runs = []
    for layout in ("fleet", "alone", "separate"):
        fleet = split_ab.run_fleet(tiny, 12, 2, set(), {}, {}, lambda _m: None, layout=layout)
        databases = {r["database"] for r in fleet["shards"].values()}
        assert len(databases) == (1 if layout == "fleet" else 2), (layout, databases)
        if layout == "alone":  # one after the other: the crawls' own seconds fit in the wall time
            assert sum(r["seconds"] for r in fleet["shards"].values()) <= fleet["wall_s"] + 0.5
        run = layouts.summarize(layout, 2, fleet)
        rows = list(fleet["shards"].values())
        assert run["pages"] == sum(r["pages"] for r in rows) > 0
        assert run["ms_per_page"] == round(1000 * run["cpu_s"] / run["pages"], 4)
        runs.append(run)
    checks = layouts.checks(runs)
    assert set(checks) == {"cpu_per_page_alone_2_vs_fleet_2", "cpu_per_page_separate_2_vs_fleet_2"}
    alone = checks["cpu_per_page_alone_2_vs_fleet_2"]
    assert alone["value"] == round(runs[1]["ms_per_page"] / runs[0]["ms_per_page"], 3)
    assert alone["ok"] is None  # information
    assert "| 2 | alone | 2 | 2 |" in layouts.markdown(
        {"name": "t", "records": 12, "runs": runs, "checks": checks}
    )
    # the two shards in one crawl process: one row, both shards' pages
    fleet = split_ab.run_fleet(tiny, 12, 2, set(), {}, {}, lambda _m: None, processes=1)
    (row,) = fleet["shards"].values()
    assert row["shards"] == ["s00", "s01"] and fleet["processes"] == 1
    assert row["pages"] > 0 and fleet["arms"]["A"]["workers"] == 1
    runs.append(layouts.summarize("fleet", 2, fleet, 1))
    assert "cpu_per_page_fleet_2_in_1_vs_fleet_2" in layouts.checks(runs)
