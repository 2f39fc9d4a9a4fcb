"""Pages that declare no charset: detection on short pages mistakes windows-1252 for its
single-byte cousins (cp1250, cp1257); windows-1252, the WHATWG default, is preferred unless the
text reads as Central European, so Western pages decode right and Czech or Polish ones still do."""

from __future__ import annotations

import pytest

from enrich_crawl.extract.page import Page

WESTERN = [
    ("de", "<html><body><p>Preis: 12 € – Größe für Müller’s Café</p></body></html>"),
    ("fr", "<html><body><p>L’été à Noël : 5 € pour le café crème</p></body></html>"),
    ("de_quotes", "<p>Über uns: Qualität für Zürich – „schön“</p>"),
    ("es", "<p>El niño comió piñata en España – año 2024, ¿qué tal?</p>"),
    ("it", "<p>Perché più caffè? Città: Roma, è così</p>"),
    ("da", "<p>Blåbærgrød og rødgrød med fløde – København</p>"),
    ("pt", "<p>Informações e ações em São Paulo: não há exceção</p>"),
    ("de_skoda", "<p>Der neue Škoda Octavia: Preis 25.000 € – für Familien</p>"),
]
CENTRAL = [
    (
        "cz_page",
        "<html><head><title>Příliš žluťoučký kůň</title></head><body><p>Příliš žluťoučký kůň "
        "úpěl ďábelské ódy. Česká republika je stát ve střední Evropě. Hlavní město je Praha, "
        "které leží na řece Vltavě.</p></body></html>",
    ),
    ("cz_short", "<p>Čeština: řeka, město, kůň, přijďte</p>"),
    ("pl", "<p>Zażółć gęślą jaźń – Łódź, Kraków i Gdańsk są pięknymi miastami w Polsce.</p>"),
]


@pytest.mark.parametrize(("what", "text"), WESTERN, ids=[w for w, _ in WESTERN])
def test_undeclared_western_page_in_cp1252_decodes_as_cp1252(what, text):
    page = Page("http://x.test/", text.encode("cp1252"), content_type="text/html")
    assert page.encoding == "cp1252", what
    assert page.text == text


@pytest.mark.parametrize(("what", "text"), CENTRAL, ids=[w for w, _ in CENTRAL])
def test_undeclared_central_european_page_in_cp1250_still_decodes_right(what, text):
    page = Page("http://x.test/", text.encode("cp1250"), content_type="text/html")
    assert page.encoding == "cp1250", what
    assert page.text == text


@pytest.mark.parametrize(
    ("codec", "text"),
    [
        ("cp1251", "<p>Привет, мир! Это пример текста на русском языке для проверки.</p>"),
        ("cp1253", "<p>Καλημέρα κόσμε, αυτό είναι ένα ελληνικό κείμενο.</p>"),
    ],
)
def test_other_scripts_keep_their_detected_encoding(codec, text):
    page = Page("http://x.test/", text.encode(codec), content_type="text/html")
    assert page.text == text


def test_a_declared_charset_still_wins_over_the_preference():
    text = "<p>Čeština: řeka, město</p>"
    page = Page("http://x.test/", text.encode("cp1250"), content_type="text/html; charset=cp1250")
    assert page.text == text
    text = "<p>Łódź, Gdańsk</p>"
    page = Page(
        "http://x.test/", text.encode("iso-8859-2"), content_type="text/html; charset=iso-8859-2"
    )
    assert page.text == text
