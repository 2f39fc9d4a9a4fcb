"""The learner: example records with known values -> mapping files that reproduce them.

1. Pages are grouped into site templates: the registrable domain, then the host and the URL
   shape (the path prefix shared by the example pages). A template with enough examples gets its
   own mapping; the long tail (hosts with one or two examples) is learned together, into one
   low-priority generic mapping whose rules must hold across hosts.
2. On the training part of a template's examples, every place where a known value sits (see
   `locate`) gives candidate rules; those found on the most examples are kept for validation.
3. Each candidate is compiled as a mapping and run by the extraction engine itself on the held-out
   examples' pages (a record's value is the first its pages yield, shallowest page first, as the
   crawl resolves it). Precision: held-out examples where it yields the known value, over those
   where it yields anything (a wrong value counts against it, nothing does not). Recall: over all
   held-out examples of the field. A rule is kept only at precision >= `min_precision`; among
   those, the most right values net of wrong ones (one wrong weighs ten missing), then the
   simplest wins.
4. A value found only on deeper pages (depth >= 1) needs the link to them: link rules (the anchor
   text, its class, ...) are learned the same way and written as `url_parsers`.
"""

from __future__ import annotations

import datetime as dt
import random
import re
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from enrich_crawl.extract.errors import MappingError
from enrich_crawl.extract.learn.compare import known_value, renderings, same_value
from enrich_crawl.extract.learn.locate import (
    CROSS_SITE_KINDS,
    Candidate,
    PageFacts,
    candidate,
    candidates_for,
    has_class,
    page_types,
    presence_candidate,
    presence_features,
    value_on_page,
    xq,
)
from enrich_crawl.extract.learn.model import Example, LearnResult
from enrich_crawl.extract.mapping import Mapping, MappingSet, compile_mapping, run_mapping

MIN_TEMPLATE_EXAMPLES = 4  # fewer examples on a template: its records go to the generic mapping
MAX_TRAIN = 24  # training examples per template and field (candidates come from these)
MAX_HELD_OUT = 80  # held-out examples per template and field (rules are validated on these)
MAX_CANDIDATES = 36  # candidates validated per field and template, most supported first
PER_HOST_GENERIC = 2  # examples per host in the generic mapping (every host weighs the same)
TEMPLATE_PRIORITY = -10
GENERIC_PRIORITY = -20
MIN_HELD_OUT_YIELD = 2  # a rule must have yielded on this many held-out examples to be judged


@dataclass
class Prepared:
    example: Example
    pages: list[PageFacts]
    values: dict[str, Any]  # known values, typed as the dataset types them
    needles: dict[str, list[str]] = field(default_factory=dict)  # field -> renderings

    @property
    def host(self) -> str:
        return urlsplit(self.pages[0].source.url).hostname or "" if self.pages else ""


@dataclass
class Judged:
    candidate: Candidate
    yielded: int = 0
    correct: int = 0
    held_out: int = 0
    mistakes: list[dict[str, Any]] = field(default_factory=list)
    outcomes: dict[str, bool] = field(default_factory=dict)  # record -> right? (where it yielded)

    @property
    def precision(self) -> float:
        return self.correct / self.yielded if self.yielded else 0.0

    @property
    def recall(self) -> float:
        return self.correct / self.held_out if self.held_out else 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "rule": self.candidate.chain,
            "kind": self.candidate.kind,
            "held_out": self.held_out,
            "yielded": self.yielded,
            "correct": self.correct,
            "precision": round(self.precision, 4),
            "recall": round(self.recall, 4),
        }


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")[:60] or "site"


def _prepare(examples: Iterable[Example], field_types: dict[str, str]) -> list[Prepared]:
    out = []
    for example in examples:
        values = {}
        for name, value in (example.values or {}).items():
            ftype = field_types.get(name)
            if ftype is None:
                continue
            typed = known_value(value, ftype)
            if typed is not None:
                values[name] = typed
        pages = []
        for page in sorted(example.pages, key=lambda p: p.depth):
            try:
                pages.append(PageFacts(page))
            except (ValueError, TypeError):
                continue  # an undecodable page teaches nothing; the others still do
        if pages and values:
            out.append(Prepared(example, pages, values))
    return out


def _template_key(prepared: Prepared) -> tuple[str, str]:
    """(host, path prefix) of the record's first page: the site a mapping is written for."""
    parts = urlsplit(prepared.pages[0].source.url)
    host = (parts.hostname or "").lower()
    path = parts.path or "/"
    directory = path.rsplit("/", 1)[0] + "/" if "/" in path else "/"
    segments = [s for s in directory.split("/") if s]
    # the first path segment keeps shared hosts' sites apart (sites.host/<slug>/...)
    return host, ("/" + segments[0] + "/") if segments else "/"


def _url_pattern(host: str, prefix: str) -> dict[str, Any]:
    host_re = re.escape(host.removeprefix("www."))
    prefix_re = re.escape(prefix) if prefix != "/" else "/"
    return {
        "type": "regex",
        "pattern": f"^https?://(?:www\\.)?{host_re}(?::\\d+)?{prefix_re}[^#]*(?:#.*)?$",
    }


GENERIC_PATTERN = {"type": "regex", "pattern": "^https?://[^/]+/[^#]*(?:#.*)?$"}


class _Compiled:
    """Candidates compiled once as one-field mappings (so the engine runs them exactly as a
    learned mapping file would be run)."""

    def __init__(self) -> None:
        self.cache: dict[tuple[str, str], Mapping | None] = {}

    def get(self, name: str, cand: Candidate) -> Mapping | None:
        key = (name, cand.processors)
        if key not in self.cache:
            raw = {
                "name": "candidate",
                "url_patterns": [GENERIC_PATTERN],
                "fields": [{"name": name, "processors": cand.chain}],
            }
            try:
                self.cache[key] = compile_mapping(raw)
            except MappingError:
                self.cache[key] = None  # e.g. a regex the engine refuses: not a rule
        return self.cache[key]


def _predict(mapping: Mapping, prepared: Prepared, name: str, ftype: str) -> tuple[Any, str]:
    """The value the crawl would resolve for the record: the first its pages yield, by depth.

    A deeper page counts only if it holds the known value somewhere: the crawl reaches deeper
    pages through learned links, which lead to those pages; a fetcher's probe of a whole site
    also holds the pages of other records (a directory's other entries), which the crawl of this
    record would never see."""
    example = prepared.example
    needles = prepared.needles.get(name)
    if needles is None:
        needles = prepared.needles[name] = renderings(prepared.values[name], ftype)
    for facts in prepared.pages:
        if facts.depth and (
            ftype == "boolean" or not value_on_page(facts, needles, words=ftype != "date")
        ):
            continue
        result = run_mapping(
            mapping,
            facts.page,
            fragment=facts.source.fragment,
            record_id=example.record_id,
            field_types={name: ftype},
            only_fields=(name,),
            with_links=False,
        )
        if name in result.fields:
            return result.fields[name], facts.source.url
    return None, ""


def _split(items: list[Prepared], rng: random.Random, *, by_host: bool) -> tuple[list, list]:
    """Training and held-out examples (whole hosts held out for the generic mapping)."""
    if by_host:
        hosts = sorted({p.host for p in items})
        rng.shuffle(hosts)
        held_hosts = set(hosts[: max(1, round(len(hosts) * 0.4))])
        train = [p for p in items if p.host not in held_hosts]
        held = [p for p in items if p.host in held_hosts]
        return train, held
    order = list(items)
    rng.shuffle(order)
    n_train = min(MAX_TRAIN, max(1, round(len(order) * 0.6)))
    return order[:n_train], order[n_train:]


def _diverse(items: list[Prepared], limit: int) -> list[Prepared]:
    """Up to `limit` examples, in turn from each kind of first page (what its `<body>` says it
    is), those with the most pages first within a kind."""
    kinds: dict[tuple[str, ...], list[Prepared]] = defaultdict(list)
    for item in sorted(items, key=lambda p: (-len(p.pages), p.example.record_id)):
        kinds[tuple(page_types(item.pages[0], ()))].append(item)
    out: list[Prepared] = []
    queues = list(kinds.values())
    while len(out) < limit and any(queues):
        for queue in queues:
            if queue and len(out) < limit:
                out.append(queue.pop(0))
    return out


def _both_answers(train: list[Prepared], name: str, limit: int) -> list[Prepared]:
    """Up to `limit` training examples of a yes/no field, the rarer answer's kept first (up to
    half): four deprecated modules among forty must all reach training, or nothing is learned."""
    by_answer = {a: [p for p in train if p.values[name] is a] for a in (True, False)}
    rare, common = sorted(by_answer.values(), key=len)
    kept = _diverse(rare, max(1, limit // 2))
    return kept + _diverse(common, limit - len(kept))


def _field_examples(items: list[Prepared], name: str) -> list[Prepared]:
    return [p for p in items if name in p.values]


def _judge(
    compiled: _Compiled, cand: Candidate, held: list[Prepared], name: str, ftype: str
) -> Judged | None:
    mapping = compiled.get(name, cand)
    if mapping is None:
        return None
    judged = Judged(cand, held_out=len(held))
    for prepared in held:
        value, url = _predict(mapping, prepared, name, ftype)
        if value is None:
            continue
        judged.yielded += 1
        right = same_value(value, prepared.values[name], ftype)
        judged.outcomes[prepared.example.record_id] = right
        if right:
            judged.correct += 1
        elif len(judged.mistakes) < 3:
            judged.mistakes.append(
                {
                    "record": prepared.example.record_id,
                    "url": url,
                    "expected": prepared.values[name],
                    "got": value,
                }
            )
    return judged


# a link that leads nowhere costs one polite fetch, not a wrong value: a lower bar than fields
LINK_MIN_PRECISION = 0.8
WRONG_COST = 10  # a wrong value costs as much as this many missing ones


def _choose(judged: list[Judged], min_precision: float) -> Judged | None:
    """The rule to keep: precision at least `min_precision` on enough held-out yields; then the
    most right values net of wrong ones (a wrong value weighs `WRONG_COST` missing ones: precision
    first, coverage next), then the more precise, then the simplest."""
    qualified = [
        j
        for j in judged
        if j.yielded >= min(MIN_HELD_OUT_YIELD, j.held_out) and j.precision >= min_precision
    ]
    if not qualified:
        return None
    return min(
        qualified,
        key=lambda j: (
            -(j.correct - WRONG_COST * (j.yielded - j.correct)),
            -j.precision,
            j.candidate.cost,
        ),
    )


MAX_FALLBACKS = 2  # second and third rules of a field, for the examples the first leaves empty


@dataclass
class FieldOutcome:
    kept: Judged | None
    rejected: list[Judged]
    examples: int
    train: int
    held_out: int
    why: str = ""
    fallbacks: list[Judged] = field(default_factory=list)


def _predict_chain(
    mappings: list[Mapping], prepared: Prepared, name: str, ftype: str
) -> tuple[Any, int]:
    """(value, index of the rule that gave it) as the crawl resolves several rules of a field:
    shallowest page first, then the rules in priority order."""
    needles = prepared.needles.get(name)
    if needles is None:
        needles = prepared.needles[name] = renderings(prepared.values[name], ftype)
    for facts in prepared.pages:
        if facts.depth and (
            ftype == "boolean" or not value_on_page(facts, needles, words=ftype != "date")
        ):
            continue
        for index, mapping in enumerate(mappings):
            result = run_mapping(
                mapping,
                facts.page,
                fragment=facts.source.fragment,
                record_id=prepared.example.record_id,
                field_types={name: ftype},
                only_fields=(name,),
                with_links=False,
            )
            if name in result.fields:
                return result.fields[name], index
    return None, -1


def _fallbacks(
    compiled: _Compiled,
    kept: Judged,
    judged: list[Judged],
    pool: list[Prepared],
    name: str,
    ftype: str,
    min_precision: float,
) -> list[Judged]:
    """Rules that fill what the kept rule leaves empty (another site's structured-data key, a
    second layout). Each is judged together with the rules before it, as the crawl will run them
    (a lower-priority rule on a shallower page comes first): on the examples (training and
    held-out: few are left) where it is the one that gives the value."""
    out: list[Judged] = []
    rules = [compiled.get(name, kept.candidate)]
    for _level in range(MAX_FALLBACKS):
        parts = []
        for j in judged:
            if j is kept or any(j.candidate is o.candidate for o in out):
                continue
            mapping = compiled.get(name, j.candidate)
            if mapping is None:
                continue
            part = Judged(j.candidate, held_out=len(pool))
            for prepared in pool:
                value, index = _predict_chain([*rules, mapping], prepared, name, ftype)
                if index != len(rules):
                    continue
                part.yielded += 1
                right = same_value(value, prepared.values[name], ftype)
                part.correct += right
                part.outcomes[prepared.example.record_id] = right
            # one right value and no wrong one is enough for a structured-data key, two for
            # anything else
            if part.correct >= 2 or (
                part.correct == part.yielded == 1 and part.candidate.kind in CROSS_SITE_KINDS
            ):
                parts.append(part)
        best = _choose(parts, min_precision)
        if best is None:
            break
        out.append(best)
        rules.append(compiled.get(name, best.candidate))
    return out


def _learn_field(
    items: list[Prepared],
    name: str,
    ftype: str,
    *,
    generic: bool,
    min_precision: float,
    rng: random.Random,
    compiled: _Compiled,
    shared_pages: set[str],
) -> FieldOutcome:
    with_value = _field_examples(items, name)
    if len(with_value) < 2:
        return FieldOutcome(None, [], len(with_value), 0, 0, "fewer than 2 examples with a value")
    if ftype == "boolean" and not generic:  # both answers on both sides of the split
        train, held = [], []
        for answer in (True, False):
            part_train, part_held = _split(
                [p for p in with_value if p.values[name] is answer], rng, by_host=False
            )
            train += part_train
            held += part_held
    else:
        train, held = _split(with_value, rng, by_host=generic)
    if not train or not held:
        return FieldOutcome(None, [], len(with_value), len(train), len(held), "too few hosts")
    # those with the most pages first: a probe that read a whole site shows where values sit
    # (the generic mapping sees many kinds of site: twice as many, taken in turn from each kind
    # of first page, so that one kind of site does not fill the training set)
    limit = MAX_TRAIN * (2 if generic else 1)
    if ftype == "boolean":
        train = _both_answers(train, name, limit)
    else:
        train = _diverse(train, limit)
    held = held[:MAX_HELD_OUT]
    support: Counter[str] = Counter()
    found: dict[str, Candidate] = {}
    if ftype == "boolean":
        found, support, why = _presence_candidates(train, name)
        if not found:
            return FieldOutcome(None, [], len(with_value), len(train), len(held), why)
    for prepared in train if ftype != "boolean" else []:
        known = prepared.values[name]
        needles = renderings(known, ftype)
        seen_here: set[str] = set()
        for facts in prepared.pages:
            scoped = bool(facts.source.fragment) or facts.source.url in shared_pages
            cands = candidates_for(
                facts,
                known,
                ftype,
                needles,
                fragment=facts.source.fragment,
                record_id=prepared.example.record_id,
                scoped=scoped,
            )
            for key, cand in cands.items():
                if generic and cand.kind == "positional":
                    continue
                found.setdefault(key, cand)
                seen_here.add(key)
        support.update(seen_here)
    if not found:
        return FieldOutcome(
            None,
            [],
            len(with_value),
            len(train),
            len(held),
            "the known values were not found on the training examples' pages",
        )
    # found on one training example only: chance, not a rule
    ranked = [c for c in found.values() if support[c.processors] >= 2 or len(train) < 4]
    ranked.sort(key=lambda c: (-support[c.processors], c.cost))
    if generic:  # cross-site first: structured-data keys hold on many hosts at once
        ranked.sort(key=lambda c: (c.kind not in CROSS_SITE_KINDS, -support[c.processors], c.cost))
        # ... but not all of the budget: the rules of one kind of site come next
        ranked = ranked[: MAX_CANDIDATES // 2] + sorted(
            ranked[MAX_CANDIDATES // 2 :], key=lambda c: (-support[c.processors], c.cost)
        )
    judged = []
    for cand in ranked[:MAX_CANDIDATES]:
        result = _judge(compiled, _whole_page_only(cand) if generic else cand, held, name, ftype)
        if result is not None:
            judged.append(result)
    kept = _choose(judged, min_precision)
    fallbacks = []
    if kept is not None and kept.correct < kept.held_out:
        fallbacks = _fallbacks(compiled, kept, judged, train + held, name, ftype, min_precision)
    chosen = {id(kept.candidate) if kept else 0, *(id(f.candidate) for f in fallbacks)}
    rejected = sorted(
        (j for j in judged if id(j.candidate) not in chosen),
        key=lambda j: (-j.precision, -j.recall),
    )
    why = ""
    if kept is None:
        why = (
            f"no rule reached precision {min_precision} on the held-out examples"
            if judged
            else "no candidate rule was found on more than one training example"
        )
    return FieldOutcome(
        kept, rejected, len(with_value), len(train), len(held), why, fallbacks=fallbacks
    )


def _whole_page_only(cand: Candidate) -> Candidate:
    """A generic rule that reads the whole page (a `<meta>`, the `<title>`, a JSON-LD key) says
    nothing of one record among many: on a page reached with a `#fragment` (one section per
    record, e.g. a directory listing) it yields nothing instead of the page's own value."""
    steps = cand.chain
    first = steps[0] if steps else {}
    expression = (first.get("parameters") or {}).get("expression", "")
    if (
        first.get("type") != "xpath"
        or not expression.startswith(("/", "("))
        or "$fragment" in expression
        or "$id" in expression
    ):
        return cand
    guarded = {
        **first,
        "parameters": {**first["parameters"], "expression": f"({expression})[$fragment = '']"},
    }
    return candidate([guarded, *steps[1:]], cand.kind)


def _presence_candidates(train: list[Prepared], name: str):
    """Yes/no rules: what is present in the sections of the `true` examples and absent from
    those of the `false` ones (a `deprecated` note, a `sold-out` badge...)."""
    trues = [p for p in train if p.values[name] is True]
    falses = [p for p in train if p.values[name] is False]
    if len(trues) < 2 or len(falses) < 2:
        return {}, Counter(), "a yes/no field needs two training examples of each answer"
    seen: dict[str, Counter[str]] = {"true": Counter(), "false": Counter()}
    for side, group in (("true", trues), ("false", falses)):
        for prepared in group:
            facts = prepared.pages[0]
            seen[side].update(
                presence_features(facts, facts.source.fragment, prepared.example.record_id)
            )
    scored = []
    for feature, hits in seen["true"].items():
        true_rate = hits / len(trues)
        false_rate = seen["false"][feature] / len(falses)
        if hits >= 2 and false_rate <= 0.2:
            scored.append((true_rate - false_rate, feature))
    scored.sort(key=lambda item: (-item[0], len(item[1])))
    found: dict[str, Candidate] = {}
    support: Counter[str] = Counter()
    for rate, feature in scored[:MAX_CANDIDATES]:
        made = presence_candidate(feature)
        found[made.processors] = made
        support[made.processors] = max(2, round(rate * len(train)))
    why = "" if found else "nothing is present in the 'true' examples' pages and absent elsewhere"
    return found, support, why


# -- links to deeper pages ---------------------------------------------------------------------


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
                out.append((f"//*[@id=$fragment]//a[{has_class(classes[0])}]/@href", "record"))
            if 0 < len(text) <= 40:
                out.append(
                    (f"//*[@id=$fragment]//a[normalize-space(.)={xq(text)}]/@href", "record")
                )
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


def _learn_links(
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
    for expression in ranked[: MAX_CANDIDATES * 2]:
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


# -- the whole ---------------------------------------------------------------------------------


def _covered_by_existing(existing: MappingSet | None, prepared: Prepared, name: str) -> bool:
    if existing is None:
        return False
    for facts in prepared.pages:
        url = facts.source.url + (f"#{facts.source.fragment}" if facts.source.fragment else "")
        if any(name in m.field_set for m in existing.matching(url)):
            return True
    return False


def learn(
    examples: list[Example],
    field_types: dict[str, str],
    *,
    existing: MappingSet | None = None,
    min_precision: float = 0.95,
    seed: int = 0,
    name_prefix: str = "learned",
) -> LearnResult:
    """Learn mappings that reproduce the examples' known values (see the module docstring)."""
    started = time.process_time()
    learned_at = dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat()
    prepared = _prepare(examples, field_types)
    groups: dict[tuple[str, str], list[Prepared]] = defaultdict(list)
    for item in prepared:
        groups[_template_key(item)].append(item)
    hosts_grouped = Counter(host for host, _prefix in groups)
    pooled: list[Prepared] = []
    per_host: Counter[str] = Counter()
    plans: list[tuple[str, list[Prepared], bool, list[dict[str, Any]], int]] = []
    for (host, prefix), items in sorted(groups.items()):
        if len(items) >= MIN_TEMPLATE_EXAMPLES:
            # the path prefix only keeps apart the sites of a host that holds several
            own = prefix if hosts_grouped[host] > 1 else "/"
            name = f"{name_prefix}_{_slug(host)}" + (f"_{_slug(own)}" if own != "/" else "")
            plans.append((name, items, False, [_url_pattern(host, own)], TEMPLATE_PRIORITY))
    # the generic mapping runs on every page, the templates' too: it learns from, and is judged
    # on, a few examples of every host (those with the most pages first: they show most)
    for item in sorted(prepared, key=lambda p: (-len(p.pages), p.example.record_id)):
        if per_host[item.host] < PER_HOST_GENERIC:
            per_host[item.host] += 1
            pooled.append(item)
    if len(per_host) >= 2:
        plans.append((f"{name_prefix}_generic", pooled, True, [GENERIC_PATTERN], GENERIC_PRIORITY))
    compiled = _Compiled()
    mappings: list[dict[str, Any]] = []
    report_fields: dict[str, dict[str, Any]] = {
        name: {"examples": 0, "covered_by_given_mappings": 0, "pages": 0, "mappings": {}}
        for name in field_types
    }
    for name, items, generic, patterns, priority in plans:
        rng = random.Random(f"{seed}:{name}")
        page_count = Counter(f.source.url for p in items for f in p.pages)
        shared_pages = {url for url, n in page_count.items() if n > 1}
        levels: list[dict[str, Judged]] = [{} for _ in range(MAX_FALLBACKS + 1)]
        value_pages: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
        for fname, ftype in field_types.items():
            usable = [p for p in items if not _covered_by_existing(existing, p, fname)]
            entry = report_fields[fname]
            n_with = len(_field_examples(usable, fname))
            if n_with == 0:
                continue
            outcome = _learn_field(
                usable,
                fname,
                ftype,
                generic=generic,
                min_precision=min_precision,
                rng=rng,
                compiled=compiled,
                shared_pages=shared_pages,
            )
            mapping_report: dict[str, Any] = {
                "examples": outcome.examples,
                "train": outcome.train,
                "held_out": outcome.held_out,
                "kept": outcome.kept.summary() if outcome.kept else None,
                "fallbacks": [j.summary() for j in outcome.fallbacks],
                "rejected": [{**j.summary(), "mistakes": j.mistakes} for j in outcome.rejected[:5]],
            }
            if outcome.kept is None:
                mapping_report["why_nothing"] = outcome.why
            entry["mappings"][name] = mapping_report
            if outcome.kept is None:
                continue
            for level, judged in enumerate([outcome.kept, *outcome.fallbacks]):
                levels[level][fname] = judged
                mapping = compiled.get(fname, judged.candidate)
                if mapping is None:
                    continue
                for item in _field_examples(items, fname):
                    # a deeper page matters where the record's own pages do not give the value:
                    # the first page (shallowest first) that yields is a deeper one, and right
                    value, url = _predict(mapping, item, fname, ftype)
                    depth = next((f.depth for f in item.pages if f.source.url == url), 0)
                    if depth and same_value(value, item.values[fname], ftype):
                        value_pages[item.example.record_id][url].add(fname)
        url_parsers, link_report = _learn_links(items, value_pages, rng, min_precision)
        for level, learned_fields in enumerate(levels):
            if not learned_fields:
                continue
            raw = _mapping_document(
                f"{name}_fallback{level}" if level else name,
                learned_fields,
                patterns=patterns,
                priority=priority - level,
                url_parsers=url_parsers if level == 0 else [],
                examples=len(items),
                learned_at=learned_at,
                generic=generic,
                level=level,
            )
            mappings.append(raw)
        if link_report:
            report_fields.setdefault("_links", {}).setdefault(name, link_report)
    for fname, entry in report_fields.items():
        if fname.startswith("_"):
            continue
        with_value = _field_examples(prepared, fname)
        entry["examples"] = len(with_value)
        entry["pages"] = sum(len(p.pages) for p in with_value)
        entry["covered_by_given_mappings"] = sum(
            1 for p in with_value if _covered_by_existing(existing, p, fname)
        )
        entry["examples"] -= entry["covered_by_given_mappings"]
        if entry["examples"] == 0 and entry["covered_by_given_mappings"]:
            entry["why_nothing"] = "covered by the given mappings"
        elif entry["examples"] == 0:
            entry["why_nothing"] = "no example record has a known value for this field"
        elif not any(m.get("kept") for m in entry["mappings"].values()):
            whys = sorted({m.get("why_nothing", "") for m in entry["mappings"].values()} - {""})
            if not entry["mappings"]:
                whys = [
                    f"{entry['examples']} example(s): too few for a site template (at least "
                    f"{MIN_TEMPLATE_EXAMPLES} records of one site) and for the generic mapping "
                    "(records of at least 2 hosts)"
                ]
            entry["why_nothing"] = "; ".join(whys)
    pages_total = sum(len(p.pages) for p in prepared)
    cpu = time.process_time() - started
    report = {
        "learned_at": learned_at,
        "min_precision": min_precision,
        "examples": len(prepared),
        "pages": pages_total,
        "templates": [
            {"mapping": name, "examples": len(items), "generic": generic}
            for name, items, generic, _p, _q in plans
        ],
        "mappings": [m["name"] for m in mappings],
        "fields": {k: v for k, v in report_fields.items() if not k.startswith("_")},
        "links": report_fields.get("_links", {}),
        "cpu_seconds": round(cpu, 3),
        "cpu_ms_per_page": round(cpu * 1000 / pages_total, 2) if pages_total else 0.0,
    }
    return LearnResult(mappings, report)


def _mapping_document(
    name: str,
    learned_fields: dict[str, Judged],
    *,
    patterns: list[dict[str, Any]],
    priority: int,
    url_parsers: list[dict[str, Any]],
    examples: int,
    learned_at: str,
    generic: bool,
    level: int,
) -> dict[str, Any]:
    description = "learned from the dataset's known values"
    if generic:
        description += " across hosts (generic rules, lowest priority)"
    if level:
        description += f"; fallback {level}: for pages where the rules above give nothing"
    raw: dict[str, Any] = {
        "name": name,
        "description": description,
        "url_patterns": patterns,
        "priority": priority,
    }
    if url_parsers:
        raw["url_parsers"] = url_parsers
    raw["fields"] = [
        {
            "name": fname,
            "description": (
                f"learned ({j.candidate.kind}): held-out precision {j.precision:.2f}, "
                f"recall {j.recall:.2f} on {j.held_out} examples"
            ),
            "processors": j.candidate.chain,
        }
        for fname, j in learned_fields.items()
    ]
    raw["learned"] = {
        "examples": examples,
        "learned_at": learned_at,
        "precision": {f: round(j.precision, 4) for f, j in learned_fields.items()},
        "recall": {f: round(j.recall, 4) for f, j in learned_fields.items()},
        "held_out": {f: j.held_out for f, j in learned_fields.items()},
        "rules": {f: j.candidate.kind for f, j in learned_fields.items()},
    }
    return raw
