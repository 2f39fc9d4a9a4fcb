"""A plain Scrapy breadth-first crawl, as a baseline: no goal direction.

One process per shard (the product's shard function). Each record is crawled breadth-first from its
seeds to the depth limit following every same-host link (as in ``baseline_seed``, and for the same
reason), and the dataset's mappings (the product's extraction engine) run on every page; the first
value found for a missing field wins. Records are fed lazily, at most ``--active`` at a time, so the
crawl interleaves hosts as Scrapy does; a page is downloaded once while it sits in a bounded cache
(128 MB) and is parsed again for every record that reaches it.

Politeness, the same as the product: robots.txt (RFC 9309: 4xx allow all, 5xx/unreachable disallow
all) downloaded before any other path of a host (a downloader middleware, since Scrapy's own treats
robots.txt errors as allow-all), Crawl-delay honoured as the host's download-slot delay (default 1 s,
no jitter), one request at a time per host, Scrapy's retries (2) on 5xx/429, 30 s timeout.

    python -m bench.e2e.baseline_bfs --spec SPEC --mappings DIR --shard I --shards P --out FILE \
        [--proxy URL --budget SECONDS --depth 2 --active 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

import scrapy
from scrapy.exceptions import IgnoreRequest

from bench.e2e.common import (
    BFS_UA,
    DEFAULT_DELAY,
    Extractor,
    RecordResult,
    RobotsRules,
    host_key,
    load_records,
    naive_links,
    records_of_shard,
    robots_url,
)
from enrich_crawl.extract import Page
from enrich_crawl.urls import fragment_of, without_fragment


class PoliteRobotsMiddleware:
    """robots.txt first (RFC 9309 error rules), then Crawl-delay as the slot's delay."""

    def __init__(self, crawler):
        self.crawler = crawler
        self.user_agent = crawler.settings.get("USER_AGENT")
        self.default_delay = crawler.settings.getfloat("DOWNLOAD_DELAY")
        self.rules: dict[str, RobotsRules | Any] = {}

    @classmethod
    def from_crawler(cls, crawler):
        return cls(crawler)

    async def _rules(self, request: scrapy.Request) -> RobotsRules:
        host = host_key(request.url)
        known = self.rules.get(host)
        if isinstance(known, RobotsRules):
            return known
        if isinstance(known, asyncio.Future):
            return await asyncio.shield(known)
        waiting: asyncio.Future = asyncio.get_running_loop().create_future()
        self.rules[host] = waiting
        robots_request = scrapy.Request(
            robots_url(request.url),
            meta={"bench_robots": True, "handle_httpstatus_all": True},
            priority=1000,
            dont_filter=True,
        )
        try:
            response = await self.crawler.engine.download_async(robots_request)
            rules = RobotsRules.from_response(response.status, response.body)
        except Exception:
            rules = RobotsRules.from_response(None, b"")
        self.rules[host] = rules
        self._set_delay(host, rules)
        waiting.set_result(rules)
        return rules

    def _set_delay(self, host: str, rules: RobotsRules) -> None:
        """The host's download slot gets the robots delay, now and whenever it is re-created."""
        delay = rules.delay(self.user_agent, self.default_delay)
        downloader = self.crawler.engine.downloader
        downloader.per_slot_settings[host] = {"delay": delay, "concurrency": 1}
        slot = downloader.slots.get(host)
        if slot is not None:
            slot.delay = delay

    async def process_request(self, request, spider=None):
        if request.meta.get("bench_robots"):
            return None
        rules = await self._rules(request)
        if not rules.allowed(request.url, self.user_agent):
            raise IgnoreRequest("robots")
        return None


class PageCache:
    def __init__(self, max_bytes: int = 128 * 1024 * 1024):
        self.max_bytes, self.bytes = max_bytes, 0
        self.items: OrderedDict[str, tuple[str, bytes, str, int]] = OrderedDict()

    def get(self, key: str):
        item = self.items.get(key)
        if item is not None:
            self.items.move_to_end(key)
        return item

    def put(self, key: str, item: tuple[str, bytes, str, int]) -> None:
        if key in self.items:
            return
        self.items[key] = item
        self.bytes += len(item[1])
        while self.bytes > self.max_bytes and len(self.items) > 1:
            _, old = self.items.popitem(last=False)
            self.bytes -= len(old[1])


class BfsSpider(scrapy.Spider):
    name = "bench_bfs"

    def __init__(self, records, extractor, depth, out_path, active, deadline, **kwargs):
        super().__init__(**kwargs)
        self.todo = list(reversed(records))
        self.extractor: Extractor = extractor
        self.depth = depth
        self.out = open(out_path, "w", encoding="utf-8")  # noqa: SIM115 - closed in closed()
        self.max_active = active
        self.deadline = deadline
        self.active: dict[str, tuple[Any, RecordResult, set[str], list[int]]] = {}
        self.waiting: dict[str, list[tuple[str, int, str]]] = {}
        self.cache = PageCache()
        self.done = 0
        self.pages = 0
        self.budget_hit = False

    async def start(self):
        for request in self._feed():
            yield request

    # -- records -------------------------------------------------------------------------------

    def _feed(self) -> list[scrapy.Request]:
        out: list[scrapy.Request] = []
        while self.todo and len(self.active) < self.max_active:
            if time.monotonic() > self.deadline:
                self.budget_hit = True
                self.todo.clear()
                break
            record = self.todo.pop()
            state = (record, RecordResult(record.id, record.missing), set(), [0])
            self.active[record.id] = state
            for seed in record.urls:
                out += self._visit(record.id, seed, 0)
            if state[3][0] == 0:  # nothing to fetch (no seeds, or all served from the cache)
                out += self._finish(record.id)
        return out

    def _finish(self, rid: str) -> list[scrapy.Request]:
        _record, result, _seen, _pending = self.active.pop(rid)
        self.out.write(result.line() + "\n")
        self.done += 1
        return self._feed()

    def _visit(self, rid: str, url: str, level: int) -> list[scrapy.Request]:
        state = self.active.get(rid)
        if state is None:
            return []
        _record, _result, seen, pending = state
        key = without_fragment(url)
        if key in seen:
            return []
        seen.add(key)
        pending[0] += 1
        cached = self.cache.get(key)
        if cached is not None:
            return self._process(key, cached, [(rid, level, fragment_of(url))])
        if key in self.waiting:
            self.waiting[key].append((rid, level, fragment_of(url)))
            return []
        self.waiting[key] = [(rid, level, fragment_of(url))]
        return [
            scrapy.Request(
                key,
                callback=self.parse,
                errback=self.failed,
                dont_filter=True,
                meta={"key": key, "handle_httpstatus_all": True},
            )
        ]

    def _process(self, key: str, item, waiters) -> list[scrapy.Request]:
        url, body, ctype, status = item
        page = Page(url, body, content_type=ctype, status=status) if status < 400 else None
        links = naive_links(page) if page is not None else []
        out: list[scrapy.Request] = []
        for rid, level, fragment in waiters:
            state = self.active.get(rid)
            if state is None:
                continue
            record, result, _seen, pending = state
            result.pages += 1
            if page is None:
                result.errors.append({"url": key, "reason": f"http_{status}"})
            else:
                wanted = set(record.missing) - set(result.fields)
                if wanted:
                    found = self.extractor.extract(
                        page, fragment=fragment, record_id=rid, wanted=wanted
                    )
                    for name, value in found.items():
                        result.fields.setdefault(name, value)
                if level < self.depth:
                    for link in links:
                        out += self._visit(rid, link, level + 1)
            pending[0] -= 1
            if pending[0] == 0 and rid in self.active:
                out += self._finish(rid)
        return out

    # -- Scrapy callbacks -------------------------------------------------------------------------

    def parse(self, response):
        key = response.meta["key"]
        self.pages += 1
        ctype = response.headers.get(b"Content-Type", b"").decode("latin-1")
        item = (response.url, response.body, ctype, response.status)
        if response.status < 400:
            self.cache.put(key, item)
        waiters = self.waiting.pop(key, [])
        yield from self._process(key, item, waiters)

    def failed(self, failure):
        request = failure.request
        key = request.meta.get("key", request.url)
        reason = "robots" if failure.check(IgnoreRequest) else type(failure.value).__name__
        out: list[scrapy.Request] = []
        for rid, _level, _fragment in self.waiting.pop(key, []):
            state = self.active.get(rid)
            if state is None:
                continue
            _record, result, _seen, pending = state
            result.errors.append({"url": key, "reason": reason})
            pending[0] -= 1
            if pending[0] == 0:
                out += self._finish(rid)
        yield from out

    def closed(self, reason):
        self.out.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", required=True)
    parser.add_argument("--mappings", required=True)
    parser.add_argument("--shard", type=int, required=True)
    parser.add_argument("--shards", type=int, required=True)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--proxy", default=None)
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--budget", type=float, default=0.0, help="seconds (0: no limit)")
    parser.add_argument(
        "--max-records", type=int, default=0, help="crawl only the shard's first N records (0: all)"
    )
    parser.add_argument("--active", type=int, default=200, help="records crawled at once")
    parser.add_argument("--default-delay", type=float, default=DEFAULT_DELAY)
    args = parser.parse_args(argv)

    from scrapy.crawler import CrawlerProcess

    started = time.monotonic()
    if args.proxy:
        for name in ("http_proxy", "https_proxy"):
            os.environ[name] = args.proxy
        os.environ.pop("no_proxy", None)
    records, field_types = load_records(args.spec)
    mine = records_of_shard(records, args.shard, args.shards)
    if args.max_records > 0:  # records are in random order (the generator shuffles them)
        mine = mine[: args.max_records]
    extractor = Extractor(args.mappings, field_types)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    settings = {
        "USER_AGENT": BFS_UA,
        "ROBOTSTXT_OBEY": False,  # replaced by PoliteRobotsMiddleware (RFC 9309 error rules)
        "CONCURRENT_REQUESTS": 64,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 1,
        "DOWNLOAD_DELAY": args.default_delay,
        "DOWNLOAD_DELAY_JITTER": 0,
        "DOWNLOAD_TIMEOUT": 30,
        "RETRY_TIMES": 2,
        "COOKIES_ENABLED": False,
        "TELNETCONSOLE_ENABLED": False,
        "LOG_LEVEL": "WARNING",
        "LOGSTATS_INTERVAL": 0,
        "CONCURRENT_ITEMS": 1,
        "DEPTH_PRIORITY": 1,
        "SCHEDULER_DISK_QUEUE": "scrapy.squeues.PickleFifoDiskQueue",
        "SCHEDULER_MEMORY_QUEUE": "scrapy.squeues.FifoMemoryQueue",
        "DOWNLOADER_MIDDLEWARES": {"bench.e2e.baseline_bfs.PoliteRobotsMiddleware": 100},
        "CLOSESPIDER_TIMEOUT": args.budget if args.budget > 0 else 0,
        "TWISTED_REACTOR": "twisted.internet.asyncioreactor.AsyncioSelectorReactor",
    }
    deadline = started + args.budget if args.budget > 0 else float("inf")
    process = CrawlerProcess(settings)
    crawler = process.create_crawler(BfsSpider)
    process.crawl(
        crawler,
        records=mine,
        extractor=extractor,
        depth=args.depth,
        out_path=args.out,
        active=args.active,
        deadline=deadline,
    )
    process.start()
    spider = crawler.spider
    print(
        json.dumps(
            {
                "shard": args.shard,
                "records_total": len(mine),
                "records_done": spider.done,
                "pages": spider.pages,
                "budget_hit": spider.budget_hit or bool(spider.active) or bool(spider.todo),
                "seconds": round(time.monotonic() - started, 3),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
