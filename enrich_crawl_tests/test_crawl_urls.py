"""URL normalisation, page identity and the URL policy (deny lists, internal addresses)."""

from __future__ import annotations

import pytest

from enrich_crawl.config import CrawlConfig
from enrich_crawl.crawl.policy import HUGE_SITES_FILE, UrlPolicy, domain_in, read_domain_list
from enrich_crawl.urls import normalise_url, page_key, private_ip, resolve_link, split_url_cell


@pytest.mark.parametrize(
    "raw, url",
    [
        # the query keeps its order in the URL fetched (only the page key sorts it)
        ("HTTP://Example.COM:80/a/../b/?b=2&a=1#frag", "http://example.com/b/?b=2&a=1#frag"),
        ("https://x.example:443/a/./b/", "https://x.example/a/b/"),
        ("x.example:8080/p", "http://x.example:8080/p"),
        ("//x.example/p", "http://x.example/p"),
        ("http://café.example/ü?q=é", "http://xn--caf-dma.example/%C3%BC?q=%C3%A9"),
        ("http://2130706433/", "http://127.0.0.1/"),  # legacy IPv4 spellings, made explicit
        ("http://0x7f.1/", "http://127.0.0.1/"),
        ("http://[::1]:8080/", "http://[::1]:8080/"),
        ("http://a.example/#org-caf%C3%A9", "http://a.example/#org-caf%C3%A9"),
        # what the hand-written normaliser got wrong (issue #23), as a browser parses it
        ("http://example.com/foo/bar//..", "http://example.com/foo/bar/"),  # not /foo/
        ("http://host.example/?'", "http://host.example/?%27"),  # a trailing quote is kept
        ('http://host.example/a"', "http://host.example/a%22"),
        ("http://a.example/a//b/./c", "http://a.example/a//b/c"),  # `//` is kept
        ("http:\\\\www.example.com\\a\\b", "http://www.example.com/a/b"),  # backslashes
        ("http://@www.example.com", "http://www.example.com/"),  # empty userinfo
        ("https:/example.com/", "https://example.com/"),
        ("http:example.com/x", "http://example.com/x"),
        ("http:///x.example", "http://x.example/"),
        ("http://%30%78%63%30%2e%30%32%35%30.01", "http://192.168.0.1/"),  # encoded host
        ("http://EXAMPLE.com/%7e?x=%7e", "http://example.com/%7e?x=%7e"),
        ("<http://a.example/x>", "http://a.example/x"),  # a cell quoted as a whole
        ("  http://a.example/x\t\n ", "http://a.example/x"),
    ],
)
def test_normalise(raw, url):
    assert normalise_url(raw) == (url, None)


@pytest.mark.parametrize(
    "raw, reason",
    [
        ("javascript:void(0)", "unsupported scheme javascript:"),
        ("mailto:a@b.example", "unsupported scheme mailto:"),
        ("file:///etc/passwd", "unsupported scheme file:"),
        ("ftp://x.example/", "unsupported scheme ftp:"),
        ("http://999.1.1.1/", "bad IP address"),
        ("http://user:pw@x.example/", "credentials"),
        ("http://", "no host"),
        ("http://[::%31]/", "bad IPv6 address"),  # a zone id: every browser refuses it
        ("http://[::1]x/", "invalid_url"),
        ("http://a.example:8x/", "bad port"),
        ("http://a..example/", "unresolvable host"),  # valid URL, no DNS name
        ("http://a!b.example/", "unresolvable host"),
        ("http://" + "a" * 64 + ".example/", "unresolvable host"),
        ("http://:pw@x.example/", "credentials"),
        ("http://exa mple.com/", "bad host"),
        ("http://x.example:99999/", "invalid_url"),
        ("htp//broken", "invalid_url"),
        ("", "empty"),
    ],
)
def test_invalid(raw, reason):
    url, why = normalise_url(raw)
    assert url is None and why.startswith("invalid_url") and reason in why


def test_a_single_label_host_is_refused_not_looked_up_unless_intranet_names_are_allowed(
    monkeypatch,
):
    """`http://exa mple.com/page` split on its space gives `http://exa/`: no public web site has
    a single-label host, so it is `invalid_url` (a reason, no DNS look-up), as a cell and as a
    link; an intranet crawl (ENRICH_ALLOW_PRIVATE=1) may use such names."""
    monkeypatch.delenv("ENRICH_ALLOW_PRIVATE", raising=False)
    tokens = split_url_cell("http://exa mple.com/page")
    assert tokens == ["http://exa", "mple.com/page"]
    url, why = normalise_url(tokens[0])
    assert url is None and why.startswith("invalid_url: single-label host 'exa'")
    assert normalise_url(tokens[1]) == ("http://mple.com/page", None)
    for cell in ("HTTP://Wiki./x", "//intranet:8080/", "exa"):
        assert normalise_url(cell)[0] is None, cell
    assert "not a URL" in normalise_url("exa")[1]  # no scheme: never taken for a host
    url, why = resolve_link("http://a.example/", "http://wiki/page")
    assert url is None and "single-label host 'wiki'" in why
    # IP literals and localhost (refused as private_address when resolved) are not names to judge
    assert normalise_url("http://10.1.2.3/") == ("http://10.1.2.3/", None)
    assert normalise_url("http://2130706433/") == ("http://127.0.0.1/", None)
    assert normalise_url("http://[::1]/") == ("http://[::1]/", None)
    assert normalise_url("http://localhost:8080/") == ("http://localhost:8080/", None)

    monkeypatch.setenv("ENRICH_ALLOW_PRIVATE", "1")
    assert normalise_url("http://exa/") == ("http://exa/", None)
    assert resolve_link("http://a.example/", "http://wiki/page") == ("http://wiki/page", None)
    assert normalise_url("http://a..example/")[0] is None  # the other policies still hold


def test_page_key_drops_fragment_and_tracking_parameters():
    assert page_key("http://a.example/x?utm_source=n&id=3&gclid=9#f") == "http://a.example/x?id=3"
    assert page_key("http://a.example/x?id=3") == "http://a.example/x?id=3"
    assert page_key("http://a.example/x#f") == "http://a.example/x"


def test_page_key_is_canonical_but_the_url_fetched_is_not():
    """One key for two spellings of a page (query order, escapes); the URL fetched unchanged."""
    first, _ = normalise_url("http://a.example/p?b=2&a=1")
    second, _ = normalise_url("http://A.example:80/p?a=1&b=2#top")
    assert first == "http://a.example/p?b=2&a=1"
    assert page_key(first) == page_key(second) == "http://a.example/p?a=1&b=2"
    assert page_key("http://a.example/%7e?q=%7e") == page_key("http://a.example/~?q=~")
    assert page_key("http://a.example/x?") == "http://a.example/x"
    # dot segments are resolved once, by the parser, and `//` stays: two resources, two keys
    assert page_key(normalise_url("http://a.example/a//b/./c")[0]) != page_key(
        normalise_url("http://a.example/a/b/c")[0]
    )


@pytest.mark.parametrize(
    "base, href, url",
    [
        ("http://a.example/d/p.html", "q.html", "http://a.example/d/q.html"),
        ("http://a.example/d/p.html", "\\x", "http://a.example/x"),  # `\` is `/` in http
        ("http://a.example/d/p.html", "///test.example", "http://test.example/"),
        ("http://a.example/d/p.html", "../../../x?b=1&a=2", "http://a.example/x?b=1&a=2"),
        ("http://a.example/d/p.html", " \tq.html\n", "http://a.example/d/q.html"),
        ("http://a.example/d/p.html", "#sec", "http://a.example/d/p.html#sec"),
        ("https://a.example/", "//cdn.example/x", "https://cdn.example/x"),
    ],
)
def test_links_resolve_as_a_browser_resolves_them(base, href, url):
    assert resolve_link(base, href) == (url, None)


@pytest.mark.parametrize(
    "href, reason",
    [
        ("javascript:void(0)", "unsupported scheme javascript:"),
        ("mailto:a@b.example", "unsupported scheme mailto:"),
        ("http://u:p@x.example/", "credentials"),
        ("http://[::%31]/", "bad IPv6 address"),
    ],
)
def test_links_refused_with_a_reason(href, reason):
    url, why = resolve_link("http://a.example/", href)
    assert url is None and reason in why


@pytest.mark.parametrize(
    "host, private",
    [
        ("127.0.0.1", True),
        ("10.1.2.3", True),
        ("192.168.0.1", True),
        ("172.16.5.4", True),
        ("169.254.169.254", True),
        ("0.0.0.0", True),
        ("[::1]", True),
        ("fe80::1", True),
        ("::ffff:10.0.0.1", True),
        ("2130706433", True),
        ("0177.0.0.1", True),
        ("8.8.8.8", False),
        ("example.com", False),
        ("localhost", False),  # a name: refused when it resolves (enrich_crawl.crawl.dns_resolver)
    ],
)
def test_private_ip(host, private):
    assert private_ip(host) is private


def test_policy_refusals():
    config = CrawlConfig.from_mapping(
        {
            "allowed_domains": ["ok.example", "youtube.com"],
            "deny": [r"/logout"],
            "deny_domains": ["blocked.ok.example"],
        }
    )
    claimed = {"https://www.youtube.com/channel/acme"}
    policy = UrlPolicy(config, allow_private=False, claimed=lambda url: url in claimed)
    assert policy.check("http://ok.example/page") is None
    assert policy.check("http://www.ok.example/page") is None  # subdomain of an allowed domain
    assert policy.check("http://ok.example/logout")[0] == "denied"
    assert policy.check("http://ok.example/file.PDF")[0] == "denied"
    assert policy.check("http://ok.example/photo.jpeg?x=1")[0] == "denied"
    assert policy.check("http://other.example/")[0] == "denied"  # outside allowed_domains
    assert policy.check("http://blocked.ok.example/")[0] == "denied"
    # a huge site is refused unless a mapping claims the URL
    assert policy.check("https://www.youtube.com/watch?v=1")[0] == "denied"
    assert policy.check("https://www.youtube.com/channel/acme") is None
    assert policy.check("http://10.0.0.1/")[0] == "private_address"
    assert policy.check("http://10.0.0.1/robots.txt", robots_fetch=True)[0] == "private_address"
    assert UrlPolicy(config, allow_private=True).check("http://10.0.0.1/")[0] == "denied"


def test_huge_sites_list_is_shipped_and_switchable(tmp_path):
    sites = read_domain_list(HUGE_SITES_FILE)
    assert len(sites) >= 150 and {"facebook.com", "youtube.com", "linkedin.com"} <= sites
    assert domain_in("m.facebook.com", sites) and not domain_in("notfacebook.com", sites)
    assert (
        UrlPolicy(CrawlConfig(huge_sites=False), allow_private=False).check(
            "https://facebook.com/x"
        )
        is None
    )
    custom = tmp_path / "sites.txt"
    custom.write_text("# mine\nexample.net\n", encoding="utf-8")
    policy = UrlPolicy(CrawlConfig(huge_sites_file=str(custom)), allow_private=False)
    assert policy.check("http://www.example.net/")[0] == "denied"
    assert policy.check("https://facebook.com/x") is None


def test_crawl_config_errors_name_the_key():
    with pytest.raises(ValueError, match=r"crawl\.deny: invalid regex"):
        CrawlConfig.from_mapping({"deny": ["("]})
    with pytest.raises(ValueError, match=r"crawl\.strategy"):
        CrawlConfig.from_mapping({"strategy": "random"})
    with pytest.raises(ValueError, match=r"crawl\.default_delay"):
        CrawlConfig.from_mapping({"default_delay": -1})
    with pytest.raises(ValueError, match=r"crawl\.huge_sites_file"):
        CrawlConfig.from_mapping({"huge_sites_file": "/nonexistent/list.txt"})


@pytest.mark.parametrize(
    "cell, tokens",
    [
        ("http://a.example/0,8599,2011497,00.html", ["http://a.example/0,8599,2011497,00.html"]),
        ("http://a.example/x,https://b.example/y", ["http://a.example/x", "https://b.example/y"]),
        ("a.example/x;  www.b.example", ["a.example/x", "www.b.example"]),
        ("a.example/x,\tb.example/y\n", ["a.example/x", "b.example/y"]),
        (
            ["a.example/x,www.b.example", None, "c.example"],
            ["a.example/x", "www.b.example", "c.example"],
        ),
        (None, []),
        (" ; ", []),
    ],
)
def test_split_url_cell(cell, tokens):
    assert split_url_cell(cell) == tokens
