"""No host waits out a lease (90 s) that nobody will hand back.

A crawl process that ends holding hosts (killed, or finished without handing them back) leaves
them leased. Another process of the same machine judges the holder dead and takes the host a delay
later, also while the holder is a zombie: exited, not yet reaped by a launcher that waits for its
crawl processes one after the other (as `run_workers` and a Dagster run launching a step per
shard do). Seen in the goal-vs-BFS crawl of 8 sites (test_frontier): shard s00 waited 88.6 s for
site006.example, which shard s01 had finished with and never handed back.
"""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import sys
import time

import psutil
import pytest

from enrich_crawl.crawl.host_limiter import HostLimiter
from enrich_crawl.crawl.state import HOSTS, CrawlState, epoch_seconds
from enrich_crawl.testing.synthweb import build_synth_web, politeness_violations, run_workers
from enrich_crawl.virtualweb import requests_by_host, running_web

LEASE = 90.0  # HostLimiter's default lease
DELAY = 0.1

# a crawl process that takes a host, keeps it for a next request, then ends without close()
HOLDER = """
import asyncio, os, socket, sys
from enrich_crawl.crawl.host_limiter import HostLimiter
from enrich_crawl.crawl.state import CrawlState

async def main():
    worker = f"s01@{socket.gethostname()}:{os.getpid()}"  # as crawl/sources.py names it
    state = CrawlState(sys.argv[1], sys.argv[2], worker=worker)
    await state.open()
    limiter = HostLimiter(state)
    await limiter.acquire("kept.example", float(sys.argv[3]), timeout=5.0)
    limiter.done("kept.example", float(sys.argv[3]), keep=True)
    print("held", flush=True)
    sys.stdin.readline()
    os._exit(0)

asyncio.run(main())
"""


def _wait_until_zombie(pid: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, f"holder {pid} did not exit"
        time.sleep(0.05)


def test_a_host_left_leased_by_an_exited_unreaped_process_is_taken_a_delay_later(
    mongo_server, mongo_db_name
):
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, mongo_server.uri, mongo_db_name, str(DELAY)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline().strip() == "held"

        async def main() -> dict:
            state = CrawlState(mongo_server.uri, mongo_db_name, worker="s00")
            await state.open()
            limiter = HostLimiter(state, max_wait=20.0)  # old code: HostBusy after 20 s
            try:
                doc = await state.db[HOSTS].find_one({"_id": "kept.example"})
                leased_for = epoch_seconds(doc["next_at"]) - time.time()
                # a living holder is waited for: one request at a time per host
                with pytest.raises(asyncio.TimeoutError):
                    await asyncio.wait_for(limiter.acquire("kept.example", DELAY, 5.0), 1.0)
                holder.stdin.write("exit\n")
                holder.stdin.flush()
                _wait_until_zombie(holder.pid)  # exited, not reaped: nobody waits for it yet
                started = time.monotonic()
                waited = await limiter.acquire("kept.example", DELAY, timeout=5.0)
                took = time.monotonic() - started
                limiter.done("kept.example", DELAY, keep=False)
                await limiter.close()
                return {
                    "leased_for": leased_for,
                    "took": took,
                    "waited": waited,
                    "stats": dict(limiter.stats),
                }
            finally:
                await limiter.close()
                await state.close()

        out = asyncio.run(main())
    finally:
        holder.kill()
        holder.wait()
    assert out["leased_for"] > LEASE - 30, out  # what the host would have waited for
    assert out["took"] < 3.0, out
    assert out["stats"]["reclaimed"] == 1, out
    assert out["stats"]["released"] == out["stats"]["acquired"] == 1, out


def test_a_host_one_shard_finished_with_is_not_waited_for_by_the_other(tmp_path, mongo_server):
    """The reported run: a breadth-first crawl of 8 sites in 2 shards, where the shard that ends
    first has crawled a site the other reaches later by a link."""
    web = build_synth_web(
        tmp_path, hosts=8, records_per_host=1, crawl_delay=None, default_delay=0.02
    )
    with running_web(web.root, log_path=tmp_path / "requests.jsonl") as server:
        run = run_workers(
            web.dataset,
            web.mappings,
            tmp_path / "work",
            proxy=server.proxy_url,
            shards=2,
            mongo_uri=mongo_server.uri,
            mongo_db=f"leases_{int(time.time() * 1000)}",
            run_id="bfs",
            crawl_overrides={"strategy": "bfs", "store_pages": False},
        )
        log = server.read_log()
    assert set(run.returncodes.values()) == {0}, run.logs
    for shard, stats in run.stats.items():
        limiter = stats["delays"]["limiter"]
        assert limiter["shared"] and limiter["acquired"] > 0, (shard, limiter)
        assert limiter["released"] == limiter["acquired"], (shard, limiter)
        assert limiter["wait_seconds"] < LEASE / 10, (shard, limiter)
    # seen from the web: no host left waiting anywhere near a lease between two requests
    gaps = {
        host: max((b["t"] - a["t"] for a, b in itertools.pairwise(entries)), default=0.0)
        for host, entries in requests_by_host(log).items()
    }
    assert max(gaps.values()) < LEASE / 10, gaps
    assert not any(politeness_violations(log, web).values())
