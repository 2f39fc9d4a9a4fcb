"""An example page parsed once, and where a known value sits on it as a reader sees it.

`PageFacts` parses an example page once (the engine's own `Page`, so the rules are validated on the
very tree the crawl will build). `find_hits(facts, needles)` finds the value: the whole text of an
element (`normalize-space(.)` equals the value), or a part of it; an attribute (`<meta content>`,
`<a title>`, `<time datetime>`, ...), whole or part; `jsonld_paths` a JSON-LD property
(`<script type="application/ld+json">`, parsed leniently as the engine does).

A value is looked for as the dataset compares it (compare.fold): whitespace collapsed and in any
case, then spelt as the page spells it (`PageFacts.variants`), so that the rules select the page's
own text exactly. Where inline elements split it in the markup (`<b>Ada</b> <i>Lovelace</i>`) it is
looked for in the page's text as a reader sees it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import lxml.etree

from enrich_crawl.extract.learn.model import ExamplePage
from enrich_crawl.extract.page import Page
from enrich_crawl.extract.processors import loads_lenient
from enrich_crawl.values import clean_text, parse_date

MAX_PART_TEXT = 400  # a value cut out of a longer text: only from texts of at most this length
_SKIP = "not(ancestor-or-self::script or ancestor-or-self::style or ancestor-or-self::noscript)"
_EXACT = lxml.etree.XPath(f"//*[{_SKIP}][normalize-space(.) = $v]")
_PART = lxml.etree.XPath(f"//*[{_SKIP}][contains(normalize-space(.), $v)]")
_ATTR_EXACT = lxml.etree.XPath("//@*[normalize-space(.) = $v]")
_ATTR_PART = lxml.etree.XPath("//@*[contains(normalize-space(.), $v)]")
# the same below one element (a record's own section of a page serving several)
_IN_EXACT = lxml.etree.XPath(f"descendant-or-self::*[{_SKIP}][normalize-space(.) = $v]")
_IN_PART = lxml.etree.XPath(f"descendant-or-self::*[{_SKIP}][contains(normalize-space(.), $v)]")
_IN_ATTR_EXACT = lxml.etree.XPath("descendant-or-self::*/@*[normalize-space(.) = $v]")
_IN_ATTR_PART = lxml.etree.XPath("descendant-or-self::*/@*[contains(normalize-space(.), $v)]")
_JSONLD = lxml.etree.XPath("//script[@type='application/ld+json']")
_LINKS = lxml.etree.XPath("//a[@href]")
_NOISY_ATTRS = frozenset({"style", "class", "id", "onclick", "src", "srcset"})
_READER_TEXT = lxml.etree.XPath(
    "//text()[not(ancestor::script or ancestor::style or ancestor::noscript or ancestor::head)]"
)
_TOKEN = re.compile(r"\w+")
MAX_VARIANTS = 4  # spellings of one value on one page (case) looked for


class PageFacts:
    """An example page, parsed once by the engine's `Page`, with what the learner asks of it."""

    def __init__(self, example_page: ExamplePage):
        self.source = example_page
        self.page = Page(
            example_page.url,
            example_page.body,
            content_type=example_page.content_type,
            status=example_page.status,
        )
        self._jsonld: list[Any] | None = None
        self._plain: str | None = None
        self._plain_folded: str | None = None
        self._reader: str | None = None
        self._reader_folded: str | None = None
        # elements naming records on a page serving several: kind of name -> ancestor -> them
        self.record_ancestors: dict[tuple[Any, ...], dict[Any, list[Any]]] = {}
        self._links: dict[str, list[Any]] | None = None
        self._skeleton: frozenset[str] | None = None  # the DOM skeleton (templates.skeleton)

    @property
    def depth(self) -> int:
        return self.source.depth

    @property
    def tree(self) -> Any:
        """The parsed page (parsed on first use: most pages of a probe are never looked into)."""
        return self.page.tree if self.page.kind in ("html", "xml") else None

    def plain_text(self) -> str:
        """The page's markup with whitespace collapsed (what a value is looked for in first)."""
        if self._plain is None:
            self._plain = clean_text(self.page.text)
        return self._plain

    def plain_folded(self) -> str:
        if self._plain_folded is None:
            self._plain_folded = self.plain_text().lower()
        return self._plain_folded

    def reader_text(self) -> str:
        """The text of the page's body as XPath's string value reads it (text nodes joined as
        they are, whitespace collapsed): `<b>Ada</b> <i>Lovelace</i>` reads "Ada Lovelace",
        `Caf&eacute;` reads "Café"."""
        if self._reader is None:
            tree = self.tree
            self._reader = clean_text("".join(_READER_TEXT(tree))) if tree is not None else ""
            self._reader_folded = self._reader.lower()
        return self._reader

    def variants(self, needle: str, *, words: bool = False) -> list[str]:
        """The needle as this page spells it: itself where the markup holds it, else the
        spellings that differ from it only in case, in the markup or (where inline elements
        split it there) in the page's text; none when the page does not hold it. With `words`,
        a spelling must stand as a whole word (see word_in)."""
        if not needle:
            return []
        plain = self.plain_text()
        escaped = "&" in needle and needle.replace("&", "&amp;") in plain
        if escaped or (needle in plain and (not words or word_in(needle, plain))):
            return [needle]
        folded = needle.lower()
        found = _spellings(plain, self.plain_folded(), needle, folded, words)
        if found:
            return found
        # split by markup: only where a word of it is in the markup at all (parsing costs)
        tokens = _TOKEN.findall(folded)
        if not tokens or max(tokens, key=len) not in self.plain_folded():
            return []
        reader = self.reader_text()
        if needle in reader and (not words or word_in(needle, reader)):
            return [needle]
        return _spellings(reader, self._reader_folded or "", needle, folded, words)

    def jsonld(self) -> list[Any]:
        if self._jsonld is None:
            self._jsonld = []
            if self.tree is not None:
                for script in _JSONLD(self.tree):
                    ok, data = loads_lenient(script.text or "")
                    if ok:
                        self._jsonld.append(data)
        return self._jsonld

    def links(self) -> dict[str, list[Any]]:
        """Absolute link target (without fragment) -> the `<a>` elements pointing there."""
        if self._links is None:
            from urllib.parse import urljoin

            from enrich_crawl.urls import normalise_link, without_fragment

            self._links = {}
            if self.tree is not None:
                base = self.page.base_url
                for anchor in _LINKS(self.tree):
                    href = (anchor.get("href") or "").strip()
                    if not href or href.startswith(("#", "mailto:", "javascript:", "tel:")):
                        continue
                    try:
                        url, _ = normalise_link(urljoin(base, href))
                    except ValueError:
                        continue
                    if url:
                        self._links.setdefault(without_fragment(url), []).append(anchor)
        return self._links


def _spellings(text: str, folded_text: str, needle: str, folded: str, words: bool) -> list[str]:
    """The spellings of `needle` in `text` that differ from it only in case."""
    if folded not in folded_text:
        return []
    out: list[str] = []
    for match in re.finditer(re.escape(needle), text, re.IGNORECASE):
        spelling = match.group(0)
        if spelling not in out and (not words or word_in(spelling, text)):
            out.append(spelling)
            if len(out) >= MAX_VARIANTS:
                break
    return out


@dataclass
class Hit:
    element: Any  # the element holding the value (for an attribute: its owner)
    attribute: str | None  # the attribute holding it, if any
    text: str  # the whole (normalised) text where it was found
    needle: str  # the rendering of the value that was found

    @property
    def exact(self) -> bool:
        return self.text == self.needle


def deepest(elements: list[Any]) -> list[Any]:
    chosen = set(elements)
    out = []
    for element in elements:
        if not any(child in chosen for child in element.iterdescendants()):
            out.append(element)
    return out


def find_hits(
    facts: PageFacts,
    wanted_needles: list[str],
    *,
    parts: bool = True,
    words: bool = True,
    within: list[Any] | None = None,
) -> list[Hit]:
    """Elements and attributes holding a needle, whole or (`parts`) as part of a longer text;
    with `words`, a part must not be glued to letters or digits (a date may: `2024-03-05T10:00`).
    With `within` (a record's own sections of a page serving several), those sections are
    looked into first, and the whole page only where they hold nothing: the same value in
    another record's section (or the limits on hits per page) must not hide the record's own."""
    tree = facts.tree
    if tree is None:
        return []
    needles = []
    for wanted in wanted_needles:
        # as the page spells it; not on the page in any case: no element or attribute holds it
        needles += [v for v in facts.variants(wanted) if v not in needles]
    if not needles:
        return []
    for section in within or ():
        hits = _hits(
            needles,
            parts=parts,
            words=words,
            queries=(
                lambda v, s=section: _IN_EXACT(s, v=v),
                lambda v, s=section: _IN_PART(s, v=v),
                lambda v, s=section: _IN_ATTR_EXACT(s, v=v),
                lambda v, s=section: _IN_ATTR_PART(s, v=v),
            ),
        )
        if hits:
            return hits
    return _hits(
        needles,
        parts=parts,
        words=words,
        queries=(
            lambda v: _EXACT(tree, v=v),
            lambda v: _PART(tree, v=v),
            lambda v: _ATTR_EXACT(tree, v=v),
            lambda v: _ATTR_PART(tree, v=v),
        ),
    )


def _hits(needles: list[str], *, parts: bool, words: bool, queries: tuple) -> list[Hit]:
    exact_of, part_of, attr_exact_of, attr_part_of = queries
    hits: list[Hit] = []
    seen: set[tuple[Any, str | None]] = set()
    for needle in needles:
        exact = deepest(exact_of(needle))
        for element in exact:
            key = (element, None)
            if key not in seen:
                seen.add(key)
                hits.append(Hit(element, None, needle, needle))
        for attr in attr_exact_of(needle):
            owner = attr.getparent()
            name = attr.attrname
            if name in _NOISY_ATTRS or (owner, name) in seen:
                continue
            seen.add((owner, name))
            hits.append(Hit(owner, name, needle, needle))
        if not parts:
            continue
        if len(exact) < 8:  # a part of a longer text, even where a whole text holds it too
            for element in deepest(part_of(needle))[:12]:
                text = clean_text(element.xpath("normalize-space(.)"))
                if words and not word_in(needle, text):
                    continue  # "12" in "R000812" is no twelve
                if len(text) <= MAX_PART_TEXT and (element, None) not in seen:
                    seen.add((element, None))
                    hits.append(Hit(element, None, text, needle))
        for attr in attr_part_of(needle):
            owner = attr.getparent()
            name = attr.attrname
            text = clean_text(str(attr))
            if name in _NOISY_ATTRS or len(text) > MAX_PART_TEXT or (owner, name) in seen:
                continue
            if words and not word_in(needle, text):
                continue
            seen.add((owner, name))
            hits.append(Hit(owner, name, text, needle))
    return hits


def word_in(needle: str, text: str) -> bool:
    """Is `needle` in `text` as a whole (not glued to letters or digits around it)?"""
    start = 0
    while True:
        index = text.find(needle, start)
        if index < 0:
            return False
        before = text[index - 1] if index else " "
        after = text[index + len(needle)] if index + len(needle) < len(text) else " "
        if not (needle[:1].isalnum() and before.isalnum()) and not (
            needle[-1:].isalnum() and after.isalnum()
        ):
            return True
        start = index + 1


def value_on_page(facts: PageFacts, needles: list[str], *, words: bool = True) -> bool:
    """Does the page hold one of the renderings of a value, in any case (parsed only where the
    markup holds a word of it but not the whole)?"""
    return any(facts.variants(n, words=words) for n in needles)


def jsonld_paths(
    facts: PageFacts, needles: list[str], date: str | None = None
) -> list[tuple[str, bool]]:
    """JSONPath expressions of JSON-LD properties equal to (or containing) a needle; with `date`,
    a date-time on that day is equal."""
    return json_paths(facts.jsonld(), needles, date)


def json_paths(blocks: list[Any], needles: list[str], date: str | None) -> list[tuple[str, bool]]:
    wanted = {n.lower() for n in needles if n}
    found: list[tuple[str, bool]] = []

    def walk(node: Any, path: list[str]) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, [*path, key])
        elif isinstance(node, list):
            for item in node:
                walk(item, [*path, "[*]"])
        elif isinstance(node, (str, int, float)) and not isinstance(node, bool) and path:
            text = clean_text(str(node))
            folded = text.lower()
            if folded in wanted or (date and date_in(text, date)):
                found.append((_jsonpath(path), True))
            elif len(text) <= MAX_PART_TEXT and any(n in folded for n in wanted):
                found.append((_jsonpath(path), False))

    for block in blocks:
        walk(block, [])
    return found


def _jsonpath(path: list[str]) -> str:
    out = "$"
    for part in path:
        if part == "[*]":
            out += "[*]"
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", part):
            out += "." + part
        else:
            out += "[" + json.dumps(part) + "]"
    return out


def date_in(text: str, value: str) -> bool:
    try:
        return parse_date(text) == value
    except ValueError:
        return False
