"""Which URLs the crawler may fetch at all (before robots.txt): plain Python, no Scrapy.

In order, a URL is refused with
- `invalid_url` when it is not an http(s) URL with a valid host;
- `private_address` when its host is a loopback, private, link-local or otherwise internal IP
  literal (any spelling), unless ENRICH_ALLOW_PRIVATE=1 (names are checked when they are resolved,
  see enrich_crawl.crawl.dns_resolver);
- `denied` when its extension is a binary, document or media type, when its host is on the deny
  list (the huge-sites list plus `crawl.deny_domains`) and no mapping claims the URL, when it is
  outside `crawl.allowed_domains`, matches no `crawl.allow` regex (when any) or matches a
  `crawl.deny` regex.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable, Iterable
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple
from urllib.parse import urlsplit

from enrich_crawl.config import PACKAGE_DIR, CrawlConfig
from enrich_crawl.dataset.shard import registrable_domain
from enrich_crawl.urls import private_ip

HUGE_SITES_FILE = PACKAGE_DIR / "data" / "huge_sites.txt"

DEFAULT_DENY_EXTENSIONS = (
    # archives, binaries, documents, media, fonts: never worth a crawl for field values
    *("7z", "apk", "bin", "bz2", "cab", "deb", "dmg", "exe", "gz", "iso", "jar", "msi", "pkg"),
    *("rar", "rpm", "tar", "tgz", "xz", "zip", "zst", "whl", "egg", "img", "vmdk"),
    *("csv", "doc", "docx", "eps", "key", "numbers", "odg", "odp", "ods", "odt", "pages", "pdf"),
    *("ppt", "pptx", "ps", "psd", "rtf", "xls", "xlsx", "xps", "ai", "indd", "epub", "mobi"),
    *("aac", "aiff", "avi", "flac", "flv", "m4a", "m4v", "mid", "mkv", "mov", "mp3", "mp4"),
    *("mpeg", "mpg", "ogg", "oga", "ogv", "opus", "wav", "webm", "wma", "wmv", "3gp"),
    *("avif", "bmp", "gif", "heic", "ico", "jpeg", "jpg", "png", "svg", "svgz", "tif", "tiff"),
    *("webp", "raw", "cr2", "nef"),
    *("eot", "otf", "ttf", "woff", "woff2", "swf", "dll", "so", "class", "pyc", "wasm"),
    *("css", "js", "mjs", "map"),
)


def read_domain_list(path: Path | str) -> frozenset[str]:
    """Domains of a list file: one per line, `#` comments, blank lines ignored."""
    domains = set()
    for line in Path(path).expanduser().read_text(encoding="utf-8").splitlines():
        entry = line.split("#", 1)[0].strip().lower().strip(".")
        if entry:
            domains.add(entry)
    return frozenset(domains)


@lru_cache(maxsize=8)
def _cached_list(path: str) -> frozenset[str]:
    return read_domain_list(path)


def domain_in(host: str, domains: frozenset[str] | set[str]) -> bool:
    """`host` is one of `domains` or a subdomain of one (checked label by label)."""
    if not domains:
        return False
    labels = host.split(".")
    return any(".".join(labels[i:]) in domains for i in range(len(labels)))


HOST_VERDICTS = 50_000  # hosts whose verdict a policy remembers (a crawl meets each many times)


class _HostVerdict(NamedTuple):
    reason: str
    detail: str
    claimable: bool = False  # a URL some mapping claims is fetched all the same (huge sites)


class UrlPolicy:
    def __init__(
        self,
        config: CrawlConfig,
        *,
        allow_private: bool,
        claimed: Callable[[str], bool] | None = None,
    ):
        self.allow_private = allow_private
        self.claimed = claimed  # URL -> a mapping claims it (exempts it from the huge-sites list)
        self.deny_extensions = frozenset(
            e.lower().lstrip(".") for e in (config.deny_extensions or DEFAULT_DENY_EXTENSIONS)
        )
        domains: set[str] = {d.lower().strip(".") for d in config.deny_domains}
        if config.huge_sites:
            domains |= _cached_list(str(config.huge_sites_file or HUGE_SITES_FILE))
        self.deny_domains = frozenset(domains)
        self.allowed_domains = frozenset(d.lower().strip(".") for d in config.allowed_domains)
        self.allow = [re.compile(p) for p in config.allow]
        self.deny = [re.compile(p) for p in config.deny]
        # host -> what the host alone decides, or None: the IP check and the allowed and denied
        # domains (the public-suffix lookup of the deny list costs more than the rest of a
        # check) are the same for every URL of a host
        self._hosts: OrderedDict[str, _HostVerdict | None] = OrderedDict()

    def _host_verdict(self, host: str) -> _HostVerdict | None:
        try:
            verdict = self._hosts[host]
        except KeyError:
            pass
        else:
            self._hosts.move_to_end(host)
            return verdict
        verdict = None
        if not self.allow_private and private_ip(host):
            verdict = _HostVerdict("private_address", f"{host} is an internal address")
        elif self.allowed_domains and not domain_in(host, self.allowed_domains):
            verdict = _HostVerdict("denied", f"{host} is outside allowed_domains")
        elif domain_in(host, self.deny_domains) or registrable_domain(host) in self.deny_domains:
            verdict = _HostVerdict("denied", f"{host} is on the deny list of huge sites", True)
        self._hosts[host] = verdict
        if len(self._hosts) > HOST_VERDICTS:
            self._hosts.popitem(last=False)
        return verdict

    def check(self, url: str, *, robots_fetch: bool = False) -> tuple[str, str] | None:
        """None when `url` may be fetched, else (reason, detail)."""
        try:
            parts = urlsplit(url)
            host = (parts.hostname or "").lower()
        except ValueError as exc:
            return "invalid_url", str(exc)
        if parts.scheme not in ("http", "https") or not host:
            return "invalid_url", f"not an http(s) URL: {url[:100]}"
        verdict = self._host_verdict(host)
        if verdict is not None and verdict.reason == "private_address":
            return verdict.reason, verdict.detail
        if robots_fetch:
            return None
        path = parts.path.lower()
        last = path.rsplit("/", 1)[-1]
        if "." in last:
            ext = last.rsplit(".", 1)[-1]
            if ext in self.deny_extensions:
                return "denied", f"extension .{ext}"
        if verdict is not None and not (
            verdict.claimable and self.claimed is not None and self.claimed(url)
        ):
            return verdict.reason, verdict.detail
        if self.allow and not any(p.search(url) for p in self.allow):
            return "denied", "matches no crawl.allow pattern"
        for pattern in self.deny:
            if pattern.search(url):
                return "denied", f"matches crawl.deny pattern {pattern.pattern!r}"
        return None

    def filter(self, urls: Iterable[str]) -> list[str]:
        return [u for u in urls if self.check(u) is None]
