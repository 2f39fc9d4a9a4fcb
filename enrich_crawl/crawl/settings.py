"""Scrapy settings of a crawl worker, derived from the dataset's CrawlConfig (documented here).

The crawl replaces four Scrapy components with polite ones (see their modules):
SCHEDULER (per-host ready times), DOWNLOADER (the fleet-wide limiter before each send),
TWISTED_DNS_RESOLVER (refuses internal addresses at connect time), and robots/AutoThrottle/retries.

With `render=True` (some mapping renders `js` or `auto`) the http/https download handler is the
browser handler (enrich_crawl.crawl.render_handler, scrapy-playwright with ENRICH_CHROMIUM); it
downloads every other request exactly as Scrapy's HTTP/1.1 handler does. Without it nothing of
Playwright is loaded.
"""

from __future__ import annotations

from typing import Any

from enrich_crawl.config import CrawlConfig
from enrich_crawl.crawl.params import WorkerParams
from enrich_crawl.crawl.transport import TLS_CIPHERS, VERIFY_CERTIFICATES

_CRAWL = "enrich_crawl.crawl"
_MW = f"{_CRAWL}.middlewares"  # guards, politeness, retry, lean

# transient failures only: DNS failures (CannotResolveHostError) are not retried
RETRY_EXCEPTIONS = [
    "scrapy.exceptions.DownloadConnectionRefusedError",
    "scrapy.exceptions.DownloadFailedError",
    "scrapy.exceptions.DownloadTimeoutError",
    "scrapy.exceptions.ResponseDataLossError",
    "twisted.internet.error.ConnectionDone",
    "twisted.internet.error.ConnectError",
    "twisted.internet.error.ConnectionLost",
    "scrapy.core.downloader.handlers.http11.TunnelError",
]


def build_settings(params: WorkerParams, *, render: bool = False) -> dict[str, Any]:
    config: CrawlConfig = params.crawl_config
    settings = _crawl_settings(params, config)
    if render:
        from enrich_crawl.crawl.render import RenderConfig, playwright_settings

        # defaults < ENRICH_RENDER_* of the worker's environment < the params' `render`
        render_config = RenderConfig.from_mapping(
            {**RenderConfig.env_overrides(), **params.render}, timeout=config.render_timeout
        )
        settings.update(
            playwright_settings(
                chromium=params.chromium,
                config=render_config,
                user_agent=params.user_agent,
            )
        )
        middlewares = settings["DOWNLOADER_MIDDLEWARES"]
        middlewares[f"{_MW}.guards.UrlPolicyMiddleware"] = None
        middlewares[f"{_CRAWL}.render.RenderUrlPolicyMiddleware"] = 60
    if _has_uvloop():
        settings["ASYNCIO_EVENT_LOOP"] = "uvloop.Loop"
    return settings


def _has_uvloop() -> bool:
    """The crawl's asyncio event loop is uvloop's (libuv, in C) where it is installed: Twisted's
    reactor runs on it as on asyncio's own, and the loop's part of every event (timers, ready
    callbacks, polling the sockets) costs less. Measured on one worker, 2,500 records without
    delays, two interleaved pairs: the worker 1.23 and 1.19x the floor against 1.29 and 1.28x on
    asyncio's loop (bench.e2e.attribution)."""
    import importlib.util

    return importlib.util.find_spec("uvloop") is not None


def _crawl_settings(params: WorkerParams, config: CrawlConfig) -> dict[str, Any]:
    return {
        "BOT_NAME": "enrich_crawl",
        "USER_AGENT": params.user_agent,
        "ENRICH_CRAWL_CONFIG": config.to_dict(),
        "DEFAULT_REQUEST_HEADERS": {
            "Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,"
            "application/json;q=0.8,*/*;q=0.5",
            "Accept-Language": "en;q=1.0,*;q=0.5",
        },
        # our RobotsMiddleware replaces Scrapy's (RFC 9309 error rules, Crawl-delay, caching)
        "ROBOTSTXT_OBEY": False,
        "SCHEDULER": f"{_CRAWL}.scheduler.PoliteScheduler",
        "DOWNLOADER": f"{_CRAWL}.downloader.PoliteDownloader",
        "TWISTED_DNS_RESOLVER": f"{_CRAWL}.dns_resolver.PrivateRefusingResolver",
        "CONCURRENT_REQUESTS": config.concurrent_requests,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 1,  # one request at a time per host
        "DOWNLOAD_DELAY": config.default_delay,
        "DOWNLOAD_DELAY_JITTER": 0.0,  # jitter would send requests closer than Crawl-delay
        "AUTOTHROTTLE_ENABLED": False,  # replaced by our Throttle, which respects per-host floors
        "AUTOTHROTTLE_TARGET_CONCURRENCY": 1.0,
        "DOWNLOAD_TIMEOUT": config.download_timeout,
        "DOWNLOAD_MAXSIZE": config.max_page_bytes,
        "DOWNLOAD_WARNSIZE": 0,
        # Scrapy's defaults, named here because `mapping test` fetches with the same policy
        # outside Scrapy (enrich_crawl.crawl.transport)
        "DOWNLOAD_VERIFY_CERTIFICATES": VERIFY_CERTIFICATES,
        "DOWNLOADER_CLIENT_TLS_CIPHERS": TLS_CIPHERS,
        "RETRY_ENABLED": config.retries > 0,
        "RETRY_TIMES": config.retries,
        "RETRY_HTTP_CODES": [500, 502, 503, 504, 522, 524, 408, 429],
        "RETRY_EXCEPTIONS": RETRY_EXCEPTIONS,
        "RETRY_PRIORITY_ADJUST": 0,
        "REDIRECT_MAX_TIMES": 10,
        "METAREFRESH_MAXDELAY": 5,
        "COOKIES_ENABLED": False,
        "TELNETCONSOLE_ENABLED": False,
        # Scrapy 2.19's remote control runs arbitrary Python sent to a local HTTP port and writes
        # job files to the user's profile: nothing a crawl worker should expose
        "REMOTE_CONTROL_ENABLED": False,
        "CONCURRENT_ITEMS": 1,  # see MEASUREMENTS.md: 100 starts 100 tasks per response
        "DNSCACHE_ENABLED": True,
        "DNS_TIMEOUT": 15,
        "LOG_LEVEL": params.log_level,
        "LOGSTATS_INTERVAL": 0,
        "MEMUSAGE_ENABLED": False,
        "HTTPERROR_ALLOWED_CODES": [],
        "DEPTH_LIMIT": 0,  # depth is per record, enforced by the frontier
        # every spider middleware wraps each page's output in one more async generator: Scrapy's
        # request depth (the frontier counts depth per record) and its meta-copy warning (the
        # spider builds each request's meta afresh) are left out
        "SPIDER_MIDDLEWARES": {
            "scrapy.spidermiddlewares.depth.DepthMiddleware": None,
            "scrapy.spidermiddlewares.metacopy.MetaCopyDetectionMiddleware": None,
        },
        "CLOSESPIDER_TIMEOUT": config.time_budget_seconds or 0,
        "DOWNLOADER_MIDDLEWARES": {
            f"{_MW}.guards.GoalMiddleware": 50,
            f"{_MW}.guards.UrlPolicyMiddleware": 60,
            f"{_MW}.politeness.RobotsMiddleware": 100,
            "scrapy.downloadermiddlewares.robotstxt.RobotsTxtMiddleware": None,
            "scrapy.downloadermiddlewares.offsite.OffsiteMiddleware": None,
            "scrapy.downloadermiddlewares.retry.RetryMiddleware": None,
            f"{_MW}.retry.BackoffRetryMiddleware": 550,
            # Scrapy's own, minus per-request work a crawl worker does not need (see their
            # docstrings): the same priorities
            "scrapy.downloadermiddlewares.redirect.MetaRefreshMiddleware": None,
            f"{_MW}.lean.CheapMetaRefreshMiddleware": 580,
            "scrapy.downloadermiddlewares.httpproxy.HttpProxyMiddleware": None,
            f"{_MW}.lean.ProxyMiddleware": 750,
            "scrapy.downloadermiddlewares.stats.DownloaderStats": None,
            f"{_MW}.lean.LeanDownloaderStats": 850,
            # above RedirectMiddleware (600): sees a 3xx before it is followed
            f"{_MW}.guards.RedirectLoopMiddleware": 650,
        },
        # only the Scrapy extensions a crawl worker uses: the others (telnet, memory usage, feed
        # export, log stats, job state, AutoThrottle, remote control, core stats) would each be
        # imported to say NotConfigured or count what stats.json counts already (RemoteControl
        # alone imports aiohttp: 0.2 s of every worker's start); CloseSpider runs time budgets
        "EXTENSIONS_BASE": {
            "scrapy.extensions.logcount.LogCount": 0,
            "scrapy.extensions.closespider.CloseSpider": 0,
        },
        "EXTENSIONS": {
            f"{_MW}.politeness.Throttle": 0,
            f"{_MW}.guards.DownloadGuard": 0,
        },
        "LOG_FORMATTER": f"{_MW}.lean.QuietLogFormatter",
        "ENRICH_PROXY": params.proxy or "",
        "ENRICH_ALLOW_PRIVATE": params.allow_private,
        "TWISTED_REACTOR": "twisted.internet.asyncioreactor.AsyncioSelectorReactor",
    }
