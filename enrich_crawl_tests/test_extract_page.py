"""Pages: decoding by the HTML rules, page kinds, broken markup, base URLs."""

from __future__ import annotations

import json

import pytest

from enrich_crawl.extract.page import Page

TITLE = "Café — 東京 ü"


def html(charset: str | None, text: str = TITLE) -> str:
    meta = f'<meta charset="{charset}">' if charset else ""
    return f"<html><head>{meta}<title>{text}</title></head><body><p>{text}</p></body></html>"


CASES = [
    # (what, charset in <meta>, bytes encoding, BOM, Content-Type, expected encoding)
    (
        "BOM beats header and meta",
        "iso-8859-1",
        "utf-8",
        b"\xef\xbb\xbf",
        "text/html; charset=cp1252",
        "utf-8",
    ),
    ("UTF-16 LE BOM", "utf-8", "utf-16-le", b"\xff\xfe", "text/html", "utf-16-le"),
    ("UTF-16 BE BOM, no header", None, "utf-16-be", b"\xfe\xff", None, "utf-16-be"),
    ("header beats meta", "utf-8", "cp1252", b"", "text/html; charset=windows-1252", "cp1252"),
    ("header Shift_JIS", None, "shift_jis", b"", "text/html; charset=Shift_JIS", None),
    ("meta windows-1252", "windows-1252", "cp1252", b"", "text/html", "cp1252"),
    ("meta EUC-JP", "euc-jp", "euc-jp", b"", "text/html", "euc_jp"),
    ("detection: UTF-8", None, "utf-8", b"", "text/html", "utf-8"),
]
SAMPLES = {"cp1252": "Café — ü", "shift_jis": "東京のカフェ", "euc-jp": "東京のカフェ"}


@pytest.mark.parametrize(
    ("meta", "codec", "bom", "content_type", "encoding"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_decoding_order_bom_header_meta_detection(meta, codec, bom, content_type, encoding):
    text = SAMPLES.get(codec, TITLE)
    body = bom + html(meta, text).encode(codec)
    page = Page("https://x.example/", body, content_type=content_type)
    if encoding:
        assert page.encoding.replace("-", "_") == encoding.replace("-", "_")
    assert page.tree.findtext(".//title") == text
    assert page.tree.findtext(".//p") == text
    assert "\ufeff" not in page.text


def test_shift_jis_declared_by_meta_only():
    body = html("Shift_JIS", "日本語のページ").encode("shift_jis")
    page = Page("https://x.example/", body, content_type="text/html")
    assert page.tree.findtext(".//p") == "日本語のページ"


def test_an_explicit_encoding_wins_and_bad_bytes_are_replaced():
    page = Page("https://x.example/", b"<p>caf\xe9 \xff</p>", encoding="utf-8")
    assert page.text == "<p>caf\ufffd \ufffd</p>"


@pytest.mark.parametrize(
    ("body", "content_type", "kind"),
    [
        ('{"a": 1}', "application/json", "json"),
        ('{"a": 1}', "application/vnd.api+json", "json"),
        ('{"@context": "https://schema.org"}', "application/ld+json", "json"),
        ("[1, 2]", None, "json"),
        ('{"a": 1}', "text/plain", "json"),
        ("{not json", "text/plain", "text"),
        ("<html><p>x</p></html>", None, "html"),
        ("<p>x</p>", "text/plain", "html"),
        ('<?xml version="1.0"?><rss><channel/></rss>', "application/rss+xml", "xml"),
        ('<?xml version="1.0"?><urlset/>', None, "xml"),
        ('<?xml version="1.0"?><html><body/></html>', None, "html"),
        ("<html/>", "application/xhtml+xml", "html"),
        ("var x = 1;", "application/javascript", "text"),
    ],
)
def test_page_kinds(body, content_type, kind):
    assert Page("https://x.example/", body, content_type=content_type).kind == kind


def test_json_pages_have_json_and_no_tree():
    page = Page("https://x.example/a.json", json.dumps({"a": [1]}), content_type="application/json")
    assert page.json == {"a": [1]}
    assert page.tree is None
    broken = Page("https://x.example/a.json", '{"a": ', content_type="application/json")
    assert broken.json is None


def test_broken_html_is_recovered_not_truncated():
    deep = "<div>" * 1000 + "<p id='deep'>bottom</p>"
    body = (
        "<html><body><p>one<p>two</b></i><table><td>cell</table>"
        "<span>a\x00b</span>" + deep + "<p>unclosed & bare <x-custom a=1 b>c"
    )
    tree = Page("https://x.example/", body.encode("utf-8"), content_type="text/html").tree
    assert tree.xpath("string(//p[@id='deep'])") == "bottom"  # below libxml2's default depth
    assert tree.xpath("//td/text()") == ["cell"]
    assert tree.xpath("string(//span)") == "a\ufffdb"
    assert "c" in tree.xpath("string(//x-custom)")


def test_empty_and_whitespace_pages_have_no_tree():
    assert Page("https://x.example/", b"", content_type="text/html").tree is None
    assert Page("https://x.example/", b"  \n ", content_type="text/html").tree is None


def test_base_url_from_base_href():
    base = Page(
        "https://x.example/a/b.html",
        '<html><head><base href="../c/"></head><body></body></html>',
        content_type="text/html",
    )
    assert base.base_url == "https://x.example/c/"
    plain = Page("https://x.example/a/b.html", "<p>x</p>", content_type="text/html")
    assert plain.base_url == "https://x.example/a/b.html"


def test_xml_pages_keep_namespaces():
    atom = b'<?xml version="1.0"?><feed xmlns="http://www.w3.org/2005/Atom"><title>T</title></feed>'
    page = Page("https://x.example/feed", atom, content_type="application/atom+xml")
    assert page.tree.tag == "{http://www.w3.org/2005/Atom}feed"
