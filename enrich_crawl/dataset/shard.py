"""Stable record -> shard assignment by a hash of the registrable domain of the record's first URL.

Records of one site land in one shard, so the requests to a host come from one crawl process, and the
assignment is the same on every run and every machine (it does not depend on Python's hash seed).
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress
from urllib.parse import urlsplit

import tldextract

# offline: the suffix list snapshot bundled with tldextract, never fetched from the web
_extract = tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None)


def shard_keys(count: int) -> list[str]:
    width = max(2, len(str(count - 1)))
    return [f"s{i:0{width}d}" for i in range(count)]


@functools.lru_cache(maxsize=65536)
def registrable_domain(host: str) -> str:
    """`www.docs.python.org` -> `python.org`; IP literals and unknown suffixes are kept whole."""
    host = host.lower().strip(".")
    if not host:
        return ""
    try:
        ipaddress.ip_address(host.strip("[]"))
        return host
    except ValueError:
        pass
    parts = _extract(host)
    if parts.domain and parts.suffix:
        return f"{parts.domain}.{parts.suffix}"
    # reserved TLDs (.example, .test, .local) have no public suffix: use the last two labels
    labels = host.split(".")
    return ".".join(labels[-2:]) if len(labels) >= 2 else host


def host_of(url: str) -> str:
    try:
        return (urlsplit(url).hostname or "").lower()
    except ValueError:
        return ""


def shard_index(domain: str, count: int) -> int:
    digest = hashlib.blake2b(domain.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % count


def shard_for_urls(urls: list[str], keys: list[str]) -> str:
    """The shard of a record: by its first URL's registrable domain (records without URLs: by '')."""
    domain = registrable_domain(host_of(urls[0])) if urls else ""
    return keys[shard_index(domain, len(keys))]


def crawl_groups(keys: list[str], processes: int) -> list[list[str]]:
    """The run's shard keys dealt out into `processes` runs of neighbouring keys, as even as
    can be (8 shards in 2 processes: s00..s03 and s04..s07)."""
    count = max(1, min(processes, len(keys)))
    size, extra = divmod(len(keys), count)
    groups, start = [], 0
    for n in range(count):
        end = start + size + (1 if n < extra else 0)
        groups.append(keys[start:end])
        start = end
    return groups


def group_key(shards: list[str]) -> str:
    """A crawl step's mapping key: its shard (`s03`), or its first and last (`s00_s03`)."""
    return shards[0] if len(shards) == 1 else f"{shards[0]}_{shards[-1]}"
