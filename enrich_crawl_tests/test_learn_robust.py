"""The learner on data as users bring it: a table that writes values in capitals, values behind a
prefix that changes from record to record, names made unique on the page ("Ada (2)"), a site-wide
banner that holds one value of a mostly-constant field, values split across inline elements, many
records on one page, and a table sorted so that its first rows are all one kind.

The Python docs (real pages of python3.11-doc) where they show the case; elsewhere small sites
generated here, each record's truth known, the learned mappings judged on records they never saw."""

from __future__ import annotations

import random

import pytest

from enrich_crawl.extract.learn import Example, ExamplePage, evaluate, learn, same_value
from enrich_crawl.extract.learn.facts import PageFacts
from enrich_crawl.extract.learn.locate import candidates_for
from enrich_crawl.extract.mapping import MappingSet, compile_mapping, run_mapping
from enrich_crawl.extract.page import Page
from enrich_crawl.learning.sample import sample_for_learning, sample_for_mappings
from enrich_crawl.testing import pydocs
from enrich_crawl.testing.learn_corpora import (
    PageSource,
    WebFolder,
    build_corpus,
    offline_fill,
    record_pages,
    score,
)
from enrich_crawl_tests.conftest import REPO

FIRST = ["Ada", "Bob", "Cyd", "Dee", "Eve", "Fay", "Gus", "Hal", "Ivy", "Jon", "Kai", "Lou"]
LAST = ["Lovelace", "Hopper", "Turing", "Noether", "Curie", "Franklin", "Babbage", "Liskov"]
GREEK = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa"]
THINGS = ["Widget docs", "Gadget manual", "Sprocket guide", "Gizmo notes", "Flange reference"]


def _page(url: str, body: str, *, fragment: str = "") -> ExamplePage:
    html = (
        "<html><head><title>Site</title></head><body>"
        f"<nav class='menu'><a href='/'>Home</a></nav>{body}</body></html>"
    )
    return ExamplePage(url, html.encode(), "text/html", fragment=fragment)


def _site(n: int, shape, host: str, field: str, seed: int = 1):
    """`n` records of one site: (examples, truth); `shape(i, rng)` -> (value, body HTML)."""
    rng = random.Random(seed)
    examples, truth = [], {}
    for i in range(n):
        value, body = shape(i, rng)
        truth[f"r{i}"] = value
        examples.append(
            Example(f"r{i}", {field: value}, [_page(f"https://{host}/p/{i}.html", body)])
        )
    return examples, truth


def _fills(mappings: MappingSet, examples: list[Example], field: str, ftype: str = "string"):
    """(right, wrong, empty) of the mappings on the examples' pages (their known values as truth)."""
    right = wrong = empty = 0
    for example in examples:
        got = None
        for source in example.pages:
            page = Page(source.url, source.body, content_type=source.content_type)
            for mapping in mappings.matching(source.url):
                fields = run_mapping(
                    mapping, page, fragment=source.fragment, record_id=example.record_id,
                    field_types={field: ftype},
                ).fields  # fmt: skip
                if field in fields:
                    got = fields[field]
                    break
            if got is not None:
                break
        if got is None:
            empty += 1
        elif same_value(got, example.values[field], ftype):
            right += 1
        else:
            wrong += 1
    return right, wrong, empty


def _learned(examples, field, ftype="string"):
    result = learn(examples, {field: ftype}, seed=1)
    return result, MappingSet([compile_mapping(m) for m in result.mappings])


def _chain(result, field):
    return [f["processors"] for m in result.mappings for f in m["fields"] if f["name"] == field]


# -- 1. case and whitespace -------------------------------------------------------------------


@pytest.fixture(scope="module")
def pydocs_corpus(tmp_path_factory):
    try:
        return build_corpus("pydocs", tmp_path_factory.mktemp("pydocs"), seed=3)
    except pydocs.CorpusUnavailable as exc:
        pytest.skip(str(exc))


def _shouting(values: dict) -> dict:
    return {k: (v.upper() if isinstance(v, str) else v) for k, v in values.items()}


def test_a_table_in_capitals_agrees_with_mappings_and_teaches_rules_on_mixed_case_pages(
    pydocs_corpus,
):
    """The e2e benchmark's table writes some descriptions in capitals; the pages in mixed case.
    The hand-written mappings agree with them (what mapping_agreement measures), and learning
    from capitals writes the rules (selecting the page's own text) that learning from the
    table's own case does."""
    source = PageSource(WebFolder(pydocs_corpus.web_root))
    ids = sorted(r for r, known in pydocs_corpus.known.items() if known)
    ids = sorted(random.Random(4).sample(ids, 80))
    plain, shouting = [], []
    for record_id in ids:
        pages = record_pages(source, pydocs_corpus.urls[record_id], 0)
        if pages:
            known = pydocs_corpus.known[record_id]
            plain.append(Example(record_id, dict(known), pages))
            shouting.append(Example(record_id, _shouting(known), pages))
    assert sum(e.values != p.values for e, p in zip(shouting, plain, strict=True)) >= 20
    types = dict(pydocs.FIELDS)
    hand = MappingSet([m for m in MappingSet.load(REPO / "mappings") if "python_docs" in m.name])
    agreement = evaluate(hand, shouting, types)["fields"]
    for field in ("title", "synopsis"):
        assert agreement[field]["yielded"] >= 10
        assert agreement[field]["precision"] >= 0.95, agreement[field]["disagreements"]

    hidden = sorted(r for r, fields in pydocs_corpus.hidden.items() if fields)
    hidden = sorted(random.Random(5).sample(hidden, 60))
    outcomes = []
    for examples in (plain, shouting):
        result = learn(examples, types, seed=1)
        learned = MappingSet([compile_mapping(m) for m in result.mappings])
        filled = score(pydocs_corpus, offline_fill(pydocs_corpus, source, learned, hidden))
        rules = {f["name"]: f["processors"] for m in result.mappings for f in m["fields"]}
        outcomes.append((rules, filled["accuracy"], filled["precision"]))
    assert {"title", "synopsis"} <= set(outcomes[1][0]), outcomes[1][0]
    assert outcomes[1] == outcomes[0]
    assert outcomes[1][2] >= 0.95


def test_values_are_found_whatever_their_case_and_spacing():
    page = PageFacts(_page("https://x.test/a", "<p class='d'>The  Alpha\n widget   for Lyon</p>"))
    assert page.variants("THE ALPHA WIDGET FOR LYON") == ["The Alpha widget for Lyon"]
    assert page.variants("the alpha widget for lyon") == ["The Alpha widget for Lyon"]
    assert page.variants("Beta widget") == []


# -- 2. a prefix that changes from record to record --------------------------------------------


def _prefixed(i, rng):
    thing = f"{THINGS[i % len(THINGS)]} {i}"
    tool = f"tool-{GREEK[i % len(GREEK)]}{i // len(GREEK) or ''}"
    return thing, f"<h1 class='title'>{tool} - {thing}</h1><p>About {tool}.</p>"


def test_a_prefix_that_changes_from_record_to_record_becomes_a_regex_over_records():
    examples, _truth = _site(36, _prefixed, "tools.test", "product")
    train, unseen = examples[:24], examples[24:]
    result, mappings = _learned(train, "product")
    (chain,) = _chain(result, "product")
    patterns = [s["parameters"]["pattern"] for s in chain if s["type"] == "regex"]
    assert patterns, chain
    # generalised: no record's own name in it, and no cut at the first "-" of "tool-alpha"
    assert not any(g in p for p in patterns for g in GREEK), patterns
    assert _fills(mappings, unseen, "product") == (len(unseen), 0, 0)


# -- 3. names made unique on the page --------------------------------------------------------


def _numbered(i, rng):
    name = f"{FIRST[i % len(FIRST)]} {LAST[i % len(LAST)]}{i}"
    shown = [name, name, f"{name}[{i % 4 + 1}]", f"{name} ({i % 3 + 1})", f"{name}(2)"][i % 5]
    return name, f"<h2>{shown}</h2><p>A short biography.</p>"


def test_a_trailing_disambiguation_number_is_left_out_of_the_value():
    examples, _truth = _site(60, _numbered, "people.test", "name")
    train, unseen = examples[:40], examples[40:]
    result, mappings = _learned(train, "name")
    assert _chain(result, "name"), result.report["fields"]["name"]
    right, wrong, empty = _fills(mappings, unseen, "name")
    assert wrong == 0 and right == len(unseen), (right, wrong, empty)


# -- 4. a rule that gives one value everywhere ------------------------------------------------


def _bannered(with_own_value: bool):
    def shape(i, rng):
        brand = "Acme" if i % 6 else f"Partner {FIRST[i % len(FIRST)]}"
        own = f"<span class='brand'>{brand}</span>" if with_own_value else ""
        return brand, f"<div class='banner'>Acme</div><p>Item {i} {own}</p>"

    return shape


def test_a_constant_rule_is_not_kept_for_a_field_whose_values_differ():
    # only the banner holds "Acme": right on most records, and wrong on every other one
    examples, _truth = _site(48, _bannered(False), "shop.test", "brand")
    result, mappings = _learned(examples, "brand")
    assert not result.mappings, [m["fields"] for m in result.mappings]
    entry = result.report["fields"]["brand"]["mappings"]["learned_shop_test"]
    assert any(r.get("constant") == "acme" for r in entry["rejected"]), entry["rejected"]

    # where each page names its own brand, that is the rule kept
    examples, _truth = _site(48, _bannered(True), "shop.test", "brand")
    train, unseen = examples[:32], examples[32:]
    result, mappings = _learned(train, "brand")
    assert _chain(result, "brand")
    partners = [e for e in examples if e.values["brand"] != "Acme"]
    assert _fills(mappings, partners, "brand") == (len(partners), 0, 0)
    assert _fills(mappings, unseen, "brand")[1] == 0


# -- 5. the sample spread over the table -------------------------------------------------------


def _sorted_table(n: int):
    """A table sorted by site: the first half one site, the second another."""
    return [
        {
            "_id": f"row{i:05d}",
            "_urls": [f"http://{'a' if i < n // 2 else 'b'}.test/item/{i}.html"],
            "_data": {"title": f"T{i}"},
            "_row": i,
        }
        for i in range(n)
    ]


def test_the_samples_are_spread_over_the_whole_table_seeded_and_deterministic():
    records = _sorted_table(4000)
    sample = sample_for_learning(records, ["title"], per_template=30, max_records=60)
    rows = sorted(s.record["_row"] for s in sample)
    assert len(rows) == 60
    hosts = {s.urls[0].split("/")[2] for s in sample}
    assert hosts == {"a.test", "b.test"}
    # within each site's rows, from all over them, not its first 30
    a_rows = [r for r in rows if r < 2000]
    assert len(a_rows) == 30 and max(a_rows) > 1000 and min(a_rows) < 1000
    again = sample_for_learning(records, ["title"], per_template=30, max_records=60)
    assert [s.id for s in again] == [s.id for s in sample]
    other = sample_for_learning(records, ["title"], per_template=30, max_records=60, seed=7)
    assert {s.id for s in other} != {s.id for s in sample}

    mapping = compile_mapping(
        {
            "name": "items",
            "url_patterns": ["^http://a\\.test/"],
            "fields": [{"name": "title", "processors": [{"type": "xpath", "parameters": {
                "expression": "//h1"}}]}],
        }
    )  # fmt: skip
    checked = sample_for_mappings(records, ["title"], MappingSet([mapping]), per_mapping=10)
    rows = sorted(s.record["_row"] for s in checked)
    assert len(rows) == 10 and max(rows) > 1000, rows


# -- 6. a value split across inline elements ---------------------------------------------------


def _inline(i, rng):
    first, last = FIRST[i % len(FIRST)], f"{LAST[i % len(LAST)]}{i}"
    return f"{first} {last}", f"<p class='by'>by <b>{first}</b> <i>{last}</i></p><p>Text.</p>"


def test_a_value_split_across_inline_elements_is_read_as_a_reader_reads_it():
    examples, _truth = _site(30, _inline, "books.test", "author")
    train, unseen = examples[:20], examples[20:]
    result, mappings = _learned(train, "author")
    assert _chain(result, "author"), result.report["fields"]["author"]
    assert _fills(mappings, unseen, "author") == (len(unseen), 0, 0)


# -- 7. many records on one page -------------------------------------------------------------


CITIES = ["Lyon", "Porto", "Graz"]


def _directory(n: int) -> tuple[list[Example], str]:
    """One listing page, one section per record (`#org-N`); each section says "Based in CITY,
    France", so the city is part of a longer text in a third of the page's sections."""
    sections = "".join(
        f"<div class='entry'><h3 id='org-{i}'>Organisation {i}</h3>"
        f"<p class='where'>Based in {CITIES[i % 3]}, France</p></div>"
        for i in range(n)
    )
    url = "https://directory.test/list.html"
    examples = [
        Example(f"org{i}", {"city": CITIES[i % 3]}, [_page(url, sections, fragment=f"org-{i}")])
        for i in range(n)
    ]
    return examples, url


def test_on_a_page_of_many_records_the_records_own_section_is_looked_into_first():
    examples, _url = _directory(90)
    late = examples[-1]  # its city shows in 29 sections before its own
    facts = PageFacts(late.pages[0])
    found = candidates_for(
        facts,
        late.values["city"],
        "string",
        [late.values["city"]],
        fragment=late.pages[0].fragment,
        record_id=late.record_id,
        scoped=True,
    )
    relative = [c for c in found.values() if "$fragment" in c.processors]
    assert relative, sorted(found)
    result, mappings = _learned(examples[:60], "city")
    (chain,) = _chain(result, "city")
    assert "$fragment" in chain[0]["parameters"]["expression"], chain
    assert _fills(mappings, examples[60:], "city") == (30, 0, 0)
