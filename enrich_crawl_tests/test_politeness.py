"""Politeness across the whole fleet: several crawl worker processes (one per partition) crawl one
virtual web of 50+ hosts at the same time, sharing one MongoDB, and the server's request log must
show that robots.txt came first on every host, that no disallowed path was ever requested, and that
no two requests to one host came closer than its Crawl-delay (or the default delay), whichever
worker sent them."""

from __future__ import annotations

import asyncio
import itertools
import os
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from enrich_crawl.crawl.host_limiter import HostBusy, HostLimiter
from enrich_crawl.crawl.state import CrawlState
from enrich_crawl.testing.synthweb import build_synth_web, politeness_violations, run_workers
from enrich_crawl.virtualweb import requests_by_host, running_web


@pytest.fixture(scope="module")
def fleet_crawl(tmp_path_factory, mongo_server):
    base = tmp_path_factory.mktemp("fleet")
    # 50 sites (2 records each) + 3 registry hosts that every partition needs at the same time
    web = build_synth_web(
        base, hosts=50, records_per_host=2, registries=3, crawl_delay=0.2, default_delay=0.3
    )
    with running_web(web.root, log_path=base / "requests.jsonl") as server:
        run = run_workers(
            web.dataset,
            web.mappings,
            base / "work",
            proxy=server.proxy_url,
            shards=4,
            mongo_uri=mongo_server.uri,
            mongo_db=f"fleet_{int(time.time())}",
        )
        log = server.read_log()
    return web, run, log


def test_every_worker_finished_and_resolved_everything(fleet_crawl):
    web, run, _log = fleet_crawl
    assert set(run.returncodes.values()) == {0}, run.logs
    assert len(run.stats) == 4
    outcomes: dict[str, int] = {}
    for stats in run.stats.values():
        assert stats["finish_reason"] == "finished"
        for outcome, count in stats["outcomes"].items():
            outcomes[outcome] = outcomes.get(outcome, 0) + count
    assert outcomes == {"resolved": web.records}
    # the registries were crawled by several partitions: the shared limiter was in use
    assert all(s["delays"]["limiter"]["shared"] for s in run.stats.values())


def test_no_request_to_a_disallowed_path(fleet_crawl):
    web, _run, log = fleet_crawl
    assert politeness_violations(log, web)["disallowed"] == []
    # the pages exist and are linked from every home page: only robots.txt kept the crawler out
    assert any((web.root / h / "private" / "secret.html").exists() for h in web.hosts)


def test_robots_txt_before_any_other_path_of_every_host(fleet_crawl):
    web, _run, log = fleet_crawl
    by_host = requests_by_host(log)
    crawled = [h for h in web.hosts if h in by_host]
    assert len(crawled) >= 50
    assert politeness_violations(log, web)["robots_not_first"] == []


def test_no_two_requests_to_a_host_closer_than_its_delay_across_workers(fleet_crawl):
    web, run, log = fleet_crawl
    problems = politeness_violations(log, web)["too_close"]
    assert problems == [], "\n".join(problems[:20])
    by_host = requests_by_host(log)
    # the check has teeth: hosts were hit many times, by several workers for the registries
    registries = [h for h in by_host if h.startswith("registry")]
    assert len(registries) == 3
    assert all(len(by_host[h]) >= 20 for h in registries)
    # robots.txt + 2 records x (home, about, contact) on each site
    assert sum(len(v) for h, v in by_host.items() if h.startswith("site")) == 50 * 7
    # the delays in force differ by host (Crawl-delay 0.2, 0.3; default 0.3 without robots.txt)
    delays = {}
    for stats in run.stats.values():
        delays.update(stats["delays"]["hosts_by_delay"])
    assert {"0.2", "0.3"} <= set(delays)


def test_shards_sharing_a_crawl_process_stay_polite_to_each_other(tmp_path, mongo_server):
    """4 shards crawled in 2 processes (two Scrapy crawlers each, CrawlerResource.crawl_processes):
    each shard finishes with its own statistics, every record resolved and half its process's
    limits (records and downloads in flight, page cache), and the registries
    that every shard needs see no two requests closer than their delay, whichever crawler of
    whichever process sent them (the fleet-wide limiter between the crawlers of one process as
    between processes)."""
    web = build_synth_web(
        tmp_path, hosts=12, records_per_host=2, registries=2, crawl_delay=0.2, default_delay=0.3
    )
    with running_web(web.root, log_path=tmp_path / "requests.jsonl") as server:
        run = run_workers(
            web.dataset,
            web.mappings,
            tmp_path / "work",
            proxy=server.proxy_url,
            shards=4,
            processes=2,
            mongo_uri=mongo_server.uri,
            mongo_db=f"grouped_{int(time.time())}",
            crawl_overrides={"concurrent_requests": 7},
        )
        log = server.read_log()
    assert set(run.returncodes.values()) == {0}, run.logs
    assert sorted(s["partition"] for s in run.stats.values()) == ["s00", "s01", "s02", "s03"]
    outcomes: Counter[str] = Counter()
    for stats in run.stats.values():
        assert stats["finish_reason"] == "finished" and stats["pages"] > 0
        outcomes.update(stats["outcomes"])
    assert outcomes == {"resolved": web.records}
    # two processes, two shards each, each crawl with half its process's limits
    processes = Counter(s["crawl_process"] for s in run.stats.values())
    assert sorted(processes.values()) == [2, 2], processes
    # 2000 records, 7 downloads (rounded up) and 32 MB of page cache halved
    expected = {"max_active_records": 1000, "concurrent_requests": 4, "page_cache_mb": 16.0}
    assert all(s["limits"] == expected for s in run.stats.values()), run.stats
    problems = politeness_violations(log, web)
    assert problems == {"disallowed": [], "robots_not_first": [], "too_close": []}, problems
    by_host = requests_by_host(log)
    assert all(len(by_host[h]) >= 8 for h in by_host if h.startswith("registry"))


def test_a_shard_that_cannot_start_leaves_the_shard_sharing_its_process(tmp_path, mongo_server):
    """Two shards in one crawl process, one of which cannot start (its output folder lies under a
    file): the other is crawled to the end, and the process names the failed shard and why
    (the worker prints one line per shard and exits 1)."""
    import json

    from enrich_crawl.crawl.params import WorkerParams
    from enrich_crawl.testing.synthweb import DEFAULT_UA, seed_shards

    web = build_synth_web(
        tmp_path, hosts=4, records_per_host=2, registries=1, crawl_delay=0.1, default_delay=0.1
    )
    spec, stage, _keys = seed_shards(web.dataset, tmp_path / "stage", 2)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    argv = [sys.executable, "-m", "enrich_crawl.crawl.worker"]
    env = {k: v for k, v in os.environ.items() if k.lower() not in ("http_proxy", "https_proxy")}
    with running_web(web.root, log_path=tmp_path / "requests.jsonl") as server:
        for key, out_dir in (("s00", tmp_path / "out" / "s00"), ("s01", blocker / "s01")):
            params = WorkerParams(
                dataset=spec.name,
                partition=key,
                seed_path=str(stage.seed_shard(key)),
                out_dir=str(out_dir),
                mappings_dir=str(web.mappings),
                field_types=spec.field_types(),
                crawl=spec.crawl.to_dict(),
                run_id="broken",
                user_agent=DEFAULT_UA,
                proxy=server.proxy_url,
                mongo_uri=mongo_server.uri,
                mongo_db=f"broken_{int(time.time())}",
                log_level="WARNING",
            )
            path = tmp_path / f"{key}.json"
            path.write_text(json.dumps(params.to_dict()), encoding="utf-8")
            argv += ["--params", str(path)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 1, done.stderr[-3000:]
    lines = {
        line["partition"]: line for line in map(json.loads, filter(None, done.stdout.splitlines()))
    }
    assert lines["s00"]["finish_reason"] == "finished" and lines["s00"]["pages"] > 0
    assert sum(lines["s00"]["outcomes"].values()) == lines["s00"]["records_fed"] > 0
    assert "s01" in lines["s01"]["error"] and "a-file" in lines["s01"]["error"]
    assert "crawl of partition s01 cannot start" in done.stderr


def test_statistics_of_each_partition(fleet_crawl):
    _web, run, _log = fleet_crawl
    for stats in run.stats.values():
        assert stats["pages"] > 0 and stats["bytes"] > 0
        assert stats["status_codes"].get("200", 0) > 0
        assert stats["robots_fetched"] + stats["robots"].get("cache_hits", 0) > 0
        assert stats["robots_refusals"] == 0  # disallowed links are never url_parser links
        assert stats["pages_per_resolved_record"] is not None
        assert stats["pages_per_resolved_record"] <= 4.5  # home, about, contact, registry
        assert "started_at" in stats and stats["errors_by_kind"] == {}
        # one crawl per process: the process's limits whole
        assert stats["limits"]["max_active_records"] == 2000
        assert stats["limits"]["page_cache_mb"] == 32.0


def test_shared_limiter_spaces_two_processes_on_one_host(mongo_server, mongo_db_name):
    """Two limiters (two crawl processes) competing for one host: every send is at least the
    delay after the previous answer, whichever process sent it."""
    delay = 0.15

    async def worker(name: str, log: list[tuple[float, float, str]]) -> None:
        state = CrawlState(mongo_server.uri, mongo_db_name, worker=name)
        await state.open()
        limiter = HostLimiter(state, max_hold=0.3)
        try:
            for _ in range(6):
                await limiter.acquire("one.example", delay, timeout=5.0)
                sent = time.time()
                await asyncio.sleep(0.01)  # the request in flight
                answered = time.time()
                log.append((sent, answered, name))
                limiter.done("one.example", delay, keep=False)
        finally:
            await limiter.close()
            await state.close()

    async def main() -> list[tuple[float, float, str]]:
        log: list[tuple[float, float, str]] = []
        await asyncio.gather(worker("a", log), worker("b", log))
        return sorted(log)

    log = asyncio.run(main())
    assert len(log) == 12 and {name for *_, name in log} == {"a", "b"}
    for (_sent, answered, _), (next_sent, _, _) in itertools.pairwise(log):
        assert next_sent - answered >= delay - 0.002


def test_a_host_held_by_a_killed_process_is_free_a_delay_later(mongo_server, mongo_db_name):
    """The retry of a killed shard does not wait out its predecessor's lease: a host held by a
    process of this machine that no longer exists is free `delay` after it is seen; a host held
    by a live process (or one of another machine) stays held until its lease ends."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host_name = socket.gethostname()
    delay = 0.3

    async def main() -> tuple[float, float, Counter]:
        state = CrawlState(mongo_server.uri, mongo_db_name, worker=f"s01@{host_name}:{os.getpid()}")
        await state.open()
        hosts = state.db["_crawl_hosts"]
        lease_end = time.time() + 90
        await hosts.insert_many(
            [
                {
                    "_id": "dead.example",
                    "next_at": lease_end,
                    "by": f"s00@{host_name}:{dead.pid}:7",
                },
                {"_id": "live.example", "next_at": lease_end, "by": f"s00@{host_name}:1:7"},
                {
                    "_id": "far.example",
                    "next_at": lease_end,
                    "by": f"s00@other-machine:{dead.pid}:7",
                },
            ]
        )
        limiter = HostLimiter(state, max_wait=1.0)
        try:
            started = time.monotonic()
            await limiter.acquire("dead.example", delay, timeout=5.0)
            took = time.monotonic() - started
            refused = 0
            for host in ("live.example", "far.example"):
                with pytest.raises(HostBusy):
                    await limiter.acquire(host, delay, timeout=5.0)
                refused += 1
            return took, refused, limiter.stats
        finally:
            await limiter.close()
            await state.close()

    took, refused, stats = asyncio.run(main())
    assert delay - 0.05 <= took < 5.0, f"acquired after {took:.2f} s"
    assert refused == 2 and stats["reclaimed"] == 1


def test_limiter_keeps_politeness_when_the_database_is_unreachable(tmp_path: Path):
    """No shared state (database down): the crawl goes on, politeness per process only."""

    async def main() -> tuple[float, bool]:
        state = CrawlState(
            "mongodb://127.0.0.1:9/?serverSelectionTimeoutMS=300", "x", timeout_ms=300
        )
        await state.open()
        limiter = HostLimiter(state)
        waited = await limiter.acquire("h.example", 1.0, timeout=5.0)
        shared = limiter.shared
        await limiter.close()
        await state.close()
        return waited, shared

    waited, shared = asyncio.run(main())
    assert waited == 0.0 and shared is False


def test_every_worker_hands_back_every_host_it_took(fleet_crawl):
    """A crawl that ends hands back the hosts it still holds: no other process waits for them."""
    _web, run, _log = fleet_crawl
    for shard, stats in run.stats.items():
        limiter = stats["delays"]["limiter"]
        assert limiter["acquired"] > 0, (shard, limiter)
        assert limiter["released"] == limiter["acquired"], (shard, limiter)
        assert limiter.get("errors", 0) == 0, (shard, limiter)
