"""The web's edge cases, each against the virtual web, in one crawl of one partition: every record
gets its value or a clear reason naming its URL, and no bad host stops the others."""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path

import pytest

from enrich_crawl.testing.synthweb import read_candidates, read_outcomes, run_workers, write_dataset
from enrich_crawl.virtualweb import requests_by_host, running_web

UA = "enrich_crawl/0.1 (+https://example.org/edge-test-bot.html)"
MAPPING = {
    "name": "edge",
    "url_patterns": [{"type": "regex", "pattern": r"^https?://e-[a-z0-9-]+\.test/"}],
    "url_parsers": [
        {
            "description": "links to follow",
            "processors": [
                {"type": "xpath", "parameters": {"expression": "//a[@class='follow']/@href"}}
            ],
        }
    ],
    "fields": [
        {
            "name": "value",
            "processors": [
                {"type": "xpath", "parameters": {"expression": "//span[@id='v']/text()"}},
                {"type": "trim", "parameters": {}},
            ],
        }
    ],
}


def _page(value: str, extra: str = "", charset_meta: str = "") -> str:
    return (
        f"<html><head>{charset_meta}<title>t</title></head><body><p>x</p>"
        f"<span id='v'>{value}</span>{extra}</body></html>"
    )


def _host(root: Path, host: str, files: dict[str, bytes | str], config: dict | None = None):
    folder = root / host
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "robots.txt").write_text("User-agent: *\nAllow: /\n", encoding="utf-8")
    for name, data in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, str):
            data = data.encode("utf-8")
        path.write_bytes(data)
    if config is not None:
        (folder / "_web.json").write_text(json.dumps(config), encoding="utf-8")


def build_edge_web(root: Path) -> list[dict[str, str]]:
    ok = {"index.html": _page("ok")}
    _host(root, "e-ok.test", ok)
    _host(root, "e-slow.test", {"index.html": _page("slow" + " " * 6000)}, {"slow": {"^/$": 400}})
    _host(root, "e-hang.test", ok, {"hang": ["^/$"]})
    _host(root, "e-500.test", ok, {"status": {"^/$": 500}})
    _host(root, "e-999.test", ok, {"status": {"^/$": 999}})
    _host(root, "e-flaky.test", {"index.html": _page("flaky")}, {"fail_first": {"^/$": 2}})
    _host(root, "e-429.test", ok, {"status": {"^/$": 429}, "headers": {"Retry-After": "1"}})
    _host(root, "e-loop.test", ok, {"redirects": {"^/start$": "/welcome", "^/welcome$": "/start"}})
    # `Location: \\e-ok.test/` names another host for a browser (`\` is `/` in http URLs);
    # `urljoin` made it a path of this host (the virtual web expands `\\` to `\`)
    _host(root, "e-redir.test", ok, {"redirects": {"^/go$": "\\\\\\\\e-ok.test/"}})
    # a page answered differently when its query is reordered: fetched as written, not sorted
    _host(
        root,
        "e-query.test",
        {
            "p.html": _page("reordered"),
            "p.html?b=2&a=1": _page("as written"),
            "start.html": "<html><body><a class='follow' href='q.html?y=1&amp;x=2'>q</a>",
            "q.html": _page("reordered"),
            "q.html?y=1&x=2": _page("link as written"),
        },
    )
    _host(root, "e-huge.test", ok, {"huge": {"^/$": 50_000_000}})
    _host(root, "e-bomb.test", ok, {"bomb": {"^/$": 1_000_000_000}})
    _host(
        root,
        "e-bin.test",
        ok,
        {"huge": {"^/photo$": 5_000_000}, "content_type": {"/photo": "image/png"}},
    )
    # charsets: cp1252 with no declaration anywhere; Shift-JIS declared only in <meta>; gb18030
    # under the label gb2312 in the header; UTF-16 with a BOM under a wrong header charset
    prose = (
        "<p>Die Rösterei in Zürich röstet täglich frische Bohnen für unsere Gäste. Wir sind ein "
        "kleines Café – seit 1952 „familiengeführt“ und stolz darauf. Öffnungszeiten: Montag bis "
        "Freitag. Über uns: Qualität, Geschmack und Nachhaltigkeit.</p>"
    )
    _host(
        root,
        "e-cp1252.test",
        {"index.html": _page("Zürich café – “quoted”", prose).encode("cp1252")},
        {"content_type": {"*": "text/html"}},
    )
    _host(
        root,
        "e-sjis.test",
        {
            "index.html": _page("東京の会社", charset_meta='<meta charset="shift_jis">').encode(
                "shift_jis"
            )
        },
        {"content_type": {"*": "text/html"}},
    )
    _host(
        root,
        "e-gb.test",
        {"index.html": _page("北京公司").encode("gb18030")},
        {"content_type": {"*": "text/html; charset=gb2312"}},
    )
    _host(
        root,
        "e-utf16.test",
        {"index.html": _page("Köln").encode("utf-16")},
        {"content_type": {"*": "text/html; charset=iso-8859-1"}},
    )
    _host(
        root,
        "e-wrongcs.test",
        {"index.html": _page("Zürich").encode("cp1252")},
        {"content_type": {"*": "text/html; charset=utf-8"}},
    )
    broken = (
        "<html><body><div><p>unclosed <b>bold <span id='v'>broken ok</span>"
        "<table><tr><td>cell</div></i></html></html><<>>&&&"
    )
    _host(root, "e-broken.test", {"index.html": broken})
    json_type = {"content_type": {"*": "application/json"}}
    _host(root, "e-json.test", {"index.html": '{"v": "json"}'}, json_type)
    _host(
        root,
        "e-xml.test",
        {"index.html": "<?xml version='1.0'?><root><span id='v'>xml ok</span></root>"},
        {"content_type": {"*": "application/xml"}},
    )
    links = "".join(
        f"<a class='follow' href='{href}'>x</a>"
        for href in (
            "javascript:void(0)",
            "mailto:someone@example.org",
            "file:///etc/passwd",
            "http://10.0.0.5/admin",
            "/brochure.pdf",
            "http://www.facebook.com/acme",
            "/about.html",
        )
    )
    _host(root, "e-links.test", {"index.html": _page("", links), "about.html": _page("linked")})
    (root / "_web.json").write_text(
        json.dumps({"hosts": {"e-down.test": {"unreachable": True}}}), encoding="utf-8"
    )
    rows = {
        "ok": "http://e-ok.test/",
        "missing": "http://e-ok.test/missing",
        "slow": "http://e-slow.test/",
        "hang": "http://e-hang.test/",
        "dns": "http://e-nohost.test/",
        "down": "http://e-down.test/",
        "s500": "http://e-500.test/",
        "s999": "http://e-999.test/",
        "flaky": "http://e-flaky.test/",
        "s429": "http://e-429.test/",
        "loop": "http://e-loop.test/start",
        "query": "http://e-query.test/p.html?b=2&a=1",
        "redirect": "http://e-redir.test/go",
        "query_link": "http://e-query.test/start.html",
        "huge": "http://e-huge.test/",
        "bomb": "http://e-bomb.test/",
        "binary": "http://e-bin.test/photo",
        "cp1252": "http://e-cp1252.test/",
        "sjis": "http://e-sjis.test/",
        "gb": "http://e-gb.test/",
        "utf16": "http://e-utf16.test/",
        "wrongcs": "http://e-wrongcs.test/",
        "broken": "http://e-broken.test/",
        "json": "http://e-json.test/",
        "xml": "http://e-xml.test/",
        "links": "http://e-links.test/",
        "loopback": "http://127.0.0.1/",
        "decimal_ip": "http://2130706433/",
        "metadata": "http://169.254.169.254/latest/meta-data/",
        "private_v6": "http://[::1]:8080/",
        "js": "javascript:alert(1)",
        "mail": "mailto:info@example.org",
        "file": "file:///etc/passwd",
        "pdf": "http://e-ok.test/report.pdf",
        "huge_site": "https://www.youtube.com/watch?v=x",
    }
    return [{"id": rid, "url": url} for rid, url in rows.items()]


@pytest.fixture(scope="module")
def edge_crawl(tmp_path_factory, mongo_server):
    base = tmp_path_factory.mktemp("edge")
    rows = build_edge_web(base / "web")
    crawl = {
        "depth": 1,
        "default_delay": 0.1,
        "download_timeout": 1.5,
        "retries": 2,
        "retry_backoff": 0.3,
        "retry_backoff_max": 5.0,
    }
    dataset, mappings = write_dataset(
        base, rows, fields={"value": {}}, mappings={"edge": MAPPING}, crawl=crawl
    )
    with running_web(base / "web", log_path=base / "requests.jsonl") as server:
        run = run_workers(
            dataset,
            mappings,
            base / "work",
            proxy=server.proxy_url,
            shards=1,
            mongo_uri=mongo_server.uri,
            mongo_db=f"edge_{int(time.time() * 1000)}",
            user_agent=UA,
        )
        log = server.read_log()
    assert run.returncodes == {"s00": 0}, run.logs
    outcomes = read_outcomes(base / "work")
    values = {rid: f.get("value") for rid, f in read_candidates(base / "work").items()}
    return run, outcomes, values, requests_by_host(log), log


def _reasons(outcomes, rid):
    return sorted({e["reason"] for e in outcomes[rid]["errors"]})


def test_every_record_has_an_outcome_and_the_crawl_finished(edge_crawl):
    run, outcomes, *_ = edge_crawl
    assert run.stats["s00"]["finish_reason"] == "finished"
    # the loader rejects no row here; unusable URLs are per-record reasons
    assert len(outcomes) == 35


@pytest.mark.parametrize(
    "rid, reason",
    [
        ("missing", "http_404"),
        ("slow", "timeout"),
        ("hang", "timeout"),
        ("dns", "dns"),
        ("down", "connection"),
        ("s500", "http_500"),
        ("s999", "http_999"),
        ("s429", "http_429"),
        ("loop", "redirect_loop"),
        ("huge", "too_large"),
        ("bomb", "too_large"),
        ("binary", "not_text"),
        ("loopback", "private_address"),
        ("decimal_ip", "private_address"),
        ("metadata", "private_address"),
        ("private_v6", "private_address"),
        ("js", "invalid_url"),
        ("mail", "invalid_url"),
        ("file", "invalid_url"),
        ("pdf", "denied"),
        ("huge_site", "denied"),
        ("json", "not_on_page"),
    ],
)
def test_failures_are_recorded_with_their_reason_and_url(edge_crawl, rid, reason):
    _run, outcomes, values, *_ = edge_crawl
    assert reason in _reasons(outcomes, rid), outcomes[rid]
    assert outcomes[rid]["outcome"] == "unresolved"
    assert values.get(rid) is None
    assert all(e.get("url") for e in outcomes[rid]["errors"])


@pytest.mark.parametrize(
    "rid, value",
    [
        ("ok", "ok"),
        ("flaky", "flaky"),  # two 503s, then the page: transient errors are retried
        ("cp1252", "Zürich café – “quoted”"),
        ("sjis", "東京の会社"),
        ("gb", "北京公司"),
        ("utf16", "Köln"),
        ("broken", "broken ok"),
        ("xml", "xml ok"),
        ("links", "linked"),
        ("query", "as written"),  # the query order of the URL fetched is the URL's own
        ("query_link", "link as written"),
        ("redirect", "ok"),  # the redirect followed as a browser follows it
    ],
)
def test_values_come_out_right(edge_crawl, rid, value):
    _run, outcomes, values, *_ = edge_crawl
    assert values.get(rid) == value, outcomes[rid]
    assert outcomes[rid]["outcome"] == "resolved"


def test_a_wrong_charset_declaration_does_not_break_the_page(edge_crawl):
    _run, outcomes, values, *_ = edge_crawl
    assert outcomes["wrongcs"]["outcome"] == "resolved"
    assert values["wrongcs"].startswith("Z") and values["wrongcs"].endswith("rich")


def test_retries_only_for_transient_errors_with_exponential_backoff(edge_crawl):
    _run, _outcomes, _values, by_host, _log = edge_crawl
    pages = {h: [e for e in v if e["path"] != "/robots.txt"] for h, v in by_host.items()}
    # 500: the request and two retries, each after a longer wait (0.3 s, then 0.6 s)
    times = [e["t"] for e in pages["e-500.test"]]
    assert len(times) == 3
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert gaps[0] >= 0.3 and gaps[1] >= 0.6 and gaps[1] > gaps[0]
    # 429 with Retry-After: 1 is honoured
    times = [e["t"] for e in pages["e-429.test"]]
    assert len(times) == 3 and all(b - a >= 1.0 for a, b in itertools.pairwise(times))
    assert len(pages["e-flaky.test"]) == 3
    # never retried: a non-standard code, a 404, a binary body, a redirect loop (stopped when it
    # comes back to its own chain, not after REDIRECT_MAX_TIMES hops)
    assert len(pages["e-999.test"]) == 1
    assert [e["path"] for e in pages["e-ok.test"]].count("/missing") == 1
    assert len(pages["e-bin.test"]) == 1
    assert [e["path"] for e in pages["e-loop.test"]] == ["/start", "/welcome"]
    # unknown hosts are not retried either (the proxy says "no such host")
    assert len(by_host.get("e-nohost.test", [])) == 1  # robots.txt only


def test_refused_urls_never_reach_the_network(edge_crawl):
    _run, _outcomes, _values, by_host, log = edge_crawl
    hosts = set(by_host)
    for refused in ("127.0.0.1", "2130706433", "169.254.169.254", "::1", "10.0.0.5"):
        assert refused not in hosts
    assert not any("youtube" in h or "facebook" in h for h in hosts)
    assert not any(e["path"].endswith(".pdf") for e in log)
    # every request carried the crawler's identity
    assert {e["ua"] for e in log if e.get("method") == "GET"} == {UA}


def test_links_to_refused_urls_are_reported_on_the_record(edge_crawl):
    _run, outcomes, *_ = edge_crawl
    errors = {e["url"]: e["reason"] for e in outcomes["links"]["errors"]}
    assert errors.get("http://10.0.0.5/admin") == "private_address"
    assert errors.get("http://e-links.test/brochure.pdf") == "denied"
    assert errors.get("http://www.facebook.com/acme") == "denied"


def test_big_bodies_are_cut_and_memory_stays_bounded(edge_crawl):
    run, _outcomes, _values, by_host, _log = edge_crawl
    stats = run.stats["s00"]
    # a 50 MB page, a gzip bomb inflating to 1 GB and a 5 MB image: none was held in memory
    assert stats["peak_rss_mb"] < 400
    assert stats["allocator"] == "jemalloc"  # the worker re-executed itself with it (allocator.py)
    assert stats["bytes"] < 12 * 1024 * 1024
    assert stats["errors_by_kind"]["too_large"] == 2
    assert stats["errors_by_kind"]["not_text"] == 1
    # the image download stopped at its headers
    photo = [e for e in by_host["e-bin.test"] if e["path"] == "/photo"]
    assert photo and photo[0]["bytes"] < 5_000_000


def test_statistics_count_status_codes_errors_and_retries(edge_crawl):
    run, *_ = edge_crawl
    stats = run.stats["s00"]
    assert stats["status_codes"]["200"] > 0
    assert stats["status_codes"]["500"] == 3 and stats["status_codes"]["999"] == 1
    assert stats["retries"] >= 6  # 500 x2, 429 x2, flaky x2, timeouts
    assert stats["refused"]["private_address"] >= 4
    assert stats["refused"]["denied"] >= 2
    assert stats["outcomes"]["resolved"] == 13
