"""The XPath a person would write to select an element: anchored on a structured-data key
(OpenGraph/`<meta>`, microdata `itemprop`, RDFa `property`), `<title>`, `<link rel=canonical>`, an
`id`, a label ("the cell after the header 'VAT'"), a class, the record's own section (`$fragment`,
`$id`); a path from the root only when nothing anchors it."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import lxml.etree

from enrich_crawl.extract.learn.facts import PageFacts, deepest
from enrich_crawl.values import clean_text

MAX_LABEL = 40  # characters of a label ("Founded", "Source code:")
_SKIP = "not(ancestor-or-self::script or ancestor-or-self::style or ancestor-or-self::noscript)"
BY_ID = lxml.etree.XPath("//*[@id = $v]")
_TEXT_IS = lxml.etree.XPath(f"//*[{_SKIP}][normalize-space(.) = $v]")
_UNSTABLE = re.compile(r"\d{3,}|[0-9a-f]{8,}", re.I)  # generated ids/classes (ember123, a1b2c3d4..)
_TAG = re.compile(r"^[A-Za-z][\w-]*$")


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


def stable_token(token: str, avoid: tuple[str, ...]) -> bool:
    return bool(token) and not _UNSTABLE.search(token) and not any(a and a in token for a in avoid)


def stable_classes(element: Any, avoid: tuple[str, ...]) -> list[str]:
    return [
        c for c in (element.get("class") or "").split() if stable_token(c, avoid) and "'" not in c
    ]


def tag_name(element: Any) -> str:
    tag = element.tag if isinstance(element.tag, str) else "*"
    return tag if _TAG.match(tag) and ":" not in tag else "*"


_HEADINGS = frozenset({"h1", "h2", "h3", "h4", "h5", "h6"})
ANY_HEADING = "*[self::h1 or self::h2 or self::h3 or self::h4 or self::h5 or self::h6]"


def _step(element: Any, avoid: tuple[str, ...], *, positional: bool = True) -> str:
    """One location step for `element` below its parent: tag, a class if it has one, a
    position only when its siblings of the same tag are otherwise indistinguishable. A heading is
    any heading: a section's title is an h1 on one page and an h2 on the next."""
    tag = tag_name(element)
    if tag in _HEADINGS and not element.get("class"):
        return ANY_HEADING + ("[1]" if positional else "")
    classes = stable_classes(element, avoid)
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


def record_scopes(facts: PageFacts, fragment: str, record_id: str) -> list[tuple[str, Any]]:
    """Elements that name the record on a page serving several: (XPath using $fragment/$id,
    element)."""
    tree = facts.tree
    out: list[tuple[str, Any]] = []
    if fragment:
        for element in BY_ID(tree, v=fragment)[:1]:
            # id(): the parser's index of ids, not a walk of the whole page (a 700 KB page of
            # the Python docs: 0.01 ms instead of 20 ms per evaluation)
            out.append(("id($fragment)", element))
    if record_id and len(record_id) <= 80 and not out:
        for element in deepest(_TEXT_IS(tree, v=record_id))[:3]:
            out.append((f"//{tag_name(element)}[normalize-space(.)=$id]", element))
    return out


_ID_HEAD = re.compile(r"^(.*?[-_:.])")
_IDS_STARTING = lxml.etree.XPath("//*[starts-with(@id, $head)]")
MAX_SECTION_LEVELS = 6
MAX_OTHER_RECORDS = 2000  # elements naming other records looked at per page


def _signature(element: Any) -> tuple[Any, ...]:
    """What an element holding a record's id has in common with those holding the others' (a
    table's first cell in every row): its tag, class, parent's tag and place among its siblings
    of the same tag."""
    parent = element.getparent()
    siblings = [s for s in parent if s.tag == element.tag] if parent is not None else [element]
    return (
        element.tag,
        element.get("class"),
        getattr(parent, "tag", None),
        siblings.index(element),
    )


def record_section(facts: PageFacts, named: Any, expression: str, fragment: str) -> Any:
    """The record's own section of a page that serves several: from the element that names it
    (`id($fragment)`, or the element whose text is the record's id) up to the last ancestor that
    names no other record (holds no id like the fragment, `org-12` beside `org-7`, nor an
    element like the one holding the record's id); never the whole body. One walk of the page
    per page and kind of name (the elements naming other records, and their ancestors)."""
    if expression.startswith("id("):
        head_match = _ID_HEAD.match(fragment)
        if head_match is None:
            return named
        key: tuple[Any, ...] = ("id", head_match.group(1))
    else:
        key = ("text", *_signature(named))
    others = facts.record_ancestors.get(key)
    if others is None:
        if key[0] == "id":
            naming = _IDS_STARTING(facts.tree, head=key[1])
        else:
            naming = [e for e in facts.tree.iter(named.tag) if _signature(e) == key[1:]]
        others = {}
        for element in naming[:MAX_OTHER_RECORDS]:
            for ancestor in element.iterancestors():
                others.setdefault(ancestor, []).append(element)
        facts.record_ancestors[key] = others
    section = named
    for _level in range(MAX_SECTION_LEVELS):
        parent = section.getparent()
        if parent is None or not isinstance(parent.tag, str) or parent.tag in ("body", "html"):
            break
        if any(other is not named for other in others.get(parent, ())):
            break
        section = parent
    return section


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
    tag = tag_name(element)
    itemprop = element.get("itemprop")
    if itemprop and stable_token(itemprop, avoid) and "'" not in itemprop:
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
        if ancestor is None or tag_name(ancestor) in ("body", "html"):
            continue  # the whole page is no record's section
        rel = relative_path(ancestor, element, avoid)
        if ancestor is named:
            head = expression
        else:
            head = f"{expression}/ancestor::{tag_name(ancestor)}[1]"
        if rel:
            yield f"{head}/{rel}", "record"
            loose = relative_path(ancestor, element, avoid, positional=False)
            if loose and loose != rel:
                yield f"{head}/{loose}", "record"
            label = _label_of(element, needle)
            if label is not None and _common_ancestor(label[0], element) is not None:
                ltag, ltext = tag_name(label[0]), label[1]
                yield (
                    f"{head}//{ltag}[normalize-space(.)={xq(ltext)}]/following-sibling::{tag}[1]",
                    "record",
                )
    # an id
    element_id = element.get("id")
    if element_id and stable_token(element_id, avoid) and "'" not in element_id:
        yield f"//{tag}[@id={xq(element_id)}]", "id"
    # a label: "the cell after the header 'Status:'"
    label = _label_of(element, needle)
    if label is not None:
        label_element, text = label
        ltag = tag_name(label_element)
        if label_element.getparent() is element.getparent():
            yield (
                f"//{ltag}[normalize-space(.)={xq(text)}]/following-sibling::{tag}[1]",
                "label",
            )
        else:
            ptag = tag_name(element.getparent())
            yield (
                f"//{ltag}[normalize-space(.)={xq(text)}]/following-sibling::{ptag}[1]/{tag}",
                "label",
            )
    # a class, alone or under its parent's class
    classes = stable_classes(element, avoid)
    for name in classes[:2]:
        yield f"//{tag}[{has_class(name)}]", "class"
    parent = element.getparent()
    if parent is not None and isinstance(parent.tag, str):
        pclasses = stable_classes(parent, avoid)
        if pclasses:
            own = f"[{has_class(classes[0])}]" if classes else ""
            yield f"//{tag_name(parent)}[{has_class(pclasses[0])}]/{tag}{own}", "class"
    # below the nearest ancestor with an id or a class
    node = element.getparent()
    while node is not None and isinstance(node.tag, str) and node.tag not in ("body", "html"):
        node_id = node.get("id")
        if node_id and stable_token(node_id, avoid) and "'" not in node_id:
            rel = relative_path(node, element, avoid)
            if rel:
                yield f"//{tag_name(node)}[@id={xq(node_id)}]/{rel}", "id"
            break
        node = node.getparent()
    node = element.getparent()
    while node is not None and isinstance(node.tag, str) and node.tag not in ("body", "html"):
        nclasses = stable_classes(node, avoid)
        if nclasses:
            rel = relative_path(node, element, avoid)
            if rel:
                yield f"//{tag_name(node)}[{has_class(nclasses[0])}]/{rel}", "path"
            break
        node = node.getparent()
    # the last resort: where it is, counted from the root
    root = element.getroottree().getroot()
    rel = relative_path(root, element, avoid)
    if rel:
        yield f"/{tag_name(root)}/{rel}", "positional"


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
        if (
            name.startswith("data-")
            and 0 < len(value) <= 30
            and plain
            and stable_token(value, avoid)
        ):
            out.append(f"/html[body[@{name}={xq(value)}]]")
    for name in stable_classes(body, avoid):
        if not any(ch.isdigit() for ch in name):
            out.append(f"/html[body[{has_class(name)}]]")
    return out[:3]
