"""The crawl's memory across runs (MongoDB): pages fetched less than `recrawl_ttl_hours` ago are
re-extracted from their stored copy without a request, stale ones are revalidated with
If-None-Match / If-Modified-Since (a 304 re-uses the stored copy), permanent failures are not asked
again, and records whose missing fields are fresh in the results collection are not crawled."""

from __future__ import annotations

import datetime as dt
import time

import pymongo
import pytest

from enrich_crawl.testing.synthweb import (
    build_synth_web,
    read_candidates,
    read_outcomes,
    run_workers,
)
from enrich_crawl.virtualweb import requests_by_host, running_web


def _gets(log):
    return [e for e in log if e.get("method") == "GET"]


@pytest.fixture(scope="module")
def store_runs(tmp_path_factory, mongo_server):
    base = tmp_path_factory.mktemp("store")
    web = build_synth_web(base, hosts=6, records_per_host=2, crawl_delay=None, default_delay=0.05)
    # one more record whose page is gone for good
    with open(web.dataset.parent / "synth.csv", "a", encoding="utf-8") as table:
        table.write("GONE,http://site000.example/org/gone/,Gone,,,,,\n")
    db = f"store_{int(time.time() * 1000)}"
    logs, runs = {}, {}
    common = dict(proxy=None, shards=2, mongo_uri=mongo_server.uri, mongo_db=db)
    with running_web(web.root, log_path=base / "requests.jsonl") as server:
        common["proxy"] = server.proxy_url
        seen = 0
        for run_id, overrides in (
            ("first", {}),
            ("again", {}),  # everything fresh in the store
            ("stale", {"recrawl_ttl_hours": 1e-6}),  # everything stale: revalidated
        ):
            runs[run_id] = run_workers(
                web.dataset,
                web.mappings,
                base / "work",
                run_id=run_id,
                crawl_overrides=overrides,
                **common,
            )
            log = server.read_log()
            logs[run_id], seen = log[seen:], len(log)
        # the results collection says site001's records are resolved, fetched an hour ago
        client = pymongo.MongoClient(mongo_server.uri)
        fetched = dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=1)
        for j in range(2):
            rid = f"R001-{j}"
            data = {"description": "d", "city": "c", "founded": 1, "email": "e", "employees": 2}
            client[db]["synth"].replace_one(
                {"_id": rid},
                {
                    "_id": rid,
                    "data": data,
                    "lineage": {k: {"value": v, "fetched_at": fetched} for k, v in data.items()},
                },
                upsert=True,
            )
        client.close()
        runs["fresh"] = run_workers(
            web.dataset,
            web.mappings,
            base / "work",
            run_id="fresh",
            crawl_overrides={"store_pages": False},
            **common,
        )
        logs["fresh"] = server.read_log()[seen:]
    for run in runs.values():
        assert set(run.returncodes.values()) == {0}, run.logs
    return base, web, runs, logs


def _total(run, key):
    return sum(s.get(key, 0) for s in run.stats.values())


def test_first_run_fetches_and_stores(store_runs):
    base, web, runs, _logs = store_runs
    outcomes = read_outcomes(base / "work", "first")
    assert sum(o["outcome"] == "resolved" for o in outcomes.values()) == web.records
    assert {e["reason"] for e in outcomes["GONE"]["errors"]} == {"http_404"}
    assert _total(runs["first"], "pages") == web.records * 4
    assert _total(runs["first"], "pages_from_store") == 0


def test_fresh_pages_are_not_fetched_again(store_runs):
    base, web, runs, logs = store_runs
    assert _gets(logs["again"]) == []  # not a single request, robots.txt included
    first = read_candidates(base / "work", "first")
    again = read_candidates(base / "work", "again")
    assert again == first
    outcomes = read_outcomes(base / "work", "again")
    assert {e["reason"] for e in outcomes["GONE"]["errors"]} == {"http_404"}
    assert _total(runs["again"], "pages_from_store") == web.records * 4
    assert _total(runs["again"], "pages") == 0


def test_stale_pages_are_revalidated_with_conditional_requests(store_runs):
    base, web, runs, logs = store_runs
    pages = [e for e in _gets(logs["stale"]) if e["path"] != "/robots.txt"]
    statuses = sorted({e["status"] for e in pages})
    assert statuses == [304, 404]  # unchanged pages answer 304; the 404 is asked again
    assert sum(e["status"] == 304 for e in pages) == web.records * 4
    assert read_candidates(base / "work", "stale") == read_candidates(base / "work", "first")
    assert _total(runs["stale"], "not_modified") == web.records * 4
    assert _total(runs["stale"], "conditional_requests") == web.records * 4


def test_records_fresh_in_the_results_collection_are_not_crawled(store_runs):
    base, web, runs, logs = store_runs
    outcomes = read_outcomes(base / "work", "fresh")
    for j in range(2):
        row = outcomes[f"R001-{j}"]
        assert row["outcome"] == "fresh" and row["pages"] == 0
        assert sorted(row["fresh"]) == sorted(
            ["city", "description", "email", "employees", "founded"]
        )
    assert "site001.example" not in requests_by_host(logs["fresh"])
    # the other records were crawled as usual (no page store in this run)
    assert sum(o["outcome"] == "resolved" for o in outcomes.values()) == web.records - 2
    assert _total(runs["fresh"], "fields_fresh") == 10


def test_a_page_stored_again_replaces_the_stored_copy(mongo_server, mongo_db_name):
    """A re-fetched page replaces its stored document, body included (binary data), and a later
    permanent failure of the same URL clears what the successful fetch had stored; no write is
    refused and the state stays available."""
    import asyncio

    from enrich_crawl.crawl.state import CrawlState, compress, decompress

    key = "http://site.example/page"

    async def main():
        state = CrawlState(mongo_server.uri, mongo_db_name, worker="t")
        await state.open()
        try:
            stored = []
            for n, doc in enumerate(
                (
                    {"_id": key, "url": key, "status": 200, "etag": '"v1"', "body": compress(b"v1")},
                    {"_id": key, "url": key, "status": 200, "etag": '"v2"', "body": compress(b"v2")},
                    {"_id": key, "url": key, "reason": "http_404", "body": None},
                )
            ):
                state.page_put({**doc, "fetched_at": time.time() + n})
                await state.flush()
                stored.append((await state.pages_get([key]))[key])
            return stored, state.available, dict(state.stats)
        finally:
            await state.close()

    (first, second, gone), available, stats = asyncio.run(main())
    assert decompress(first["body"]) == b"v1" and decompress(second["body"]) == b"v2"
    assert second["etag"] == '"v2"'
    assert gone["reason"] == "http_404" and not gone["etag"] and not gone["body"]
    assert available and not stats.get("write_errors/_crawl_pages")


def test_stored_bodies_read_back_whatever_version_wrote_them():
    import zlib

    from enrich_crawl.crawl.state import compress, decompress

    body = ("<html><body>" + "<p>Café – 東京</p>" * 2000 + "</body></html>").encode("utf-8")
    packed = compress(body)
    assert len(packed) < len(body) / 4 and decompress(packed) == body
    assert decompress(zlib.compress(body, 3)) == body  # the bodies earlier versions stored
    import pyarrow as pa

    zstd = pa.Codec("zstd", compression_level=1).compress(body, asbytes=True)
    assert decompress(b"ZS" + len(body).to_bytes(4, "big") + zstd) == body
    assert decompress(compress(b"")) == b""
