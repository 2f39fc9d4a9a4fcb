"""The CPU floor: a Scrapy spider that fetches given URLs and parses each page once with lxml.

Nothing else: no robots.txt, no delays, no extraction, no link following, no output; it imports
nothing of the product either (its start-up is part of its CPU). What the product spends per page
beyond this is its own overhead (politeness bookkeeping, extraction, frontier, staging, Dagster).
Requests are fed a few hundred at a time from the callbacks, never as one unbounded start()
generator (see MEASUREMENTS.md).

With `--delays` it is a polite bare crawler instead (information, not the check's floor): one
request at a time per host, each host's delay between its sends (Scrapy's download slots), hosts
served as their answers come in; what crawling at the pace of politeness costs Scrapy by itself.
With `--from-answer` too, each host's delay counts from the answer to its last request, as the
product counts it (Scrapy's slots count from the send: a request slower than the delay leaves
no gap at all between its answer and the next send).

    python -m bench.e2e.floor --urls FILE [--proxy URL] [--concurrency 64] [--delays FILE]
        [--from-answer]

FILE holds one absolute URL per line. Prints JSON statistics on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import deque
from pathlib import Path
from urllib.parse import urlsplit

import lxml.html
import scrapy
from scrapy.core.downloader.handlers.http11 import HTTP11DownloadHandler

from bench.e2e.agents import FLOOR_UA

_PARSER = lxml.html.HTMLParser(encoding="utf-8", remove_comments=True)


class PooledHTTP11DownloadHandler(HTTP11DownloadHandler):
    """Scrapy's HTTP/1.1 handler keeping as many idle connections per pool key as requests in
    flight. Scrapy keeps `CONCURRENT_REQUESTS_PER_DOMAIN` of them, and through a forward proxy every
    plain-http request shares one key (the proxy's): paced at one request per host, the floor
    would open and close a TCP connection for almost every request (the product keeps its proxy
    connections the same way, see enrich_crawl.crawl.downloader)."""

    def __init__(self, crawler):
        super().__init__(crawler)
        self._pool.maxPersistentPerHost = max(1, crawler.settings.getint("CONCURRENT_REQUESTS"))


class FloorSpider(scrapy.Spider):
    name = "bench_floor"

    def __init__(
        self, urls: list[str], window: int, paced: bool = False, from_answer: bool = False, **kwargs
    ):
        super().__init__(**kwargs)
        self.from_answer = from_answer
        self.todo = [] if paced else list(reversed(urls))  # paced: served from by_host
        self.window = window
        self.pages = 0
        self.parsed = 0
        self.failed_requests = 0
        # paced (`--delays`): one request out per host, the next of the same host sent when the
        # answer is in (its slot adds the delay); hosts taken in the order they first appear
        self.paced = paced
        self.by_host: dict[str, deque[str]] = {}
        for url in urls if paced else ():
            self.by_host.setdefault(urlsplit(url).hostname or "", deque()).append(url)
        self.hosts_waiting = deque(self.by_host)

    def _request(self, url: str, host: str = "") -> scrapy.Request:
        return scrapy.Request(
            url,
            callback=self.parse,
            errback=self.failed,
            dont_filter=True,
            meta={"handle_httpstatus_all": True, "dont_retry": True, "floor_host": host},
        )

    def _answered(self, request: scrapy.Request) -> None:
        """`--from-answer`: the host's delay starts now (its slot counts from `lastseen`)."""
        if self.from_answer:
            slot = self.crawler.engine.downloader.slots.get(request.meta.get("download_slot"))
            if slot is not None:
                slot.lastseen = time.monotonic()

    def _next(self, answered_host: str | None = None):
        if not self.paced:
            if self.todo:
                yield self._request(self.todo.pop())
            return
        host = answered_host if self.by_host.get(answered_host or "") else None
        while host is None and self.hosts_waiting:
            host = self.hosts_waiting.popleft()
        if host is None:
            return
        yield self._request(self.by_host[host].popleft(), host)

    async def start(self):
        for _ in range(self.window):
            for request in self._next():
                yield request

    def parse(self, response):
        self._answered(response.request)
        self.pages += 1
        body = response.body
        if body.strip():
            try:
                lxml.html.document_fromstring(body, parser=_PARSER)
                self.parsed += 1
            except (lxml.etree.ParserError, ValueError):
                pass
        yield from self._next(response.meta.get("floor_host"))

    def failed(self, failure):
        self._answered(failure.request)
        self.failed_requests += 1
        yield from self._next(failure.request.meta.get("floor_host"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--urls", required=True, type=Path)
    parser.add_argument("--proxy", default=None)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument(
        "--delays",
        type=Path,
        help='paced: JSON {"default": seconds, "hosts": {host: seconds}}; one request at a time '
        "per host, that delay between its sends (a polite bare crawler; default: no delays)",
    )
    parser.add_argument(
        "--from-answer",
        action="store_true",
        help="with --delays: each host's delay counts from the answer to its last request (as "
        "the product counts it), not from its send",
    )
    args = parser.parse_args(argv)

    from scrapy.crawler import CrawlerProcess

    started = time.monotonic()
    if args.proxy:
        for name in ("http_proxy", "https_proxy"):
            os.environ[name] = args.proxy
        os.environ.pop("no_proxy", None)
    urls = [u.strip() for u in args.urls.read_text("utf-8").splitlines() if u.strip()]
    settings = {
        "USER_AGENT": FLOOR_UA,
        "ROBOTSTXT_OBEY": False,
        "CONCURRENT_REQUESTS": args.concurrency,
        "CONCURRENT_REQUESTS_PER_DOMAIN": args.concurrency,
        "DOWNLOAD_DELAY": 0,
        "DOWNLOAD_TIMEOUT": 30,
        "RETRY_ENABLED": False,
        "COOKIES_ENABLED": False,
        "TELNETCONSOLE_ENABLED": False,
        "LOG_LEVEL": "WARNING",
        "LOGSTATS_INTERVAL": 0,
        "CONCURRENT_ITEMS": 1,
        # a development-time lint: Scrapy reads the source of a generator callback again for
        # every response (its cache is keyed by the bound method, a new object each time), a
        # tenth of this spider's CPU that no crawl needs
        "WARN_ON_GENERATOR_RETURN_VALUE": False,
        "TWISTED_REACTOR": "twisted.internet.asyncioreactor.AsyncioSelectorReactor",
    }
    if args.delays:
        delays = json.loads(args.delays.read_text("utf-8"))
        settings.update(
            CONCURRENT_REQUESTS_PER_DOMAIN=1,
            DOWNLOAD_DELAY=float(delays.get("default", 1.0)),
            RANDOMIZE_DOWNLOAD_DELAY=False,
            DOWNLOAD_HANDLERS={
                scheme: "bench.e2e.floor.PooledHTTP11DownloadHandler"
                for scheme in ("http", "https")
            },
            DOWNLOAD_SLOTS={
                host: {"concurrency": 1, "delay": float(delay), "randomize_delay": False}
                for host, delay in (delays.get("hosts") or {}).items()
            },
        )
    process = CrawlerProcess(settings)
    crawler = process.create_crawler(FloorSpider)
    window = args.concurrency if args.delays else args.concurrency * 2
    process.crawl(
        crawler,
        urls=urls,
        window=window,
        paced=bool(args.delays),
        from_answer=bool(args.delays) and args.from_answer,
    )
    process.start()
    spider = crawler.spider
    print(
        json.dumps(
            {
                "urls": len(urls),
                "pages": spider.pages,
                "parsed": spider.parsed,
                "failed": spider.failed_requests,
                "seconds": round(time.monotonic() - started, 3),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
