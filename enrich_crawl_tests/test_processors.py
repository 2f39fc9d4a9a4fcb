"""Every processor type of the mapping language: what it does, and how bad parameters are refused
at load time (with the JSON path and the reason)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from enrich_crawl.extract.errors import MappingError
from enrich_crawl.extract.page import Page
from enrich_crawl.extract.processors import PAGE, REGISTRY, Context, compile_chain

HTML = """<!doctype html><html><head><base href="/base/"><title> T </title></head><body>
<ul id="l"><li class="a">One</li><li class="a"> Two
  words </li><li class="b">3</li></ul>
<p id="p1">Founded in <b>1998</b>, 1,200 staff</p>
<a href="rel/x.html">x</a><a href="https://other.example/y#frag">y</a><a href="mailto:a@b.c">m</a>
<section id="org-1"><span class="city">Zürich</span></section>
<section id="org-2"><span class="city">Bern</span></section>
<script type="application/ld+json">{"@type": "Organization", "name": "Acme", "n": {"v": 5},
 "tags": ["a", "b"], "offers": [{"price": 3, "ok": true}, {"price": 7, "ok": false}]}</script>
</body></html>"""

URL = "https://site.example/dir/page.html"


def P(kind: str, **parameters: Any) -> dict[str, Any]:
    return {"type": kind, "parameters": parameters}


def run(
    processors: list[dict],
    body: str | bytes = HTML,
    *,
    url: str = URL,
    content_type: str = "text/html",
    fragment: str = "",
    record_id: str = "",
    errors: list[str] | None = None,
) -> list[Any]:
    chain = compile_chain(processors, "$.fields[0].processors")
    ctx = Context(
        page=Page(url, body, content_type=content_type), fragment=fragment, record_id=record_id
    )
    values = chain([PAGE], ctx)
    if errors is not None:
        errors.extend(ctx.errors)
    return values


# -- selectors -------------------------------------------------------------------------------------


def test_xpath_text_attributes_elements_and_scalars():
    assert run([P("xpath", expression="//li/text()")]) == ["One", " Two\n  words ", "3"]
    assert run([P("xpath", expression="//a/@href")])[:2] == [
        "rel/x.html",
        "https://other.example/y#frag",
    ]
    # an element at the end of the chain becomes its string value (all its text)
    assert run([P("xpath", expression="//p[@id='p1']")]) == ["Founded in 1998, 1,200 staff"]
    assert run([P("xpath", expression="count(//li)")]) == [3]
    assert run([P("xpath", expression="boolean(//li[@class='b'])")]) == [True]
    assert run([P("xpath", expression="boolean(//li[@class='zzz'])")]) == [False]
    assert run([P("xpath", expression="string(//title)")]) == [" T "]
    assert run([P("xpath", expression="//nothing")]) == []


def test_xpath_variables_url_fragment_id():
    expression = "//section[@id=$fragment]//span[@class='city']/text()"
    assert run([P("xpath", expression=expression)], fragment="org-2") == ["Bern"]
    assert run([P("xpath", expression=expression)], fragment="org-9") == []
    assert run([P("xpath", expression="concat($url, '|', $id)")], record_id="R1") == [URL + "|R1"]


def test_xpath_chaining_on_elements_and_on_html_strings():
    # a later selector runs on each value, an element as context node
    assert run([P("xpath", expression="//section"), P("xpath", expression=".//span/text()")]) == [
        "Zürich",
        "Bern",
    ]
    # a string value is parsed as an HTML fragment
    fragment_html = '{"html": "<p>a <b>bold</b> move</p><p>two</p>"}'
    assert run(
        [P("jsonpath", expression="$.html"), P("xpath", expression="//b/text()")],
        fragment_html,
        content_type="application/json",
    ) == ["bold"]


def test_xpath_namespaces_on_xml_pages():
    atom = b"""<?xml version="1.0" encoding="utf-8"?>
<feed xmlns="http://www.w3.org/2005/Atom"><entry><title>First</title></entry>
<entry><title>Second</title></entry></feed>"""
    processors = [
        P(
            "xpath",
            expression="//a:entry/a:title/text()",
            namespaces={"a": "http://www.w3.org/2005/Atom"},
        )
    ]
    assert run(processors, atom, content_type="application/atom+xml") == ["First", "Second"]


def test_css_with_text_and_attr_pseudo_elements():
    assert run([P("css", expression="li.a::text")]) == ["One", " Two\n  words "]
    assert run([P("css", expression="a::attr(href)")])[0] == "rel/x.html"
    assert run([P("css", expression="section#org-1"), P("css", expression="span::text")]) == [
        "Zürich"
    ]


def test_jsonpath_on_json_pages_and_on_json_ld_after_xpath():
    body = json.dumps({"a": {"b": [1, 2]}, "s": "x", "flag": False, "none": None})
    assert run([P("jsonpath", expression="$.a.b[*]")], body, content_type="application/json") == [
        1,
        2,
    ]
    assert run([P("jsonpath", expression="$.flag")], body, content_type="application/json") == [
        False
    ]
    assert run([P("jsonpath", expression="$.none")], body, content_type="application/json") == []
    ld = P("xpath", expression="//script[@type='application/ld+json']/text()")
    assert run([ld, P("jsonpath", expression="$.n.v")]) == [5]
    assert run([ld, P("jsonpath", expression="$.offers[?(@.price > 4)].price")]) == [7]
    # objects stay JSON values; a string field gets them as JSON text later
    assert run([ld, P("jsonpath", expression="$.n")]) == [{"v": 5}]


def test_jsonpath_filters_never_change_the_page_data():
    # jsonpath-ng's filter rewrites dicts in place; the engine must not let one field spoil another
    body = json.dumps({"g": [{"t": "P", "offers": {"price": "3"}}]})
    page = Page(URL, body, content_type="application/json")
    first = compile_chain([P("jsonpath", expression="$..*[?(@.t = 'P')].offers")], "$")
    second = compile_chain([P("jsonpath", expression="$..offers.price")], "$")
    assert first([PAGE], Context(page=page)) == [{"price": "3"}]
    assert second([PAGE], Context(page=page)) == ["3"]
    assert page.json == {"g": [{"t": "P", "offers": {"price": "3"}}]}


def test_jsonpath_on_text_that_is_not_json_records_an_error():
    errors: list[str] = []
    values = run(
        [P("xpath", expression="//title/text()"), P("jsonpath", expression="$.a")], errors=errors
    )
    assert values == []
    assert any("not JSON" in e for e in errors)


def test_jsonpath_accepts_json_ld_as_found_in_the_wild():
    html = """<script type="application/ld+json">
    //<![CDATA[
    {"name": "Line one
line two", "list": [1, 2,],}
    //]]>
    </script>"""
    ld = P("xpath", expression="//script/text()")
    assert run([ld, P("jsonpath", expression="$.name"), P("trim")], html) == ["Line one line two"]
    assert run([ld, P("jsonpath", expression="$.list[*]")], html) == [1, 2]


# -- strings ---------------------------------------------------------------------------------------


def test_regex_groups_named_groups_all_and_case():
    p1 = P("xpath", expression="//p[@id='p1']")
    assert run([p1, P("regex", pattern=r"Founded in (\d{4})")]) == ["1998"]
    assert run([p1, P("regex", pattern=r"\d{4}")]) == ["1998"]  # no group: whole match
    assert run([p1, P("regex", pattern=r"(?P<year>\d{4})", group="year")]) == ["1998"]
    assert run([p1, P("regex", pattern=r"(F)(ounded)", group=2)]) == ["ounded"]
    assert run([p1, P("regex", pattern=r"\d+", all=True)]) == ["1998", "1", "200"]
    assert run([p1, P("regex", pattern=r"FOUNDED", ignore_case=True)]) == ["Founded"]
    assert run([p1, P("regex", pattern=r"nowhere")]) == []
    # on the page itself: its text
    assert run([P("regex", pattern=r"<title>\s*(\w)")]) == ["T"]


def test_replace_with_references_count_and_case():
    a = P("xpath", expression="//a[3]/@href")
    assert run([a, P("replace", pattern=r"^mailto:", replacement="")]) == ["a@b.c"]
    assert run([a, P("replace", pattern=r"^mailto:(\w+)@(.*)$", replacement=r"\2/\1")]) == ["b.c/a"]
    assert run([a, P("replace", pattern="[a-c]", replacement="_", count=1)]) == ["m_ilto:a@b.c"]
    assert run([a, P("replace", pattern="MAILTO:", ignore_case=True)]) == ["a@b.c"]


def test_trim_collapse_and_characters():
    li = P("xpath", expression="//li[2]/text()")
    assert run([li, P("trim")]) == ["Two words"]
    assert run([li, P("trim", collapse=False)]) == ["Two\n  words"]
    assert run([P("xpath", expression="string('//x.html//')"), P("trim", characters="/")]) == [
        "x.html"
    ]


def test_lower_and_upper():
    li = P("xpath", expression="//li[1]/text()")
    assert run([li, P("lower")]) == ["one"]
    assert run([li, P("upper")]) == ["ONE"]


def test_split_plain_regex_and_maxsplit():
    text = P("xpath", expression="string(' a, b,,c ; d ')")
    assert run([text, P("split")]) == ["a", "b", "c ; d"]
    assert run([text, P("split", separator=r"[,;]", regex=True)]) == ["a", "b", "c", "d"]
    assert run([text, P("split", separator=",", maxsplit=1)]) == ["a", "b,,c ; d"]


def test_join_skips_empty_values():
    assert run([P("xpath", expression="//li/text()"), P("trim"), P("join", separator="|")]) == [
        "One|Two words|3"
    ]
    assert run([P("xpath", expression="//li/text()"), P("join")]) == ["One  Two\n  words  3"]
    assert run([P("xpath", expression="//none"), P("join")]) == []


def test_join_with_no_separator_reads_text_as_a_reader_sees_it():
    """A whitespace-only text node between two inline elements is the space a reader sees."""
    page = "<p><code>Cmd <var>a</var> <var>b</var></code> <i>x</i>\n<i>y</i></p>"
    assert run([P("xpath", expression="//code//text()"), P("join", separator="")], page) == [
        "Cmd a b"
    ]
    assert run(
        [
            P("xpath", expression="//i/text() | //i/following-sibling::text()[1]"),
            P("join", separator=""),
        ],
        page,
    ) == ["x y"]
    assert run([P("xpath", expression="//var//text()"), P("join", separator="")], page) == ["ab"]
    assert run([P("xpath", expression="//code/text()[2]"), P("join", separator="")], page) == []


def test_first_last_nth():
    li = P("xpath", expression="//li/text()")
    assert run([li, P("first")]) == ["One"]
    assert run([li, P("last")]) == ["3"]
    assert run([li, P("nth", index=1), P("trim")]) == ["Two words"]
    assert run([li, P("nth", index=-1)]) == ["3"]
    assert run([li, P("nth", index=5)]) == []
    assert run([P("xpath", expression="//none"), P("first")]) == []


def test_unique_and_filter():
    values = P("xpath", expression="//li/@class")
    assert run([values, P("unique")]) == ["a", "b"]
    li = P("xpath", expression="//li/text()")
    assert run([li, P("filter", pattern=r"^\d+$")]) == ["3"]
    assert run([li, P("filter", pattern=r"^\d+$", invert=True), P("trim")]) == [
        "One",
        "Two words",
    ]
    assert run([li, P("filter", pattern="one", ignore_case=True)]) == ["One"]


def test_text_separates_blocks_not_inline_elements_and_skips_scripts():
    html = (
        "<div id='d'><p>Edel<b>stahl</b>-Kocher.</p><ul><li>a</li><li>b</li></ul>"
        "<script>var x = 1;</script><style>.x{}</style>end</div>"
    )
    d = P("xpath", expression="//div[@id='d']")
    assert run([d, P("text")], html) == ["Edelstahl-Kocher. a b end"]
    assert run([d, P("text", separator=" | ")], html) == ["Edelstahl-Kocher. | a | b | end"]
    assert run([d], html) == ["Edelstahl-Kocher.abvar x = 1;.x{}end"]  # the string value


def test_urljoin_uses_base_href_or_a_fixed_base():
    hrefs = P("xpath", expression="//a/@href")
    assert run([hrefs, P("urljoin")])[:2] == [
        "https://site.example/base/rel/x.html",
        "https://other.example/y#frag",
    ]
    assert run([hrefs, P("first"), P("urljoin", base="https://cdn.example/a/")]) == [
        "https://cdn.example/a/rel/x.html"
    ]


def test_format_with_value_and_variables():
    fmt = P("format", template="https://api.example/{id}/{value}?from={url}#{fragment}")
    assert run([P("xpath", expression="//li[1]/text()"), fmt], record_id="R1", fragment="f") == [
        f"https://api.example/R1/One?from={URL}#f"
    ]
    assert run([P("xpath", expression="//li[1]/text()"), P("format", template="{{{value}}}")]) == [
        "{One}"
    ]


# -- conversions -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "params", "expected"),
    [
        ("2024-03-05", {}, "2024-03-05"),
        ("2024-03-05T10:11:12Z", {}, "2024-03-05"),
        ("March 5, 2024", {}, "2024-03-05"),
        ("5th March 2024", {}, "2024-03-05"),
        ("05.03.2024", {}, "2024-03-05"),
        ("05/03/24", {"format": "%d/%m/%y"}, "2024-03-05"),
        ("Tue 5 Mar", {"format": "%a %d %b"}, "1900-03-05"),
        ("3/5/2024", {"format": ["%d.%m.%Y", "%m/%d/%Y"]}, "2024-03-05"),
        ("not a date", {}, None),
        ("2024-13-45", {}, None),
    ],
)
def test_date(text, params, expected):
    values = run([P("xpath", expression=f"string('{text}')"), P("date", **params)])
    assert values == ([expected] if expected else [])


@pytest.mark.parametrize(
    ("text", "params", "expected"),
    [
        ("1,200 staff", {}, 1200),
        ("-3.5e2", {}, -350),
        ("€ 1.234,50", {"decimal": ","}, 1234.5),
        ("12,5 %", {"decimal": ","}, 12.5),
        ("3.14", {}, 3.14),
        ("\u22124", {}, -4),
        ("none here", {}, None),
    ],
)
def test_number(text, params, expected):
    values = run([P("xpath", expression=f"string('{text}')"), P("number", **params)])
    assert values == ([expected] if expected is not None else [])


def test_number_passes_json_numbers_and_drops_booleans():
    body = json.dumps({"a": [3, 2.5, True, "7 items", None]})
    assert run(
        [P("jsonpath", expression="$.a[*]"), P("number")], body, content_type="application/json"
    ) == [3, 2.5, 7]


def test_boolean_words_lists_and_json_booleans():
    body = json.dumps({"a": ["Yes", "nein", "0", "maybe", True, "Vorrätig", "Ausverkauft"]})
    values = run(
        [
            P("jsonpath", expression="$.a[*]"),
            P("boolean", true=["vorrätig"], false=["ausverkauft"]),
        ],
        body,
        content_type="application/json",
    )
    assert values == [True, False, False, True, True, False]


def test_default_fills_only_an_empty_result():
    assert run([P("xpath", expression="//none"), P("default", value="n/a")]) == ["n/a"]
    assert run([P("xpath", expression="//li[1]/text()"), P("default", value="n/a")]) == ["One"]
    assert run([P("xpath", expression="string(//none)"), P("default", value=0)]) == [0]
    assert run([P("xpath", expression="//none"), P("default", value=None)]) == []


# -- bad parameters ----------------------------------------------------------------------------------

EXSLT_RE = "http://exslt.org/regular-expressions"
BAD_PARAMETERS: list[tuple[str, dict[str, Any] | None, str, str]] = [
    # (type, parameters, JSON path suffix of the error, words of the reason)
    ("xpath", {}, "parameters.expression", "required key 'expression'"),
    ("xpath", None, "parameters.expression", "required key 'expression'"),
    ("xpath", {"expression": ""}, "parameters.expression", "must not be empty"),
    ("xpath", {"expression": 3}, "parameters.expression", "expected a string"),
    ("xpath", {"expression": "//a["}, "parameters.expression", "invalid XPath"),
    ("xpath", {"expression": "//a[$nope]"}, "parameters.expression", "unknown variable $nope"),
    ("xpath", {"expression": "//a[lower-case(.)]"}, "parameters.expression", "unknown function"),
    ("xpath", {"expression": "//a", "expr": 1}, "parameters.expr", "unknown key 'expr'"),
    ("xpath", {"expression": "x:f(.)"}, "parameters.expression", "namespace prefix"),
    (
        "xpath",
        {"expression": "re:test(., 'a')", "namespaces": {"re": EXSLT_RE}},
        "parameters.expression",
        "not available",
    ),
    ("xpath", {"expression": "//a", "namespaces": {"a": 1}}, "parameters.namespaces.a", "string"),
    ("css", {}, "parameters.expression", "required key"),
    ("css", {"expression": "a::foo("}, "parameters.expression", "invalid CSS selector"),
    ("css", {"expression": "a:no-such-pseudo"}, "parameters.expression", "invalid CSS selector"),
    ("jsonpath", {}, "parameters.expression", "required key"),
    ("jsonpath", {"expression": "$.["}, "parameters.expression", "invalid JSONPath"),
    ("jsonpath", {"expression": ["$.a"]}, "parameters.expression", "expected a string"),
    ("regex", {}, "parameters.pattern", "required key 'pattern'"),
    ("regex", {"pattern": "("}, "parameters.pattern", "invalid regular expression"),
    ("regex", {"pattern": "(a+)+$"}, "parameters.pattern", "is refused"),
    ("regex", {"pattern": "(a)", "group": 2}, "parameters.group", "no group 2"),
    ("regex", {"pattern": "(?P<x>a)", "group": "y"}, "parameters.group", "no group named 'y'"),
    ("regex", {"pattern": "a", "group": -1}, "parameters.group", "at least 0"),
    ("regex", {"pattern": "a", "all": "yes"}, "parameters.all", "true or false"),
    ("replace", {}, "parameters.pattern", "required key"),
    ("replace", {"pattern": "a", "replacement": r"\2"}, "parameters.replacement", "group"),
    ("replace", {"pattern": "a", "replacement": r"\g<x>"}, "parameters.replacement", "group name"),
    ("replace", {"pattern": "a", "replacement": 1}, "parameters.replacement", "expected a string"),
    ("replace", {"pattern": "(x*)*"}, "parameters.pattern", "is refused"),
    ("replace", {"pattern": "a", "count": -1}, "parameters.count", "at least 0"),
    ("filter", {}, "parameters.pattern", "required key"),
    ("filter", {"pattern": "(a|aa)+"}, "parameters.pattern", "is refused"),
    ("filter", {"pattern": "a", "invert": 1}, "parameters.invert", "true or false"),
    ("trim", {"collapse": "no"}, "parameters.collapse", "true or false"),
    ("trim", {"characters": ""}, "parameters.characters", "must not be empty"),
    ("trim", {"strip": True}, "parameters.strip", "unknown key"),
    ("lower", {"x": 1}, "parameters.x", "allowed here: none"),
    ("upper", {"x": 1}, "parameters.x", "allowed here: none"),
    ("first", {"n": 2}, "parameters.n", "unknown key"),
    ("last", {"n": 2}, "parameters.n", "unknown key"),
    ("unique", {"key": 1}, "parameters.key", "unknown key"),
    ("nth", {}, "parameters.index", "required key"),
    ("nth", {"index": "1"}, "parameters.index", "expected an integer"),
    ("join", {"separator": 1}, "parameters.separator", "expected a string"),
    ("split", {"separator": ""}, "parameters.separator", "must not be empty"),
    ("split", {"separator": "(", "regex": True}, "parameters.separator", "invalid regular"),
    ("split", {"maxsplit": -1}, "parameters.maxsplit", "at least 0"),
    ("text", {"separator": 2}, "parameters.separator", "expected a string"),
    ("urljoin", {"base": "/relative/"}, "parameters.base", "not an absolute http(s) URL"),
    ("urljoin", {"base": "ftp://x.example/"}, "parameters.base", "not an absolute http(s) URL"),
    ("format", {}, "parameters.template", "required key"),
    ("format", {"template": "{nope}"}, "parameters.template", "unknown placeholder {nope}"),
    ("format", {"template": "{value"}, "parameters.template", "invalid template"),
    ("date", {"format": "%Q"}, "parameters.format", "invalid date format"),
    ("date", {"format": "dd.mm.yyyy"}, "parameters.format", "no %-directive"),
    ("date", {"format": ["%Y", "%Q"]}, "parameters.format[1]", "invalid date format"),
    ("date", {"format": 5}, "parameters.format", "is not valid"),
    ("number", {"decimal": ";"}, "parameters.decimal", "is not one of"),
    ("boolean", {"true": "yes"}, "parameters.true", "expected a list"),
    ("boolean", {"true": []}, "parameters.true", "must not be an empty list"),
    ("boolean", {"true": ["x"], "false": ["X"]}, "parameters.false", "both true and false"),
    ("default", {}, "parameters.value", "required key 'value'"),
]


@pytest.mark.parametrize(
    ("kind", "params", "where", "reason"),
    BAD_PARAMETERS,
    ids=[f"{k}-{i}" for i, (k, *_rest) in enumerate(BAD_PARAMETERS)],
)
def test_bad_parameters_are_refused_with_path_and_reason(kind, params, where, reason):
    spec: dict[str, Any] = {"type": kind}
    if params is not None:
        spec["parameters"] = params
    with pytest.raises(MappingError) as caught:
        compile_chain([P("trim"), spec], "$.fields[3].processors")
    assert caught.value.where == f"$.fields[3].processors[1].{where}", caught.value.errors
    assert reason in caught.value.reason, caught.value.errors


def test_every_processor_type_has_bad_parameter_cases_and_is_documented():
    assert {kind for kind, *_ in BAD_PARAMETERS} == set(REGISTRY)
    for ptype in REGISTRY.values():
        assert ptype.doc, f"{ptype.name} has no docstring"


def test_unknown_types_and_malformed_processors():
    cases = [
        ([{"type": "xpth", "parameters": {}}], "$.p[0].type", "did you mean 'xpath'"),
        (["xpath"], "$.p[0]", "must be an object"),
        ([{"parameters": {}}], "$.p[0].type", "required"),
        ([{"type": "trim", "params": {}}], "$.p[0].params", "did you mean 'parameters'"),
        ([], "$.p", "non-empty list"),
        ({"type": "trim"}, "$.p", "non-empty list"),
    ]
    for specs, where, reason in cases:
        with pytest.raises(MappingError) as caught:
            compile_chain(specs, "$.p")
        assert caught.value.where == where
        assert reason in caught.value.reason


def test_all_bad_processors_of_a_chain_are_reported_together():
    with pytest.raises(MappingError) as caught:
        compile_chain(
            [P("xpath", expression="//a["), P("trim"), P("regex", pattern="(")],
            "$.fields[0].processors",
        )
    wheres = [where for where, _ in caught.value.problems]
    assert wheres == [
        "$.fields[0].processors[0].parameters.expression",
        "$.fields[0].processors[2].parameters.pattern",
    ]
