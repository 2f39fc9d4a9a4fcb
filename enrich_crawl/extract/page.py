"""A fetched page, decoded by the HTML rules and parsed once, however many mappings read it."""

from __future__ import annotations

import json
from functools import cached_property
from typing import Any
from urllib.parse import urljoin

import lxml.etree
import lxml.html
from w3lib.encoding import html_to_unicode

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


def _detect(body: bytes) -> str | None:
    """Last resort of the HTML decoding rules: guess the encoding from the bytes."""
    try:
        body.decode("utf-8")
        return "utf-8"
    except UnicodeDecodeError:
        pass
    from charset_normalizer import from_bytes

    best = from_bytes(body[:65536]).best()
    return best.encoding if best is not None else "cp1252"


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
        """The URL relative links resolve against (`<base href>` when present)."""
        tree = self.tree
        if tree is not None and self.kind == "html":
            base = tree.xpath("(//base/@href)[1]")
            if base:
                try:
                    return urljoin(self.url, str(base[0]).strip())
                except ValueError:
                    return self.url
        return self.url
