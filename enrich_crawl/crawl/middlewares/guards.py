"""Guards on the way to the network: GoalMiddleware drops requests nobody needs any more;
UrlPolicyMiddleware refuses internal addresses and denied URLs (enrich_crawl.crawl.policy); on the
way back, RedirectLoopMiddleware stops a redirect that comes back to a URL of its own chain before
Scrapy follows it; the DownloadGuard extension stops downloads of binary content as soon as the
headers show it, and cuts robots.txt at 500 KiB.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from scrapy import Request, signals
from scrapy.exceptions import StopDownload

from enrich_crawl.crawl.context import CrawlContext, crawl_config
from enrich_crawl.crawl.errors import STOP_REASON, Refused
from enrich_crawl.crawl.policy import UrlPolicy
from enrich_crawl.crawl.robots import MAX_ROBOTS_BYTES, ROBOTS_FETCH
from enrich_crawl.urls import canonical, join_url

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.http import Response

# content types that can never hold field values: stop the download at the headers
BINARY_TYPES = (
    "image/",
    "audio/",
    "video/",
    "font/",
    "application/pdf",
    "application/zip",
    "application/gzip",
    "application/x-",
    "application/vnd.",
    "application/msword",
    "application/octet-stream",
    "application/java-archive",
    "application/wasm",
)


class GoalMiddleware:
    """Drop a request when every record waiting for its page is already done (the scheduler does
    it when the request comes up; this catches requests that reach the downloader otherwise)."""

    def __init__(self, crawler: Crawler):
        self.crawler = crawler

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> GoalMiddleware:
        return cls(crawler)

    def process_request(self, request: Request) -> None:
        if CrawlContext.of(self.crawler).is_unwanted(request):
            self.crawler.stats.inc_value("enrich/dropped_goal_reached")
            raise Refused("goal_reached")


class UrlPolicyMiddleware:
    """enrich_crawl.crawl.policy.UrlPolicy on every request, redirects included."""

    def __init__(self, crawler: Crawler):
        self.crawler = crawler
        settings = crawler.settings
        self.policy = UrlPolicy(
            crawl_config(crawler),
            allow_private=settings.getbool("ENRICH_ALLOW_PRIVATE"),
            claimed=self._claimed,
        )

    def _claimed(self, url: str) -> bool:
        claims = CrawlContext.of(self.crawler).claims
        return bool(claims is not None and claims(url))

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> UrlPolicyMiddleware:
        return cls(crawler)

    def process_request(self, request: Request) -> None:
        verdict = self.policy.check(request.url, robots_fetch=bool(request.meta.get(ROBOTS_FETCH)))
        if verdict is not None:
            reason, detail = verdict
            self.crawler.stats.inc_value(f"enrich/refused/{reason}")
            raise Refused(reason, detail)


class RedirectLoopMiddleware:
    """A redirect to a URL already in its own chain is a loop: stop it at once (`redirect_loop`)
    instead of fetching it again up to REDIRECT_MAX_TIMES. The Location is resolved as a browser
    resolves it (WHATWG URL Standard, `urls.join_url`) and handed to Scrapy's RedirectMiddleware
    absolute, so the redirect followed is the one a browser would follow."""

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> RedirectLoopMiddleware:
        return cls()

    def process_response(self, request: Request, response: Response, spider: Any = None):
        if not 300 <= response.status < 400 or b"Location" not in response.headers:
            return response
        raw = response.headers[b"Location"]
        try:  # what browsers do with a non-ASCII Location: UTF-8, else each byte a character
            location = raw.decode("utf-8")
        except UnicodeDecodeError:
            location = raw.decode("latin-1")
        target = join_url(request.url, location)
        if target is None:  # not a URL: left to Scrapy (which does not follow it either)
            return response
        # the same URL up to spelling (query order, escapes): tracking parameters count here, a
        # server may redirect `/x` to `/x?utm_source=...` and serve it
        try:
            chain = {
                canonical(u, keep_fragment=False)
                for u in [*request.meta.get("redirect_urls", []), request.url]
            }
            looped = canonical(target, keep_fragment=False) in chain
        except ValueError:
            looped = False
        if looped:
            raise Refused("redirect_loop", f"{request.url} redirects back to {target}")
        if target != location:
            headers = response.headers.copy()
            headers[b"Location"] = target
            response = response.replace(headers=headers)
        return response


class DownloadGuard:
    """Stop what must not be downloaded as soon as it shows: binary bodies (at the headers, reason
    `not_text`) and robots.txt beyond 500 KiB (cut there, the rest ignored as RFC 9309 allows)."""

    def __init__(self, crawler: Crawler):
        self.crawler = crawler
        self.stopped: Counter[str] = Counter()
        crawler.signals.connect(self._headers, signal=signals.headers_received)
        crawler.signals.connect(self._bytes, signal=signals.bytes_received)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> DownloadGuard:
        return cls(crawler)

    def _headers(self, headers, body_length, request, spider=None) -> None:
        if request.meta.get(ROBOTS_FETCH):
            return
        ctype = (headers.get(b"Content-Type") or b"").decode("latin-1").lower().strip()
        if ctype.startswith(BINARY_TYPES):
            self.stopped["not_text"] += 1
            request.meta[STOP_REASON] = "not_text"
            raise StopDownload(fail=True)

    def _bytes(self, data, request, spider=None) -> None:
        if not request.meta.get(ROBOTS_FETCH):
            return
        received = request.meta.get("enrich_robots_bytes", 0) + len(data)
        request.meta["enrich_robots_bytes"] = received
        if received > MAX_ROBOTS_BYTES:
            self.stopped["robots_truncated"] += 1
            raise StopDownload(fail=False)
