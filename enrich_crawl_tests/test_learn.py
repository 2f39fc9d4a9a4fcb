"""The learner (enrich_crawl.extract.learn) on real pages: the Python docs of python3.11-doc (one
template, pages serving several modules) and the structured corpus (fixture pages of many real
sites with OpenGraph/JSON-LD/microdata). Small samples of the corpora, the real extraction engine,
`enrich-crawl mapping check` on what is written."""

from __future__ import annotations

import json
import os
import random

import pytest

from enrich_crawl.extract.learn import (
    REPORT_NAME,
    Example,
    ExamplePage,
    evaluate,
    learn,
    same_value,
    write_learned,
)
from enrich_crawl.extract.mapping import MappingSet, compile_mapping, run_mapping
from enrich_crawl.extract.page import Page
from enrich_crawl.testing import pydocs
from enrich_crawl.testing.learn_corpora import (
    PageSource,
    WebFolder,
    build_corpus,
    offline_fill,
    record_pages,
    score,
)
from enrich_crawl_tests.conftest import REPO, product_env, run_cli


def _unavailable(exc: Exception) -> None:
    if os.environ.get("ENRICH_REQUIRE_SERVICES") == "1":
        pytest.fail(f"corpus unavailable: {exc}")
    pytest.skip(str(exc))


@pytest.fixture(scope="module")
def pydocs_corpus(tmp_path_factory):
    try:
        return build_corpus("pydocs", tmp_path_factory.mktemp("pydocs"), seed=3)
    except pydocs.CorpusUnavailable as exc:
        _unavailable(exc)


@pytest.fixture(scope="module")
def structured_corpus(tmp_path_factory):
    try:
        return build_corpus(
            "structured", tmp_path_factory.mktemp("structured"), seed=3, sources="set-up"
        )
    except (RuntimeError, ImportError) as exc:  # no registry client or extruct here
        _unavailable(exc)


def _examples(corpus, ids, source):
    out = []
    for record_id in ids:
        pages = record_pages(source, corpus.urls[record_id], 0)
        if pages:
            out.append(Example(record_id, dict(corpus.known[record_id]), pages))
    return out


@pytest.fixture(scope="module")
def pydocs_learned(pydocs_corpus, tmp_path_factory):
    """Learned from 120 example modules (depth 0: the module's own page)."""
    source = PageSource(WebFolder(pydocs_corpus.web_root))
    ids = sorted(r for r, known in pydocs_corpus.known.items() if known)
    ids = sorted(random.Random(1).sample(ids, 120))
    examples = _examples(pydocs_corpus, ids, source)
    result = learn(examples, pydocs_corpus.field_types, seed=1)
    out = tmp_path_factory.mktemp("learned-pydocs")
    write_learned(result, out)
    return result, out, examples, source


@pytest.fixture(scope="module")
def structured_learned(structured_corpus, tmp_path_factory):
    source = PageSource(WebFolder(structured_corpus.web_root))
    ids = sorted(r for r, known in structured_corpus.known.items() if known)
    examples = _examples(structured_corpus, ids, source)
    result = learn(examples, structured_corpus.field_types, seed=1)
    out = tmp_path_factory.mktemp("learned-structured")
    write_learned(result, out)
    return result, out, examples, source


def _rules(mapping: dict) -> dict[str, list[dict]]:
    return {f["name"]: f["processors"] for f in mapping["fields"]}


def _expressions(mappings: list[dict]) -> list[str]:
    out = []
    for mapping in mappings:
        chains = [f["processors"] for f in mapping.get("fields", [])]
        chains += [p["processors"] for p in mapping.get("url_parsers", [])]
        for chain in chains:
            out += [s["parameters"]["expression"] for s in chain if s["type"] == "xpath"]
    return out


def test_pydocs_learns_record_relative_label_anchored_rules(pydocs_learned):
    """One template (docs.python.org/3.11/...), pages serving several modules: the rules start
    at the record's own section (`$fragment`), and the source path is found by its label."""
    result, _out, _examples, _source = pydocs_learned
    assert [m["name"] for m in result.mappings][:1] == ["learned_docs_python_org"]
    mapping = result.mappings[0]
    rules = _rules(mapping)
    source_rule = rules["source_path"][0]["parameters"]["expression"]
    assert "$fragment" in source_rule and "'Source code:'" in source_rule
    assert "following-sibling::" in source_rule
    title_rule = json.dumps(rules["title"])
    assert "$fragment" in title_rule and "self::h1" in title_rule  # any heading of the section
    assert any(s["type"] == "regex" for s in rules["title"])  # without the trailing ¶
    learned = mapping["learned"]
    for field in ("title", "synopsis", "source_path"):
        assert learned["precision"][field] >= 0.95
        assert learned["recall"][field] >= 0.9
    assert mapping["url_patterns"][0]["pattern"].startswith("^https?://(?:www\\.)?docs\\.python")


def test_pydocs_learned_mapping_fills_hidden_cells_like_the_hand_written_one(
    pydocs_corpus, pydocs_learned
):
    _result, out, _examples, source = pydocs_learned
    hidden = sorted(r for r, fields in pydocs_corpus.hidden.items() if fields)
    hidden = sorted(random.Random(2).sample(hidden, 80))
    learned = score(
        pydocs_corpus, offline_fill(pydocs_corpus, source, MappingSet.load(out), hidden)
    )
    hand = MappingSet([m for m in MappingSet.load(REPO / "mappings") if "python_docs" in m.name])
    reference = score(pydocs_corpus, offline_fill(pydocs_corpus, source, hand, hidden))
    assert learned["precision"] >= 0.95, learned["mistakes"]
    assert learned["accuracy"] >= 0.9, learned["mistakes"]
    assert learned["accuracy"] >= 0.9 * reference["accuracy"]


def test_a_low_precision_rule_is_reported_and_not_written(pydocs_learned):
    result, out, _examples, _source = pydocs_learned
    report = json.loads((out / REPORT_NAME).read_text(encoding="utf-8"))
    assert report == json.loads(json.dumps(result.report, default=str))
    rejected = [
        (field, rule)
        for field, entry in report["fields"].items()
        for mapping in entry["mappings"].values()
        for rule in mapping["rejected"]
        if rule["precision"] < report["min_precision"] and rule["yielded"] >= 2
    ]
    assert rejected, "some candidate rule should have been too imprecise on held-out examples"
    written = {json.dumps(rule) for m in result.mappings for rule in _rules(m).values()}
    for field, rule in rejected:
        assert json.dumps(rule["rule"]) not in written
        assert rule["mistakes"], f"{field}: a rejected rule names its wrong values"
        assert {"record", "url", "expected", "got"} <= set(rule["mistakes"][0])


def test_structured_corpus_learns_one_generic_cross_site_mapping(structured_learned):
    """One or two records per host: structured-data keys that hold on many hosts at once."""
    result, _out, examples, _source = structured_learned
    hosts = {e.pages[0].url.split("/")[2] for e in examples}
    assert len(hosts) >= 100
    generic = [m for m in result.mappings if m["name"].startswith("learned_generic")]
    assert generic and generic[0]["priority"] < 0
    assert generic[0]["url_patterns"][0]["pattern"] == "^https?://[^/]+/[^#]*(?:#.*)?$"
    rules = _rules(generic[0])
    assert (
        rules["title"][0]["parameters"]["expression"]
        == "(//meta[@property='og:title']/@content)[$fragment = '']"
    )
    # a whole-page rule says nothing of one record among many: on a page reached with a
    # #fragment (a listing with one section per record) it yields nothing, not the page's title
    title = compile_mapping(
        {
            "name": "t",
            "url_patterns": [".*"],
            "fields": [{"name": "title", "processors": rules["title"]}],
        }
    )
    listing = Page(
        "http://listing.test/members.html",
        b"<html><head><meta property='og:title' content='All our members'></head>"
        b"<body><div id='m-1'>Ada</div><div id='m-2'>Bob</div></body></html>",
        content_type="text/html",
    )
    assert run_mapping(title, listing).fields == {"title": "All our members"}
    assert run_mapping(title, listing, fragment="m-1").fields == {}
    assert "og:description" in json.dumps(rules["description"])
    assert generic[0]["learned"]["rules"]["title"] == "meta"
    kinds = {k for m in generic for k in m["learned"]["rules"].values()}
    assert "jsonld" in kinds  # the headline and dates of JSON-LD blocks


def test_structured_learned_mappings_fill_hidden_cells(structured_corpus, structured_learned):
    _result, out, _examples, source = structured_learned
    hidden = sorted(r for r, fields in structured_corpus.hidden.items() if fields)
    result = score(
        structured_corpus, offline_fill(structured_corpus, source, MappingSet.load(out), hidden)
    )
    assert result["accuracy"] >= 0.9, result["mistakes"]
    assert result["precision"] >= 0.97, result["mistakes"]


def test_every_learned_mapping_passes_mapping_check_without_positional_paths(
    pydocs_learned, structured_learned
):
    for result, out, _examples, _source in (pydocs_learned, structured_learned):
        # a mappings folder as it stands: the report and a schema file are not mappings
        (out / "mapping.schema.json").write_text(
            (REPO / "mappings" / "mapping.schema.json").read_text(encoding="utf-8"),
            encoding="utf-8",
        )
        proc = run_cli(["mapping", "check", str(out)], product_env(), REPO)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        for mapping in result.mappings:
            assert f"ok  {mapping['name']}" in proc.stdout
        for expression in _expressions(result.mappings):
            # a condition on the page (/html[...]: its template's guard) is no positional path
            assert not expression.startswith("/html/"), expression
            assert "/body/div[" not in expression, expression
        assert all(
            k != "positional" for m in result.mappings for k in m["learned"]["rules"].values()
        )


def test_existing_mappings_take_precedence(pydocs_corpus, pydocs_learned):
    _result, _out, examples, _source = pydocs_learned
    hand = MappingSet([m for m in MappingSet.load(REPO / "mappings") if "python_docs" in m.name])
    result = learn(examples[:60], pydocs_corpus.field_types, existing=hand, seed=1)
    learned_fields = {f["name"] for m in result.mappings for f in m["fields"]}
    assert not learned_fields & {"title", "synopsis", "source_path", "added_in"}
    assert result.report["fields"]["title"]["why_nothing"] == "covered by the given mappings"


def test_evaluate_names_the_mapping_field_and_url_of_a_disagreement(pydocs_learned):
    _result, out, examples, _source = pydocs_learned
    mappings = MappingSet.load(out)
    types = dict(pydocs.FIELDS)
    good = evaluate(mappings, examples[:40], types)
    name = "learned_docs_python_org"
    assert good["mappings"][name]["title"]["precision"] == 1.0
    changed = [
        Example(e.record_id, {**e.values, "title": "Something else"}, e.pages)
        for e in examples[:40]
        if "title" in e.values
    ]
    bad = evaluate(mappings, changed, types, max_disagreements=2)
    entry = bad["mappings"][name]["title"]
    assert entry["precision"] == 0.0 and entry["yielded"] == len(changed)
    assert len(entry["disagreements"]) == 2
    first = entry["disagreements"][0]
    assert first["expected"] == "Something else"
    assert first["url"].startswith("https://docs.python.org/3.11/") and "#module-" in first["url"]
    assert bad["fields"]["title"]["agreed"] == 0


def test_values_compare_as_the_dataset_reads_them():
    assert same_value("  Hello   world ", "Hello world", "string")
    assert same_value("\u201cquoted\u201d", '"quoted"', "string")
    # case and whitespace as the dataset means them: a table of capitals, a page of mixed case
    assert same_value("Hello  world", "HELLO WORLD", "string")
    assert not same_value("hello world", "hello there", "string")
    assert same_value(["Ada", "Bob"], ["ADA", "bob"], "list")
    assert same_value("1,200", 1200, "integer")
    assert same_value(3.0, 3, "number")
    assert same_value("March 5, 2024", "2024-03-05", "date")
    assert same_value(["a", "b"], ["a", "b"], "list")
    assert same_value(False, False, "boolean") and not same_value(True, False, "boolean")


def test_learn_reports_why_nothing_was_learned(tmp_path):
    page = ExamplePage("https://shop.example/p/1", b"<html><body><p>nothing here</p></body></html>")
    result = learn(
        [Example("1", {"price": 12, "sku": "A-1"}, [page])],
        {"price": "number", "sku": "string", "color": "string"},
    )
    assert result.mappings == []
    fields = result.report["fields"]
    assert "too few for a site template" in fields["price"]["why_nothing"]
    assert fields["color"]["why_nothing"] == "no example record has a known value for this field"
    paths = write_learned(result, tmp_path / "out")
    assert [p.name for p in paths] == [REPORT_NAME]
    assert len(MappingSet.load(tmp_path / "out")) == 0


def test_json_answers_are_learned_as_key_paths():
    """A JSON API answer (the shape of PyPI's JSON API): the value's key path."""
    examples = []
    for i in range(12):
        body = json.dumps(
            {"info": {"name": f"pkg{i}", "version": f"1.{i}.0", "requires_python": ">=3.8"}}
        ).encode()
        page = ExamplePage(f"https://pypi.example/pypi/pkg{i}/json", body, "application/json")
        examples.append(Example(f"pkg{i}", {"version": f"1.{i}.0"}, [page]))
    result = learn(examples, {"version": "string"})
    (mapping,) = result.mappings
    assert mapping["fields"][0]["processors"][0] == {
        "type": "jsonpath",
        "parameters": {"expression": "$.info.version"},
    }
    assert mapping["learned"]["rules"] == {"version": "json"}


def test_odd_pages_teach_nothing_and_stop_nothing():
    """The web at large: empty bodies, binary bytes served as HTML, an image, a script, a page
    over the size cap, a JSON list; learning goes on with the good pages and says why a field
    whose values sit only on odd pages was not learned."""
    good = [
        ExamplePage(
            f"https://shop{i}.example/p/{i}.html",
            f"<html><head><meta property='og:title' content='Lamp {i}'></head>"
            f"<body><h1>Lamp {i}</h1></body></html>".encode(),
            "text/html",
        )
        for i in range(6)
    ]
    odd = [
        ExamplePage("https://odd1.example/empty.html", b"", "text/html"),
        ExamplePage("https://odd2.example/bin.html", bytes(range(256)) * 16, "text/html"),
        ExamplePage("https://odd3.example/pic.png", b"\x89PNG\r\n\x1a\n" + b"\0" * 64, "image/png"),
        ExamplePage("https://odd4.example/app.js", b"var title = 'Lamp';", "text/javascript"),
        ExamplePage(
            "https://odd5.example/huge.html",
            b"<html><body>" + b"<p>Lamp</p>" * 300_000 + b"</body></html>",
            "text/html",
        ),
        ExamplePage("https://odd6.example/list.json", b"[1, 2, 3]", "application/json"),
    ]
    examples = [Example(f"g{i}", {"title": f"Lamp {i}"}, [p]) for i, p in enumerate(good)]
    examples += [
        Example(f"o{i}", {"title": "Lamp", "sku": f"S-{i}"}, [p]) for i, p in enumerate(odd)
    ]
    result = learn(examples, {"title": "string", "sku": "string"}, seed=0)
    assert result.report["pages_skipped"] == {"too_large": 1}
    generic = next(m for m in result.mappings if m["name"] == "learned_generic")
    assert "og:title" in json.dumps(generic["fields"])
    why = result.report["fields"]["sku"]["why_nothing"]
    assert "not found" in why or "fewer than 2" in why, why
