"""The crawl worker's lean versions of Scrapy components and its batched database work: each does
what the component it replaces does, for less CPU per page (issue #9). Real Scrapy components,
real pages, the real MongoDB-wire server."""

from __future__ import annotations

import asyncio
import time

import pytest
from scrapy import Request
from scrapy.http import HtmlResponse
from scrapy.utils.misc import build_from_crawler
from scrapy.utils.test import get_crawler

from enrich_crawl.config import CrawlConfig
from enrich_crawl.crawl.downloader import PoliteDownloader
from enrich_crawl.crawl.frontier import Waiter
from enrich_crawl.crawl.middlewares.lean import (
    CheapMetaRefreshMiddleware,
    LeanDownloaderStats,
    ProxyMiddleware,
)
from enrich_crawl.crawl.pagecache import PageCache
from enrich_crawl.crawl.params import WorkerParams
from enrich_crawl.crawl.policy import UrlPolicy
from enrich_crawl.crawl.robots import RobotsRules
from enrich_crawl.crawl.spider import EnrichSpider
from enrich_crawl.crawl.state import CrawlState
from enrich_crawl.extract.mapping import MappingSet
from enrich_crawl.extract.page import Page


def _crawler(**settings):
    crawler = get_crawler(settings_dict=settings)
    crawler._apply_settings()
    return crawler


# -- URL policy ----------------------------------------------------------------------------------


def test_policy_verdicts_per_host_do_not_leak_between_urls_of_the_host():
    """The host's verdict is computed once; what depends on the URL (extension, claims by a
    mapping, allow/deny patterns) is still decided per URL, in any order."""
    claimed = {"https://www.youtube.com/channel/acme"}
    policy = UrlPolicy(
        CrawlConfig.from_mapping({"deny": [r"/logout"]}),
        allow_private=False,
        claimed=lambda url: url in claimed,
    )
    for _ in range(2):  # the second round answers from the host cache
        assert policy.check("https://www.youtube.com/watch?v=1")[0] == "denied"
        assert policy.check("https://www.youtube.com/channel/acme") is None
        assert policy.check("http://ok.example/page") is None
        assert policy.check("http://ok.example/logout")[0] == "denied"
        assert policy.check("http://ok.example/report.pdf")[0] == "denied"
        assert policy.check("http://127.0.0.1/x")[0] == "private_address"
        assert policy.check("http://127.0.0.1/robots.txt", robots_fetch=True)[0] == (
            "private_address"
        )
        # a robots.txt fetch is only refused for internal addresses, whatever the deny list
        assert policy.check("https://www.youtube.com/robots.txt", robots_fetch=True) is None
    assert set(policy._hosts) == {"www.youtube.com", "ok.example", "127.0.0.1"}


# -- Scrapy components ---------------------------------------------------------------------------


def test_proxy_middleware_honours_the_environment_and_no_proxy(monkeypatch):
    monkeypatch.setenv("http_proxy", "http://user:secret@proxy.example:3128")
    monkeypatch.setenv("https_proxy", "http://proxy.example:3129")
    monkeypatch.setenv("no_proxy", "direct.example,.internal.example")
    middleware = build_from_crawler(ProxyMiddleware, _crawler())
    for _ in range(2):  # the second time from the per-host cache
        request = Request("http://site.example/a")
        middleware.process_request(request)
        assert request.meta["proxy"] == "http://proxy.example:3128"
        assert request.headers[b"Proxy-Authorization"].startswith(b"Basic ")
        secure = Request("https://site.example/a")
        middleware.process_request(secure)
        assert secure.meta["proxy"] == "http://proxy.example:3129"
        assert b"Proxy-Authorization" not in secure.headers
        for url in ("http://direct.example/", "http://a.internal.example/"):
            direct = Request(url)
            middleware.process_request(direct)
            assert not direct.meta.get("proxy")
    chosen = Request("http://site.example/b", meta={"proxy": "http://other.example:8080"})
    middleware.process_request(chosen)
    assert chosen.meta["proxy"] == "http://other.example:8080"


def test_lean_downloader_stats_count_requests_and_statuses():
    from scrapy.statscollectors import MemoryStatsCollector

    collector = MemoryStatsCollector(_crawler())
    stats = LeanDownloaderStats(collector)
    for status in (200, 200, 404):
        request = Request("http://site.example/")
        stats.process_request(request)
        stats.process_response(request, HtmlResponse(request.url, status=status, body=b"x"))
    got = collector.get_stats()
    assert got["downloader/request_count"] == 3
    assert got["downloader/response_count"] == 3
    assert got["downloader/response_status_count/200"] == 2
    assert got["downloader/response_status_count/404"] == 1


@pytest.mark.parametrize(
    "body, encoding, redirected",
    [
        (
            b'<html><head><meta http-equiv="Refresh" content="0; url=/next"></head></html>',
            None,
            True,
        ),
        (b"<html><head><META HTTP-EQUIV=refresh CONTENT='1;URL=/next'></head></html>", None, True),
        (b"<html><head><title>no refresh here</title></head><body>x</body></html>", None, False),
        # refresh mentioned in the text only: Scrapy's own scan decides (no redirect)
        (b"<html><body>press F5 to refresh</body></html>", None, False),
        # UTF-16 has NUL bytes: always Scrapy's path, which decodes it
        (
            '<html><head><meta http-equiv="refresh" content="0; url=/next"></head></html>',
            "utf-16",
            True,
        ),
    ],
)
def test_meta_refresh_is_followed_exactly_when_scrapy_would(body, encoding, redirected):
    crawler = _crawler(METAREFRESH_MAXDELAY=5)
    middleware = build_from_crawler(CheapMetaRefreshMiddleware, crawler)
    if encoding:
        body = body.encode(encoding)
    headers = {"Content-Type": f"text/html; charset={encoding}"} if encoding else {}
    request = Request("http://site.example/start")
    response = HtmlResponse(request.url, body=body, headers=headers, request=request)
    result = middleware.process_response(request, response)
    if redirected:
        assert isinstance(result, Request) and result.url == "http://site.example/next"
    else:
        assert result is response


def test_downloader_arms_no_timer_for_an_empty_slot():
    """Scrapy re-enters its queue after each send and arms a timer `delay` ahead even with
    nothing queued; the polite downloader does not, and still delays a request that comes."""

    async def main():
        crawler = _crawler(DOWNLOAD_DELAY=5.0, DOWNLOAD_DELAY_JITTER=0.0)
        downloader = PoliteDownloader(crawler)
        try:
            request = Request("http://site.example/")
            _key, slot = downloader._get_slot(request)
            slot.lastseen = time.monotonic()
            downloader._process_queue(slot)
            assert slot.latercall is None  # nothing queued: nothing armed
            slot.queue.append((request, None))
            downloader._process_queue(slot)
            assert slot.latercall is not None  # queued within the delay: held until it passes
            assert len(slot.queue) == 1
            slot.latercall.cancel()
        finally:
            downloader.close()

    asyncio.run(main())


# -- batched database work -----------------------------------------------------------------------


def test_robots_reads_of_a_burst_take_one_database_call(mongo_server, mongo_db_name):
    origins = [f"http://site{i:02d}.example" for i in range(30)]

    async def main():
        writer = CrawlState(mongo_server.uri, mongo_db_name, worker="w")
        await writer.open()
        for origin in origins[:10]:
            writer.robots_put(
                RobotsRules.from_response(origin, 200, b"User-agent: *\nDisallow: /x")
            )
        await writer.close()

        reader = CrawlState(mongo_server.uri, mongo_db_name, worker="r")
        await reader.open()
        try:
            found = await asyncio.gather(*(reader.robots_get(o, 3600.0) for o in origins))
            later = await reader.robots_get(origins[0], 3600.0)
            return found, later, dict(reader.stats)
        finally:
            await reader.close()

    found, later, stats = asyncio.run(main())
    assert [rules is not None for rules in found] == [True] * 10 + [False] * 20
    assert not found[0].allowed(f"{origins[0]}/x/y", "bot") and found[0].allowed(origins[0], "bot")
    assert later is not None
    assert stats["reads/_crawl_robots"] == 2  # the burst of 30, then the later one


def test_queued_pages_wait_for_the_flush_but_this_process_sees_them(mongo_server, mongo_db_name):
    async def main():
        state = CrawlState(mongo_server.uri, mongo_db_name, worker="w")
        await state.open()
        try:
            state.page_put({"_id": "http://a.example/", "url": "http://a.example/", "status": 200})
            mine = await state.pages_get(["http://a.example/"])
            in_db_before = await state.db["_crawl_pages"].count_documents({})
            await state.flush()
            in_db_after = await state.db["_crawl_pages"].count_documents({})
            return mine, in_db_before, in_db_after
        finally:
            await state.close()

    mine, before, after = asyncio.run(main())
    assert mine["http://a.example/"]["status"] == 200
    assert (before, after) == (0, 1)


# -- extraction on demand ------------------------------------------------------------------------

ORG_MAPPING = """{
  "name": "org",
  "url_patterns": [{"type": "regex", "pattern": "^https?://org\\\\.example/.*$"}],
  "url_parsers": [{"description": "about",
                   "processors": [{"type": "xpath", "parameters": {"expression": "//a/@href"}}]}],
  "fields": [
    {"name": "city", "processors": [{"type": "xpath", "parameters": {"expression": "//p[@class='city']/text()"}}]},
    {"name": "phone", "processors": [{"type": "xpath", "parameters": {"expression": "//p[@class='phone']/text()"}}]},
    {"name": "founded", "processors": [{"type": "xpath", "parameters": {"expression": "//p[@class='founded']/text()"}},
                                        {"type": "number", "parameters": {}}]}
  ]
}"""


def _org_spider(tmp_path) -> tuple[EnrichSpider, MappingSet]:
    """A crawl's spider (its extraction room) with the org mapping, outside Scrapy."""
    (tmp_path / "maps").mkdir()
    (tmp_path / "maps" / "org.json").write_text(ORG_MAPPING, encoding="utf-8")
    mappings = MappingSet.load(tmp_path / "maps")
    params = WorkerParams(
        dataset="d",
        partition="s00",
        seed_path=str(tmp_path / "seed.parquet"),
        out_dir=str(tmp_path / "out"),
        mappings_dir=str(tmp_path / "maps"),
        field_types={"founded": "integer"},
    )
    return EnrichSpider(params=params, mappings=mappings), mappings


def test_fields_run_only_for_records_that_want_them_and_links_only_when_followed(tmp_path):
    spider, mappings = _org_spider(tmp_path)
    try:
        page = Page(
            "http://org.example/",
            b"<html><body><p class='city'>Oslo</p><p class='phone'>+47 1</p>"
            b"<p class='founded'>1999</p><a href='/about'>About</a></body></html>",
            content_type="text/html; charset=utf-8",
        )
        page.content_hash = "h"
        mapping = mappings.mappings[0]
        waiter = Waiter("R1", "", 0, "http://org.example/", "http://org.example/")
        assert spider.extraction.extract(page, mapping, waiter, {"city"}) == {"city": "Oslo"}
        entry = spider.extraction.extraction(page, mapping, waiter)
        assert entry.tried == {"city"} and entry.links is None
        # another record on the same page wants more: only the new fields run
        other = Waiter("R2", "", 0, "http://org.example/", "http://org.example/")
        got = spider.extraction.extract(page, mapping, other, {"city", "founded", "unknown_field"})
        assert got == {"city": "Oslo", "founded": 1999}
        assert entry.tried == {"city", "founded"}
        assert spider.extraction.links(page, mapping, waiter) == ["http://org.example/about"]
        assert entry.links == ["http://org.example/about"]
    finally:
        spider.out.close()
        spider.pages.close()


def test_mappings_matched_per_url_are_remembered_for_the_urls_in_play_only(tmp_path, monkeypatch):
    from enrich_crawl.crawl import extraction

    monkeypatch.setattr(extraction, "MATCH_CACHE", 8)
    spider, _mappings = _org_spider(tmp_path)
    try:
        extractor = spider.extraction
        matched: list[str] = []
        real = extractor.mappings.matching

        def matching(url):  # the real matcher, each URL it is asked about noted
            matched.append(url)
            return real(url)

        monkeypatch.setattr(extractor.mappings, "matching", matching)
        org = extractor.matching("http://org.example/")
        assert [m.name for m in org] == [m.name for m in real("http://org.example/")]
        assert org  # the org mapping claims the site
        for i in range(50):  # a crawl's stream of URLs, most of them claimed by no mapping
            assert extractor.matching(f"http://elsewhere.example/{i}") == ()
            # in play: kept, never matched again
            assert extractor.matching("http://org.example/") is org
        assert matched.count("http://org.example/") == 1
        assert len(extractor.match_cache) == 8
        assert "http://org.example/" in extractor.match_cache
        assert "http://elsewhere.example/0" not in extractor.match_cache
        # the URLs of a site share one answer: the memo holds a tuple per answer, not per URL
        assert extractor.matching("http://org.example/about") is org
        assert extractor.matching("http://elsewhere.example/0") is extractor.matching("x:") == ()
    finally:
        spider.out.close()
        spider.pages.close()


def test_the_feed_reads_only_the_columns_of_the_shard_it_uses(tmp_path):
    """A crawl holds a whole row group of what it reads: `_data` and `_raw` (most of a shard's
    bytes) are left on disk."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from enrich_crawl.crawl.feed import FEED_COLUMNS

    spider, _mappings = _org_spider(tmp_path)
    try:
        row = {
            "_id": "R1",
            "_row": 1,
            "_urls": ["http://org.example/"],
            "_url_errors": "[]",
            "_missing": ["city"],
            "_data": '{"name": "Org"}',
            "_raw": '{"name": "Org"}',
        }
        pq.write_table(pa.Table.from_pylist([row]), tmp_path / "seed.parquet")
        (record,) = list(spider.feed.records())
        assert set(record) == set(FEED_COLUMNS) == {"_id", "_urls", "_missing", "_url_errors"}
        assert record["_url_errors"] == [] and record["_urls"] == ["http://org.example/"]
    finally:
        spider.out.close()
        spider.pages.close()


def test_page_cache_remembers_which_evicted_pages_the_store_keeps(tmp_path):
    cache = PageCache(max_bytes=1, spill_dir=str(tmp_path), max_parsed=1)
    try:
        for i in range(3):
            key = f"http://s{i}.example/"
            page = Page(key, b"<p>%d</p>" % i, content_type="text/html")
            cache.put(key, page, stored=i < 2)
        # the two oldest left memory; the store keeps them, so nothing was spilled
        assert cache.spilled == 0 and cache.dropped == 2
        assert cache.in_store_only("http://s0.example/")
        assert cache.in_store_only("http://s1.example/")
        assert not cache.in_store_only("http://s2.example/")  # still in memory
        assert not cache.in_store_only("http://never.example/")
        assert cache.get("http://s0.example/") is None  # asked of the store, not the cache
    finally:
        cache.close()


def test_page_cache_asks_its_scratch_file_only_for_what_it_spilled(tmp_path):
    cache = PageCache(max_bytes=1, spill_dir=str(tmp_path), max_parsed=1)
    try:
        # SQLite keeps 64 KiB of the scratch file, not its default 2 MiB per crawl
        assert cache.db.execute("PRAGMA cache_size").fetchone()[0] == -64
        pages = [
            Page(f"http://p{i}.example/", b"<p>%d</p>" % i, content_type="text/html")
            for i in range(3)
        ]
        for i, page in enumerate(pages):
            cache.put(f"http://p{i}.example/", page)
        cache.put_failure("http://gone.example/", "http_404")
        assert cache.spilled == 2  # the two oldest left memory for the scratch file
        assert cache.get("http://p0.example/").body == b"<p>0</p>"
        assert cache.failure("http://gone.example/") == "http_404"
        assert cache.get("http://never.example/") is None
        assert cache.failure("http://never.example/") is None
        assert cache.get("http://gone.example/") is None  # a failure is not a page
    finally:
        cache.close()
