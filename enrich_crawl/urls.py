"""URL handling shared by the loader, the extractor and the crawler.

URLs are parsed as a browser parses them: by ada (a WHATWG URL Standard parser), for dataset cells,
links found in pages (resolved against the page's URL or its `<base href>`) and redirects. The URL
that is fetched is the parser's serialisation (`href`); the canonical form that recognises the same
page (fragment and tracking parameters dropped, query sorted, escapes normalised) is only the key
of `page_key`, never what is fetched. On top of the standard, the product's own policies refuse
unsupported schemes, credentials, host names no DNS lookup can resolve and single-label host
names (`http://exa/`: no public web site has one; an intranet may, so ENRICH_ALLOW_PRIVATE=1
lets them through); private addresses are refused at fetch time (`enrich_crawl.crawl.policy`),
with `private_ip` from here.

Reasons returned here use the reasons of a result document's `errors` (`invalid_url`, ...),
followed by a short explanation after a colon.
"""

from __future__ import annotations

import functools
import ipaddress
import re
import socket
from urllib.parse import parse_qsl, unquote, urldefrag, urlencode, urlsplit, urlunsplit

from ada_url import URL, HostType
from w3lib.url import canonicalize_url, safe_url_string

from enrich_crawl import config

# -- URL cells -------------------------------------------------------------------------------------

# what starts the next URL after a `,` or `;` in a URL cell: a scheme and `//`, or `www.`
URL_START = r"[A-Za-z][A-Za-z0-9+.-]*://|[Ww][Ww][Ww]\."
_CELL_SEPARATOR = re.compile(rf"\s+|[,;]+(?=\s*(?:{URL_START}))")
# a `,` or `;` at either end of a piece is list punctuation, never part of the URL
LIST_PUNCTUATION = ",;"


def split_url_cell(cell: object) -> list[str]:
    """The URLs of a cell: separated by whitespace, or by `,`/`;` directly followed by the next
    URL (optional whitespace, then `scheme://` or `www.`). A comma or semicolon inside a URL
    belongs to it (`/article/0,8599,2011497,00.html`, `/item;jsessionid=A1B2`); one at either end
    of a piece is list punctuation (`a.com/x, b.com/y`) and is dropped.

    `enrich_crawl.dataset.clean` does the same on whole columns with Arrow; the tests hold them
    equal.
    """
    if cell is None:
        return []
    if isinstance(cell, (list, tuple)):
        out: list[str] = []
        for item in cell:
            out.extend(split_url_cell(item))
        return out
    text = str(cell).strip()
    if not text:
        return []
    pieces = (piece.strip(LIST_PUNCTUATION) for piece in _CELL_SEPARATOR.split(text))
    return [piece for piece in pieces if piece]


# -- parsing and the product's policies ------------------------------------------------------------

_HAS_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
# "example.org/x" or "example.org:8080/x": a host without a scheme (a browser's address bar adds
# http://; the URL Standard would read `example.org:` as a scheme)
_HOSTLIKE = re.compile(
    r"^(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+[A-Za-z]{2,63}\.?(?::\d+)?(?:[/?#]|$)"
)
# the URL Standard strips leading and trailing C0 controls and spaces and removes every tab and
# newline: done here too, before our own checks look at the scheme
_TAB_OR_NEWLINE = re.compile(r"[\t\n\r]")
_C0_OR_SPACE = "".join(chr(c) for c in range(0x21))
# a name DNS can look up: labels of letters, digits, `-` or `_`, 1-63 characters, 253 in all
_DNS_NAME = re.compile(r"^(?:[a-z0-9_-]{1,63}\.)*[a-z0-9_-]{1,63}\.?$")
_ENDS_IN_NUMBER = re.compile(r"(?:^|\.)(?:\d+|0x[0-9a-f]*)\.?$")
# the authority of a URL the parser refused, to say which part was wrong
_AUTHORITY = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:[/\\]*([^/\\?#]*)")
# a cell quoted as a whole: "<http://x>" (RFC 3986 appendix C), "'http://x'", '"http://x"'
_QUOTE_PAIRS = {"<": ">", '"': '"', "'": "'"}
# query parameters that only track the visitor: dropped from page keys (one page, one fetch)
TRACKING_PARAMS = re.compile(
    r"^(?:utm_[a-z_]+|gclid|dclid|fbclid|msclkid|mc_cid|mc_eid|yclid|_ga|_gl|igshid|"
    r"ref_src|spm|scid)$",
    re.IGNORECASE,
)
WEB_SCHEMES = ("http", "https")
# a name for this machine by definition (RFC 6761): refused as `private_address` when the crawler
# resolves it (enrich_crawl.crawl.dns_resolver), like the loopback address it names
LOOPBACK_NAMES = frozenset({"localhost"})
SINGLE_LABEL = "invalid_url: single-label host"


def _prepare(text: str) -> str:
    """The input the URL Standard parses: C0 controls and spaces stripped, tabs and newlines gone,
    lone surrogates (which no UTF-8 can carry) replaced by U+FFFD as a browser does."""
    text = text.strip(_C0_OR_SPACE)
    if "\t" in text or "\n" in text or "\r" in text:
        text = _TAB_OR_NEWLINE.sub("", text)
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


def _unquoted(text: str) -> str:
    """A cell quoted as a whole loses its quotes (only a matching pair: a lone trailing quote may
    end a query, `http://host/?'`)."""
    while len(text) >= 2 and _QUOTE_PAIRS.get(text[0]) == text[-1]:
        text = text[1:-1].strip()
    return text


def _why_invalid(text: str) -> str:
    """The reason an http(s) URL was refused by the parser (most often: its host or port)."""
    match = _AUTHORITY.match(text)
    authority = match.group(1) if match else ""
    hostport = authority.rpartition("@")[2]
    if hostport.startswith("["):
        host, _, port = hostport.partition("]")
        host += "]"
        port = port[1:] if port.startswith(":") else port
    else:
        host, _, port = hostport.partition(":")
    if port and (not port.isdigit() or int(port) > 65535):
        return f"invalid_url: bad port {port[:20]!r}"
    if not host:
        return "invalid_url: no host"
    if host.startswith("["):
        return f"invalid_url: bad IPv6 address {host[:80]!r}"
    if _ENDS_IN_NUMBER.search(unquote(host).lower()):
        return f"invalid_url: bad IP address {host[:80]!r}"
    return f"invalid_url: bad host {host[:80]!r}"


def _checked(text: str, base: str | None = None) -> tuple[str | None, str | None]:
    """Parse `text` (against `base`) as a browser does, then apply the product's policies."""
    try:
        url = URL(text) if base is None else URL(text, base)
    except ValueError:
        scheme = _HAS_SCHEME.match(text)
        if scheme is not None and scheme.group(1).lower() in WEB_SCHEMES:
            return None, _why_invalid(text)
        return None, "invalid_url: not a URL" if base is None else "invalid_url: not a valid link"
    scheme = url.protocol[:-1]
    if scheme not in WEB_SCHEMES:
        return None, f"invalid_url: unsupported scheme {scheme}:"
    if url.username or url.password:
        # credentials in a URL from a dataset or a page are never sent anywhere
        return None, "invalid_url: credentials in URL"
    if url.host_type == HostType.DEFAULT:
        host = url.hostname
        if len(host) > 253 or not _DNS_NAME.match(host):
            return None, f"invalid_url: unresolvable host {host[:80]!r}"
        if "." not in host.rstrip(".") and host not in LOOPBACK_NAMES:
            # whether an intranet is crawled is the caller's setting, not the URL's: both are
            # returned and `_intranet` decides (so the caches below hold one answer per URL)
            return url.href, (
                f"{SINGLE_LABEL} {host[:80]!r}: not a public web site "
                "(intranet names need ENRICH_ALLOW_PRIVATE=1)"
            )
    return url.href, None


def _intranet(checked: tuple[str | None, str | None]) -> tuple[str | None, str | None]:
    """A URL whose host is a single label (`http://exa/`, e.g. `http://exa mple.com/` split on
    its space) is refused, not looked up, unless ENRICH_ALLOW_PRIVATE=1 lets the crawl reach
    intranet hosts."""
    url, reason = checked
    if url is not None and reason is not None:
        return (url, None) if config.allow_private() else (None, reason)
    return checked


def normalise_url(token: str) -> tuple[str | None, str | None]:
    """Return (URL to fetch, None) or (None, reason), for a URL written in a dataset cell.

    The URL is parsed as a browser parses it (WHATWG URL Standard): host lower-cased and in its
    ASCII form, default port dropped, dot segments removed, characters percent-encoded as a browser
    sends them; the query keeps its order, the fragment is kept (it can address a section of a
    shared page). A missing scheme is added (`example.org/x` -> `http://example.org/x`); only
    http(s) URLs are accepted, without credentials, with a host DNS can resolve that is not a
    single label (unless ENRICH_ALLOW_PRIVATE=1).
    """
    return _intranet(_normalised(token))


def _normalised(token: str) -> tuple[str | None, str | None]:
    """`normalise_url` before the intranet setting (`_intranet`) has decided."""
    text = _unquoted(_prepare(token))
    if not text:
        return None, "invalid_url: empty"
    if text.startswith("//"):
        text = "http:" + text
    elif _HOSTLIKE.match(text):
        text = "http://" + text
    scheme = _HAS_SCHEME.match(text)
    if scheme is None:
        return None, "invalid_url: not a URL"
    if scheme.group(1).lower() not in WEB_SCHEMES:
        return None, f"invalid_url: unsupported scheme {scheme.group(1).lower()}:"
    return _checked(text)


@functools.lru_cache(maxsize=4096)
def _normalised_link(url: str) -> tuple[str | None, str | None]:
    return _normalised(url)


def normalise_link(url: str) -> tuple[str | None, str | None]:
    """`normalise_url` of an absolute link. The same links recur on every page of a site (menus,
    footers): the results of the recent ones are remembered."""
    return _intranet(_normalised_link(url))


# A result is keyed by the page's base URL, so it recurs only within a page (a link in the menu
# and the text, the url_parsers of two mappings): a crawl of 2,000 records resolved 6,638 links
# with 2 hits when this kept 8,192 results (~3 MB at its bound, for nothing)
@functools.lru_cache(maxsize=512)
def _resolved_link(base: str, href: str) -> tuple[str | None, str | None]:
    return _checked(_prepare(href), base)


def resolve_link(base: str, href: str) -> tuple[str | None, str | None]:
    """A link found on a page, resolved against `base` (the page's URL or its `<base href>`)
    as a browser resolves it, then held to the same policies as `normalise_url`: (URL, None)
    or (None, reason). The same link recurs on a page (menu and text, several mappings): the
    results of the recent ones are remembered."""
    return _intranet(_resolved_link(base, href))


def clear_link_caches() -> None:
    """Forget the remembered links (benchmarks measure the work, not the cache)."""
    _normalised_link.cache_clear()
    _resolved_link.cache_clear()


def join_url(base: str, href: str) -> str | None:
    """`href` resolved against `base` as a browser does (any scheme); None when not a URL."""
    try:
        return URL(_prepare(href), base).href
    except ValueError:
        return None


# -- identity of a page ----------------------------------------------------------------------------


def canonical(url: str, *, keep_fragment: bool = True) -> str:
    """w3lib's canonical form (sorted query, normalised escapes): a key, never a URL to fetch."""
    return canonicalize_url(safe_url_string(url), keep_fragments=keep_fragment)


def without_fragment(url: str) -> str:
    return urldefrag(url)[0]


def fragment_of(url: str) -> str:
    """The percent-decoded fragment without '#', or ''."""
    return unquote(urldefrag(url)[1])


@functools.lru_cache(maxsize=8192)
def page_key(url: str) -> str:
    """The identity of a page, for deduplication and the crawled-page store: the URL without its
    fragment and visitor-tracking query parameters (`utm_*`, `gclid`, ...), with the query sorted
    and percent-escapes normalised (w3lib's canonical form). Never the URL fetched: some servers
    answer differently when parameters change order."""
    url = without_fragment(url)
    if "?" not in url and "%" not in url:  # the parser's form is already canonical
        return url
    try:
        url = canonical(url, keep_fragment=False)
    except ValueError:  # not a URL w3lib can read: keyed as written
        return url
    parts = urlsplit(url)
    if not parts.query:
        return url.rstrip("?") if url.endswith("?") else url
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    kept = [(k, v) for k, v in pairs if not TRACKING_PARAMS.match(k)]
    if len(kept) == len(pairs):
        return url
    return urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(kept), ""))


# -- addresses -------------------------------------------------------------------------------------


def ip_literal(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address a host names literally, including the legacy IPv4 forms that browsers, curl and
    proxies accept (`2130706433`, `0x7f.1`, `127.1`, `0177.0.0.1`): a dataset must not reach an
    internal address by spelling it differently. None for a DNS name."""
    host = host.strip().lower().rstrip(".")
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        pass
    if not _ENDS_IN_NUMBER.search(host):
        return None
    try:
        return ipaddress.IPv4Address(socket.inet_aton(host))
    except (OSError, ValueError):
        return None


def private_ip(host: str) -> bool:
    """True for loopback, private, link-local, reserved, multicast or unspecified IP literals
    (legacy IPv4 spellings such as `2130706433` included)."""
    address = ip_literal(host)
    if address is None:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        address = address.ipv4_mapped
    return bool(
        address.is_private
        or address.is_loopback
        or address.is_link_local
        or address.is_reserved
        or address.is_multicast
        or address.is_unspecified
    )
