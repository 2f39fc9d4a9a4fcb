"""Candidate rules for a known value on an example page: the processor chains that select it
(see `selectors` for the XPath, `facts` for where the value is), followed by the steps that turn
the selected text into the value (`regex` cutting a part out, `number`, `date`...), and yes/no
rules (the presence of something in the record's section).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from enrich_crawl.extract.learn.facts import (
    PageFacts,
    date_in,
    find_hits,
    json_paths,
    jsonld_paths,
)
from enrich_crawl.extract.learn.selectors import (
    BY_ID,
    element_selectors,
    has_class,
    page_types,
    record_scopes,
    record_section,
    stable_classes,
    tag_name,
    xp,
    xq,
)
from enrich_crawl.values import clean_text

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
JSONLD_SELECTOR = "//script[@type='application/ld+json']"


@dataclass(frozen=True)
class Candidate:
    """A processor chain for one field, and what kind of anchor it uses."""

    processors: str  # JSON of the processor list (hashable, the candidate's identity)
    kind: str
    cost: int  # simplicity: lower is simpler

    @property
    def chain(self) -> list[dict[str, Any]]:
        return json.loads(self.processors)


_LABELLED = re.compile(r"normalize-space\(\.\)=.*?following-sibling::")
LABEL_BONUS = 10  # within a kind, a label-anchored rule counts as this many steps shorter


def candidate(steps: list[dict[str, Any]], kind: str) -> Candidate:
    """A rule's identity and cost: its kind, then its length; within a kind a rule anchored on
    a label ("the link after 'Source code:'") goes before one that counts on the page's shape
    (the first link of the section's paragraph), which the rest of a site may not share."""
    text = json.dumps(steps, ensure_ascii=False, separators=(",", ":"))
    cost = KIND_COST[kind] * 100 + len(text) // 8
    if _LABELLED.search(text):
        cost -= LABEL_BONUS
    return Candidate(text, kind, cost)


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


def candidates_for(
    facts: PageFacts,
    known: Any,
    ftype: str,
    needles: list[str],
    *,
    fragment: str = "",
    record_id: str = "",
    scoped: bool = False,
    contexts: dict[tuple[str, str], tuple[str, str, str]] | None = None,
) -> dict[str, Candidate]:
    """Every candidate rule that selects the known value on this page; where a selector gives a
    longer text holding the value, `contexts` gets (selector, kind) -> (text before, value, text
    after), for generalising over records (see generalise)."""
    out: dict[str, Candidate] = {}
    if facts.page.kind == "json" and facts.page.json is not None:
        # a JSON API answer: the value's key path, as a person would write it
        date = str(known) if ftype == "date" else None
        for path, whole in json_paths([facts.page.json], needles, date):
            if whole:
                steps = [{"type": "jsonpath", "parameters": {"expression": path}}]
                made = candidate([*steps, *value_steps(ftype)], "json")
                out.setdefault(made.processors, made)
        return out
    if facts.tree is None:
        return out
    avoid = tuple(a for a in (fragment, record_id, *needles) if a and len(a) >= 2)
    scopes = record_scopes(facts, fragment, record_id) if scoped else []
    tail = value_steps(ftype)

    def add(steps: list[dict[str, Any]], kind: str) -> None:
        made = candidate(steps, kind)
        if made.processors not in out:
            out[made.processors] = made

    conditions = page_types(facts, avoid)
    sections = [record_section(facts, named, expression, fragment) for expression, named in scopes]
    for hit in find_hits(facts, needles, words=ftype != "date", within=sections):
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
                    index = hit.text.find(hit.needle)
                    if contexts is not None and index >= 0:
                        end = index + len(hit.needle)
                        contexts.setdefault(
                            (variant, kind), (hit.text[:index], hit.needle, hit.text[end:])
                        )
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
        named = BY_ID(tree, v=fragment)
        if named:
            head, root = "id($fragment)", named[0]
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
        tag = tag_name(element)
        for name in stable_classes(element, avoid)[:3]:
            out.add(f"{head}//{tag}[{has_class(name)}]")
            if head and element.getparent() is root:
                out.add(f"{head}/{tag}[{has_class(name)}]")
        text = (element.text or "").strip()
        short = 2 < len(text) <= 25 and len(element) == 0
        if short and not any(ch.isdigit() for ch in text) and not any(a in text for a in avoid):
            out.add(f"{head}//{tag}[normalize-space(.)={xq(clean_text(text))}]")
    return out


def presence_candidate(feature: str) -> Candidate:
    kind = "record" if feature.startswith("id($fragment)") else "class"
    if "normalize-space(.)=" in feature and "@class" not in feature:
        kind = "record" if kind == "record" else "label"
    return candidate([xp(f"boolean({feature})")], kind)
