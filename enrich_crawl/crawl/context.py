"""What the components of one crawl share, found through the crawler, never through the spider.

Scrapy builds the spider, the scheduler, the downloader and the middlewares separately; each of
them asks `CrawlContext.of(crawler)` for the one context of the crawl (made on first use, as
Scrapy's own components find each other with `crawler.get_extension`). The crawl's configuration
is parsed into it once from the ENRICH_CRAWL_CONFIG setting (as scrapy-playwright's
Config.from_settings); the spider fills in what it opens: the run's page cache, the persistent
state and the shared limiter once the database answers, and the goal test of its frontier; the
browser's handler registers its statistics when pages render.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from enrich_crawl.config import CrawlConfig

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler

    from enrich_crawl.crawl.host_limiter import HostLimiter
    from enrich_crawl.crawl.pagecache import PageCache
    from enrich_crawl.crawl.state import CrawlState

CONFIG_SETTING = "ENRICH_CRAWL_CONFIG"  # CrawlConfig.to_dict() of the crawl


@dataclass
class CrawlContext:
    config: CrawlConfig
    pages: PageCache | None = None  # the run's pages and robots spill (the spider's)
    state: CrawlState | None = None  # MongoDB state, when the database answered
    limiter: HostLimiter | None = None  # the fleet-wide per-host limiter, when shared
    # whether nobody waits for a request's page any more (the frontier's goal test)
    unwanted: Callable[[Request], bool] | None = None
    # whether a URL is one the crawl asked for itself (a record's seed or a followed link)
    claims: Callable[[str], bool] | None = None
    # whether the scheduler drops a request nobody waits for (it then drops its page's waits)
    discard: Callable[[Request], bool] | None = None
    # the browser's statistics (render_handler.RenderDownloadHandler.snapshot), when pages render
    browser_snapshot: Callable[[], dict[str, Any]] | None = None

    @classmethod
    def of(cls, crawler: Crawler) -> CrawlContext:
        context: Any = getattr(crawler, "enrich_context", None)
        if context is None:
            mapping = crawler.settings.getdict(CONFIG_SETTING) or None
            context = cls(CrawlConfig.from_mapping(mapping))
            crawler.enrich_context = context  # type: ignore[attr-defined]
        return context

    def is_unwanted(self, request: Request) -> bool:
        return self.unwanted is not None and self.unwanted(request)


def crawl_config(crawler: Crawler) -> CrawlConfig:
    """The crawl's configuration, parsed once per crawler (CrawlContext): the one source every
    component reads; no other setting repeats a field of it."""
    return CrawlContext.of(crawler).config
