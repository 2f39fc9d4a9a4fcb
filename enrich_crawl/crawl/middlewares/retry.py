"""Retries of transient failures only, after an exponential backoff that the PoliteScheduler
enforces (the retried request's NOT_BEFORE)."""

from __future__ import annotations

import email.utils
import time
from typing import TYPE_CHECKING, Any

from scrapy import Request
from scrapy.downloadermiddlewares.retry import RetryMiddleware

from enrich_crawl.crawl.context import crawl_config
from enrich_crawl.crawl.errors import reason_for_exception, reason_for_response
from enrich_crawl.crawl.scheduler import NOT_BEFORE

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.http import Response


class BackoffRetryMiddleware(RetryMiddleware):
    """Scrapy's retries for transient failures only (RETRY_HTTP_CODES, timeouts, resets), each
    after an exponential backoff (crawl.retry_backoff doubling, at least the host's delay, a
    Retry-After answer honoured up to crawl.retry_backoff_max). A proxy's "no such host" answer,
    DNS failures and refused internal addresses are not retried."""

    base: float  # seconds before the first retry (crawl.retry_backoff)
    cap: float  # the longest wait (crawl.retry_backoff_max)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> BackoffRetryMiddleware:
        middleware = super().from_crawler(crawler)
        config = crawl_config(crawler)
        middleware.base = config.retry_backoff
        middleware.cap = config.retry_backoff_max
        return middleware

    def _backoff(self, request: Request, retry_after: float | None = None) -> float:
        attempt = request.meta.get("retry_times", 0)
        delay = self.base * (2**attempt)
        slot = self.crawler.engine.downloader.slots.get(request.meta.get("download_slot", ""))
        if slot is not None:
            delay = max(delay, slot.delay)
        if retry_after is not None:
            delay = max(delay, retry_after)
        return min(delay, self.cap)

    @staticmethod
    def _retry_after(response: Response) -> float | None:
        value = response.headers.get(b"Retry-After")
        if not value:
            return None
        text = value.decode("latin-1").strip()
        try:
            return max(0.0, float(text))
        except ValueError:
            pass
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        return max(0.0, when.timestamp() - time.time())

    def process_response(self, request: Request, response: Response, spider: Any = None):
        if request.meta.get("dont_retry", False) or response.status not in self.retry_http_codes:
            return response
        if reason_for_response(response.status, response.headers) == "dns":
            return response  # the proxy says the name does not exist: not transient
        retry_after = self._retry_after(response)
        if retry_after is not None and retry_after > self.cap:
            return response  # the server asks for more patience than a run has
        new = self._retry(request, f"{response.status}")
        if new is None:
            return response
        new.meta[NOT_BEFORE] = time.monotonic() + self._backoff(request, retry_after)
        return new

    def process_exception(self, request: Request, exception: Exception, spider: Any = None):
        if reason_for_exception(exception, request) in ("dns", "private_address", "too_large"):
            return None
        new = super().process_exception(request, exception)
        if isinstance(new, Request):
            new.meta[NOT_BEFORE] = time.monotonic() + self._backoff(request)
        return new
