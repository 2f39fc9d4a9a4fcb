"""google/robotstxt's own test suite (robots_test.cc, reporting_robots_test.cc), translated to data
(fixtures/google_robotstxt_cases.json: where it came from, and the Google-only cases skipped with
why), against our robots.txt handling: every case RFC 9309 decides, asked with the test's user
agent and again with ours (the test's agent renamed to our product token in the file)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from enrich_crawl.crawl.robots import RobotsRules

DATA = json.loads(
    (Path(__file__).parent / "fixtures" / "google_robotstxt_cases.json").read_text(encoding="utf-8")
)
OUR_UA = "enrich_crawl/0.1 (+https://example.org/bot.html)"
CASES = [
    (group, agent, url, allowed)
    for group in DATA["groups"]
    for agent, url, allowed in group["checks"]
]


def _case_id(case) -> str:
    group, agent, url, allowed = case
    return f"{group['test']}:{agent}:{url[-40:]}:{'allow' if allowed else 'deny'}"


def _verdict(robots: str, encoding: str | None) -> RobotsRules:
    body = robots.encode(encoding or "utf-8")
    return RobotsRules.from_response("http://foo.bar", 200, body)


def _as_ours(robots: str, agent: str) -> str:
    """The file with the test's agent renamed to our product token on its User-agent lines
    (whole token, any case: `FooBot` is renamed, `FooBotX` is another robot)."""
    line = re.compile(rf"(?i)(?<![a-z])(user[- ]?agent[ \t]*:?[ \t]*){re.escape(agent)}(?![a-z_-])")
    return line.sub(r"\1enrich_crawl", robots)


def test_the_data_says_where_it_came_from():
    source = DATA["source"]
    assert source["repository"] == "https://github.com/google/robotstxt"
    assert re.fullmatch(r"[0-9a-f]{40}", source["commit"])
    assert set(source["files"]) == {"robots_test.cc", "reporting_robots_test.cc"}
    assert len(CASES) >= 150
    assert all(s["why"] and s["test"] for s in DATA["skipped"])


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_google_case_with_the_tests_user_agent(case):
    group, agent, url, allowed = case
    assert _verdict(group["robots"], group.get("encoding")).allowed(url, agent) is allowed


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_google_case_with_our_user_agent(case):
    group, agent, url, allowed = case
    robots = _as_ours(group["robots"], agent)
    assert _verdict(robots, group.get("encoding")).allowed(url, OUR_UA) is allowed
