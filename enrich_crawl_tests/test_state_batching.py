"""The crawled-URL store's writes leave in batches: every FLUSH_INTERVAL, or at once when
FLUSH_BATCH pages are queued, and everything at close; meanwhile the process sees its own queued
pages. A killed process loses only its queue, and the next crawl fetches only those again (see
test_recovery.py for the crawl side)."""

from __future__ import annotations

import asyncio
import time

from pymongo import MongoClient

from enrich_crawl.crawl.state import FLUSH_BATCH, FLUSH_INTERVAL, PAGES, CrawlState


def _page(n: int) -> dict:
    return {"_id": f"http://p.test/{n}", "url": f"http://p.test/{n}", "status": 200,
            "fetched_at": time.time(), "useful": False, "body": None}  # fmt: skip


def test_page_writes_leave_in_batches_and_all_at_close(mongo_server, mongo_db_name):
    assert FLUSH_INTERVAL >= 1.0  # the test's pauses are far below it

    async def main() -> dict:
        state = CrawlState(mongo_server.uri, mongo_db_name, worker="w")
        await state.open()
        for n in range(FLUSH_BATCH - 1):
            state.page_put(_page(n))
        await asyncio.sleep(0.3)
        queued = state.stats[f"batches/{PAGES}"]  # below a batch: waiting for the interval
        state.page_put(_page(FLUSH_BATCH - 1))  # a full batch leaves at once
        await asyncio.sleep(0.5)
        full = (state.stats[f"batches/{PAGES}"], state.stats[f"writes/{PAGES}"])
        for n in range(FLUSH_BATCH, FLUSH_BATCH + 3):
            state.page_put(_page(n))
        own = await state.pages_get([f"http://p.test/{FLUSH_BATCH + 2}"])
        await state.close()
        return {"queued": queued, "full": full, "own": own, "stats": dict(state.stats)}

    out = asyncio.run(main())
    assert out["queued"] == 0, out["stats"]
    assert out["full"] == (1, FLUSH_BATCH), out["stats"]
    assert list(out["own"]) == [f"http://p.test/{FLUSH_BATCH + 2}"]
    assert out["stats"][f"batches/{PAGES}"] == 2, out["stats"]  # the rest at close, in one
    with MongoClient(mongo_server.uri) as client:
        assert client[mongo_db_name][PAGES].count_documents({}) == FLUSH_BATCH + 3
