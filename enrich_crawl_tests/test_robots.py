"""robots.txt per RFC 9309: the rules (unit), and what the crawler does with them against the
virtual web: error statuses, huge/HTML/redirected files, product-token groups, wildcards,
Crawl-delay, and the cache across runs."""

from __future__ import annotations

import itertools
import json
import time

import pytest

from enrich_crawl.crawl.robots import MAX_ROBOTS_BYTES, RobotsRules, product_token
from enrich_crawl.testing.synthweb import read_candidates, read_outcomes, run_workers, write_dataset
from enrich_crawl.virtualweb import requests_by_host, running_web

UA = "enrich_crawl/0.1 (+https://example.org/bot.html)"


GROUPS = "User-agent: enrich_crawl\nDisallow: /us/\n\nUser-agent: *\nDisallow: /\n"


def rules(text: str | bytes, status: int = 200) -> RobotsRules:
    body = text.encode("utf-8") if isinstance(text, str) else text
    return RobotsRules.from_response("http://h.test", status, body)


@pytest.mark.parametrize(
    "text, url, allowed",
    [
        # longest match wins; Allow wins a tie
        ("User-agent: *\nDisallow: /a/\nAllow: /a/b.html\n", "http://h.test/a/b.html", True),
        ("User-agent: *\nDisallow: /a/\nAllow: /a/b.html\n", "http://h.test/a/c.html", False),
        ("User-agent: *\nDisallow: /x\nAllow: /x\n", "http://h.test/x", True),
        # wildcards and end anchors
        ("User-agent: *\nDisallow: /*.php$\n", "http://h.test/index.php", False),
        ("User-agent: *\nDisallow: /*.php$\n", "http://h.test/index.php?x=1", True),
        ("User-agent: *\nDisallow: /private*/\n", "http://h.test/private-area/x", False),
        # our product token's group, whatever its case, beats the * group
        (GROUPS.replace("enrich_crawl", "ENRICH_crawl"), "http://h.test/page", True),
        (GROUPS, "http://h.test/us/x", False),
        # a group for another crawler does not apply
        ("User-agent: otherbot\nDisallow: /\n", "http://h.test/page", True),
        # a UTF-8 BOM does not hide the first line
        ("\ufeffUser-agent: *\nDisallow: /x\n", "http://h.test/x", False),
        # percent-encoding is compared in one form
        ("User-agent: *\nDisallow: /%E4%B8%AD\n", "http://h.test/中", False),
        # /robots.txt itself is always allowed
        ("User-agent: *\nDisallow: /\n", "http://h.test/robots.txt", True),
        # garbage and an HTML page (a soft 404) have no rules
        ("<html><body>Disallow: /\nNot found</body></html>", "http://h.test/x", True),
        ("\x00\x01binary\xff junk\nDisallow: /\n", "http://h.test/x", True),
    ],
)
def test_rules(text, url, allowed):
    assert rules(text).allowed(url, UA) is allowed


@pytest.mark.parametrize(
    "between",
    [
        "Noindex: /x",
        "Crawl-delay: 5",
        "Sitemap: http://h.test/s.xml",
        "Unknown-thing: y",
        "junk",
        "",
    ],
)
def test_lines_between_user_agents_do_not_end_the_group(between):
    """The politeness bug of issue #23: a line that is not a rule between two `User-agent` lines
    ended the group, so the crawler believed it was allowed everywhere (RFC 9309 2.2.4)."""
    text = f"User-agent: enrich_crawl\n{between}\nUser-agent: *\nDisallow: /\n"
    verdict = rules(text)
    assert not verdict.allowed("http://h.test/page", UA)
    assert not verdict.allowed("http://h.test/page", "otherbot/1.0")


@pytest.mark.parametrize(
    "agent_line, ours",
    [
        ("User-agent: enrich", False),  # another robot's token, not a prefix of ours
        ("User-agent: enrich_crawler", False),
        ("User-agent: crawl", False),
        ("User-agent: ENRICH_CRAWL", True),
        ("User-agent: enrich_crawl/2.0", True),  # the token ends at the version
        ("User-agent: enrich_crawl extra words", True),
    ],
)
def test_the_product_token_matches_whole_tokens_only(agent_line, ours):
    text = f"{agent_line}\nDisallow: /mine/\n\nUser-agent: *\nDisallow: /all/\n"
    verdict = rules(text)
    assert verdict.allowed("http://h.test/mine/x", UA) is not ours
    assert verdict.allowed("http://h.test/all/x", UA) is ours


def test_crawl_delay_is_per_group():
    text = (
        "User-agent: enrich_crawl\nCrawl-delay: 3\nUser-agent: friendbot\nDisallow: /x\n\n"
        "User-agent: *\nCrawl-delay: 10\nDisallow: /\n"
    )
    verdict = rules(text)
    assert verdict.crawl_delay(UA) == 3.0  # read in our group, even between its UA lines
    assert verdict.crawl_delay("friendbot/1") == 3.0
    assert verdict.crawl_delay("otherbot/1") == 10.0
    assert not verdict.allowed("http://h.test/x/1", UA) and verdict.allowed("http://h.test/y", UA)
    # our groups combined: their rules together, the largest delay
    twice = "User-agent: enrich_crawl\nCrawl-delay: 1\nDisallow: /a\n\n"
    twice += "User-agent: enrich_crawl\nCrawl-delay: 4\nDisallow: /b\n"
    verdict = rules(twice)
    assert verdict.crawl_delay(UA) == 4.0
    assert not verdict.allowed("http://h.test/a", UA) and not verdict.allowed("http://h.test/b", UA)


def test_an_origin_keeps_its_agent_rules_not_the_parsed_groups():
    """A crawl holds the verdicts of hundreds of origins: once the rules for a product token are
    built, the groups they came from are let go, and another token reads the file again."""
    verdict = rules("User-agent: enrich_crawl\nDisallow: /mine\n\nUser-agent: *\nDisallow: /\n")
    assert verdict.allowed("http://h.test/yours", UA)
    assert verdict._groups is None and list(verdict._agents) == ["enrich_crawl"]
    assert not verdict.allowed("http://h.test/yours", "otherbot/2")
    assert not verdict.allowed("http://h.test/mine", UA)


def test_misspelt_records_and_a_missing_colon_are_read_as_meant():
    """As Google's parser does (its ID_LineSyntax_Line case): the intent is plain."""
    assert not rules("user-agent FooBot\ndisallow /\n").allowed("http://h.test/x", "FooBot")
    assert not rules("useragent: *\ndisallaw: /x\n").allowed("http://h.test/x", UA)


@pytest.mark.parametrize(
    "status, allowed",
    [(200, True), (401, True), (403, True), (404, True), (410, True), (500, False), (503, False)],
)
def test_error_statuses(status, allowed):
    verdict = rules("", status)
    assert verdict.allowed("http://h.test/page", UA) is allowed
    assert verdict.allowed("http://h.test/robots.txt", UA)


def test_unreachable_disallows_for_now_and_is_cached_briefly():
    verdict = RobotsRules.unreachable("http://h.test", "timeout")
    assert not verdict.allowed("http://h.test/page", UA)
    assert verdict.cause == "timeout"
    day = 24 * 3600.0
    assert not verdict.expired(day, now=verdict.fetched_at + 60)
    assert verdict.expired(day, now=verdict.fetched_at + 3600)  # 5xx/unreachable: 30 min
    ok = rules("User-agent: *\nAllow: /\n")
    assert not ok.expired(day, now=ok.fetched_at + 3600)
    assert ok.expired(day, now=ok.fetched_at + day + 1)


@pytest.mark.parametrize(
    "line, delay",
    [
        ("Crawl-delay: 0.5", 0.5),
        ("Crawl-delay: 2", 2.0),
        ("Crawl-delay: abc", None),
        ("Crawl-delay: -3", None),
        ("", None),
    ],
)
def test_crawl_delay(line, delay):
    assert rules(f"User-agent: *\nDisallow: /x\n{line}\n").crawl_delay(UA) == delay


def test_huge_file_is_read_up_to_500_kib():
    head = "User-agent: *\nDisallow: /early/\n"
    padding = "# " + "x" * 98 + "\n"
    body = head + padding * (MAX_ROBOTS_BYTES // len(padding) + 10) + "Disallow: /late/\n"
    verdict = rules(body)
    assert verdict.note == "truncated"
    assert not verdict.allowed("http://h.test/early/a", UA)
    assert verdict.allowed("http://h.test/late/a", UA)  # beyond 500 KiB: ignored


def test_product_token_and_cache_document_round_trip():
    assert product_token("enrich_crawl/0.1 (+https://x)") == "enrich_crawl"
    verdict = rules("User-agent: *\nDisallow: /a\nCrawl-delay: 0.25\n")
    again = RobotsRules.from_doc(json.loads(json.dumps(verdict.to_doc())))
    assert again.crawl_delay(UA) == 0.25 and not again.allowed("http://h.test/a", UA)


# -- against the virtual web -------------------------------------------------------------------

MAPPING = {
    "name": "robots_sites",
    "url_patterns": [{"type": "regex", "pattern": r"^https?://r-[a-z0-9-]+\.test/"}],
    "fields": [
        {
            "name": "value",
            "processors": [
                {"type": "xpath", "parameters": {"expression": "//span[@id='v']/text()"}}
            ],
        }
    ],
}


def _site(root, host, robots, paths, config=None):
    folder = root / host
    folder.mkdir(parents=True)
    if robots is not None:
        (folder / "robots.txt").write_text(robots, encoding="utf-8")
    for path in paths:
        target = folder / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(f"<html><body><span id='v'>{host}{path}</span></body></html>", "utf-8")
    if config:
        (folder / "_web.json").write_text(json.dumps(config), encoding="utf-8")


@pytest.fixture(scope="module")
def robots_web(tmp_path_factory):
    base = tmp_path_factory.mktemp("robots")
    root = base / "web"
    padding = "# " + "x" * 98 + "\n"
    cases = {
        "r-5xx.test": ("User-agent: *\nAllow: /\n", ["/a.html"], {"status": {"robots": 503}}),
        "r-none.test": (None, ["/a.html"], None),
        "r-401.test": ("", ["/a.html"], {"status": {"robots": 401}}),
        "r-huge.test": (
            "User-agent: *\nDisallow: /early/\n"
            + padding * (MAX_ROBOTS_BYTES // len(padding) + 50)
            + "Disallow: /late/\n",
            ["/early/a.html", "/late/a.html"],
            None,
        ),
        "r-html.test": ("<!doctype html><html><body>Disallow: /</body></html>", ["/a.html"], None),
        "r-agents.test": (
            "User-agent: enrich_crawl\nDisallow: /only-us/\n\nUser-agent: *\nDisallow: /\n",
            ["/only-us/a.html", "/other.html"],
            None,
        ),
        "r-wild.test": (
            "User-agent: *\nDisallow: /*.php$\nAllow: /public/*.php$\n",
            ["/x.php", "/public/a.php"],
            None,
        ),
        "r-redirect.test": (
            "User-agent: *\nAllow: /\n",
            ["/secret/a.html", "/open.html"],
            {"redirects": {"^/robots\\.txt$": "/real-robots.txt"}},
        ),
        "r-delay.test": (
            "User-agent: *\nCrawl-delay: 0.5\n",
            [f"/p{i}.html" for i in range(4)],
            None,
        ),
        "r-down.test": ("User-agent: *\nAllow: /\n", ["/a.html"], {"unreachable": True}),
    }
    for host, (robots, paths, config) in cases.items():
        _site(root, host, robots, paths, config)
    (root / "r-redirect.test" / "real-robots.txt").write_text(
        "User-agent: *\nDisallow: /secret/\n", encoding="utf-8"
    )
    rows = []
    for host, (_robots, paths, _config) in cases.items():
        for path in paths:
            rows.append({"id": f"{host}{path}", "url": f"http://{host}{path}"})
    crawl = {"default_delay": 0.1, "retry_backoff": 0.2, "store_pages": False, "retries": 1}
    dataset, mappings = write_dataset(
        base, rows, fields={"value": {}}, mappings={"robots_sites": MAPPING}, crawl=crawl
    )
    return base, dataset, mappings


@pytest.fixture(scope="module")
def robots_crawl(robots_web, mongo_server):
    base, dataset, mappings = robots_web
    db = f"robots_{int(time.time() * 1000)}"
    with running_web(base / "web", log_path=base / "requests.jsonl") as server:
        run = run_workers(
            dataset,
            mappings,
            base / "work",
            proxy=server.proxy_url,
            shards=1,
            mongo_uri=mongo_server.uri,
            mongo_db=db,
            user_agent=UA,
        )
        first = server.read_log()
        again = run_workers(
            dataset,
            mappings,
            base / "work",
            proxy=server.proxy_url,
            shards=1,
            mongo_uri=mongo_server.uri,
            mongo_db=db,
            user_agent=UA,
            run_id="again",
        )
        second = server.read_log()[len(first) :]
        expired = run_workers(
            dataset,
            mappings,
            base / "work",
            proxy=server.proxy_url,
            shards=1,
            mongo_uri=mongo_server.uri,
            mongo_db=db,
            user_agent=UA,
            run_id="expired",
            crawl_overrides={"robots_ttl_hours": 1e-6},
        )
        third = server.read_log()[len(first) + len(second) :]
    for result in (run, again, expired):
        assert result.returncodes == {"s00": 0}, result.logs
    return base, run, first, second, third


def test_crawl_obeys_robots(robots_crawl):
    base, run, log, _second, _third = robots_crawl
    outcomes = read_outcomes(base / "work")
    values = {rid: f["value"] for rid, f in read_candidates(base / "work").items()}
    by_host = requests_by_host(log)
    expected = {
        "r-5xx.test/a.html": "robots",  # 5xx robots.txt: disallowed for now
        "r-none.test/a.html": None,  # 404: allow all
        "r-401.test/a.html": None,
        "r-huge.test/early/a.html": "robots",
        "r-huge.test/late/a.html": None,  # the rule sits beyond 500 KiB
        "r-html.test/a.html": None,
        "r-agents.test/only-us/a.html": "robots",
        "r-agents.test/other.html": None,
        "r-wild.test/x.php": "robots",
        "r-wild.test/public/a.php": None,
        "r-redirect.test/secret/a.html": "robots",  # the rules came through a redirect
        "r-redirect.test/open.html": None,
        "r-down.test/a.html": "connection",
    }
    for rid, reason in expected.items():
        reasons = {e["reason"] for e in outcomes[rid]["errors"]}
        if reason is None:
            assert values.get(rid) == rid, outcomes[rid]
        else:
            assert reason in reasons, outcomes[rid]
            assert rid not in values
            host, _, path = rid.partition("/")
            assert f"/{path}" not in [e["path"] for e in by_host.get(host, [])]
    # robots.txt first on every host, once per host and run; a 5xx or a connection failure is
    # retried once, after the retry backoff (0.2 s), not the host's delay (0.1 s). Cutting
    # r-huge's robots.txt at its size limit closes that connection (shared by all hosts through
    # the proxy): no request is sent on it again (test_connections)
    for host, entries in by_host.items():
        assert entries[0]["path"] == "/robots.txt", host
        robots_requests = [e for e in entries if e["path"] == "/robots.txt"]
        expected_count = 2 if host in ("r-5xx.test", "r-down.test") else 1
        assert len(robots_requests) == expected_count, (host, robots_requests)
        if expected_count == 2:
            first, retry = robots_requests
            assert retry["t"] - (first["t"] + first["dur"]) >= 0.2, (host, robots_requests)
    assert [e["path"] for e in by_host["r-5xx.test"]] == ["/robots.txt", "/robots.txt"]
    stats = run.stats["s00"]
    assert stats["robots"]["truncated"] == 1 and stats["robots"]["html"] == 1
    assert stats["robots_refusals"] == 5


def test_crawl_delay_is_enforced(robots_crawl):
    _base, _run, log, _second, _third = robots_crawl
    entries = requests_by_host(log)["r-delay.test"]
    assert len(entries) == 5
    gaps = [b["t"] - (a["t"] + a["dur"]) for a, b in itertools.pairwise(entries)]
    assert min(gaps) >= 0.5


def test_robots_are_cached_across_runs_for_their_ttl(robots_crawl):
    _base, _run, _first, second, third = robots_crawl
    # second run: every page fetched again (no page store here), no robots.txt fetched, except
    # for hosts whose verdict was "unreachable/5xx" (kept 30 min): not fetched either
    assert second and not [e for e in second if e["path"] == "/robots.txt"]
    assert not [e for e in second if e["path"] in ("/early/a.html", "/x.php")]
    # with an expired TTL robots.txt comes first again
    for host, entries in requests_by_host(third).items():
        assert entries[0]["path"] == "/robots.txt", host
