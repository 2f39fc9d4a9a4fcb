"""URL handling shared by the loader, the extractor and the crawler.

Reasons returned here use the reasons of a result document's `errors` (`invalid_url`, ...), followed by a short
explanation after a colon.
"""

from __future__ import annotations

import functools
import ipaddress
import posixpath
import re
import socket
from urllib.parse import parse_qsl, unquote, urldefrag, urlencode, urlsplit, urlunsplit

from w3lib.url import canonicalize_url, safe_url_string

_CELL_SPLIT = re.compile(r"[\s,;]+")
_HAS_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
_HOSTLIKE = re.compile(
    r"^(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+[A-Za-z]{2,63}\.?(?::\d+)?(?:[/?#]|$)"
)
_LABEL = re.compile(r"^(?!-)[a-z0-9_-]{1,63}(?<!-)$")
_ENDS_IN_NUMBER = re.compile(r"(?:^|\.)(?:\d+|0x[0-9a-f]*)$")
# query parameters that only track the visitor: dropped from page keys (one page, one fetch)
TRACKING_PARAMS = re.compile(
    r"^(?:utm_[a-z_]+|gclid|dclid|fbclid|msclkid|mc_cid|mc_eid|yclid|_ga|_gl|igshid|"
    r"ref_src|spm|scid)$",
    re.IGNORECASE,
)
WEB_SCHEMES = ("http", "https")


def split_url_cell(cell: object) -> list[str]:
    """A cell may hold several URLs split on whitespace, ',' or ';'."""
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
    return [token for token in _CELL_SPLIT.split(text) if token]


def _valid_host(host: str) -> bool:
    if not host or len(host) > 253:
        return False
    try:
        ipaddress.ip_address(host.strip("[]"))
        return True
    except ValueError:
        pass
    labels = host.rstrip(".").split(".")
    return all(_LABEL.match(label) for label in labels)


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


def _ends_in_number(host: str) -> bool:
    """WHATWG URL: a host whose last label is a number must be an IPv4 address."""
    return bool(_ENDS_IN_NUMBER.search(host.strip().lower().rstrip(".")))


def _idna(host: str) -> str | None:
    """Internationalised host names in their ASCII (punycode) form; None when impossible."""
    if host.isascii():
        return host
    try:
        import idna

        return idna.encode(host, uts46=True).decode("ascii")
    except (ImportError, UnicodeError, ValueError):
        try:
            return host.encode("idna").decode("ascii")
        except UnicodeError:
            return None


def normalise_url(token: str) -> tuple[str | None, str | None]:
    """Return (canonical absolute URL, None) or (None, reason).

    A missing scheme is added (`example.org/x` -> `http://example.org/x`); only http(s) URLs with a
    valid host are accepted; the fragment is kept (it can address a section of a shared page).
    """
    text = token.strip().strip("<>\"'")
    if not text:
        return None, "invalid_url: empty"
    if text.startswith("//"):
        text = "http:" + text
    elif _HOSTLIKE.match(text):  # "example.org/x" or "example.org:8080/x": no scheme given
        text = "http://" + text
    try:
        parts = urlsplit(text)
    except ValueError as exc:
        return None, f"invalid_url: {exc}"
    scheme = parts.scheme.lower()
    if scheme not in WEB_SCHEMES:
        if not scheme:
            return None, "invalid_url: not a URL"
        return None, f"invalid_url: unsupported scheme {scheme}:"
    try:
        host = parts.hostname or ""
        port = parts.port
    except ValueError as exc:
        return None, f"invalid_url: {exc}"
    if parts.username is not None or parts.password is not None:
        # credentials in a URL from a dataset or a page are never sent anywhere
        return None, "invalid_url: credentials in URL"
    ascii_host = _idna(host)
    if ascii_host is None:
        return None, f"invalid_url: bad host {host!r}"
    if _ends_in_number(ascii_host):
        address = ip_literal(ascii_host)
        if address is None:
            return None, f"invalid_url: bad IP address {host!r}"
        ascii_host = f"[{address}]" if address.version == 6 else str(address)
    elif not _valid_host(ascii_host):
        return None, f"invalid_url: bad host {host!r}" if host else "invalid_url: no host"
    elif ":" in ascii_host:  # IPv6 literal
        ascii_host = f"[{ipaddress.ip_address(ascii_host)}]"
    default_port = {"http": 80, "https": 443}[scheme]
    netloc = ascii_host if port in (None, default_port) else f"{ascii_host}:{port}"
    path = _remove_dot_segments(parts.path)
    text = urlunsplit((scheme, netloc, path, parts.query, parts.fragment))
    try:
        return canonical(text), None
    except ValueError as exc:  # pragma: no cover - w3lib is lenient
        return None, f"invalid_url: {exc}"


@functools.lru_cache(maxsize=4096)
def normalise_link(url: str) -> tuple[str | None, str | None]:
    """`normalise_url` of a link found on a page (made absolute). The same links recur on every
    page of a site (menus, footers): the results of the recent ones are remembered (a site's
    pages come close together; a larger cache only grows the crawl's memory)."""
    return normalise_url(url)


def _remove_dot_segments(path: str) -> str:
    """RFC 3986 5.2.4: `/a/./b/../c` -> `/a/c` (the trailing slash kept)."""
    if "." not in path:
        return path
    segments = path.split("/")
    if not any(s in (".", "..") for s in segments):
        return path
    resolved = posixpath.normpath(path)
    if resolved.startswith("//"):
        resolved = "/" + resolved.lstrip("/")
    if path.endswith(("/", "/.", "/..")) and not resolved.endswith("/"):
        resolved += "/"
    return resolved


def canonical(url: str, *, keep_fragment: bool = True) -> str:
    """w3lib canonical form (sorted query, normalised escapes); fragment kept unless asked."""
    return canonicalize_url(safe_url_string(url), keep_fragments=keep_fragment)


def without_fragment(url: str) -> str:
    return urldefrag(url)[0]


def fragment_of(url: str) -> str:
    """The percent-decoded fragment without '#', or ''."""
    return unquote(urldefrag(url)[1])


def page_key(url: str) -> str:
    """The identity of a page for fetching and caching: the canonical URL without its fragment
    and without visitor-tracking query parameters (`utm_*`, `gclid`, ...)."""
    url = without_fragment(url)
    parts = urlsplit(url)
    if not parts.query:
        return url.rstrip("?") if url.endswith("?") else url
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    kept = [(k, v) for k, v in pairs if not TRACKING_PARAMS.match(k)]
    if len(kept) == len(pairs):
        return url
    return urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(kept), ""))


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
