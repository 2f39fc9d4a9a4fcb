"""DNS resolution that refuses private addresses at connect time (`TWISTED_DNS_RESOLVER`).

A URL policy that resolved a name before the request and let Scrapy resolve it again to connect
could be fooled by a name that answers a public address first and a private one next (DNS
rebinding). Refusing in the resolver the crawler connects with closes that gap: whatever a dataset
or a page links to, the crawler never opens a connection to a loopback, private, link-local or
otherwise internal address unless ENRICH_ALLOW_PRIVATE=1.

With a proxy the crawler connects only to the proxy (which resolves the sites' names itself); the
proxy's own host is exempt, and literal internal IPs in URLs are refused by the URL policy instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from scrapy.resolver import CachingThreadedResolver
from twisted.internet import defer
from twisted.internet.error import DNSLookupError

from enrich_crawl import config
from enrich_crawl.crawl.errors import PRIVATE_MARK, PRIVATE_NAMES
from enrich_crawl.urls import private_ip

if TYPE_CHECKING:
    from scrapy.crawler import Crawler


class PrivateAddressRefused(DNSLookupError):
    """A host name resolved to an internal address."""


class PrivateRefusingResolver(CachingThreadedResolver):
    def __init__(
        self,
        reactor: Any,
        cache_size: int,
        timeout: float,
        *,
        allow_private: bool,
        exempt: set[str],
    ):
        super().__init__(reactor, cache_size, timeout)
        self.allow_private = allow_private
        self.exempt = exempt

    @classmethod
    def from_crawler(cls, crawler: Crawler, reactor: Any) -> PrivateRefusingResolver:
        settings = crawler.settings
        cache_size = settings.getint("DNSCACHE_SIZE") if settings.getbool("DNSCACHE_ENABLED") else 0
        exempt = set()
        proxies = [settings.get("ENRICH_PROXY") or ""]
        proxies += config.proxy_urls()
        for proxy in filter(None, proxies):
            host = urlsplit(proxy if "://" in proxy else f"http://{proxy}").hostname
            if host:
                exempt.add(host.lower())
        return cls(
            reactor,
            cache_size,
            settings.getfloat("DNS_TIMEOUT"),
            allow_private=settings.getbool("ENRICH_ALLOW_PRIVATE"),
            exempt=exempt,
        )

    def getHostByName(self, name: str, timeout: Any = ()) -> defer.Deferred:
        deferred = super().getHostByName(name, timeout)
        if self.allow_private or name.lower() in self.exempt:
            return deferred
        return deferred.addCallback(self._refuse_private, name)

    @staticmethod
    def _refuse_private(address: str, name: str) -> str:
        if private_ip(address):
            PRIVATE_NAMES.add(name.lower())
            raise PrivateAddressRefused(f"{PRIVATE_MARK}: {name} resolves to {address}")
        return address
