"""The crawl's downloader middlewares and extensions, by concern: guards.py (the goal, the URL
policy, redirect loops, binary downloads), politeness.py (robots.txt, per-host delays), retry.py
(transient failures, with backoff), lean.py (Scrapy's own, doing less per request).

Order of `process_request` (lowest first, closest to the engine): GoalMiddleware, UrlPolicyMiddleware,
RobotsMiddleware; on the way back RedirectLoopMiddleware before Scrapy's redirects, and
BackoffRetryMiddleware (enrich_crawl.crawl.settings holds the numbers).
"""

from enrich_crawl.crawl.middlewares.guards import (
    DownloadGuard,
    GoalMiddleware,
    RedirectLoopMiddleware,
    UrlPolicyMiddleware,
)
from enrich_crawl.crawl.middlewares.lean import (
    CheapMetaRefreshMiddleware,
    LeanDownloaderStats,
    ProxyMiddleware,
    QuietLogFormatter,
)
from enrich_crawl.crawl.middlewares.politeness import RobotsMiddleware, Throttle
from enrich_crawl.crawl.middlewares.retry import BackoffRetryMiddleware

__all__ = [
    "BackoffRetryMiddleware",
    "CheapMetaRefreshMiddleware",
    "DownloadGuard",
    "GoalMiddleware",
    "LeanDownloaderStats",
    "ProxyMiddleware",
    "QuietLogFormatter",
    "RedirectLoopMiddleware",
    "RobotsMiddleware",
    "Throttle",
    "UrlPolicyMiddleware",
]
