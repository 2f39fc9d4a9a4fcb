"""Regex safety: catastrophic patterns refused at load time, the rest time-bounded at run time."""

from __future__ import annotations

import re
import sys
import time
from collections import Counter

import pytest

from enrich_crawl.extract.errors import MappingError
from enrich_crawl.extract.mapping import compile_mapping, run_mapping
from enrich_crawl.extract.page import Page
from enrich_crawl.extract.processors import PAGE, Context, compile_chain, compile_regex
from enrich_crawl.extract.regex_safety import backtracking_hazard

EXPONENTIAL = [
    r"(a+)+$",
    r"(a*)*b",
    r"^(\w+\s?)*$",
    r"(.*,)+x",
    r"(a|a)+$",
    r"(a|aa)+$",
    r"(?:a|b|ab)+c",
    r"(?:\s+|\w+)+$",
    r"(x+x+)+y",
    r"^(([a-z])+.)+[A-Z]([a-z])+$",
    r"(a{1,3})+$",
    r"(?:a+b?)+$",
    r"((ab)*)+$",
    r"(\d+|\d+\.\d+)+$",
    r"(.*a){12}",
    r"(a+){10,}",
    r"(?:[a-z]+\d*)+$",
    r"(?=(a+)+b)",
    r"(?:1?\d?\d\.)+$",
    r"(?i)(?:A|a)(?:a|A)+(?:ab|Ab|a)+$",
]

SAFE = [
    r"(?:[^,]+,)+",
    r"(\d+\.)+",
    r"(?:\s*,\s*\w+)+",
    r"(a|b)*",
    r"(\w|\d)+$",  # re merges the branches into one character class
    r"(ab|ac)+",
    r"(?:ab+|a)+",
    r"(\d{4})+",
    r"(a++)+$",  # possessive
    r"(?>a+)+$",  # atomic
    r"^https?://(?:www\.)?gravatar\.com/\w+/?$",
    r"^mailto:([^?]+).*$",
    r"(?:New|Added) in version (\d+(?:\.\d+)*)",
    r"(?:\"[^\"]*\"|[^,])+",
    r"(?:(?:25[0-5]|2[0-4]\d|1?\d?\d)\.){3}(?:25[0-5]|2[0-4]\d|1?\d?\d)",
    r"^[\w.+-]+@[\w-]+(?:\.[\w-]+)+$",
    r"(?:https?|ftp)://[^\s/$.?#].[^\s]*",
    r"<[^>]+>",
    r"(?:\\.|[^\"\\])*",
    r"(?:\d{1,3},)+\d{3}",
]


@pytest.mark.parametrize("pattern", EXPONENTIAL)
def test_exponential_patterns_are_refused(pattern):
    assert backtracking_hazard(pattern), pattern
    with pytest.raises(MappingError) as caught:
        compile_regex(pattern, "$.x.pattern")
    assert caught.value.where == "$.x.pattern"
    assert "is refused" in caught.value.reason
    assert "atomic" in caught.value.reason  # says how to fix it


@pytest.mark.parametrize("pattern", SAFE)
def test_unambiguous_patterns_are_accepted(pattern):
    assert backtracking_hazard(pattern) is None, pattern
    compile_regex(pattern, "$.x.pattern")


def test_patterns_are_python_re_syntax():
    for pattern in (r"(?<name>x)", r"\p{L}+", r"(?V1)a"):  # `regex`-only syntax
        with pytest.raises(MappingError, match="invalid regular expression"):
            compile_regex(pattern, "$.x")
    assert compile_regex(r"(?P<name>x)(?P=name)", "$.x").search("xx")


def test_refused_patterns_in_url_patterns_and_split():
    raw = {
        "name": "m",
        "url_patterns": [r"^https://(a+)+\.example/"],
        "fields": [
            {
                "name": "f",
                "processors": [
                    {"type": "split", "parameters": {"separator": "(,|,)+", "regex": True}}
                ],
            }
        ],
    }
    with pytest.raises(MappingError) as caught:
        compile_mapping(raw)
    wheres = [where for where, _ in caught.value.problems]
    assert wheres == ["$.fields[0].processors[0].parameters.separator", "$.url_patterns[0].pattern"]


def test_a_slow_pattern_times_out_on_that_field_only():
    # polynomial, not exponential: accepted statically, stopped by the timeout
    raw = {
        "name": "slow",
        "url_patterns": ["^https://x\\.example/"],
        "fields": [
            {
                "name": "slow",
                "processors": [{"type": "regex", "parameters": {"pattern": r"^.*?x.*?y.*?z$"}}],
            },
            {
                "name": "fast",
                "processors": [{"type": "regex", "parameters": {"pattern": r"(xy){3}"}}],
            },
        ],
    }
    mapping = compile_mapping(raw)
    page = Page("https://x.example/", "xy" * 20000, content_type="text/plain")
    result = run_mapping(mapping, page)
    assert result.fields == {"fast": "xy"}
    assert any(e.startswith("slow: regex") and "timed out" in e for e in result.errors)


def test_the_regex_budget_of_a_run_stops_further_regexes():
    chain = compile_chain(
        [
            {"type": "xpath", "parameters": {"expression": "//p/text()"}},
            {"type": "regex", "parameters": {"pattern": r"^.*?x.*?y.*?z$"}},
        ],
        "$.p",
    )
    body = "<html><body>" + "<p>" + "xy" * 20000 + "</p>" * 1 + "<p>xyz</p>" * 3 + "</body></html>"
    ctx = Context(page=Page("https://x.example/", body, content_type="text/html"))
    ctx.regex_budget = 0.05
    assert chain([PAGE], ctx) == []
    assert any("timed out" in e for e in ctx.errors)
    assert any("budget is spent" in e for e in ctx.errors)


def test_url_pattern_matching_never_raises_on_long_urls():
    raw = {
        "name": "m",
        "url_patterns": [r"^https://x\.example/.*?a.*?b.*?c$"],
        "url_parsers": [
            {"processors": [{"type": "xpath", "parameters": {"expression": "//a/@href"}}]}
        ],
    }
    mapping = compile_mapping(raw)
    assert mapping.matches("https://x.example/abc")
    assert not mapping.matches("https://x.example/" + "ab" * 30000)


def test_safe_list_really_is_fast_on_adversarial_input():
    """The accepted patterns run quickly on the inputs that kill the refused ones (a check of the
    analysis, run with Python's own `re`, which has no timeout)."""
    adversarial = ["a" * 28 + "!", "1" * 28 + "!", "ab" * 14 + "!", ", " * 14 + "!"]
    for pattern in SAFE:
        compiled = re.compile(pattern)
        for text in adversarial:
            compiled.search(text)  # would hang the test (600 s timeout) if exponential


def test_the_timed_engine_matches_exactly_like_python_re():
    """SPEC says `re`; the time-bounded `regex` engine (VERSION0) must give the same results."""
    import regex

    patterns = [
        r"\s*",
        r"x*",
        r"\b",
        r"(?=a)",
        r"(a)|b",
        r"[\w.+-]+@[\w-]+",
        r"(?i)straße",
        r"\d+",
        r"^",
        r"$",
        r"(?m)^\w",
        r"(?s).",
        r"[^\W\d]+",
        r"(?P<y>\d{4})-(?P<m>\d\d)",
        r"(?a)\w+",
    ]
    texts = ["", "abc", "a b  c", "STRASSE straße", "x@y.z", "2024-03 é ü ١٢", "l1\nl2", "aaa"]
    for pattern in patterns:
        ours, theirs = compile_regex(pattern, "$"), re.compile(pattern)
        assert ours.flags & regex.VERSION0
        for text in texts:
            assert ours.findall(text) == theirs.findall(text), (pattern, text)
            assert ours.split(text) == theirs.split(text), (pattern, text)
            assert ours.sub(r"<\g<0>>", text) == theirs.sub(r"<\g<0>>", text), (pattern, text)


def test_timed_matching_keeps_the_gil_while_another_thread_runs():
    """`regex` lets go of the GIL while it matches unless told not to; in a crawl worker (pymongo's
    monitor threads, Twisted's thread pool) every URL pattern match and regex processor then
    handed the interpreter to another thread and waited to get it back. Counted, not timed: how
    many times a busy thread gets to run between steps of matching (a URL pattern, the regex
    processor, and each matching function of a compiled pattern), the interpreter's switch
    interval set beyond the test's length (so it runs only when a match lets go of the GIL). Each
    step scans ~100,000 characters, long enough for a waiting thread to take the GIL whenever it
    is let go (on short inputs the matching thread mostly takes it back first, whatever the load:
    such a test passes with the GIL let go)."""
    import threading

    mapping = compile_mapping(
        {
            "name": "m",
            "url_patterns": [r"^https?://[a-z0-9.-]+\.example(?::\d+)?/[^#]*(?:#.*)?$"],
            "fields": [
                {
                    "name": "v",
                    "processors": [{"type": "regex", "parameters": {"pattern": r"(\d+)"}}],
                }
            ],
        }
    )
    text = "x" * 100_000 + " 1203,4"
    url = "http://sites.pagebox-1.example/" + "a" * 60_000 + "/about.html"
    page = Page("https://x.example/a", text, content_type="text/plain")
    scan = compile_regex(r"\d", "scan")  # scans the x's for the digits at the end
    anchored = compile_regex(r"x*\d", "anchored")  # takes the x's, then fails on the space
    steps = {
        "url pattern": lambda: mapping.matches(url),
        "regex processor": lambda: run_mapping(mapping, page).fields == {"v": "1203"},
        "search": lambda: scan.search(text, timeout=1.0).group() == "1",
        "finditer": lambda: len(list(scan.finditer(text, timeout=1.0))) == 5,
        "findall": lambda: scan.findall(text, timeout=1.0) == list("12034"),
        "sub": lambda: scan.sub("#", text, timeout=1.0).endswith(" ####,#"),
        "subn": lambda: scan.subn("#", text, timeout=1.0)[1] == 5,
        "split": lambda: len(scan.split(text, timeout=1.0)) == 6,
        "match": lambda: anchored.match(text, timeout=1.0) is None,
        "fullmatch": lambda: anchored.fullmatch(text, timeout=1.0) is None,
    }
    names = list(steps)
    done = [0]
    seen: set[int] = set()
    stop = threading.Event()

    def busy() -> None:
        while not stop.is_set():
            seen.add(done[0])
            time.sleep(0)  # lets the matches go on as soon as they want the GIL back

    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(1.0)  # no hand-over forced by the interpreter while the matches run
    thread = threading.Thread(target=busy)
    thread.start()
    try:
        for _ in range(40):
            for name in names:
                assert steps[name](), name
                done[0] += 1
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(switch_interval)
    # the GIL held: the busy thread runs before the first step and after the last (and now and
    # then between two steps); let go of: during nearly every step of the function that lets go
    during = Counter(names[n % len(names)] for n in seen if 0 < n < done[0])
    assert sum(during.values()) < 10, during
