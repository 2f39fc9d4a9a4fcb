"""Site templates: which example pages a mapping is written for, and where it applies.

A template is the registrable domain, the URL shape and the DOM structure of a record's first
page. Within a registrable domain, pages are grouped by the skeleton of their DOM (tag paths of
the page, with their stable classes): product pages and blog posts of one shop are two templates
with their own rules, and product pages on `de.shop.example` and `fr.shop.example` are one. Each
template's `url_patterns` name its host (any subdomain of the domain when its pages came from
several) and, where its pages share one and the domain's others do not, the first path segment.
Where the patterns of two templates of a domain would both match a page, each template's rules
carry a guard: an element its pages have and the other template's lack
(`/html[.//div[contains(concat(' ', normalize-space(@class), ' '), ' product ')]]//h1`), and
rules are judged on the other template's examples too (a value they give there counts against
them when it is wrong).
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

GENERIC_PATTERN = {"type": "regex", "pattern": "^https?://[^/]+/[^#]*(?:#.*)?$"}

SAME_TEMPLATE = 0.5  # Jaccard of two skeletons for the second page to join the first's group
CORE_SHARE = 0.5  # a shingle on at least this share of a group's pages is part of its core
CORE_COVERED = 0.7  # two groups are one template when the cores hold this share of each other
JOIN_COVERED = 0.6  # a page of a small group joins a template whose core it holds this much of
GUARD_OWN = 0.9  # a guard element is on at least this share of the template's pages...
GUARD_FOREIGN = 0.05  # ... and on at most this share of the other template's
MAX_SKELETON = 1000  # elements of a page's body looked at, in document order
_UNSTABLE = re.compile(r"\d{3,}|[0-9a-f]{8,}", re.I)  # generated classes (ember123, a1b2c3d4)
_NAME = re.compile(r"^[A-Za-z][\w-]*$")
_SKIPPED = frozenset({"script", "style", "noscript", "template", "svg", "path"})


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")[:60] or "site"


@dataclass
class Template:
    """The examples a mapping is learned from, and the mapping's place (patterns, priority)."""

    name: str
    items: list[Any]  # Prepared examples
    patterns: list[dict[str, Any]]
    priority: int
    generic: bool = False
    guard: str | None = None  # XPath condition on /html that the template's pages meet
    foreign: list[Any] = field(default_factory=list)  # other templates' examples it matches
    hosts: list[str] = field(default_factory=list)

    def report(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "mapping": self.name,
            "examples": len(self.items),
            "generic": self.generic,
        }
        if not self.generic:
            out["hosts"] = self.hosts[:10]
        if self.guard:
            out["guard"] = self.guard
        if self.foreign:
            out["other_templates_examples"] = len(self.foreign)
        return out


# -- the skeleton of a page ------------------------------------------------------------------


def _step(element: Any) -> str:
    tag = element.tag if isinstance(element.tag, str) else "*"
    tag = tag.lower() if _NAME.match(tag) else "*"
    for name in (element.get("class") or "").split():
        if _NAME.match(name) and not _UNSTABLE.search(name):
            return f"{tag}.{name}"
    return tag


def skeleton(facts: Any) -> frozenset[str]:
    """Shingles of the page's DOM: each element's tag (and first stable class) with its parent's
    and grandparent's, `div.main/ul.nav/li`; cached on the page."""
    cached = getattr(facts, "_skeleton", None)
    if cached is not None:
        return cached
    out: set[str] = set()
    tree = facts.tree if facts.page.kind == "html" else None
    bodies = tree.xpath("/html/body") if tree is not None else []
    if bodies:
        steps: dict[tuple[str, str | None], str] = {}
        stack = [(bodies[0], "body", "html")]
        count = 0
        while stack and count < MAX_SKELETON:
            element, own, up = stack.pop()
            for child in reversed(element):  # popped in document order
                tag = child.tag
                if not isinstance(tag, str) or tag in _SKIPPED:
                    continue
                key = (tag, child.get("class"))
                step = steps.get(key)
                if step is None:
                    step = steps[key] = _step(child)
                out.add(f"{up}/{own}/{step}")
                stack.append((child, step, own))
                count += 1
    facts._skeleton = frozenset(out)
    return facts._skeleton


def _jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


def _core(members: list[frozenset[str]]) -> frozenset[str]:
    counts: Counter[str] = Counter()
    for shingles in members:
        counts.update(shingles)
    least = max(1, CORE_SHARE * len(members))
    return frozenset(s for s, n in counts.items() if n >= least)


def _held(core: frozenset[str], shingles: frozenset[str]) -> float:
    """Share of `core` found in `shingles`."""
    return len(core & shingles) / len(core) if core else 1.0


def structure_groups(skeletons: list[frozenset[str]], min_size: int) -> list[list[int]]:
    """Indexes of pages grouped by DOM structure: each page joins the first group whose first
    page it resembles (Jaccard >= SAME_TEMPLATE); groups whose cores (shingles of at least half
    their pages) hold each other (one of them CORE_COVERED of the other) are one template; the pages of groups smaller
    than `min_size` join the template whose core they hold most of (at least JOIN_COVERED)."""
    groups: list[list[int]] = []
    leaders: list[frozenset[str]] = []
    for index, shingles in enumerate(skeletons):
        scores = [_jaccard(shingles, lead) for lead in leaders]
        best = max(range(len(scores)), key=scores.__getitem__) if scores else -1
        if best >= 0 and scores[best] >= SAME_TEMPLATE:
            groups[best].append(index)
        else:
            groups.append([index])
            leaders.append(shingles)
    merged = True
    while merged and len(groups) > 1:
        merged = False
        groups.sort(key=len, reverse=True)
        cores = [_core([skeletons[i] for i in g]) for g in groups]
        for a in range(len(groups)):
            for b in range(a + 1, len(groups)):
                if max(_held(cores[a], cores[b]), _held(cores[b], cores[a])) >= CORE_COVERED:
                    groups[a] += groups.pop(b)
                    merged = True
                    break
            if merged:
                break
    big = [g for g in groups if len(g) >= min_size]
    if not big:
        return groups
    cores = [_core([skeletons[i] for i in g]) for g in big]
    out = [list(g) for g in big]
    for group in groups:
        if len(group) >= min_size:
            continue
        for index in group:
            held = [_held(core, skeletons[index]) for core in cores]
            best = max(range(len(held)), key=held.__getitem__)
            if held[best] >= JOIN_COVERED:
                out[best].append(index)
            else:
                out.append([index])
    return out


# -- guards: what one template's pages have and another's lack ---------------------------------


def _marker_xpath(step: str) -> str | None:
    tag, _, name = step.partition(".")
    if tag == "*" or not _NAME.match(tag) or tag in ("html", "body"):
        return None
    if name:
        return f"//{tag}[contains(concat(' ', normalize-space(@class), ' '), ' {name} ')]"
    return f"//{tag}"


def guard_for(own: list[frozenset[str]], others: list[frozenset[str]]) -> str | None:
    """An XPath condition on `/html` true on (nearly) every page of `own` and (nearly) no page of
    `others`: an element (tag and class) that one template has and the other lacks."""
    if not own or not others:
        return None

    def markers(shingles: frozenset[str]) -> set[str]:
        return {s.rsplit("/", 1)[-1] for s in shingles}

    own_counts: Counter[str] = Counter()
    for shingles in own:
        own_counts.update(markers(shingles))
    other_counts: Counter[str] = Counter()
    for shingles in others:
        other_counts.update(markers(shingles))
    ranked = []
    for marker, hits in own_counts.items():
        own_rate = hits / len(own)
        other_rate = other_counts[marker] / len(others)
        if own_rate >= GUARD_OWN and other_rate <= GUARD_FOREIGN:
            xpath = _marker_xpath(marker)
            if xpath:
                # a class says more than a bare tag; then the most common, then the shortest
                ranked.append(("." not in marker, -own_rate, other_rate, len(marker), xpath))
    if not ranked:
        return None
    return f"/html[.{min(ranked)[-1]}]"


def guarded(expression: str, guard: str) -> str | None:
    """`expression` evaluated only on pages meeting `guard` (None where it cannot be guarded: a
    yes/no `boolean(...)` would answer "no" on the other template's pages instead of nothing)."""
    if expression.startswith("//"):
        return guard + expression
    if expression.startswith("/html["):
        return guard + expression[len("/html") :]
    if expression.startswith("id($fragment)"):
        head = "id($fragment)"
        return f"{head}[{guard}]{expression[len(head) :]}"
    return None


# -- grouping ----------------------------------------------------------------------------------


def _first_segment(url: str) -> str:
    path = urlsplit(url).path or "/"
    directory = path.rsplit("/", 1)[0] + "/" if "/" in path else "/"
    segments = [s for s in directory.split("/") if s]
    return "/" + segments[0] + "/" if segments else "/"


def url_pattern(hosts: list[str], domain: str, prefix: str) -> dict[str, Any]:
    """The URLs of a template: its host (any subdomain of `domain` when it has several) and the
    path prefix ("/": the whole host)."""
    names = {h.removeprefix("www.") for h in hosts}
    if len(names) == 1:
        host_re = "(?:www\\.)?" + re.escape(next(iter(names)))
    else:
        host_re = "(?:[^/.]+\\.)*" + re.escape(domain)
    prefix_re = re.escape(prefix) if prefix != "/" else "/"
    return {
        "type": "regex",
        "pattern": f"^https?://{host_re}(?::\\d+)?{prefix_re}[^#]*(?:#.*)?$",
    }


def _matches(pattern: dict[str, Any], url: str) -> bool:
    return re.search(pattern["pattern"], url) is not None


def _domain(host: str) -> str:
    from enrich_crawl.dataset.shard import registrable_domain

    return registrable_domain(host) or host


def _pattern_of(members: list[Any], items: list[Any], domain: str) -> tuple[dict, str, list]:
    """(URL pattern, path prefix, hosts) of a template: its hosts, and the first path segment its
    pages share where the domain's other pages are not all under it."""
    hosts = sorted({m.host for m in members})
    segments = {_first_segment(m.pages[0].source.url) for m in members}
    prefix = next(iter(segments)) if len(segments) == 1 else "/"
    if prefix != "/" and all(_first_segment(i.pages[0].source.url) == prefix for i in items):
        prefix = "/"  # the whole domain is under it: the host says as much
    return url_pattern(hosts, domain, prefix), prefix, hosts


def _distinct(
    groups: list[list[int]], items: list[Any], skeletons: list[frozenset[str]], domain: str
) -> list[list[int]]:
    """Groups at overlapping URLs stay apart only where each has an element the other lacks
    (a guard): otherwise they are one template whose pages vary (reference pages with and
    without tables), merged into the larger."""
    groups = sorted(groups, key=len, reverse=True)
    merged = True
    while merged:
        merged = False
        patterns = [_pattern_of([items[i] for i in g], items, domain)[0] for g in groups]
        for a in range(len(groups)):
            for b in range(a + 1, len(groups)):
                overlap = any(
                    _matches(patterns[a], items[i].pages[0].source.url) for i in groups[b]
                ) or any(_matches(patterns[b], items[i].pages[0].source.url) for i in groups[a])
                if not overlap:
                    continue
                own = [skeletons[i] for i in groups[a]]
                other = [skeletons[i] for i in groups[b]]
                if guard_for(own, other) is None or guard_for(other, own) is None:
                    groups[a] += groups.pop(b)
                    merged = True
                    break
            if merged:
                break
    return groups


def plan_templates(
    prepared: list[Any],
    *,
    min_examples: int,
    name_prefix: str,
    priority: int,
) -> list[Template]:
    """The site templates with at least `min_examples` examples (see the module docstring);
    examples of smaller ones are left to the generic mapping."""
    by_domain: dict[str, list[Any]] = defaultdict(list)
    for item in prepared:
        by_domain[_domain(item.host)].append(item)
    plans: list[Template] = []
    for domain, items in sorted(by_domain.items()):
        if len(items) < min_examples:
            continue
        items = sorted(items, key=lambda p: (p.pages[0].source.url, p.example.record_id))
        skeletons = [skeleton(item.pages[0]) for item in items]
        groups = structure_groups(skeletons, min_examples)
        big = _distinct([g for g in groups if len(g) >= min_examples], items, skeletons, domain)
        names: set[str] = set()
        for group in big:
            members = [items[i] for i in group]
            pattern, prefix, hosts = _pattern_of(members, items, domain)
            base = slug(hosts[0]) if len(hosts) == 1 else slug(domain)
            name = f"{name_prefix}_{base}" + (f"_{slug(prefix)}" if prefix != "/" else "")
            if name in names:  # a second template at the same URLs
                name += f"_{sum(1 for n in names if n == name or n.startswith(name + '_')) + 1}"
            names.add(name)
            template = Template(name, members, [pattern], priority, hosts=hosts)
            inside = set(group)
            template.foreign = [
                item
                for index, item in enumerate(items)
                if index not in inside and _matches(pattern, item.pages[0].source.url)
            ]
            # guarded against the other templates at its URLs (not against odd single pages)
            rivals = [
                skeletons[i]
                for other in big
                if other is not group
                for i in other
                if _matches(pattern, items[i].pages[0].source.url)
            ]
            if rivals:
                template.guard = guard_for([skeletons[i] for i in group], rivals)
            plans.append(template)
    return plans
