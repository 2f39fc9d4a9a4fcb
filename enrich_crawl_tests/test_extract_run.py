"""Running mappings on pages: typed field values, list fields, links, variables, one parse."""

from __future__ import annotations

import json

from enrich_crawl.extract.mapping import compile_mapping, run_mapping, try_mappings
from enrich_crawl.extract.page import Page

PAGE_HTML = """<html><head><base href="https://cdn.site.example/root/"></head><body>
<nav><a href="../about.html">About</a> <a href="/contact?b=2&a=1#team">Contact</a>
<a href="mailto:x@y.z">mail</a> <a href="javascript:void(0)">js</a> <a href="#top">top</a>
<a href="https://other.example/p/%7Euser/./x/../y">other</a> <a href="../about.html">dup</a></nav>
<dl><dt>Founded</dt><dd>1,998</dd><dt>Staff</dt><dd>approx. 1,200</dd>
<dt>Open</dt><dd>Yes</dd><dt>Release</dt><dd>March 3, 2025</dd><dt>Rating</dt><dd>4.5</dd>
<dt>Tags</dt><dd>a, b; c</dd><dt>Empty</dt><dd>   </dd></dl>
<ul class="people"><li>Ann</li><li> </li><li>Bob</li></ul>
<section id="rec-1"><span>first</span></section><section id="rec-2"><span>second</span></section>
<table><tr><td>R1</td><td>one</td></tr><tr><td>R2</td><td>two</td></tr></table>
</body></html>"""


def dd(label: str) -> dict:
    return {
        "type": "xpath",
        "parameters": {"expression": f"//dt[.='{label}']/following-sibling::dd[1]"},
    }


def field(name: str, *processors: dict, ftype: str | None = None) -> dict:
    rule = {"name": name, "processors": list(processors)}
    if ftype:
        rule["type"] = ftype
    return rule


def mapping(*fields: dict, **extra) -> object:
    raw = {"name": "t", "url_patterns": ["^https://site\\.example/"], "fields": list(fields)}
    raw.update(extra)
    return compile_mapping(raw)


def page(body: str = PAGE_HTML, url: str = "https://site.example/a/b.html", ctype="text/html"):
    return Page(url, body, content_type=ctype)


def test_values_are_typed_by_the_dataset_field_types():
    m = mapping(
        field("founded", dd("Founded")),
        field("staff", dd("Staff")),
        field("open", dd("Open")),
        field("release", dd("Release")),
        field("rating", dd("Rating")),
        field("tags", dd("Tags")),
        field("plain", dd("Staff")),
    )
    types = {
        "founded": "integer",
        "staff": "integer",
        "open": "boolean",
        "release": "date",
        "rating": "number",
        "tags": "list",
        "plain": "string",
    }
    result = run_mapping(m, page(), field_types=types)
    assert result.fields == {
        "founded": 1998,
        "staff": 1200,
        "open": True,
        "release": "2025-03-03",
        "rating": 4.5,
        "tags": ["a, b; c"],  # one value: splitting is the mapping's job (split)
        "plain": "approx. 1,200",
    }
    assert result.errors == []


def test_a_value_that_does_not_convert_is_skipped_with_an_error():
    m = mapping(field("open", dd("Rating")), field("rating", dd("Open"), ftype="number"))
    result = run_mapping(m, page(), field_types={"open": "boolean"})
    assert result.fields == {}
    assert result.errors == [
        "open: cannot convert '4.5' to boolean: not a boolean: '4.5'",
        "rating: cannot convert 'Yes' to number: no number in 'Yes'",
    ]
    # the next value that converts is taken
    two = mapping(
        field(
            "rating",
            {"type": "xpath", "parameters": {"expression": "//dd[.='Yes' or .='4.5']"}},
            ftype="number",
        )
    )
    assert run_mapping(two, page()).fields == {"rating": 4.5}


def test_the_first_non_empty_value_wins_and_list_fields_take_all():
    people = {"type": "xpath", "parameters": {"expression": "//ul[@class='people']/li"}}
    m = mapping(field("first", people), field("all", people, ftype="list"))
    assert run_mapping(m, page()).fields == {"first": "Ann", "all": ["Ann", "Bob"]}
    # the dataset's type wins over the mapping's own
    assert run_mapping(m, page(), field_types={"all": "string"}).fields["all"] == "Ann"


def test_mapping_declared_types_apply_without_a_dataset():
    m = mapping(field("founded", dd("Founded"), ftype="integer"), field("empty", dd("Empty")))
    assert run_mapping(m, page()).fields == {"founded": 1998}


def test_json_values_become_json_text_for_string_fields_and_items_for_lists():
    body = json.dumps({"o": {"k": 1}, "l": ["x", 2, True, None, {"z": 1}], "n": 2.0})
    m = mapping(
        field("obj", {"type": "jsonpath", "parameters": {"expression": "$.o"}}),
        field("lst", {"type": "jsonpath", "parameters": {"expression": "$.l"}}),
        field("num", {"type": "jsonpath", "parameters": {"expression": "$.n"}}),
    )
    p = page(body, ctype="application/json")
    typed = run_mapping(m, p, field_types={"obj": "string", "lst": "list", "num": "string"})
    assert typed.fields == {
        "obj": '{"k": 1}',
        "lst": ["x", "2", "true", '{"z": 1}'],
        "num": "2",
    }
    untyped = run_mapping(m, p)
    assert untyped.fields == {"obj": {"k": 1}, "lst": ["x", 2, True, None, {"z": 1}], "num": 2.0}


def test_links_are_absolute_http_urls_as_a_browser_resolves_them_without_duplicates():
    m = compile_mapping(
        {
            "name": "links",
            "url_patterns": ["^https://site\\.example/"],
            "url_parsers": [
                {"processors": [{"type": "xpath", "parameters": {"expression": "//nav/a/@href"}}]}
            ],
        }
    )
    result = run_mapping(m, page())
    assert result.links == [
        "https://cdn.site.example/about.html",  # against <base href>
        # the query keeps its order (only the page key sorts it), the fragment is kept
        "https://cdn.site.example/contact?b=2&a=1#team",
        "https://cdn.site.example/root/#top",
        "https://other.example/p/%7Euser/y",  # dot segments resolved, escapes as written
    ]
    assert run_mapping(m, page(), with_links=False).links == []


def test_fragment_and_id_select_per_record():
    m = mapping(
        field(
            "by_fragment",
            {"type": "xpath", "parameters": {"expression": "//section[@id=$fragment]/span"}},
        ),
        field(
            "by_id",
            {"type": "xpath", "parameters": {"expression": "//tr[td[1]=$id]/td[2]"}},
        ),
    )
    assert m.uses_fragment and m.uses_id
    assert run_mapping(m, page(), fragment="rec-2", record_id="R1").fields == {
        "by_fragment": "second",
        "by_id": "one",
    }
    assert run_mapping(m, page(), fragment="nope", record_id="R9").fields == {}


def test_only_fields_restricts_the_work():
    m = mapping(field("a", dd("Founded")), field("b", dd("Staff")))
    assert run_mapping(m, page(), only_fields=["b"]).fields == {"b": "approx. 1,200"}


def test_one_parse_per_page_however_many_mappings_run():
    m1 = mapping(
        field("a", dd("Founded")),
        field("c", {"type": "xpath", "parameters": {"expression": "//dt[1]/text()"}}),
    )
    m2 = mapping(field("b", dd("Staff")), name="t2")
    p = page()
    run_mapping(m1, p)
    tree = p.__dict__["tree"]
    run_mapping(m2, p, fragment="rec-1", record_id="R2")
    assert p.__dict__["tree"] is tree
    # selector results on the whole page are shared across runs, but never elements: they would
    # keep the tree alive after the crawl's page cache drops it
    assert p.selector_cache
    assert not [v for values in p.selector_cache.values() for v in values if hasattr(v, "tag")]
    del p.__dict__["tree"]
    assert run_mapping(m2, p).fields == {"b": "approx. 1,200"}
    assert p.__dict__["tree"] is not tree


def test_try_mappings_merges_by_priority_and_reports_matches():
    low = mapping(field("x", dd("Founded")), field("y", dd("Open")), name="low", priority=0)
    high = mapping(field("x", dd("Staff")), name="high", priority=5)
    other = compile_mapping(
        {
            "name": "other",
            "url_patterns": ["^https://elsewhere/"],
            "fields": [field("z", dd("Open"))],
        }
    )
    output, errors = try_mappings([low, other, high], page())
    assert output == {
        "mappings": ["high", "low"],
        "fields": {"x": "approx. 1,200", "y": "Yes"},
        "links": [],
    }
    assert errors == []
    forced, _ = try_mappings([other], page(), force=True)
    assert forced["mappings"] == ["other"] and forced["fields"] == {"z": "Yes"}


def test_extraction_errors_do_not_stop_other_fields():
    m = mapping(
        field(
            "bad",
            {"type": "xpath", "parameters": {"expression": "//title/text()"}},
            {"type": "jsonpath", "parameters": {"expression": "$.x"}},
        ),
        field("good", dd("Open")),
    )
    result = run_mapping(
        m, page("<html><head><title>not json</title></head><dl><dt>Open</dt><dd>no</dd></dl>")
    )
    assert result.fields == {"good": "no"}
    assert result.errors and result.errors[0].startswith("bad: jsonpath")
