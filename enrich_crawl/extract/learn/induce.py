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

import datetime as dt
import random
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from enrich_crawl.extract.learn.compare import known_value, renderings, same_value
from enrich_crawl.extract.learn.facts import PageFacts
from enrich_crawl.extract.learn.generalise import MAX_CONTEXTS, add_generalised
from enrich_crawl.extract.learn.judge import (
    MAX_FALLBACKS,
    MAX_TRAIN,
    Compiled,
    Judged,
    Prepared,
    both_answers,
    choose,
    choose_fallbacks,
    diverse,
    field_examples,
    judge,
    numbered_twin,
    predict,
    probe_constant,
    split_examples,
)
from enrich_crawl.extract.learn.links import learn_links
from enrich_crawl.extract.learn.locate import (
    CROSS_SITE_KINDS,
    Candidate,
    candidate,
    candidates_for,
    presence_candidate,
    presence_features,
)
from enrich_crawl.extract.learn.model import Example, LearnResult
from enrich_crawl.extract.learn.templates import (
    GENERIC_PATTERN,
    Template,
    guarded,
    plan_templates,
)
from enrich_crawl.extract.mapping import MappingSet

MIN_TEMPLATE_EXAMPLES = 4  # fewer examples on a template: its records go to the generic mapping
MAX_HELD_OUT = 80  # held-out examples per template and field (rules are validated on these)
MAX_CANDIDATES = 36  # candidates validated per field and template, most supported first
PER_HOST_GENERIC = 2  # examples per host in the generic mapping (every host weighs the same)
MAX_PAGE_BYTES = 2_000_000  # larger example pages are left out of learning (counted in the report)
TEMPLATE_PRIORITY = -10
GENERIC_PRIORITY = -20


def _prepare(
    examples: Iterable[Example], field_types: dict[str, str], skipped: Counter[str]
) -> list[Prepared]:
    """The examples with their known values typed and their pages parsed; pages that teach
    nothing are counted in `skipped` by why (too large, undecodable)."""
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
            if len(page.body or b"") > MAX_PAGE_BYTES:
                # a rule is judged by running it on every example page: on a 6 MB page each
                # candidate costs a second (a regex on 100,000 texts); the site's other pages
                # show the same template
                skipped["too_large"] += 1
                continue
            try:
                pages.append(PageFacts(page))
            except (ValueError, TypeError):
                skipped["undecodable"] += 1
                continue  # an undecodable page teaches nothing; the others still do
        if pages and values:
            out.append(Prepared(example, pages, values))
    return out


@dataclass
class FieldOutcome:
    kept: Judged | None
    rejected: list[Judged]
    examples: int
    train: int
    held_out: int
    why: str = ""
    fallbacks: list[Judged] = field(default_factory=list)


def _learn_field(
    items: list[Prepared],
    name: str,
    ftype: str,
    *,
    generic: bool,
    min_precision: float,
    rng: random.Random,
    compiled: Compiled,
    shared_pages: set[str],
    guard: str | None = None,
    foreign: list[Prepared] | None = None,
) -> FieldOutcome:
    """The rule for one field of a template (or the generic mapping), its fallbacks and the
    rules rejected; `guard` is the template's condition on its pages (rules are judged guarded),
    `foreign` the examples of other templates that its URL patterns match (a wrong value there
    counts against a rule)."""
    with_value = field_examples(items, name)
    if len(with_value) < 2:
        return FieldOutcome(None, [], len(with_value), 0, 0, "fewer than 2 examples with a value")
    if ftype == "boolean" and not generic:  # both answers on both sides of the split
        train, held = [], []
        for answer in (True, False):
            part_train, part_held = split_examples(
                [p for p in with_value if p.values[name] is answer],
                rng,
                by_host=False,
                answer=True,
            )
            train += part_train
            held += part_held
    else:
        train, held = split_examples(with_value, rng, by_host=generic)
    if not train or not held:
        return FieldOutcome(None, [], len(with_value), len(train), len(held), "too few hosts")
    # those with the most pages first: a probe that read a whole site shows where values sit
    # (the generic mapping sees many kinds of site: twice as many, taken in turn from each kind
    # of first page, so that one kind of site does not fill the training set)
    limit = MAX_TRAIN * (2 if generic else 1)
    if ftype == "boolean":
        train = both_answers(train, name, limit)
    else:
        train = diverse(train, limit)
    held = held[:MAX_HELD_OUT]
    support: Counter[str] = Counter()
    found: dict[str, Candidate] = {}
    if ftype == "boolean":
        found, support, why = _presence_candidates(train, name)
        if not found:
            return FieldOutcome(None, [], len(with_value), len(train), len(held), why)
    # selector -> the text around the value on each training record (see generalise)
    contexts: dict[tuple[str, str], list[tuple[str, str, str]]] = defaultdict(list)
    for prepared in train if ftype != "boolean" else []:
        known = prepared.values[name]
        needles = renderings(known, ftype)
        seen_here: set[str] = set()
        around: dict[tuple[str, str], tuple[str, str, str]] = {}
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
                contexts=around,
            )
            for key, cand in cands.items():
                if generic and cand.kind == "positional":
                    continue
                found.setdefault(key, cand)
                seen_here.add(key)
        support.update(seen_here)
        for key, context in around.items():
            if len(contexts[key]) < MAX_CONTEXTS:
                contexts[key].append(context)
    if ftype != "boolean":
        add_generalised(contexts, ftype, found, support, generic=generic)
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
        if generic:
            cand = _whole_page_only(cand)
        elif guard:
            cand = _guarded(cand, guard)
        result = judge(compiled, cand, held, name, ftype, foreign=foreign)
        if result is None:
            continue
        judged.append(result)
        twin = numbered_twin(result)
        if twin is not None:
            # "Ada Lovelace (2)" where the known value is "Ada Lovelace": the same selector,
            # without the page's disambiguation number
            twin_result = judge(compiled, twin, held, name, ftype, foreign=foreign)
            if twin_result is not None:
                judged.append(twin_result)
    for result in judged:
        if result.looks_constant:
            # one value on every held-out page: does it give the same on pages whose known
            # value is another one (a banner, a logo's alt text)?
            probe_constant(compiled, result, train, name, ftype)
    kept = choose(judged, min_precision)
    fallbacks = []
    if kept is not None and kept.correct < kept.held_out:
        fallbacks = choose_fallbacks(
            compiled, kept, judged, train + held, name, ftype, min_precision, foreign=foreign
        )
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


def _guarded(cand: Candidate, guard: str) -> Candidate:
    """The rule read only on pages of its template (see templates.guarded)."""
    steps = cand.chain
    first = steps[0] if steps else {}
    expression = (first.get("parameters") or {}).get("expression", "")
    if first.get("type") != "xpath":
        return cand
    condition = guarded(expression, guard)
    if condition is None:
        return cand
    step = {**first, "parameters": {**first["parameters"], "expression": condition}}
    return candidate([step, *steps[1:]], cand.kind)


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
        # what tells the answers apart best in training goes first where held-out examples
        # cannot tell (one 'true' among seventy held out)
        made = Candidate(made.processors, made.kind, made.cost - round(rate * 100))
        found[made.processors] = made
        support[made.processors] = max(2, round(rate * len(train)))
    why = "" if found else "nothing is present in the 'true' examples' pages and absent elsewhere"
    return found, support, why


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
    skipped: Counter[str] = Counter()
    prepared = _prepare(examples, field_types, skipped)
    plans = plan_templates(
        prepared,
        min_examples=MIN_TEMPLATE_EXAMPLES,
        name_prefix=name_prefix,
        priority=TEMPLATE_PRIORITY,
    )
    # the generic mapping runs on every page, the templates' too: it learns from, and is judged
    # on, a few examples of every host (those with the most pages first: they show most)
    pooled: list[Prepared] = []
    per_host: Counter[str] = Counter()
    for item in sorted(prepared, key=lambda p: (-len(p.pages), p.example.record_id)):
        if per_host[item.host] < PER_HOST_GENERIC:
            per_host[item.host] += 1
            pooled.append(item)
    if len(per_host) >= 2:
        plans.append(
            Template(
                f"{name_prefix}_generic",
                pooled,
                [GENERIC_PATTERN],
                GENERIC_PRIORITY,
                generic=True,
            )
        )
    compiled = Compiled()
    mappings: list[dict[str, Any]] = []
    report_fields: dict[str, dict[str, Any]] = {
        name: {"examples": 0, "covered_by_given_mappings": 0, "pages": 0, "mappings": {}}
        for name in field_types
    }
    links: dict[str, Any] = {}
    for template in plans:
        written, link_report = _learn_template(
            template,
            field_types,
            report_fields,
            existing=existing,
            min_precision=min_precision,
            rng=random.Random(f"{seed}:{template.name}"),
            compiled=compiled,
            learned_at=learned_at,
        )
        mappings += written
        if link_report:
            links[template.name] = link_report
    _explain(report_fields, prepared, existing)
    pages_total = sum(len(p.pages) for p in prepared)
    cpu = time.process_time() - started
    report = {
        "learned_at": learned_at,
        "min_precision": min_precision,
        "examples": len(prepared),
        "pages": pages_total,
        "pages_skipped": dict(skipped),
        "templates": [template.report() for template in plans],
        "mappings": [m["name"] for m in mappings],
        "fields": report_fields,
        "links": links,
        "cpu_seconds": round(cpu, 3),
        "cpu_ms_per_page": round(cpu * 1000 / pages_total, 2) if pages_total else 0.0,
    }
    return LearnResult(mappings, report)


def _learn_template(
    template: Template,
    field_types: dict[str, str],
    report_fields: dict[str, dict[str, Any]],
    *,
    existing: MappingSet | None,
    min_precision: float,
    rng: random.Random,
    compiled: Compiled,
    learned_at: str,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The mapping documents of one template (its rules, then its fallbacks) and its link
    report; each field's outcome goes into `report_fields`."""
    items = template.items
    page_count = Counter(f.source.url for p in items for f in p.pages)
    shared_pages = {url for url, n in page_count.items() if n > 1}
    levels: list[dict[str, Judged]] = [{} for _ in range(MAX_FALLBACKS + 1)]
    value_pages: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for fname, ftype in field_types.items():
        usable = [p for p in items if not _covered_by_existing(existing, p, fname)]
        if not field_examples(usable, fname):
            continue
        outcome = _learn_field(
            usable,
            fname,
            ftype,
            generic=template.generic,
            min_precision=min_precision,
            rng=rng,
            compiled=compiled,
            shared_pages=shared_pages,
            guard=template.guard,
            foreign=field_examples(template.foreign, fname)[:MAX_HELD_OUT],
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
        report_fields[fname]["mappings"][template.name] = mapping_report
        if outcome.kept is None:
            continue
        for level, judged in enumerate([outcome.kept, *outcome.fallbacks]):
            levels[level][fname] = judged
            mapping = compiled.get(fname, judged.candidate)
            if mapping is None:
                continue
            for item in field_examples(items, fname):
                # a deeper page matters where the record's own pages do not give the value:
                # the first page (shallowest first) that yields is a deeper one, and right
                value, url = predict(mapping, item, fname, ftype)
                depth = next((f.depth for f in item.pages if f.source.url == url), 0)
                if depth and same_value(value, item.values[fname], ftype):
                    value_pages[item.example.record_id][url].add(fname)
    url_parsers, link_report = learn_links(items, value_pages, rng, min_precision)
    written = []
    for level, learned_fields in enumerate(levels):
        if learned_fields:
            written.append(
                _mapping_document(
                    f"{template.name}_fallback{level}" if level else template.name,
                    learned_fields,
                    patterns=template.patterns,
                    priority=template.priority - level,
                    url_parsers=url_parsers if level == 0 else [],
                    examples=len(items),
                    learned_at=learned_at,
                    generic=template.generic,
                    level=level,
                )
            )
    return written, link_report


def _explain(
    report_fields: dict[str, dict[str, Any]],
    prepared: list[Prepared],
    existing: MappingSet | None,
) -> None:
    """Per field of the report: its examples and pages, and why nothing was learned where
    nothing was."""
    for fname, entry in report_fields.items():
        with_value = field_examples(prepared, fname)
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
