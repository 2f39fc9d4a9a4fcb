"""Scrapy's own components, doing less per request: the proxy's no_proxy verdict cached per host,
downloader statistics without byte counts, the meta refresh looked for only where it can be, and
no DEBUG line per response that the log level hides anyway."""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING, Any
from urllib.request import proxy_bypass

from scrapy import Request
from scrapy.downloadermiddlewares.httpproxy import HttpProxyMiddleware
from scrapy.downloadermiddlewares.redirect import MetaRefreshMiddleware
from scrapy.downloadermiddlewares.stats import DownloaderStats
from scrapy.logformatter import LogFormatter
from scrapy.utils.httpobj import urlparse_cached

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.http import Response


class ProxyMiddleware(HttpProxyMiddleware):
    """Scrapy's HttpProxyMiddleware (http_proxy / https_proxy / no_proxy of the environment, a
    `proxy` in request meta), with the no_proxy verdict cached per host: urllib's proxy_bypass()
    reads the whole environment on every call, a tenth of a millisecond per request."""

    def __init__(self, auth_encoding: str | None = "latin-1"):
        super().__init__(auth_encoding)
        self._bypass = functools.lru_cache(maxsize=4096)(proxy_bypass)

    def process_request(self, request: Request) -> None:
        if "proxy" in request.meta or not self.proxies:
            return super().process_request(request)
        parsed = urlparse_cached(request)
        scheme = parsed.scheme
        creds, proxy_url, use = None, None, None
        if (
            scheme not in ("http", "https")  # no_proxy is only read for http(s)
            or (parsed.hostname and not self._bypass(parsed.hostname))
        ) and scheme in self.proxies:
            use = scheme
            creds, proxy_url = self.proxies[scheme]
        self._set_proxy_and_creds(request, proxy_url, creds, use)
        return None


class LeanDownloaderStats(DownloaderStats):
    """Scrapy's downloader statistics (request, response, status and exception counts) without
    the byte counts, which re-serialise every request and the headers of every response; the
    crawl counts body bytes itself."""

    def process_request(self, request: Request) -> None:
        self.stats.inc_value("downloader/request_count")
        return None

    def process_response(self, request: Request, response: Response) -> Response:
        self.stats.inc_value("downloader/response_count")
        self.stats.inc_value(f"downloader/response_status_count/{response.status}")
        return response


# a `<meta http-equiv="refresh">` among the first 4,096 characters spells "refresh" in the first
# 16 KiB of an ASCII-compatible body (a character takes at most 4 bytes of UTF-8)
_REFRESH_SCAN = 4 * 4096


class CheapMetaRefreshMiddleware(MetaRefreshMiddleware):
    """Scrapy's MetaRefreshMiddleware, which decodes every HTML body whole to look at its first
    4,096 characters: a body whose first bytes cannot hold a refresh is passed on undecoded
    (UTF-16/32 bodies, with NUL bytes, always take Scrapy's path)."""

    def process_response(self, request: Request, response: Response) -> Response:
        head = response.body[:_REFRESH_SCAN]
        if b"\x00" not in head and b"refresh" not in head.lower():
            return response
        return super().process_response(request, response)


class QuietLogFormatter(LogFormatter):
    """Scrapy's log formatter, without the DEBUG "Crawled (200) <GET ...>" line of every response
    when the log level hides it anyway: Scrapy builds that record (and its referer) for every
    page before the handler drops it."""

    def __init__(self, debug: bool = False):
        self.debug = debug

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> QuietLogFormatter:
        level = crawler.settings.get("LOG_LEVEL") or "DEBUG"
        numeric = level if isinstance(level, int) else logging.getLevelName(str(level).upper())
        return cls(debug=isinstance(numeric, int) and numeric <= logging.DEBUG)

    def crawled(self, request: Request, response: Response, spider: Any) -> Any:
        return super().crawled(request, response, spider) if self.debug else None
