"""Judging candidate rules the way the crawl will run them: each compiled as a mapping and run
by the extraction engine on held-out examples' pages; precision, recall, the rule to keep and its
fallbacks."""

from __future__ import annotations

import random
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from enrich_crawl.extract.errors import MappingError
from enrich_crawl.extract.learn.compare import fold, renderings, same_value
from enrich_crawl.extract.learn.facts import PageFacts, value_on_page
from enrich_crawl.extract.learn.locate import CROSS_SITE_KINDS, Candidate, candidate
from enrich_crawl.extract.learn.model import Example
from enrich_crawl.extract.learn.selectors import page_types
from enrich_crawl.extract.learn.templates import GENERIC_PATTERN
from enrich_crawl.extract.mapping import Mapping, compile_mapping, run_mapping

MAX_TRAIN = 24  # training examples per template and field (candidates come from these)
FEW = 8  # examples of a yes/no answer up to which all but one are for training
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
    values_given: set[str] = field(default_factory=set)  # what it yielded, as compared
    values_known: set[str] = field(default_factory=set)  # the known values it was judged on
    numbered: int = 0  # wrong values that are the known one with a number: "Ada (2)"

    def saw(self, value: Any, known: Any) -> None:
        """Note a value it gave and the known one, for `constant`."""
        if len(self.values_given) < 2:
            self.values_given.add(_as_compared(value))
        if len(self.values_known) < 2:
            self.values_known.add(_as_compared(known))

    @property
    def looks_constant(self) -> bool:
        return self.yielded >= MIN_CONSTANT_YIELDS and len(self.values_given) == 1

    @property
    def constant(self) -> bool:
        """The same value on every page (a site-wide banner, a logo's alt text) where the known
        values differ: the rule does not read the record, whatever its precision on a field
        whose values are mostly one (a shop's own brand on most of its products)."""
        return (
            self.yielded >= MIN_CONSTANT_YIELDS
            and len(self.values_given) == 1
            and len(self.values_known) > 1
        )

    @property
    def precision(self) -> float:
        return self.correct / self.yielded if self.yielded else 0.0

    @property
    def recall(self) -> float:
        return self.correct / self.held_out if self.held_out else 0.0

    def summary(self) -> dict[str, Any]:
        out = {
            "rule": self.candidate.chain,
            "kind": self.candidate.kind,
            "held_out": self.held_out,
            "yielded": self.yielded,
            "correct": self.correct,
            "precision": round(self.precision, 4),
            "recall": round(self.recall, 4),
        }
        if self.constant:
            out["constant"] = sorted(self.values_given)[0]
        return out


MIN_CONSTANT_YIELDS = 3  # a rule that gave one value this many times, where values differ


def _as_compared(value: Any) -> str:
    if isinstance(value, str):
        return fold(value)
    if isinstance(value, list):
        return "\x1f".join(fold(str(v)) for v in value)
    return repr(value)


class Compiled:
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


def predict(mapping: Mapping, prepared: Prepared, name: str, ftype: str) -> tuple[Any, str]:
    """The value the crawl would resolve for the record: the first its pages yield, by depth,
    and the URL of the page that gave it (see predict_chain)."""
    value, _index, url = predict_chain([mapping], prepared, name, ftype)
    return value, url


def split_examples(
    items: list[Prepared], rng: random.Random, *, by_host: bool, answer: bool = False
) -> tuple[list, list]:
    """Training and held-out examples (whole hosts held out for the generic mapping); `answer`:
    the examples of one answer of a yes/no field."""
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
    if answer and 2 < len(order) <= FEW:
        # few examples (a yes/no field's rare answer: four deprecated modules among
        # hundreds): all but one go to training, where a mark must show on two of them;
        # with two in training, one marked in an older way leaves no mark common to both
        n_train = len(order) - 1
    return order[:n_train], order[n_train:]


def diverse(items: list[Prepared], limit: int) -> list[Prepared]:
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


def both_answers(train: list[Prepared], name: str, limit: int) -> list[Prepared]:
    """Up to `limit` training examples of a yes/no field, the rarer answer's kept first (up to
    half): four deprecated modules among forty must all reach training, or nothing is learned."""
    by_answer = {a: [p for p in train if p.values[name] is a] for a in (True, False)}
    rare, common = sorted(by_answer.values(), key=len)
    kept = diverse(rare, max(1, limit // 2))
    return kept + diverse(common, limit - len(kept))


def field_examples(items: list[Prepared], name: str) -> list[Prepared]:
    return [p for p in items if name in p.values]


def judge(
    compiled: Compiled,
    cand: Candidate,
    held: list[Prepared],
    name: str,
    ftype: str,
    *,
    foreign: list[Prepared] | None = None,
) -> Judged | None:
    """The candidate run on the held-out examples: where it yields, right or wrong. On `foreign`
    examples (another template's, at URLs the mapping will match) only a wrong value counts."""
    mapping = compiled.get(name, cand)
    if mapping is None:
        return None
    judged = Judged(cand, held_out=len(held))
    for prepared in held:
        value, url = predict(mapping, prepared, name, ftype)
        if value is None:
            continue
        judged.yielded += 1
        judged.saw(value, prepared.values[name])
        right = same_value(value, prepared.values[name], ftype)
        judged.outcomes[prepared.example.record_id] = right
        if right:
            judged.correct += 1
        else:
            _mistake(judged, prepared, url, value, name)
            if ftype == "string" and _numbered(value, prepared.values[name]):
                judged.numbered += 1
    for prepared in foreign or ():
        value, url = predict(mapping, prepared, name, ftype)
        if value is not None and not same_value(value, prepared.values[name], ftype):
            judged.yielded += 1
            _mistake(judged, prepared, url, value, name)
    return judged


# a disambiguation number after a name: "Ada Lovelace (2)", "Ada Lovelace[2]"
NUMBERED_TAIL = r"(?: ?\(\d+\)| ?\[\d+\])"


def _numbered(value: Any, known: Any) -> bool:
    if not isinstance(value, str):
        return False
    text = fold(value)
    head = fold(str(known))
    return text.startswith(head) and re.fullmatch(NUMBERED_TAIL, text[len(head) :]) is not None


def numbered_twin(judged: Judged) -> Candidate | None:
    """The rule without the page's trailing disambiguation number, where every wrong value it
    gave was the known one with such a number (names made unique on the page: "Ada (2)")."""
    wrong = judged.yielded - judged.correct
    steps = judged.candidate.chain
    if not wrong or judged.numbered != wrong or not steps:
        return None
    strip = {"type": "regex", "parameters": {"pattern": f"^(.+?){NUMBERED_TAIL}?$"}}
    if steps[-1]["type"] == "trim":
        return candidate([*steps, strip], judged.candidate.kind)
    if steps[-1]["type"] == "regex" and len(steps) >= 2:
        return candidate([*steps, {"type": "trim", "parameters": {}}, strip], judged.candidate.kind)
    return None


def probe_constant(
    compiled: Compiled, judged: Judged, train: list[Prepared], name: str, ftype: str
) -> None:
    """Run a rule that gave one value on every held-out page on a few training examples whose
    known value is another: where it gives that value again, it is `constant`."""
    mapping = compiled.get(name, judged.candidate)
    if mapping is None:
        return
    (given,) = judged.values_given
    others = [p for p in train if _as_compared(p.values[name]) != given][:MAX_CONSTANT_PROBES]
    for prepared in others:
        value, _url = predict(mapping, prepared, name, ftype)
        if value is not None:
            judged.values_given.add(_as_compared(value))
            judged.values_known.add(_as_compared(prepared.values[name]))
        if len(judged.values_given) > 1:
            return


MAX_CONSTANT_PROBES = 6


def _mistake(judged: Judged, prepared: Prepared, url: str, value: Any, name: str) -> None:
    if len(judged.mistakes) < 3:
        judged.mistakes.append(
            {
                "record": prepared.example.record_id,
                "url": url,
                "expected": prepared.values[name],
                "got": value,
            }
        )


# a link that leads nowhere costs one polite fetch, not a wrong value: a lower bar than fields
LINK_MIN_PRECISION = 0.8
WRONG_COST = 10  # a wrong value costs as much as this many missing ones


def choose(judged: list[Judged], min_precision: float) -> Judged | None:
    """The rule to keep: precision at least `min_precision` on enough held-out yields; then the
    most right values net of wrong ones (a wrong value weighs `WRONG_COST` missing ones: precision
    first, coverage next), then the more precise, then the simplest."""
    qualified = [
        j
        for j in judged
        if j.yielded >= min(MIN_HELD_OUT_YIELD, j.held_out)
        and j.precision >= min_precision
        and not j.constant
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


def predict_chain(
    mappings: list[Mapping], prepared: Prepared, name: str, ftype: str
) -> tuple[Any, int, str]:
    """(value, index of the rule that gave it, URL of its page) as the crawl resolves several
    rules of a field: shallowest page first, then the rules in priority order.

    A deeper page counts only if it holds the known value somewhere: the crawl reaches deeper
    pages through learned links, which lead to those pages; a fetcher's probe of a whole site
    also holds the pages of other records (a directory's other entries), which the crawl of this
    record would never see."""
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
                return result.fields[name], index, facts.source.url
    return None, -1, ""


def choose_fallbacks(
    compiled: Compiled,
    kept: Judged,
    judged: list[Judged],
    pool: list[Prepared],
    name: str,
    ftype: str,
    min_precision: float,
    *,
    foreign: list[Prepared] | None = None,
) -> list[Judged]:
    """Rules that fill what the kept rule leaves empty (another site's structured-data key, a
    second layout). Each is judged together with the rules before it, as the crawl will run them
    (a lower-priority rule on a shallower page comes first): on the examples (training and
    held-out: few are left) where it is the one that gives the value, and on `foreign` ones
    (another template's) where it gives a wrong value."""
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
                value, index, _url = predict_chain([*rules, mapping], prepared, name, ftype)
                if index != len(rules):
                    continue
                part.yielded += 1
                part.saw(value, prepared.values[name])
                right = same_value(value, prepared.values[name], ftype)
                part.correct += right
                part.outcomes[prepared.example.record_id] = right
            for prepared in foreign or ():
                value, index, _url = predict_chain([*rules, mapping], prepared, name, ftype)
                if index == len(rules) and not same_value(value, prepared.values[name], ftype):
                    part.yielded += 1
            # one right value and no wrong one is enough for a structured-data key, two for
            # anything else
            if part.correct >= 2 or (
                part.correct == part.yielded == 1 and part.candidate.kind in CROSS_SITE_KINDS
            ):
                parts.append(part)
        best = choose(parts, min_precision)
        if best is None:
            break
        out.append(best)
        rules.append(compiled.get(name, best.candidate))
    return out
