"""The fleet-wide limiter's database writes in batches, and its hosts handed back at the end.

The takes and hand-backs of a moment leave in one `bulk_write`: a take that finds its host busy
fails alone (another process still holds it), the others are taken. A crawl that ends hands back
every host it still holds (answered or not), so that no other process waits for its leases (a
whole fleet's crawl: test_politeness.py; a holder that died: test_limiter_leases.py).
"""

from __future__ import annotations

import asyncio
import time

import pytest

from enrich_crawl.crawl.host_limiter import HostBusy, HostLimiter
from enrich_crawl.crawl.state import CrawlState

HOSTS = [f"h{n}.example" for n in range(6)]


async def _open(mongo_server, db: str, name: str) -> tuple[CrawlState, HostLimiter]:
    state = CrawlState(mongo_server.uri, db, worker=name)
    await state.open()
    return state, HostLimiter(state, max_wait=0.6)


def test_takes_and_hand_backs_of_a_moment_leave_in_one_write(mongo_server, mongo_db_name):
    delay = 0.2

    async def main() -> dict:
        state_a, a = await _open(mongo_server, mongo_db_name, "a")
        state_b, b = await _open(mongo_server, mongo_db_name, "b")
        try:
            # b holds one host already: a's batch takes the five others and fails on that one
            await b.acquire(HOSTS[0], delay, timeout=5.0)
            before = a.stats["batches"]
            results = await asyncio.gather(
                *(a.acquire(host, delay, timeout=5.0) for host in HOSTS[1:]),
                asyncio.wait_for(a.acquire(HOSTS[0], delay, timeout=5.0), 0.3),
                return_exceptions=True,
            )
            taken_in = a.stats["batches"] - before
            # b now finds every host a took busy
            busy = 0
            for host in HOSTS[1:]:
                with pytest.raises(HostBusy):
                    await b.acquire(host, delay, timeout=5.0)
                busy += 1
            # a answers all five: the hand-backs leave together, b gets them `delay` later
            before = a.stats["batches"]
            answered = time.time()
            for host in HOSTS[1:]:
                a.done(host, delay, keep=False)
            await asyncio.gather(*list(a.releasing.values()))
            handed_back_in = a.stats["batches"] - before
            for host in HOSTS[1:]:
                await b.acquire(host, delay, timeout=5.0)
            b_took_after = time.time() - answered
            return {
                "results": results,
                "taken_in": taken_in,
                "busy": busy,
                "handed_back_in": handed_back_in,
                "b_took_after": b_took_after,
                "released": a.stats["released"],
            }
        finally:
            for limiter, state in ((a, state_a), (b, state_b)):
                await limiter.close()
                await state.close()

    out = asyncio.run(main())
    assert out["results"][:5] == [0.0] * 5, out
    assert isinstance(out["results"][5], asyncio.TimeoutError), out  # b's host: waited for
    assert out["taken_in"] == 1, out
    assert out["busy"] == 5 and out["handed_back_in"] == 1 and out["released"] == 5, out
    assert out["b_took_after"] >= delay - 0.01, out


def test_close_hands_back_every_host_held(mongo_server, mongo_db_name):
    """A host kept for a next request and one whose request is still out (the crawl stopped
    midway) are both handed back at close: another process takes them a delay later, not at the
    end of the lease (90 s)."""
    delay = 0.3

    async def main() -> tuple[float, float, int]:
        state_a, a = await _open(mongo_server, mongo_db_name, "a")
        state_b, b = await _open(mongo_server, mongo_db_name, "b")
        try:
            await a.acquire("kept.example", delay, timeout=5.0)
            a.done("kept.example", delay, keep=True)  # held for a next request
            await a.acquire("out.example", delay, timeout=5.0)  # no answer yet
            closed_at = time.time()
            await a.close()
            closed = a.stats["closed"]
            took = []
            for host in ("kept.example", "out.example"):
                await b.acquire(host, delay, timeout=5.0)  # HostBusy after 0.6 s if still held
                took.append(time.time() - closed_at)
            return took[0], took[1], closed
        finally:
            await b.close()
            await state_b.close()
            await state_a.close()

    kept, out, closed = asyncio.run(main())
    assert closed == 2
    assert kept < delay + 0.5 and delay - 0.01 <= out < delay + 0.5, (kept, out)


def test_a_take_given_up_on_the_way_is_handed_back(mongo_server, mongo_db_name):
    """A request given up while its take waits for its batch (the crawl closing, a timeout): the
    take still leaves, and the host is handed back at once instead of staying leased."""

    async def main() -> tuple[float, dict]:
        state_a, a = await _open(mongo_server, mongo_db_name, "a")
        state_b, b = await _open(mongo_server, mongo_db_name, "b")
        try:
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(a.acquire("gone.example", 0.2, timeout=5.0), 0.001)
            await asyncio.sleep(0.2)  # the batch left; the take went through, then back
            if a.releasing:
                await asyncio.gather(*list(a.releasing.values()))
            started = time.monotonic()
            await b.acquire("gone.example", 0.2, timeout=5.0)  # HostBusy if still leased
            return time.monotonic() - started, dict(a.stats)
        finally:
            for limiter, state in ((a, state_a), (b, state_b)):
                await limiter.close()
                await state.close()

    took, stats = asyncio.run(main())
    assert stats["released"] == 1, stats
    assert took < 0.5, took
