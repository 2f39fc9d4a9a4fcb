"""Links to deeper pages: where a value sits only on a page linked from the record's own (the
about page of a home page), the link that leads there, learned and judged like a field rule and
written as `url_parsers`."""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from typing import Any

from enrich_crawl.extract.errors import MappingError
from enrich_crawl.extract.learn.facts import PageFacts
from enrich_crawl.extract.learn.judge import LINK_MIN_PRECISION, MAX_TRAIN, Prepared
from enrich_crawl.extract.learn.selectors import has_class, page_types, xq
from enrich_crawl.extract.learn.templates import GENERIC_PATTERN
from enrich_crawl.extract.mapping import compile_mapping, run_mapping

MAX_LINK_CANDIDATES = 72  # link rules judged per template, best supported first


def _link_candidates(parent: PageFacts, target_url: str) -> list[tuple[str, str]]:
    """(XPath of the link's href, kind) for the links of `parent` that lead to `target_url`."""
    out: list[tuple[str, str]] = []
    fragment = parent.source.fragment
    section = parent.tree.xpath("//*[@id=$v]", v=fragment) if fragment else []
    for anchor in parent.links().get(target_url, [])[:3]:
        if section and any(a is section[0] for a in anchor.iterancestors()):
            # the link in the record's own section of a page that lists several
            classes = [c for c in (anchor.get("class") or "").split() if "'" not in c]
            text = " ".join((anchor.xpath("normalize-space(.)") or "").split())
            if classes:
                out.append((f"id($fragment)//a[{has_class(classes[0])}]/@href", "record"))
            if 0 < len(text) <= 40:
                out.append((f"id($fragment)//a[normalize-space(.)={xq(text)}]/@href", "record"))
        text = " ".join((anchor.xpath("normalize-space(.)") or "").split())
        if 0 < len(text) <= 40:
            out.append((f"//a[normalize-space(.)={xq(text)}]/@href", "label"))
        classes = [c for c in (anchor.get("class") or "").split() if "'" not in c]
        if classes:
            out.append((f"//a[{has_class(classes[0])}]/@href", "class"))
        parent_el = anchor.getparent()
        pclasses = [c for c in (parent_el.get("class") or "").split() if "'" not in c]
        if pclasses and parent_el.tag in ("li", "div", "p", "span", "td"):
            joined = " ".join(pclasses)
            out.append((f"//{parent_el.tag}[@class={xq(joined)}]/a/@href", "class"))
        if classes and pclasses:
            out.append(
                (
                    f"//{parent_el.tag}[{has_class(pclasses[-1])}]/a[{has_class(classes[0])}]/@href",
                    "class",
                )
            )
    # the same links on this kind of page only (the home page's menu, not every page's)
    conditions = page_types(parent, ())
    out += [(c + e, k) for e, k in list(out) if e.startswith("//") for c in conditions]
    return out


def learn_links(
    items: list[Prepared],
    value_pages: dict[str, dict[str, set[str]]],
    rng: random.Random,
    min_precision: float,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """url_parsers that lead from a record's pages to the deeper pages holding its values.

    `value_pages`: record id -> {URL of a deeper page where a kept field rule yields the known
    value: those fields}. A link rule is judged on the held-out records that have a known value
    of a field it led to in training: it must lead to the page holding it (or to a page on the way
    there). Returns (url_parsers, report entries)."""
    support: Counter[str] = Counter()
    kinds: dict[str, str] = {}
    serves: dict[str, set[str]] = defaultdict(set)
    deep = [p for p in items if value_pages.get(p.example.record_id)]
    if len(deep) < 2:
        return [], []
    max_depth = max(f.depth for p in deep for f in p.pages)
    leads: dict[str, dict[str, set[str]]] = {}  # record -> URL on the way to values -> fields
    hops: dict[str, list[tuple[PageFacts, PageFacts]]] = {}
    for prepared in deep:
        record = prepared.example.record_id
        by_url = {f.source.url: f for f in prepared.pages}
        leads[record] = defaultdict(set)
        hops[record] = []
        for url, fields in value_pages[record].items():
            if url not in by_url:
                continue
            for parent, child in _path_to(prepared, by_url[url], by_url):
                leads[record][child.source.url] |= fields
                hops[record].append((parent, child))
    order = list(deep)
    rng.shuffle(order)
    n_held = max(1, round(len(order) * 0.4))
    held, train = order[:n_held], order[n_held:][:MAX_TRAIN]
    for prepared in train:
        record = prepared.example.record_id
        here: set[str] = set()
        for parent, child in hops[record]:
            for expression, kind in _link_candidates(parent, child.source.url):
                kinds.setdefault(expression, kind)
                serves[expression] |= leads[record][child.source.url]
                here.add(expression)
        support.update(here)
    reports: list[dict[str, Any]] = []
    parsers: list[dict[str, Any]] = []
    covered: set[str] = set()
    # the best supported links of each set of fields first (the about page's link should not
    # crowd out the team page's)
    by_fields: dict[frozenset[str], list[str]] = defaultdict(list)
    for expression in sorted(support, key=lambda e: (-support[e], len(e))):
        by_fields[frozenset(serves[expression])].append(expression)
    ranked = [
        e
        for rank in range(max(len(v) for v in by_fields.values()))
        for v in by_fields.values()
        if rank < len(v)
        for e in v[rank : rank + 1]
    ]
    for expression in ranked[:MAX_LINK_CANDIDATES]:
        if support[expression] < 2 and len(train) >= 4:
            continue
        try:
            mapping = compile_mapping(
                {
                    "name": "links",
                    "url_patterns": [GENERIC_PATTERN],
                    "url_parsers": [
                        {
                            "processors": [
                                {"type": "xpath", "parameters": {"expression": expression}}
                            ]
                        }
                    ],
                }
            )
        except MappingError:
            continue
        useful = yielded = fetched = pages_linking = relevant = 0
        reached: set[str] = set()
        for prepared in held:
            record = prepared.example.record_id
            targets = {u for u, f in leads[record].items() if f & serves[expression]}
            if not targets:
                continue  # no known value of the fields this link leads to
            relevant += 1
            got: set[str] = set()
            for facts in prepared.pages:
                if facts.depth >= max_depth:
                    continue  # links of the deepest pages are never followed
                result = run_mapping(
                    mapping,
                    facts.page,
                    fragment=facts.source.fragment,
                    record_id=prepared.example.record_id,
                    with_links=True,
                    only_fields=(),
                )
                links = {u.split("#")[0] for u in result.links}
                if links:
                    pages_linking += 1
                    fetched += len(links)
                got |= links
            if got:
                yielded += 1
                hit = got & targets
                if hit:
                    useful += 1
                    reached.update(f"{prepared.example.record_id} {u}" for u in hit)
        precision = useful / yielded if yielded else 0.0
        entry = {
            "rule": expression,
            "kind": kinds[expression],
            "fields": sorted(serves[expression]),
            "held_out": relevant,
            "yielded": yielded,
            "precision": round(precision, 4),
            "recall": round(useful / relevant, 4) if relevant else 0.0,
            "links_per_page": round(fetched / pages_linking, 2) if pages_linking else 0.0,
        }
        keep = (
            yielded
            and precision >= min(min_precision, LINK_MIN_PRECISION)
            and fetched / pages_linking <= 3
            and not reached <= covered
        )
        entry["kept"] = bool(keep)
        reports.append(entry)
        if keep:
            covered |= reached
            parsers.append(
                {
                    "description": f"learned: links to the pages holding values ({entry['kind']})",
                    "processors": [{"type": "xpath", "parameters": {"expression": expression}}],
                }
            )
        if len(parsers) >= 8:
            break
    return parsers, reports


def _path_to(prepared: Prepared, target: PageFacts, by_url: dict[str, PageFacts]):
    """Parent -> child page pairs from a depth-0 page down to `target` (breadth-first over the
    record's own pages and their links)."""
    if target.depth == 0:
        return []
    for parent in prepared.pages:
        if parent.depth == target.depth - 1 and target.source.url in parent.links():
            return [*_path_to(prepared, parent, by_url), (parent, target)]
    return []
