"""A fetched page, decoded by the HTML rules and parsed once, however many mappings read it."""

from __future__ import annotations

import json
from functools import cached_property
from typing import Any

import lxml.etree
import lxml.html
from w3lib.encoding import html_to_unicode

from enrich_crawl.urls import join_url

# huge_tree: without it libxml2 silently drops everything below depth 255, and real pages with
# unclosed <div>s get there (parsel, hence Scrapy, parse with huge_tree too)
_HTML_PARSER = lxml.html.HTMLParser(encoding="utf-8", remove_comments=True, huge_tree=True)
_XML_PARSER = lxml.etree.XMLParser(
    encoding="utf-8",
    resolve_entities=False,
    no_network=True,
    remove_comments=True,
    recover=True,
    huge_tree=True,
)
JSON_TYPES = ("application/json", "text/json", "application/ld+json", "application/javascript")
XML_TYPES = (
    "application/xml",
    "text/xml",
    "application/rss+xml",
    "application/atom+xml",
    "application/rdf+xml",
)
HTML_TYPES = ("text/html", "application/xhtml+xml")
_BASE_HREF = lxml.etree.XPath("(//base/@href)[1]")  # compiled once: every HTML page asks


WESTERN = "cp1252"  # the WHATWG default for pages that declare nothing (Western locales)
CENTRAL = "cp1250"
# single-byte Latin encodings that detection confuses with windows-1252 on short pages
LATIN_SINGLE_BYTE = frozenset(
    {
        "cp1250",
        "cp1254",
        "cp1257",
        "cp1258",
        "cp775",
        "cp850",
        "cp852",
        "cp857",
        "cp858",
        "latin_1",
        "iso8859_2",
        "iso8859_3",
        "iso8859_4",
        "iso8859_9",
        "iso8859_10",
        "iso8859_13",
        "iso8859_14",
        "iso8859_15",
        "iso8859_16",
        "mac_latin2",
        "mac_roman",
        "mac_iceland",
        "mac_turkish",
    }
)
# what Central European letters (č ř ě ů ň ď ł ż ą ...) become when read as windows-1252
_CP1252_SUSPECT = frozenset("ÈèÌìÒòÙùÏïÐðØøÃãÕõÞþ¹³¿¥ªº¼¾")
_CE_LETTERS = frozenset("šžŠŽ")


def _central_european(text: str) -> bool:
    """Text read as windows-1252 that is really Central European: some word has two different
    letters such text turns into (`pøijïte`, `Za¿ó³æ`), or one of them next to š/ž (`Èeština`).
    A Western word rarely has two different ones (`crème`, `più`, `rødgrød` have one)."""
    for word in text.split():
        suspect = len(_CP1252_SUSPECT.intersection(word))
        if suspect >= 2 or (suspect and any(ch in _CE_LETTERS for ch in word)):
            return True
    return False


def _detect(body: bytes) -> str | None:
    """Last resort of the HTML decoding rules: guess the encoding from the bytes.

    Detection on a short page cannot tell windows-1252 from its single-byte Latin cousins
    (cp1250, cp1257, ...: `Café 12 €` is valid in all of them) and often picks a cousin. Like
    browsers, prefer windows-1252 unless the text reads as Central European in it, or the detector
    rejected windows-1252 outright (bytes it leaves undefined, or far more "mess" in it)."""
    try:
        body.decode("utf-8")
        return "utf-8"
    except UnicodeDecodeError:
        pass
    from charset_normalizer import from_bytes

    sample = body[:65536]
    matches = from_bytes(sample)
    best = matches.best()
    if best is None:
        return WESTERN
    guess = best.encoding
    if guess != WESTERN and guess not in LATIN_SINGLE_BYTE:
        return guess  # another script (Cyrillic, Greek, ...) or a multi-byte encoding
    try:
        western = sample.decode(WESTERN)
    except UnicodeDecodeError:
        return guess  # bytes windows-1252 leaves undefined (0x81, 0x8D, 0x8F, 0x90, 0x9D)
    if _central_european(western):
        if guess != WESTERN:
            return guess
        central = next((m for m in matches if m.encoding == CENTRAL), None)
        return CENTRAL if central is not None else guess
    if guess == WESTERN:
        return guess
    same = WESTERN in (best.could_be_from_charset or [])  # identical text either way
    close = any(m.encoding == WESTERN and m.chaos <= best.chaos + 0.05 for m in matches)
    return WESTERN if same or close else guess


def decode_body(body: bytes, content_type: str | None) -> tuple[str, str]:
    """(encoding, text) by the HTML rules: BOM, Content-Type charset, <meta charset>, detection."""
    encoding, text = html_to_unicode(content_type or "", body, auto_detect_fun=_detect)
    return encoding, text.lstrip("\ufeff")


class Page:
    """A page as the extractor sees it: `text` (decoded), `tree` (lxml root, HTML/XML pages) or
    `json` (JSON pages), parsed lazily and once. `selector_cache` holds what selectors computed on
    the whole page (strings, numbers, parsed JSON; never elements, so dropping `tree` frees it),
    shared by every field and mapping that runs on the page."""

    def __init__(
        self,
        url: str,
        body: bytes | str,
        *,
        content_type: str | None = None,
        status: int = 200,
        encoding: str | None = None,
    ):
        self.url = url
        self.status = status
        self.content_type = (content_type or "").split(";")[0].strip().lower()
        self._header = content_type
        self.selector_cache: dict[Any, Any] = {}
        if isinstance(body, str):
            self.text = body.lstrip("\ufeff")
            self.encoding = "utf-8"
            self.body = body.encode("utf-8")
        else:
            self.body = body
            if encoding:
                self.encoding = encoding
                self.text = body.decode(encoding, errors="replace").lstrip("\ufeff")
            else:
                self.encoding, self.text = decode_body(body, content_type)

    def __repr__(self) -> str:
        return f"<Page {self.url} {self.kind} {len(self.body)} bytes>"

    @cached_property
    def kind(self) -> str:
        """ "html", "xml", "json" or "text"."""
        ctype = self.content_type
        if (ctype in JSON_TYPES or ctype.endswith("+json")) and (
            ctype != "application/javascript" or self._looks_like_json()
        ):
            return "json"
        if ctype in XML_TYPES or (ctype.endswith("+xml") and ctype not in HTML_TYPES):
            return "xml"
        if ctype in HTML_TYPES:
            return "html"
        if not ctype or ctype in ("text/plain", "application/octet-stream"):
            if self._looks_like_json():
                return "json"
            head = self.text.lstrip()[:2048]
            if head.startswith("<?xml") and "<html" not in head.lower():
                return "xml"
            if head.startswith("<"):
                return "html"
            return "html" if not ctype else "text"
        return "text"

    def _looks_like_json(self) -> bool:
        if self.text.lstrip()[:1] not in ("{", "["):
            return False
        try:
            self.__dict__["json"] = json.loads(self.text)
        except ValueError:
            return False
        return True

    @cached_property
    def json(self) -> Any:
        """The parsed JSON body (JSON pages), else None."""
        if self.kind != "json":
            return None
        try:
            return json.loads(self.text)
        except ValueError:
            return None

    @cached_property
    def tree(self) -> Any:
        """The lxml root element (HTML or XML pages), else None. Broken markup is recovered."""
        kind = self.kind
        if kind == "json":
            return None
        # the parsers read UTF-8: a body that decoded as clean UTF-8 (no BOM, no byte replaced)
        # as it came, anything else re-encoded from the decoded text
        clean_utf8 = (
            self.encoding.replace("_", "-").lower() in ("utf-8", "utf8")
            and not self.body.startswith(b"\xef\xbb\xbf")
            and "\ufffd" not in self.text
        )
        data = self.body if clean_utf8 else None
        if data is None:
            data = self.text.encode("utf-8")
        if not data.strip():
            return None
        if kind == "xml":
            try:
                root = lxml.etree.fromstring(data, _XML_PARSER)
                if root is not None:
                    return root
            except lxml.etree.XMLSyntaxError:
                pass
        try:
            return lxml.html.document_fromstring(data, parser=_HTML_PARSER)
        except (lxml.etree.ParserError, ValueError):
            return None

    @cached_property
    def base_url(self) -> str:
        """The URL relative links resolve against: the first `<base href>` resolved against the
        page's URL, as a browser does (the page's URL when there is none or it is not a URL)."""
        tree = self.tree
        if tree is not None and self.kind == "html":
            base = _BASE_HREF(tree)
            if base:
                return join_url(self.url, str(base[0])) or self.url
        return self.url
