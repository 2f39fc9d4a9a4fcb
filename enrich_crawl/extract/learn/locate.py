"""Where a known value sits on a page, and the rules a person would write to get it there again.

`PageFacts` parses an example page once (the engine's own `Page`, so the rules are validated on the
very tree the crawl will build). `locate(facts, needles, ...)` finds the value as a reader sees it:

- the whole text of an element (`normalize-space(.)` equals the value), or a part of it (then a
  `regex` step cuts it out, with the literal text around it as context);
- an attribute (`<meta content>`, `<a title>`, `<time datetime>`, ...), whole or part;
- a JSON-LD property (`<script type="application/ld+json">`, parsed leniently as the engine does);

and `Candidate`s are the processor chains that select it, anchored the way a person would anchor
them: structured-data keys (OpenGraph/`<meta>`, JSON-LD, microdata `itemprop`, RDFa `property`),
`<title>`, `<link rel=canonical>`, an `id`, a label ("the cell after the header 'VAT'"), a class,
the record's own section (`$fragment`, `$id`); a positional path only when nothing anchors it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import lxml.etree

from enrich_crawl.extract.learn.model import ExamplePage
from enrich_crawl.extract.page import Page
from enrich_crawl.extract.processors import loads_lenient
from enrich_crawl.values import clean_text, parse_date

# rule kinds, from the most to the least transferable; a positional path is the last resort
KIND_COST = {
    "meta": 0,
    "jsonld": 0,
    "microdata": 0,
    "rdfa": 0,
    "canonical": 0,
    "title": 1,
    "json": 1,
    "record": 1,
    "label": 2,
    "id": 2,
    "class": 3,
    "path": 5,
    "positional": 9,
}
CROSS_SITE_KINDS = frozenset({"meta", "jsonld", "microdata", "rdfa", "canonical", "title"})
MAX_PART_TEXT = 400  # a value cut out of a longer text: only from texts of at most this length
MAX_LABEL = 40  # characters of a label ("Founded", "Source code:")
_SKIP = "not(ancestor-or-self::script or ancestor-or-self::style or ancestor-or-self::noscript)"
_EXACT = lxml.etree.XPath(f"//*[{_SKIP}][normalize-space(.) = $v]")
_PART = lxml.etree.XPath(f"//*[{_SKIP}][contains(normalize-space(.), $v)]")
_ATTR_EXACT = lxml.etree.XPath("//@*[normalize-space(.) = $v]")
_ATTR_PART = lxml.etree.XPath("//@*[contains(normalize-space(.), $v)]")
_JSONLD = lxml.etree.XPath("//script[@type='application/ld+json']")
_BY_ID = lxml.etree.XPath("//*[@id = $v]")
_TEXT_IS = lxml.etree.XPath(f"//*[{_SKIP}][normalize-space(.) = $v]")
_LINKS = lxml.etree.XPath("//a[@href]")
_NOISY_ATTRS = frozenset({"style", "class", "id", "onclick", "src", "srcset"})
_UNSTABLE = re.compile(r"\d{3,}|[0-9a-f]{8,}", re.I)  # generated ids/classes (ember123, a1b2c3d4..)
_TAG = re.compile(r"^[A-Za-z][\w-]*$")
JSONLD_SELECTOR = "//script[@type='application/ld+json']"


def xq(text: str) -> str:
    """An XPath string literal for `text`."""
    if "'" not in text:
        return f"'{text}'"
    if '"' not in text:
        return f'"{text}"'
    parts = text.split("'")
    return "concat(" + ', "\'", '.join(f"'{p}'" for p in parts) + ")"


def has_class(name: str) -> str:
    return f"contains(concat(' ', normalize-space(@class), ' '), ' {name} ')"


def xp(expression: str) -> dict[str, Any]:
    return {"type": "xpath", "parameters": {"expression": expression}}


@dataclass(frozen=True)
class Candidate:
    """A processor chain for one field, and what kind of anchor it uses."""

    processors: str  # JSON of the processor list (hashable, the candidate's identity)
    kind: str
    cost: int  # simplicity: lower is simpler

    @property
    def chain(self) -> list[dict[str, Any]]:
        return json.loads(self.processors)


def candidate(steps: list[dict[str, Any]], kind: str) -> Candidate:
    text = json.dumps(steps, ensure_ascii=False, separators=(",", ":"))
    return Candidate(text, kind, KIND_COST[kind] * 100 + len(text) // 8)


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
        self._links: dict[str, list[Any]] | None = None

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


# -- finding the value -----------------------------------------------------------------------------


@dataclass
class Hit:
    element: Any  # the element holding the value (for an attribute: its owner)
    attribute: str | None  # the attribute holding it, if any
    text: str  # the whole (normalised) text where it was found
    needle: str  # the rendering of the value that was found

    @property
    def exact(self) -> bool:
        return self.text == self.needle


def _deepest(elements: list[Any]) -> list[Any]:
    chosen = set(elements)
    out = []
    for element in elements:
        if not any(child in chosen for child in element.iterdescendants()):
            out.append(element)
    return out


def find_hits(
    facts: PageFacts, needles: list[str], *, parts: bool = True, words: bool = True
) -> list[Hit]:
    """Elements and attributes holding a needle, whole or (`parts`) as part of a longer text;
    with `words`, a part must not be glued to letters or digits (a date may: `2024-03-05T10:00`)."""
    tree = facts.tree
    if tree is None:
        return []
    hits: list[Hit] = []
    seen: set[tuple[Any, str | None]] = set()
    page_text = facts.plain_text()
    for needle in needles:
        if not needle:
            continue
        if needle not in page_text and needle.replace("&", "&amp;") not in page_text:
            continue  # not in the markup at all: no element or attribute holds it
        exact = _deepest(_EXACT(tree, v=needle))
        for element in exact:
            key = (element, None)
            if key not in seen:
                seen.add(key)
                hits.append(Hit(element, None, needle, needle))
        for attr in _ATTR_EXACT(tree, v=needle):
            owner = attr.getparent()
            name = attr.attrname
            if name in _NOISY_ATTRS or (owner, name) in seen:
                continue
            seen.add((owner, name))
            hits.append(Hit(owner, name, needle, needle))
        if not parts:
            continue
        if len(exact) < 8:  # a part of a longer text, even where a whole text holds it too
            for element in _deepest(_PART(tree, v=needle))[:12]:
                text = clean_text(element.xpath("normalize-space(.)"))
                if words and not word_in(needle, text):
                    continue  # "12" in "R000812" is no twelve
                if len(text) <= MAX_PART_TEXT and (element, None) not in seen:
                    seen.add((element, None))
                    hits.append(Hit(element, None, text, needle))
        for attr in _ATTR_PART(tree, v=needle):
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
    """Does the page's text hold one of the renderings of a value (cheap: no parse)?"""
    text = facts.plain_text()
    return any(n and n in text and (not words or word_in(n, text)) for n in needles)


def jsonld_paths(
    facts: PageFacts, needles: list[str], date: str | None = None
) -> list[tuple[str, bool]]:
    """JSONPath expressions of JSON-LD properties equal to (or containing) a needle; with `date`,
    a date-time on that day is equal."""
    return _json_paths(facts.jsonld(), needles, date)


def _json_paths(blocks: list[Any], needles: list[str], date: str | None) -> list[tuple[str, bool]]:
    wanted = set(needles)
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
            if text in wanted or (date and date_in(text, date)):
                found.append((_jsonpath(path), True))
            elif len(text) <= MAX_PART_TEXT and any(n in text for n in wanted):
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


# -- from a hit to candidate rules ------------------------------------------------------------------


def _stable(token: str, avoid: tuple[str, ...]) -> bool:
    return bool(token) and not _UNSTABLE.search(token) and not any(a and a in token for a in avoid)


def _classes(element: Any, avoid: tuple[str, ...]) -> list[str]:
    return [c for c in (element.get("class") or "").split() if _stable(c, avoid) and "'" not in c]


def _tag(element: Any) -> str:
    tag = element.tag if isinstance(element.tag, str) else "*"
    return tag if _TAG.match(tag) and ":" not in tag else "*"


_HEADINGS = frozenset({"h1", "h2", "h3", "h4", "h5", "h6"})
ANY_HEADING = "*[self::h1 or self::h2 or self::h3 or self::h4 or self::h5 or self::h6]"


def _step(element: Any, avoid: tuple[str, ...], *, positional: bool = True) -> str:
    """One location step for `element` below its parent: tag, a class if it has one, a
    position only when its siblings of the same tag are otherwise indistinguishable. A heading is
    any heading: a section's title is an h1 on one page and an h2 on the next."""
    tag = _tag(element)
    if tag in _HEADINGS and not element.get("class"):
        return ANY_HEADING + ("[1]" if positional else "")
    classes = _classes(element, avoid)
    parent = element.getparent()
    if classes:
        step = f"{tag}[{has_class(classes[0])}]"
        same = [s for s in parent if s.tag == element.tag and classes[0] in (s.get("class") or "")]
    else:
        step = tag
        same = [s for s in parent if s.tag == element.tag] if parent is not None else [element]
    if positional and len(same) > 1:
        step += f"[{same.index(element) + 1}]"
    return step


def relative_path(
    ancestor: Any, element: Any, avoid: tuple[str, ...], *, positional: bool = True
) -> str | None:
    steps = []
    node = element
    while node is not None and node is not ancestor:
        steps.append(_step(node, avoid, positional=positional))
        node = node.getparent()
    if node is None:
        return None
    return "/".join(reversed(steps))


def _label_of(element: Any, needle: str) -> tuple[Any, str] | None:
    """The label a reader sees before the value: the previous sibling element (`<dt>`, `<th>`,
    `<strong>`, `<span class=label>`...) with a short text, or the header cell before the cell
    holding it."""
    for node in (element, element.getparent()):
        if node is None:
            continue
        previous = node.getprevious()
        while previous is not None and not isinstance(previous.tag, str):
            previous = previous.getprevious()
        if previous is None:
            continue
        text = clean_text(previous.xpath("normalize-space(.)"))
        if 0 < len(text) <= MAX_LABEL and needle not in text and not text.isdigit():
            return previous, text
    return None


def _scope_of(facts: PageFacts, fragment: str, record_id: str) -> list[tuple[str, Any]]:
    """Elements that name the record on a page serving several: (XPath using $fragment/$id,
    element)."""
    tree = facts.tree
    out: list[tuple[str, Any]] = []
    if fragment:
        for element in _BY_ID(tree, v=fragment)[:1]:
            out.append(("//*[@id=$fragment]", element))
    if record_id and len(record_id) <= 80 and not out:
        for element in _deepest(_TEXT_IS(tree, v=record_id))[:3]:
            out.append((f"//{_tag(element)}[normalize-space(.)=$id]", element))
    return out


def _common_ancestor(a: Any, b: Any) -> Any:
    ancestors = {*a.iterancestors(), a}  # elements, not id()s: lxml proxies come and go
    node = b
    while node is not None and node not in ancestors:
        node = node.getparent()
    return node


def element_selectors(
    facts: PageFacts, element: Any, needle: str, avoid: tuple[str, ...], scopes: list
) -> Iterator[tuple[str, str]]:
    """(XPath selecting `element`, kind) in the ways a person would write it."""
    tag = _tag(element)
    itemprop = element.get("itemprop")
    if itemprop and _stable(itemprop, avoid) and "'" not in itemprop:
        yield f"//*[@itemprop={xq(itemprop)}]", "microdata"
    prop = element.get("property")
    if prop and tag != "meta" and "'" not in prop:
        yield f"//*[@property={xq(prop)}]", "rdfa"
    if tag == "title":
        yield "//title", "title"
    if tag == "meta":
        for key in ("property", "name", "itemprop"):
            if element.get(key):
                yield f"//meta[@{key}={xq(element.get(key))}]", "meta"
                break
        return
    if tag == "link" and "canonical" in (element.get("rel") or "").split():
        yield "//link[@rel='canonical']", "canonical"
        return
    # record-relative: the record's own section of a page that serves several
    for expression, named in scopes:
        ancestor = _common_ancestor(named, element)
        if ancestor is None or _tag(ancestor) in ("body", "html"):
            continue  # the whole page is no record's section
        rel = relative_path(ancestor, element, avoid)
        if ancestor is named:
            head = expression
        else:
            head = f"{expression}/ancestor::{_tag(ancestor)}[1]"
        if rel:
            yield f"{head}/{rel}", "record"
            loose = relative_path(ancestor, element, avoid, positional=False)
            if loose and loose != rel:
                yield f"{head}/{loose}", "record"
            label = _label_of(element, needle)
            if label is not None and _common_ancestor(label[0], element) is not None:
                ltag, ltext = _tag(label[0]), label[1]
                yield (
                    f"{head}//{ltag}[normalize-space(.)={xq(ltext)}]/following-sibling::{tag}[1]",
                    "record",
                )
    # an id
    element_id = element.get("id")
    if element_id and _stable(element_id, avoid) and "'" not in element_id:
        yield f"//{tag}[@id={xq(element_id)}]", "id"
    # a label: "the cell after the header 'Status:'"
    label = _label_of(element, needle)
    if label is not None:
        label_element, text = label
        ltag = _tag(label_element)
        if label_element.getparent() is element.getparent():
            yield (
                f"//{ltag}[normalize-space(.)={xq(text)}]/following-sibling::{tag}[1]",
                "label",
            )
        else:
            ptag = _tag(element.getparent())
            yield (
                f"//{ltag}[normalize-space(.)={xq(text)}]/following-sibling::{ptag}[1]/{tag}",
                "label",
            )
    # a class, alone or under its parent's class
    classes = _classes(element, avoid)
    for name in classes[:2]:
        yield f"//{tag}[{has_class(name)}]", "class"
    parent = element.getparent()
    if parent is not None and isinstance(parent.tag, str):
        pclasses = _classes(parent, avoid)
        if pclasses:
            own = f"[{has_class(classes[0])}]" if classes else ""
            yield f"//{_tag(parent)}[{has_class(pclasses[0])}]/{tag}{own}", "class"
    # below the nearest ancestor with an id or a class
    node = element.getparent()
    while node is not None and isinstance(node.tag, str) and node.tag not in ("body", "html"):
        node_id = node.get("id")
        if node_id and _stable(node_id, avoid) and "'" not in node_id:
            rel = relative_path(node, element, avoid)
            if rel:
                yield f"//{_tag(node)}[@id={xq(node_id)}]/{rel}", "id"
            break
        node = node.getparent()
    node = element.getparent()
    while node is not None and isinstance(node.tag, str) and node.tag not in ("body", "html"):
        nclasses = _classes(node, avoid)
        if nclasses:
            rel = relative_path(node, element, avoid)
            if rel:
                yield f"//{_tag(node)}[{has_class(nclasses[0])}]/{rel}", "path"
            break
        node = node.getparent()
    # the last resort: where it is, counted from the root
    root = element.getroottree().getroot()
    rel = relative_path(root, element, avoid)
    if rel:
        yield f"/{_tag(root)}/{rel}", "positional"


def page_types(facts: PageFacts, avoid: tuple[str, ...]) -> list[str]:
    """Conditions naming the kind of page, from what `<body>` says of it (`data-page="about"`,
    `class="page-about"`, WordPress's `single-post`...): `/html[body[...]]`."""
    bodies = facts.tree.xpath("/html/body") if facts.tree is not None else []
    if not bodies:
        return []
    body = bodies[0]
    out = []
    for name, value in body.attrib.items():
        plain = "'" not in value and not any(ch.isdigit() for ch in value)
        if name.startswith("data-") and 0 < len(value) <= 30 and plain and _stable(value, avoid):
            out.append(f"/html[body[@{name}={xq(value)}]]")
    for name in _classes(body, avoid):
        if not any(ch.isdigit() for ch in name):
            out.append(f"/html[body[{has_class(name)}]]")
    return out[:3]


def value_steps(ftype: str) -> list[dict[str, Any]]:
    """The processors that turn the selected text into the field's type."""
    if ftype in ("integer", "number"):
        return [{"type": "number", "parameters": {}}]
    if ftype == "date":
        return [{"type": "date", "parameters": {}}]
    if ftype == "list":
        return [{"type": "split", "parameters": {"separator": ","}}]
    return [{"type": "trim", "parameters": {}}]


_DIGITS = re.compile(r"^\d+$")
_VERSION = re.compile(r"^\d+(?:\.\d+)+$")
_NUMBERISH = re.compile(r"^[-+]?\d[\d,. \u00a0']*$")


def _capture(needle: str, after: str) -> str:
    if _DIGITS.match(needle):
        return r"(\d+)"
    if _VERSION.match(needle):
        return r"(\d+(?:\.\d+)+)"
    if _NUMBERISH.match(needle):
        return r"(\d[\d,.]*\d|\d)"
    if after and after not in needle:
        return f"([^{re.escape(after)}]+)"
    return "(.+)"


def part_steps(text: str, needle: str, ftype: str) -> list[list[dict[str, Any]]]:
    """Ways to cut `needle` out of `text` (a longer text holding it): a `regex` with the literal
    context around it, or with a generalised prefix (`name: value`)."""
    index = text.find(needle)
    if index < 0:
        return []
    before, after = text[:index], text[index + len(needle) :]
    out: list[list[dict[str, Any]]] = []
    trim = {"type": "trim", "parameters": {}}

    def regex(pattern: str) -> dict[str, Any]:
        return {"type": "regex", "parameters": {"pattern": pattern}}

    tail = value_steps(ftype)
    tail = [] if tail == [trim] else tail
    if len(before) <= 60 and len(after) <= 60 and (before or after):
        pattern = "^" + _escape(before) + "(.+)" + _escape(after) + "$"
        if not after:
            pattern = "^" + _escape(before) + "(.+)$"
        out.append([trim, regex(pattern), *tail])
    numbered = re.fullmatch(r"(?:\d+(?:\.\d+)*\.? )?", before)
    if numbered is not None and after and len(after) <= 20:
        # section numbers ("9.43. Title"): numbered on some pages, not on others
        pattern = "^(?:\\d+(?:\\.\\d+)*\\.? )?(.+)" + _escape(after) + "$"
        out.append([trim, regex(pattern), *tail])
    words = before.split(" ")
    context = " ".join(words[-3:]) if before else ""
    if context and len(context) <= 40:
        stop = after[:1]
        capture = _capture(needle, stop)
        pattern = _escape(context) + capture
        if capture == "(.+)":
            pattern += _escape(after[:1]) if after else "$"
        out.append([trim, regex(pattern), *tail])
    # a generalised prefix ("name: value") and suffix (" (Unix)", " (deprecated)"): the parts
    # that change from record to record around the value
    separator = re.search(r"([:|\u2013\u2014-])\s*$", before)
    notes = re.fullmatch(r"(?:\s*\([^()]*\))+", after) if after else None
    head = None
    if separator and len(before) <= 80:
        mark = _escape(separator.group(1))
        head = f"^[^{mark}]*{mark}\\s*"
    elif not before:
        head = "^"
    if head is not None and (not after or notes):
        if not after and head != "^":
            out.append([trim, regex(head + "(\\S.*)$"), *tail])
        # notes may follow the value on other records even where they do not on this one
        out.append([trim, regex(head + "(\\S.*?)(?: \\([^()]*\\))*$"), *tail])
    if notes and context:
        pattern = _escape(context) + "(\\S.*?)(?: \\([^()]*\\))*$"
        out.append([trim, regex(pattern), *tail])
    return out


def _escape(text: str) -> str:
    """re.escape, but spaces left as they are (easier to read in a mapping file)."""
    return re.escape(text).replace("\\ ", " ")


def date_in(text: str, value: str) -> bool:
    try:
        return parse_date(text) == value
    except ValueError:
        return False


def candidates_for(
    facts: PageFacts,
    known: Any,
    ftype: str,
    needles: list[str],
    *,
    fragment: str = "",
    record_id: str = "",
    scoped: bool = False,
) -> dict[str, Candidate]:
    """Every candidate rule that selects the known value on this page."""
    out: dict[str, Candidate] = {}
    if facts.page.kind == "json" and facts.page.json is not None:
        # a JSON API answer: the value's key path, as a person would write it
        date = str(known) if ftype == "date" else None
        for path, whole in _json_paths([facts.page.json], needles, date):
            if whole:
                steps = [{"type": "jsonpath", "parameters": {"expression": path}}]
                made = candidate([*steps, *value_steps(ftype)], "json")
                out.setdefault(made.processors, made)
        return out
    if facts.tree is None:
        return out
    avoid = tuple(a for a in (fragment, record_id, *needles) if a and len(a) >= 2)
    scopes = _scope_of(facts, fragment, record_id) if scoped else []
    tail = value_steps(ftype)

    def add(steps: list[dict[str, Any]], kind: str) -> None:
        made = candidate(steps, kind)
        if made.processors not in out:
            out[made.processors] = made

    conditions = page_types(facts, avoid)
    for hit in find_hits(facts, needles, words=ftype != "date"):
        exact = hit.exact or (ftype == "date" and date_in(hit.text, str(known)))
        for expression, kind in element_selectors(facts, hit.element, hit.needle, avoid, scopes):
            if hit.attribute:
                if kind == "meta" and hit.attribute != "content":
                    continue
                expression = f"{expression}/@{hit.attribute}"
            variants = [expression]
            if expression.startswith("//") and kind not in ("record", "positional"):
                # the same rule on this kind of page only (a site's home page, its about page)
                variants += [condition + expression for condition in conditions]
            for variant in variants:
                if exact:
                    add([xp(variant), *tail], kind)
                else:
                    for steps in part_steps(hit.text, hit.needle, ftype):
                        add([xp(variant), *steps], kind)
    for path, whole in jsonld_paths(facts, needles, str(known) if ftype == "date" else None):
        head = [xp(JSONLD_SELECTOR), {"type": "jsonpath", "parameters": {"expression": path}}]
        if whole:
            add([*head, *tail], "jsonld")
            short = "$.." + path.rsplit(".", 1)[-1] if "." in path else None
            if short and re.fullmatch(r"\$\.\.[A-Za-z_]\w*", short):
                add(
                    [
                        xp(JSONLD_SELECTOR),
                        {"type": "jsonpath", "parameters": {"expression": short}},
                        {"type": "first", "parameters": {}},
                        *tail,
                    ],
                    "jsonld",
                )
    return out


MAX_FEATURE_ELEMENTS = 600  # elements of a record's section looked at for yes/no features


def presence_features(facts: PageFacts, fragment: str, record_id: str) -> set[str]:
    """XPath expressions of what is present in the record's section (its `$fragment` section,
    else the page): elements by class, directly under the section or anywhere in it, and short
    texts. A yes/no field is learned as the presence of one of them (`boolean(...)`)."""
    tree = facts.tree
    if tree is None:
        return set()
    head, root = "", None
    if fragment:
        named = _BY_ID(tree, v=fragment)
        if named:
            head, root = "//*[@id=$fragment]", named[0]
    if root is None:
        bodies = tree.xpath("//body")
        root = bodies[0] if bodies else tree
    avoid = tuple(a for a in (fragment, record_id) if a)
    out: set[str] = set()
    for count, element in enumerate(root.iterdescendants()):
        if count >= MAX_FEATURE_ELEMENTS:
            break
        if not isinstance(element.tag, str) or element.tag in ("script", "style"):
            continue
        tag = _tag(element)
        for name in _classes(element, avoid)[:3]:
            out.add(f"{head}//{tag}[{has_class(name)}]")
            if head and element.getparent() is root:
                out.add(f"{head}/{tag}[{has_class(name)}]")
        text = (element.text or "").strip()
        short = 2 < len(text) <= 25 and len(element) == 0
        if short and not any(ch.isdigit() for ch in text) and not any(a in text for a in avoid):
            out.add(f"{head}//{tag}[normalize-space(.)={xq(clean_text(text))}]")
    return out


def presence_candidate(feature: str) -> Candidate:
    kind = "record" if feature.startswith("//*[@id=$fragment]") else "class"
    if "normalize-space(.)=" in feature and "@class" not in feature:
        kind = "record" if kind == "record" else "label"
    return candidate([xp(f"boolean({feature})")], kind)
