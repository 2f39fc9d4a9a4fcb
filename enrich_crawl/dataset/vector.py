"""Arrow kernels: the cell rules of `enrich_crawl.dataset.cells` applied to whole columns.

Every kernel covers the common shape of a value with vectorised Arrow/NumPy operations and sends
what it does not cover to the plain-Python rule (`cells`, `enrich_crawl.values`,
`enrich_crawl.urls.normalise_url`, `enrich_crawl.dataset.shard`), once per distinct value. The fast
shapes are deliberately narrow; the tests check every kernel against the Python rule it stands for.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from hashlib import blake2b
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from enrich_crawl.dataset.cells import (
    JUNK_RANGES,
    LOSSLESS_INTEGER,
    LOSSLESS_NUMBER,
    WHITESPACE_RANGES,
    coerce_cell,
    re2_class,
)
from enrich_crawl.dataset.shard import host_of, registrable_domain, shard_index
from enrich_crawl.staging import dumps
from enrich_crawl.urls import normalise_url

_JUNK = re2_class(JUNK_RANGES)
_WS_RUN = re2_class(WHITESPACE_RANGES) + "+"
# printable ASCII words separated by single spaces: already clean, nothing to do
_PLAIN = r"^(?:[\x21-\x7e]+(?: [\x21-\x7e]+)*)?$"
_CONTROL = r"[\x00-\x1f]"

STRING = pa.string()


def as_numpy_bool(array: pa.Array | pa.ChunkedArray, null: bool = False) -> np.ndarray:
    return np.asarray(pc.fill_null(array, null).to_numpy(zero_copy_only=False), dtype=bool)


def clean_strings(array: pa.Array) -> pa.Array:
    """`cells.clean_cell` on every value (nulls stay null); only values that need it are touched."""
    todo = pc.invert(pc.fill_null(pc.match_substring_regex(array, _PLAIN), True))
    if not pc.any(todo).as_py():
        return array
    part = array.filter(todo)
    part = pc.replace_substring_regex(part, _JUNK, "")
    part = pc.utf8_normalize(part, "NFC")
    part = pc.replace_substring_regex(part, _WS_RUN, " ")
    part = pc.utf8_trim(part, " ")
    return pc.replace_with_mask(array, todo, part)


def missing_mask(cleaned: pa.Array, markers: pa.Array) -> np.ndarray:
    """Null, empty, or a missing marker (case-insensitive)."""
    mask = pc.or_(pc.equal(cleaned, ""), pc.is_in(pc.utf8_lower(cleaned), value_set=markers))
    return as_numpy_bool(mask, True)


def with_nulls(array: pa.Array, mask: np.ndarray) -> pa.Array:
    if not mask.any():
        return array
    return pc.if_else(pa.array(mask), pa.scalar(None, array.type), array)


def concat(*parts: Any) -> pa.Array:
    return pc.binary_join_element_wise(*parts, "")


def json_strings(array: pa.Array, *, may_hold_controls: bool = True) -> pa.Array:
    """JSON text of every string (null -> `null`), as `json.dumps(ensure_ascii=False)` writes it."""
    text = array
    if (
        pc.any(pc.match_substring(array, '"')).as_py()
        or pc.any(pc.match_substring(array, "\\")).as_py()
    ):
        text = pc.replace_substring(text, "\\", "\\\\")
        text = pc.replace_substring(text, '"', '\\"')
    out = concat(pa.scalar('"'), text, pa.scalar('"'))
    if may_hold_controls:
        controls = as_numpy_bool(pc.match_substring_regex(array, _CONTROL))
        if controls.any():
            values = array.filter(pa.array(controls)).to_pylist()
            out = pc.replace_with_mask(
                out,
                pa.array(controls),
                pa.array([json.dumps(v, ensure_ascii=False) for v in values], STRING),
            )
    return pc.fill_null(out, "null")


def json_objects(names: Sequence[str], fragments: Sequence[pa.Array], length: int) -> pa.Array:
    """One JSON object per row from each key's JSON fragments (every fragment non-null)."""
    if not names:
        return pa.array(["{}"] * length, STRING)
    parts: list[Any] = []
    for i, (name, fragment) in enumerate(zip(names, fragments, strict=True)):
        parts.append(
            pa.scalar(("{" if i == 0 else ",") + json.dumps(name, ensure_ascii=False) + ":")
        )
        parts.append(fragment)
    parts.append(pa.scalar("}"))
    return concat(*parts)


def sparse_json_objects(
    names: Sequence[str], fragments: Sequence[pa.Array], masks: Sequence[np.ndarray], length: int
) -> pa.Array:
    """One JSON object per row holding only the keys whose mask is set on that row."""
    parts = []
    for name, fragment, mask in zip(names, fragments, masks, strict=True):
        if not mask.any():
            continue
        entry = concat(pa.scalar(json.dumps(name, ensure_ascii=False) + ":"), fragment, ",")
        parts.append(pc.if_else(pa.array(mask), entry, pa.scalar("")))
    if not parts:
        return pa.array(["{}"] * length, STRING)
    body = pc.utf8_rtrim(concat(*parts), ",")
    return concat(pa.scalar("{"), body, pa.scalar("}"))


def json_numbers(array: pa.Array) -> pa.Array:
    """JSON text of an integer, float or boolean array (null -> `null`)."""
    kind = array.type
    if pa.types.is_boolean(kind):
        out = pc.if_else(array, pa.scalar("true"), pa.scalar("false"))
    elif pa.types.is_integer(kind):
        out = pc.cast(array, STRING)
    else:
        finite = as_numpy_bool(pc.is_finite(array))
        text = pc.cast(array, STRING)
        # Arrow writes 1200.0 as "1200", which JSON would read back as an integer
        plain = as_numpy_bool(pc.match_substring_regex(text, r"^-?[0-9]+$"))
        out = pc.if_else(pa.array(plain), concat(text, pa.scalar(".0")), text)
        odd = ~finite & as_numpy_bool(pc.is_valid(array))
        if odd.any():  # inf, nan: as json.dumps writes them (Infinity, NaN)
            values = array.filter(pa.array(odd)).to_pylist()
            out = pc.replace_with_mask(
                out, pa.array(odd), pa.array([json.dumps(v) for v in values], STRING)
            )
    return pc.fill_null(out, "null")


# -- typed fields -----------------------------------------------------------------------------


@dataclass
class Coerced:
    """A field column after coercion: JSON text per row, and what happened to each cell."""

    fragments: pa.Array  # JSON text of the typed value, `null` when missing
    missing: np.ndarray  # no value (missing before, an error, or an empty list)
    lossy: np.ndarray  # the raw value must be kept
    errors: pa.Array  # the reason of a type error, else null
    values: pa.Array | None = None  # typed values when a kernel has them (dates: ISO text)


def python_coercion(
    values: list[Any], ftype: str
) -> tuple[list[str], list[bool], list[bool], list[str | None]]:
    """`cells.coerce_cell` value by value: (JSON fragments, missing, lossy, error reasons)."""
    fragments, missing, lossy, errors = [], [], [], []
    for value in values:
        if value is None:
            fragments.append("null")
            missing.append(True)
            lossy.append(False)
            errors.append(None)
            continue
        try:
            typed, lost = coerce_cell(value, ftype)
        except ValueError as exc:
            fragments.append("null")
            missing.append(True)
            lossy.append(True)
            errors.append(str(exc))
            continue
        fragments.append("null" if typed is None else dumps(typed))
        missing.append(typed is None)
        lossy.append(lost)
        errors.append(None)
    return fragments, missing, lossy, errors


def _days_in_month(year: np.ndarray, month: np.ndarray) -> np.ndarray:
    days = np.array([31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31])[np.clip(month, 1, 12) - 1]
    leap = (year % 4 == 0) & ((year % 100 != 0) | (year % 400 == 0))
    return days + ((month == 2) & leap)


def valid_iso_dates(text: pa.Array) -> np.ndarray:
    """For strings starting with `YYYY-MM-DD`: is that a real calendar date (year >= 1)?"""
    year = pc.cast(pc.utf8_slice_codeunits(text, 0, 4), pa.int32()).to_numpy(zero_copy_only=False)
    month = pc.cast(pc.utf8_slice_codeunits(text, 5, 7), pa.int32()).to_numpy(zero_copy_only=False)
    day = pc.cast(pc.utf8_slice_codeunits(text, 8, 10), pa.int32()).to_numpy(zero_copy_only=False)
    ok = (year >= 1) & (month >= 1) & (month <= 12) & (day >= 1)
    return ok & (day <= _days_in_month(year, month))


_ISO_DATE = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$"
_ISO_DATETIME = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9:.]+(?:Z|[+-][0-9]{2}:?[0-9]{2})?$"


def _coerce_distinct(values: pa.Array, ftype: str) -> Coerced:
    """Coerce distinct, non-null cleaned strings; vectorised shapes first, Python for the rest."""
    n = len(values)
    fragments = pa.array(["null"] * n, STRING)
    missing = np.zeros(n, bool)
    lossy = np.zeros(n, bool)
    done = np.zeros(n, bool)
    dates: pa.Array | None = None
    if ftype == "integer":
        done = as_numpy_bool(pc.match_substring_regex(values, r"^-?(?:0|[1-9][0-9]{0,14})$"))
        fragments = pc.if_else(pa.array(done), values, fragments)
    elif ftype == "number":
        done = as_numpy_bool(pc.match_substring_regex(values, "^" + LOSSLESS_NUMBER + "$"))
        whole = as_numpy_bool(pc.match_substring_regex(values, "^" + LOSSLESS_INTEGER + "$"))
        text = pc.if_else(pa.array(whole), concat(values, pa.scalar(".0")), values)
        fragments = pc.if_else(pa.array(done), text, fragments)
    elif ftype == "date":
        iso = as_numpy_bool(pc.match_substring_regex(values, _ISO_DATE))
        stamp = as_numpy_bool(pc.match_substring_regex(values, _ISO_DATETIME))
        shaped = iso | stamp
        valid = np.zeros(n, bool)
        if shaped.any():
            valid[shaped] = valid_iso_dates(values.filter(pa.array(shaped)))
        done = valid
        lossy = stamp & valid
        day = pc.utf8_slice_codeunits(values, 0, 10)
        fragments = pc.if_else(
            pa.array(done), concat(pa.scalar('"'), day, pa.scalar('"')), fragments
        )
        dates = with_nulls(day, ~done)
    errors = pa.nulls(n, STRING)
    rest = ~done
    if rest.any():
        py_fragments, py_missing, py_lossy, py_errors = python_coercion(
            values.filter(pa.array(rest)).to_pylist(), ftype
        )
        mask = pa.array(rest)
        fragments = pc.replace_with_mask(fragments, mask, pa.array(py_fragments, STRING))
        errors = pc.replace_with_mask(errors, mask, pa.array(py_errors, STRING))
        missing[rest] = py_missing
        lossy[rest] = py_lossy
        if ftype == "date":
            # parse_date output is ISO text: the JSON fragment without its quotes
            parsed = [f[1:-1] if f != "null" else None for f in py_fragments]
            dates = pc.replace_with_mask(dates, mask, pa.array(parsed, STRING))
    return Coerced(fragments, missing, lossy, errors, dates)


def _coerce_lists(values: pa.Array) -> Coerced:
    """`list` fields: split on , ; | (whitespace around them dropped), empty items dropped."""
    n = len(values)
    lists = pc.split_pattern_regex(values, pattern=" ?[,;|] ?")
    items = pc.list_flatten(lists)
    parents = pc.list_parent_indices(lists).to_numpy()
    keep = as_numpy_bool(pc.not_equal(items, ""))
    items = items.filter(pa.array(keep))
    parents = parents[keep]
    counts = np.bincount(parents, minlength=n)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    kept = pa.ListArray.from_arrays(pa.array(offsets), items)
    escaped = pc.replace_substring(pc.replace_substring(items, "\\", "\\\\"), '"', '\\"')
    joined = pc.binary_join(pa.ListArray.from_arrays(pa.array(offsets), escaped), '","')
    empty = counts == 0
    fragments = pc.if_else(
        pa.array(empty), pa.scalar("null"), concat(pa.scalar('["'), joined, pa.scalar('"]'))
    )
    lossy = empty | as_numpy_bool(pc.not_equal(pc.binary_join(kept, ", "), values))
    return Coerced(fragments, empty, lossy, pa.nulls(n, STRING))


def coerce_strings(cleaned: pa.Array, ftype: str) -> Coerced:
    """Coerce a cleaned string column (null = missing) to a field type, per distinct value."""
    n = len(cleaned)
    if ftype == "string":
        missing = as_numpy_bool(pc.is_null(cleaned))
        fragments = json_strings(cleaned, may_hold_controls=False)
        return Coerced(fragments, missing, np.zeros(n, bool), pa.nulls(n, STRING), cleaned)
    encoded = pc.dictionary_encode(cleaned)
    indices = encoded.indices
    distinct = encoded.dictionary
    if ftype == "list":
        per = _coerce_lists(distinct)
    else:
        per = _coerce_distinct(distinct, ftype)
    absent = as_numpy_bool(pc.is_null(indices))
    safe = pc.fill_null(indices, 0)
    if len(distinct) == 0:
        return Coerced(
            pa.array(["null"] * n, STRING),
            np.ones(n, bool),
            np.zeros(n, bool),
            pa.nulls(n, STRING),
            pa.nulls(n, STRING),
        )
    take = safe.to_numpy(zero_copy_only=False)
    fragments = with_nulls(per.fragments.take(safe), absent)
    values = None if per.values is None else with_nulls(per.values.take(safe), absent)
    return Coerced(
        pc.fill_null(fragments, "null"),
        absent | per.missing[take],
        ~absent & per.lossy[take],
        with_nulls(per.errors.take(safe), absent),
        values,
    )


# -- URLs and shards ----------------------------------------------------------------------------

_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOST = rf"(?:{_LABEL}\.)+[A-Za-z]{{2,63}}"
_SCHEME = r"[Hh][Tt][Tt][Pp][Ss]?"
_PATH = r"(?:/[A-Za-z0-9._~-]+)*/?"
_FRAGMENT = r"#[A-Za-z0-9._~-]+"
# scheme optional (then the host must look like one: normalise_url adds http://), no port,
# query, userinfo, percent-escape or dot-segment, a plain fragment at most: the canonical form is
# then scheme and host lower-cased and "/" for an empty path (checked against normalise_url)
_FAST_URL = rf"^(?:{_SCHEME}://)?{_HOST}{_PATH}(?:{_FRAGMENT})?$"
_SLOW_PARTS = r"(?:^|/)\.\.?(?:[/#]|$)|[Xx][Nn]--"


def fast_urls(tokens: pa.Array) -> tuple[np.ndarray, pa.Array, pa.Array]:
    """(covered, canonical URL, host) for the tokens whose canonical form needs no Python."""
    covered = as_numpy_bool(pc.match_substring_regex(tokens, _FAST_URL))
    covered &= ~as_numpy_bool(pc.match_substring_regex(tokens, _SLOW_PARTS))
    covered &= as_numpy_bool(pc.less_equal(pc.utf8_length(tokens), 2000))
    # plain string operations from here (cheaper than regex groups); only covered tokens count
    head = pc.utf8_lower(pc.utf8_slice_codeunits(tokens, 0, 8))
    scheme = pc.if_else(pc.starts_with(head, "https://"), pa.scalar("https"), pa.scalar("http"))
    rest = pc.replace_substring_regex(tokens, f"^{_SCHEME}://", "", max_replacements=1)
    host = pc.utf8_lower(pc.replace_substring_regex(rest, "[/#].*", "", max_replacements=1))
    tail = pc.replace_substring_regex(rest, "^[^/#]*", "", max_replacements=1)
    slash = pc.or_(pc.equal(tail, ""), pc.starts_with(tail, "#"))
    covered &= as_numpy_bool(pc.less_equal(pc.utf8_length(host), 253))
    url = concat(scheme, pa.scalar("://"), host, pc.if_else(slash, "/", ""), tail)
    return covered, url, host


@dataclass
class NormalisedTokens:
    urls: pa.Array  # canonical URL, or null when invalid
    reasons: list[str | None]  # normalise_url's reason for invalid tokens (None when valid)
    hosts: pa.Array  # host of the canonical URL when the fast path knows it, else null


def normalise_tokens(tokens: pa.Array) -> NormalisedTokens:
    """normalise_url on distinct tokens: the fast shape vectorised, the rest in Python."""
    covered, url, host = fast_urls(tokens)
    urls = with_nulls(url, ~covered)
    hosts = with_nulls(host, ~covered)
    reasons: list[str | None] = [None] * len(tokens)
    rest = np.flatnonzero(~covered)
    if len(rest):
        results = [normalise_url(t) for t in tokens.take(pa.array(rest)).to_pylist()]
        urls = pc.replace_with_mask(
            urls, pa.array(~covered), pa.array([u for u, _ in results], STRING)
        )
        for i, (_, reason) in zip(rest.tolist(), results, strict=True):
            reasons[i] = reason
    return NormalisedTokens(urls, reasons, hosts)


@dataclass(frozen=True)
class SuffixShapes:
    """The public-suffix rules, arranged for a vectorised registrable domain."""

    rules: frozenset[str]  # every rule, wildcards (*.ck) and exceptions (!www.ck) as written
    extended: frozenset[str]  # suffixes some longer rule (or wildcard/exception) ends with
    tops: frozenset[str]  # one-label rules without a wildcard below them (com, io, fr, ...)
    seconds: frozenset[str]  # two-label rules nothing extends (co.uk, com.au, ...)
    known_tlds: frozenset[str]  # the last label of any rule


@functools.cache
def suffix_shapes() -> SuffixShapes:
    import tldextract

    # the same offline snapshot and options as enrich_crawl.dataset.shard uses
    rules = set(tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None).tlds)
    extended: set[str] = set()
    for rule in rules:
        labels = rule.lstrip("!").split(".")
        for k in range(1, len(labels)):
            extended.add(".".join(labels[k:]))
    wildcard = {r[2:] for r in rules if r.startswith("*.")}
    tops = {r for r in rules if "." not in r and r.isascii() and r.isalpha()} - wildcard
    seconds = {
        r
        for r in rules
        if r.count(".") == 1 and r.isascii() and "*" not in r and "!" not in r and "xn--" not in r
    }
    return SuffixShapes(
        rules=frozenset(rules),
        extended=frozenset(extended),
        tops=frozenset(tops),
        seconds=frozenset(seconds - extended),
        known_tlds=frozenset(r.rsplit(".", 1)[-1] for r in rules),
    )


def registrable_domains(hosts: pa.Array) -> pa.Array:
    """shard.registrable_domain of distinct lower-case hosts (null = no host).

    Vectorised for hosts of plain labels when the public suffix is plainly the top label
    (example.com, example.io: no rule for example.io nor below it), a two-label rule nothing
    extends (example.co.uk), or when no rule knows the top label (example.test: the last two
    labels); tldextract decides the rest.
    """
    shapes = suffix_shapes()
    plain = as_numpy_bool(
        pc.and_(
            pc.match_substring_regex(hosts, "^" + _HOST + "$"),
            pc.invert(pc.match_substring(hosts, "xn--")),
        )
    )
    # the last three labels, by splitting the reversed host ("" where a host has fewer)
    reversed_labels = pc.split_pattern(
        concat(pc.utf8_reverse(hosts), pa.scalar("...")), pattern=".", max_splits=3
    )
    tld = pc.utf8_reverse(pc.list_element(reversed_labels, 0))
    two = concat(pc.utf8_reverse(pc.list_element(reversed_labels, 1)), pa.scalar("."), tld)
    l3 = pc.utf8_reverse(pc.list_element(reversed_labels, 2))
    three = pc.if_else(pc.equal(l3, ""), pa.scalar(None, STRING), concat(l3, pa.scalar("."), two))

    def member(values: pa.Array, names: frozenset[str]) -> np.ndarray:
        return as_numpy_bool(pc.is_in(values, value_set=pa.array(sorted(names), STRING)))

    two_free = ~member(two, shapes.rules) & ~member(two, shapes.extended)
    by_top = plain & member(tld, shapes.tops) & two_free
    unknown = plain & ~member(tld, shapes.known_tlds)
    by_second = plain & member(two, shapes.seconds) & as_numpy_bool(pc.is_valid(three))
    domains = pc.if_else(pa.array(by_second), three, pa.scalar(None, STRING))
    domains = pc.if_else(pa.array(by_top | unknown), two, domains)
    done = by_top | unknown | by_second
    rest = np.flatnonzero(~done & as_numpy_bool(pc.is_valid(hosts)))
    if len(rest):
        values = [registrable_domain(h) for h in hosts.take(pa.array(rest)).to_pylist()]
        mask = np.zeros(len(hosts), bool)
        mask[rest] = True
        domains = pc.replace_with_mask(domains, pa.array(mask), pa.array(values, STRING))
    return domains


def shard_index_array(domains: list[str], count: int) -> np.ndarray:
    """shard.shard_index of each domain (the same blake2b digest, without a call per domain)."""
    digests = b"".join(blake2b(d.encode("utf-8"), digest_size=8).digest() for d in domains)
    return (np.frombuffer(digests, dtype=">u8") % np.uint64(count)).astype(np.int32)


def shard_indices(first_urls: pa.Array, first_hosts: pa.Array, count: int) -> np.ndarray:
    """shard.shard_for_urls for each record given its first URL (null: no URL), as key indices."""
    hosts = first_hosts
    unknown = as_numpy_bool(pc.and_(pc.is_null(hosts), pc.is_valid(first_urls)))
    if unknown.any():
        found = [host_of(u) for u in first_urls.filter(pa.array(unknown)).to_pylist()]
        hosts = pc.replace_with_mask(hosts, pa.array(unknown), pa.array(found, STRING))
    has_url = as_numpy_bool(pc.is_valid(first_urls))
    hosts = pc.if_else(pa.array(has_url), pc.fill_null(hosts, ""), pa.scalar(None, STRING))
    encoded = pc.dictionary_encode(hosts)
    distinct = encoded.dictionary
    nonempty = as_numpy_bool(pc.not_equal(distinct, ""))
    domains = pa.array([""] * len(distinct), STRING)
    if nonempty.any():
        domains = pc.replace_with_mask(
            domains, pa.array(nonempty), registrable_domains(distinct.filter(pa.array(nonempty)))
        )
    per_host = shard_index_array(domains.to_pylist(), count)
    out = np.full(len(first_urls), shard_index("", count), dtype=np.int32)
    if len(per_host):
        idx = encoded.indices.to_numpy(zero_copy_only=False)
        out[has_url] = per_host[idx[has_url].astype(np.int64)]
    return out
