"""How the crawler reaches a site, for the fetches made outside Scrapy (`enrich-crawl mapping test
--url`): a page the crawl reads must be readable there too, and one it cannot read must fail there
for the same reason.

- TLS: certificates are not verified, as Scrapy's default context factory does
  (`DOWNLOAD_VERIFY_CERTIFICATES` false: the crawler reads public pages, it sends nothing secret,
  and many sites the crawl must read serve expired, self-signed or incomplete chains); OpenSSL's
  `DEFAULT` ciphers (`DOWNLOADER_CLIENT_TLS_CIPHERS`), TLS 1.0 and later (Twisted's minimum), and
  legacy renegotiation allowed (Scrapy sets OP_LEGACY_SERVER_CONNECT: old servers). The crawl's
  Scrapy settings take VERIFY_CERTIFICATES and TLS_CIPHERS from here (crawl/settings.py).
- Proxy: `http_proxy` carries http and https alike and `no_proxy` is not read, as the crawl worker
  does (enrich_crawl.crawl.worker); without it, urllib reads the environment as Scrapy's
  HttpProxyMiddleware does (`https_proxy`, `no_proxy`).

Plain code: nothing here imports Scrapy or Twisted.
"""

from __future__ import annotations

import ssl
import urllib.request
import warnings

from enrich_crawl import config

VERIFY_CERTIFICATES = False  # Scrapy's DOWNLOAD_VERIFY_CERTIFICATES default
TLS_CIPHERS = "DEFAULT"  # Scrapy's DOWNLOADER_CLIENT_TLS_CIPHERS default
# OpenSSL's SSL_OP_LEGACY_SERVER_CONNECT (not exported by every Python's ssl module)
_OP_LEGACY_SERVER_CONNECT = getattr(ssl, "OP_LEGACY_SERVER_CONNECT", 0x4)


def crawler_ssl_context() -> ssl.SSLContext:
    """An SSLContext with the crawler's TLS policy (see the module's docstring)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if VERIFY_CERTIFICATES:
        context.load_default_certs()
    else:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    context.set_ciphers(TLS_CIPHERS)
    with warnings.catch_warnings():  # Python deprecates TLS 1.0; the crawl still speaks it
        warnings.simplefilter("ignore", DeprecationWarning)
        context.minimum_version = ssl.TLSVersion.TLSv1
    context.options |= ssl.OP_ALL | _OP_LEGACY_SERVER_CONNECT
    return context


def crawler_proxies(proxy: str | None = None) -> dict[str, str] | None:
    """The proxies by scheme the crawl uses: `proxy` (default: http_proxy) for http and https,
    or None when none is set (urllib then reads the environment, as Scrapy does)."""
    proxy = proxy or config.http_proxy()
    return {"http": proxy, "https": proxy} if proxy else None


def crawler_opener(proxy: str | None = None) -> urllib.request.OpenerDirector:
    """A urllib opener that fetches as the crawler does: its TLS policy and its proxy."""
    return urllib.request.build_opener(
        urllib.request.ProxyHandler(crawler_proxies(proxy)),
        urllib.request.HTTPSHandler(context=crawler_ssl_context()),
    )
