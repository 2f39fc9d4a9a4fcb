"""The vectorised kernels of the loader agree with the plain-Python rules they stand for."""

from __future__ import annotations

import json
import random
import string
import sys
import unicodedata

import numpy as np
import pyarrow as pa
import pytest

from enrich_crawl.dataset import vector as vec
from enrich_crawl.dataset.cells import (
    JUNK_RANGES,
    WHITESPACE_RANGES,
    clean_cell,
    coerce_cell,
)
from enrich_crawl.dataset.shard import registrable_domain, shard_index
from enrich_crawl.urls import normalise_url

RANDOM = random.Random(7)


def _in(ranges, code):
    return any(a <= code <= b for a, b in ranges)


def test_character_classes_match_python():
    for code in range(sys.maxunicode + 1):
        ch = chr(code)
        assert _in(WHITESPACE_RANGES, code) == ch.isspace(), hex(code)
        junk = (unicodedata.category(ch) == "Cc" and not ch.isspace()) or code in (0x200B, 0xFEFF)
        assert _in(JUNK_RANGES, code) == junk, hex(code)


def _dirty_text(rng: random.Random) -> str:
    odd = [" ", "  ", "\t", "\n", "\r\n", "\x00", "\x1b", "\x7f", "\x85", "\u00a0", "\u2009"]
    odd += ["\u3000", "\u200b", "\ufeff", "e\u0301", "é", "ß", "İ", "ﬁ", "Å", "A\u030a", "😀"]
    odd += ["\u2028", "\x1c", "\x0b", "\\", '"']
    alphabet = [*(string.ascii_letters + string.digits + string.punctuation), *odd]
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))


def test_clean_strings_is_clean_cell():
    values = [_dirty_text(RANDOM) for _ in range(5000)] + ["", "plain", "two  spaces", None]
    got = vec.clean_strings(pa.array(values, pa.string())).to_pylist()
    want = [None if v is None else clean_cell(v) for v in values]
    assert got == want


def test_clean_cell_examples():
    assert clean_cell("  Zu\u0308rich\u00a0 \n City\x00 ") == "Zürich City"
    assert clean_cell("\ufeffa\u200bb\tc") == "ab c"
    assert clean_cell(" \r\n ") == ""


def test_json_strings_is_json_dumps():
    values = [_dirty_text(RANDOM) for _ in range(3000)] + [None, "", 'a"b\\c']
    got = vec.json_strings(pa.array(values, pa.string())).to_pylist()
    want = ["null" if v is None else json.dumps(v, ensure_ascii=False) for v in values]
    assert got == want


def test_json_numbers_read_back_as_python_dumps():
    floats = [1200.0, 1e20, 1.5e-7, 0.1, -0.0, 5e-324, float("inf"), float("nan"), None, 3.0]
    got = vec.json_numbers(pa.array(floats, pa.float64())).to_pylist()
    for text, value in zip(got, floats, strict=True):
        decoded = json.loads(text)
        if value is None:
            assert decoded is None
        elif value != value:  # NaN
            assert decoded != decoded
        else:
            assert decoded == value and isinstance(decoded, float), text
    ints = vec.json_numbers(pa.array([1, None, -5], pa.int64())).to_pylist()
    assert ints == ["1", "null", "-5"]
    assert vec.json_numbers(pa.array([True, None, False])).to_pylist() == ["true", "null", "false"]


CORPUS = {
    "integer": [
        "1998",
        "-5",
        "0",
        "007",
        "+3",
        "1,200",
        "1 200",
        "about 300",
        "12.5",
        "12.0",
        "many",
        "1e3",
        "−7",
        "12345678901234567",
        "123456789012345",
        "-0",
        "19xx",
        "2010.0",
        "∞",
    ],
    "number": [
        "1.5",
        "-0.25",
        "1,234.5",
        "3",
        "007",
        "1e-3",
        "12.50",
        "abc",
        "-0",
        "0.1",
        "1e999",
        "99999999999999999999.5",
    ],
    "boolean": ["yes", "No", "TRUE", "false", "0", "1", "on", "oui", "maybe", "t", "sí", "2"],
    "date": [
        "2023-01-15",
        "2023-02-30",
        "0000-01-01",
        "2024-02-29",
        "2023-02-29",
        "March 3, 2025",
        "15.01.2023",
        "2024-11-02T10:00:00Z",
        "2024-11-02 10:00",
        "2023",
        "2023-13-01",
        "soon",
        "2023-1-5",
        "1st June 2021",
        "2021-06",
    ],
    "list": [
        "a, b; c",
        "x|y",
        ",;",
        "one",
        "a ,, b",
        " ; a",
        "a;",
        "tag one, tag two",
        'q"uote, b',
    ],
    "string": ["a", "b c"],
}


@pytest.mark.parametrize("ftype", sorted(CORPUS))
def test_coerce_strings_is_coerce_cell(ftype):
    values = [*CORPUS[ftype], None, *CORPUS[ftype][:3]]
    if ftype in ("integer", "number"):
        values += [str(RANDOM.randint(-(10**9), 10**9)) for _ in range(200)]
        values += [f"{RANDOM.uniform(-1e6, 1e6):.{RANDOM.randint(0, 6)}f}" for _ in range(200)]
    done = vec.coerce_strings(pa.array(values, pa.string()), ftype)
    fragments = done.fragments.to_pylist()
    errors = done.errors.to_pylist()
    for i, value in enumerate(values):
        if value is None:
            assert fragments[i] == "null" and done.missing[i] and errors[i] is None
            continue
        try:
            typed, lossy = coerce_cell(value, ftype)
        except ValueError as exc:
            assert errors[i] == str(exc), value
            assert done.missing[i] and done.lossy[i] and fragments[i] == "null"
            continue
        assert errors[i] is None, (value, errors[i])
        decoded = json.loads(fragments[i])
        assert decoded == typed and type(decoded) is type(typed), (value, fragments[i], typed)
        assert bool(done.lossy[i]) == lossy, value
        assert bool(done.missing[i]) == (typed is None), value


def _random_label(rng):
    size = rng.randint(1, 12)
    chars = string.ascii_letters + string.digits + "-"
    label = "".join(rng.choice(chars) for _ in range(size))
    return label


def _url_tokens(rng: random.Random) -> list[str]:
    tlds = ["com", "org", "co.uk", "example", "io", "DE", "com.au", "test", "xn--p1ai", "1"]
    tokens = []
    for _ in range(3000):
        host = ".".join(_random_label(rng) for _ in range(rng.randint(1, 3)))
        host += "." + rng.choice(tlds)
        scheme = rng.choice(["", "http://", "https://", "HTTP://", "HtTpS://", "//", "ftp://"])
        path = rng.choice(
            [
                "",
                "/",
                "/a",
                "/A/b.html",
                "/a/./b",
                "/a/../b",
                "/.",
                "//x",
                "/~u",
                "/a_b-c",
                "/%7e",
                "/é",
                "/a b",
                "/x?b=2&a=1",
                "/x?",
                "/#",
                "#frag",
                "/p#Org-1",
                "/p#a%20b",
                ":80/x",
                ":8080",
                "/(x)",
                "/a:b@c",
            ]
        )
        tokens.append(scheme + host + path)
    tokens += [
        "not",
        "a",
        "url",
        "<http://a.com/>",
        "'a.com'",
        "http://",
        "mailto:x@y.z",
        "http://10.1.2.3/",
        "http://[::1]/",
        "localhost",
        "http://localhost/",
        "a.com.",
        "http://user@a.com/",
        "http://a_b.example.com/",
        "http://-a.com/",
        "a" * 70 + ".com",
    ]
    return tokens


def test_normalise_tokens_is_normalise_url():
    tokens = sorted(set(_url_tokens(RANDOM)))
    done = vec.normalise_tokens(pa.array(tokens, pa.string()))
    urls = done.urls.to_pylist()
    covered, _, _ = vec.fast_urls(pa.array(tokens, pa.string()))
    assert covered.sum() > len(tokens) // 10  # the fast path does carry the common shapes
    for i, token in enumerate(tokens):
        url, reason = normalise_url(token)
        assert urls[i] == url, (token, urls[i], url)
        assert done.reasons[i] == reason, token
    hosts = done.hosts.to_pylist()
    for token, url, host in zip(tokens, urls, hosts, strict=True):
        if host is not None:
            from enrich_crawl.dataset.shard import host_of

            assert host == host_of(url), token


def test_registrable_domains_is_registrable_domain():
    shapes = vec.suffix_shapes()
    hosts = []
    for tld in sorted(shapes.tops):
        hosts += [f"example.{tld}", f"www.shop-1.{tld}"]
    for second in sorted(shapes.seconds):
        hosts += [f"www.example.{second}", second]
    for rule in sorted(shapes.rules)[::7]:
        hosts.append("a-b.www." + rule.lstrip("*.!"))
    hosts += [
        "www.foo.blogspot.com",
        "city.kobe.jp",
        "x.city.kobe.jp",
        "a.b.ck",
        "www.ck",
        "localhost",
        "example.test",
        "a.b.example",
        "10.1.2.3",
        "xn--bcher-kva.example",
        "a.xn--p1ai",
        "uk",
        "co.uk",
        "foo.uk",
        "a.b.c.d.e.com",
        "x.github.io",
        "s3.amazonaws.com",
    ]
    hosts = sorted(set(h.lower() for h in hosts))
    got = vec.registrable_domains(pa.array(hosts, pa.string())).to_pylist()
    for host, domain in zip(hosts, got, strict=True):
        assert domain == registrable_domain(host), host


def test_shard_index_array_is_shard_index():
    domains = ["", "python.org", "example.co.uk", "école.fr"] + [f"d{i}.com" for i in range(500)]
    for count in (1, 3, 8, 16):
        assert vec.shard_index_array(domains, count).tolist() == [
            shard_index(d, count) for d in domains
        ]


def test_id_index_first_wins_across_batches():
    from enrich_crawl.dataset.load import IdIndex

    rng = random.Random(3)
    index = IdIndex()
    first: dict[str, int] = {}
    row = 0
    for _ in range(40):  # many batches: runs get merged along the way
        ids = [rng.choice([None, *(f"id{rng.randint(0, 3000)}" for _ in range(5))])]
        ids += [f"id{rng.randint(0, 3000)}" for _ in range(rng.randint(0, 200))]
        rows = list(range(row + 1, row + 1 + len(ids)))
        row += len(ids)
        got = index.first_rows(pa.array(ids, pa.string()), np.array(rows, dtype=np.int64))
        for rid, r, g in zip(ids, rows, got.tolist(), strict=True):
            if rid is None:
                assert g == -1
            else:
                first.setdefault(rid, r)
                assert g == first[rid], rid
    assert len(index.runs) <= 12
