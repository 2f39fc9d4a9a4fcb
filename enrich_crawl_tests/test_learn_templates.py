"""Site templates by DOM structure: one shop whose product pages and blog posts share one URL
shape gets a mapping per template, each guarded by an element of its own pages; the product pages
of its subdomains (too few on each for a template of their own) join the product template."""

from __future__ import annotations

import json
import random
import re

import pytest

from enrich_crawl.extract.learn import Example, ExamplePage, learn, same_value, write_learned
from enrich_crawl.extract.learn.facts import PageFacts
from enrich_crawl.extract.learn.templates import guarded, skeleton, structure_groups
from enrich_crawl.extract.mapping import MappingSet, run_mapping
from enrich_crawl.extract.page import Page

FIELDS = {"title": "string", "price": "number", "author": "string"}
WORDS = [
    "amber",
    "birch",
    "cedar",
    "delta",
    "ember",
    "fjord",
    "garnet",
    "harbor",
    "indigo",
    "juniper",
    "kestrel",
    "lumen",
]
CHROME_TOP = (
    "<header class='site-header'><a class='logo' href='/'>Cedar &amp; Co</a>"
    "<nav class='menu'><a href='/item/'>Shop</a> <a href='/item/blog'>Blog</a>"
    " <a href='/about'>About</a></nav></header>"
)
CHROME_BOTTOM = (
    "<footer class='site-footer'><p class='legal'>Cedar &amp; Co, 2024</p>"
    "<ul class='links'><li><a href='/contact'>Contact</a></li></ul></footer>"
)


def _product(rng: random.Random, n: int) -> tuple[str, dict]:
    name = f"{rng.choice(WORDS).title()} {rng.choice(WORDS)} lamp {n}"
    price = round(rng.uniform(5, 500), 2)
    rows = "".join(
        f"<tr><th>{label}</th><td>{rng.choice(WORDS)}</td></tr>"
        for label in rng.sample(["Maker", "Colour", "Material", "Origin"], 3)
    )
    body = (
        f"<main><div class='product'><div class='crumbs'><a href='/item/'>Shop</a></div>"
        f"<h1 class='product-name'>{name}</h1><p class='price'>EUR <span class='amount'>"
        f"{price:.2f}</span></p><p class='blurb'>A {rng.choice(WORDS)} lamp.</p>"
        f"<div class='specs'><table>{rows}</table></div>"
        "<button class='add-to-cart'>Add to cart</button></div></main>"
    )
    return body, {"title": name, "price": price, "author": None}


def _post(rng: random.Random, n: int) -> tuple[str, dict]:
    title = f"Why {rng.choice(WORDS)} light matters ({n})"
    author = f"{rng.choice(WORDS).title()} {rng.choice(WORDS).title()}"
    paragraphs = "".join(
        f"<p>{' '.join(rng.choice(WORDS) for _ in range(12))}</p>" for _ in range(rng.randint(2, 5))
    )
    body = (
        "<main><article class='post'><h1 class='blog-name'>The Cedar blog</h1>"
        f"<h2 class='entry-title'>{title}</h2><div class='byline'>By "
        f"<span class='author'>{author}</span></div>"
        f"<div class='entry-content'>{paragraphs}</div>"
        "<aside class='share'><a href='/share'>Share</a></aside></article></main>"
    )
    return body, {"title": title, "price": None, "author": author}


def _page(body: str) -> bytes:
    return (
        f"<!doctype html><html><head><title>Cedar &amp; Co</title></head><body>{CHROME_TOP}"
        f"{body}{CHROME_BOTTOM}</body></html>"
    ).encode()


@pytest.fixture(scope="module")
def shop():
    """(url, page body, truth) of 40 product pages on www, 8 on each of de./fr. and 40 posts,
    all under /item/."""
    rng = random.Random(7)
    pages = []
    for n in range(40):
        body, truth = _product(rng, n)
        pages.append((f"http://www.shop.test/item/{rng.choice(WORDS)}-{n}.html", body, truth))
        body, truth = _post(rng, n)
        pages.append((f"http://www.shop.test/item/{rng.choice(WORDS)}-post-{n}.html", body, truth))
    for sub in ("de", "fr"):
        for n in range(8):
            body, truth = _product(rng, 100 + n)
            pages.append((f"http://{sub}.shop.test/item/{rng.choice(WORDS)}-{n}.html", body, truth))
    return [(url, _page(body), truth) for url, body, truth in pages]


@pytest.fixture(scope="module")
def shop_learned(shop, tmp_path_factory):
    """Learned from every product and post of www but the last 10 of each, and from 3 product
    pages of each of de. and fr."""
    examples, held = [], []
    counts = {"de": 0, "fr": 0}
    for index, (url, body, truth) in enumerate(shop):
        sub = url.split("//")[1].split(".")[0]
        known = {k: v for k, v in truth.items() if v is not None}
        if sub in counts:
            counts[sub] += 1
            chosen = counts[sub] <= 3
        else:
            chosen = index < 60
        if chosen:
            examples.append(Example(f"r{index}", known, [ExamplePage(url, body, "text/html")]))
        else:
            held.append((url, body, truth))
    result = learn(examples, FIELDS, seed=3)
    out = tmp_path_factory.mktemp("learned-shop")
    write_learned(result, out)
    return result, MappingSet.load(out), held


def _fill(mappings: MappingSet, url: str, body: bytes) -> dict:
    """What the crawl would fill from one page: per field, the first value by priority."""
    found: dict = {}
    page = Page(url, body, content_type="text/html")
    for mapping in mappings.matching(url):
        result = run_mapping(mapping, page, field_types=FIELDS, with_links=False)
        for name, value in result.fields.items():
            found.setdefault(name, value)
    return found


def test_one_shop_two_page_types_two_guarded_mappings(shop_learned):
    result, _mappings, _held = shop_learned
    templates = [t for t in result.report["templates"] if not t["generic"]]
    assert len(templates) == 2, templates
    products = next(t for t in templates if len(t["hosts"]) > 1)
    posts = next(t for t in templates if t is not products)
    assert sorted(products["hosts"]) == ["de.shop.test", "fr.shop.test", "www.shop.test"]
    assert posts["hosts"] == ["www.shop.test"]
    assert products["guard"] and posts["guard"] and products["guard"] != posts["guard"]
    by_name = {m["name"]: m for m in result.mappings}
    rules = {
        t["mapping"]: {
            f["name"]: json.dumps(f["processors"]) for f in by_name[t["mapping"]]["fields"]
        }
        for t in (products, posts)
    }
    # each its own rule: the product's name is its h1, the post's title its h2 (its h1 is the
    # blog's name)
    assert "h1" in rules[products["mapping"]]["title"]
    assert (
        "h2" in rules[posts["mapping"]]["title"]
        or "entry-title" in rules[posts["mapping"]]["title"]
    )
    assert "price" in rules[products["mapping"]] and "author" in rules[posts["mapping"]]
    # every rule of a template reads only pages of that template
    for name, fields in rules.items():
        guard = next(t["guard"] for t in templates if t["mapping"] == name)
        assert all(json.dumps(guard)[1:-1] in rule for rule in fields.values()), fields
    # the product template holds on the subdomains' pages: one pattern for the domain
    pattern = by_name[products["mapping"]]["url_patterns"][0]["pattern"]
    for url in ("http://fr.shop.test/item/x-1.html", "http://www.shop.test/item/y.html"):
        assert re.search(pattern, url)


def test_each_template_fills_its_own_pages_and_nothing_else(shop_learned):
    _result, mappings, held = shop_learned
    cells = right = filled = 0
    for url, body, truth in held:
        found = _fill(mappings, url, body)
        for name, value in found.items():
            filled += 1
            right += same_value(value, truth[name], FIELDS[name])
        cells += sum(1 for v in truth.values() if v is not None)
        assert found.get("title") == truth["title"], (url, found)
        assert ("price" in found) == (truth["price"] is not None), (url, found)
    assert right == filled  # no value where the page's template has none, no wrong one
    assert right >= 0.95 * cells


def test_structure_groups_keep_one_template_whose_pages_vary(shop):
    """Posts of 2 to 5 paragraphs, product pages with other spec rows: one group each."""
    facts = [PageFacts(ExamplePage(url, body, "text/html")) for url, body, _t in shop]
    skeletons = [skeleton(f) for f in facts]
    groups = structure_groups(skeletons, 4)
    kinds = [{"post" in shop[i][0] for i in group} for group in groups]
    assert len(groups) == 2 and all(len(k) == 1 for k in kinds)


def test_a_guard_goes_where_the_rule_starts():
    guard = "/html[.//div[contains(concat(' ', normalize-space(@class), ' '), ' product ')]]"
    assert guarded("//h1", guard) == guard + "//h1"
    assert guarded("/html[body[@id='p']]//h1", guard) == guard + "[body[@id='p']]//h1"
    assert guarded("id($fragment)/h2", guard) == f"id($fragment)[{guard}]/h2"
    assert guarded("boolean(//div[@class='sold-out'])", guard) is None
