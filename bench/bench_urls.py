"""URL handling, the hand-written normaliser it replaced vs the WHATWG parser (ada), same run.

    python -m bench.bench_urls [--rows 200000] [--repeats 5] [--results FILE]

Cases, interleaved round by round (the machine is shared; the median over rounds is reported):

- `cells`: every URL token of the URL columns of a generated dirty table
  (`enrich_crawl.dataset.synth`, the table `bench.bench_load` loads), each through the Python rule
  (`normalise_url`), as the row-at-a-time reference does: tokens per second, old vs new.
- `loader`: the loader's URL stage on the distinct tokens (`vector.normalise_tokens`: the
  vectorised fast shape, the Python rule for the rest), with the old rule vs the new one.
- `links`: links of pages resolved against their page (`urljoin` + old normaliser vs
  `resolve_link`), on a mix of relative, absolute, fragment and query links (caches cleared).
- `split`: URL cells split (`split_url_cell`: on every `,`/`;` before, only before a URL now).

Also reported, not timed: each normaliser against the WPT URL test data's http(s) cases
(enrich_crawl_tests/fixtures/wpt_url_http.json): invalid URLs accepted, valid URLs made into
another resource, valid URLs refused. Results go to bench/results/bench_urls.json with `checks`.

The old normaliser is kept below (from enrich_crawl/urls.py before the change), only for this
comparison.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import ipaddress
import json
import os
import platform
import posixpath
import re
import socket
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit, urlunsplit

import pyarrow as pa

RESULTS = Path(__file__).resolve().parent / "results"
WPT = (
    Path(__file__).resolve().parent.parent / "enrich_crawl_tests" / "fixtures" / "wpt_url_http.json"
)


# -- the old normaliser (enrich_crawl/urls.py at 58482ee), for the comparison only ---------------

_OLD_CELL_SPLIT = re.compile(r"[\s,;]+")
_OLD_HOSTLIKE = re.compile(
    r"^(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+[A-Za-z]{2,63}\.?(?::\d+)?(?:[/?#]|$)"
)
_OLD_LABEL = re.compile(r"^(?!-)[a-z0-9_-]{1,63}(?<!-)$")
_OLD_ENDS_IN_NUMBER = re.compile(r"(?:^|\.)(?:\d+|0x[0-9a-f]*)$")


def old_split_url_cell(cell: object) -> list[str]:
    if cell is None:
        return []
    text = str(cell).strip()
    return [t for t in _OLD_CELL_SPLIT.split(text) if t] if text else []


def _old_valid_host(host: str) -> bool:
    if not host or len(host) > 253:
        return False
    try:
        ipaddress.ip_address(host.strip("[]"))
        return True
    except ValueError:
        pass
    return all(_OLD_LABEL.match(label) for label in host.rstrip(".").split("."))


def _old_ip_literal(host: str):
    host = host.strip().lower().rstrip(".")
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        pass
    if not _OLD_ENDS_IN_NUMBER.search(host):
        return None
    try:
        return ipaddress.IPv4Address(socket.inet_aton(host))
    except (OSError, ValueError):
        return None


def _old_idna(host: str) -> str | None:
    if host.isascii():
        return host
    try:
        import idna

        return idna.encode(host, uts46=True).decode("ascii")
    except (ImportError, UnicodeError, ValueError):
        try:
            return host.encode("idna").decode("ascii")
        except UnicodeError:
            return None


def _old_remove_dot_segments(path: str) -> str:
    if "." not in path:
        return path
    segments = path.split("/")
    if not any(s in (".", "..") for s in segments):
        return path
    resolved = posixpath.normpath(path)
    if resolved.startswith("//"):
        resolved = "/" + resolved.lstrip("/")
    if path.endswith(("/", "/.", "/..")) and not resolved.endswith("/"):
        resolved += "/"
    return resolved


def old_normalise_url(token: str) -> tuple[str | None, str | None]:
    from w3lib.url import canonicalize_url, safe_url_string

    text = token.strip().strip("<>\"'")
    if not text:
        return None, "invalid_url: empty"
    if text.startswith("//"):
        text = "http:" + text
    elif _OLD_HOSTLIKE.match(text):
        text = "http://" + text
    try:
        parts = urlsplit(text)
    except ValueError as exc:
        return None, f"invalid_url: {exc}"
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        return None, "invalid_url: not a URL" if not scheme else "invalid_url: unsupported scheme"
    try:
        host = parts.hostname or ""
        port = parts.port
    except ValueError as exc:
        return None, f"invalid_url: {exc}"
    if parts.username is not None or parts.password is not None:
        return None, "invalid_url: credentials in URL"
    ascii_host = _old_idna(host)
    if ascii_host is None:
        return None, "invalid_url: bad host"
    if _OLD_ENDS_IN_NUMBER.search(ascii_host.strip().lower().rstrip(".")):
        address = _old_ip_literal(ascii_host)
        if address is None:
            return None, "invalid_url: bad IP address"
        ascii_host = f"[{address}]" if address.version == 6 else str(address)
    elif not _old_valid_host(ascii_host):
        return None, "invalid_url: bad host"
    elif ":" in ascii_host:
        ascii_host = f"[{ipaddress.ip_address(ascii_host)}]"
    default_port = {"http": 80, "https": 443}[scheme]
    netloc = ascii_host if port in (None, default_port) else f"{ascii_host}:{port}"
    path = _old_remove_dot_segments(parts.path)
    text = urlunsplit((scheme, netloc, path, parts.query, parts.fragment))
    try:
        return canonicalize_url(safe_url_string(text), keep_fragments=True), None
    except ValueError as exc:
        return None, f"invalid_url: {exc}"


@functools.lru_cache(maxsize=4096)
def old_normalise_link(url: str) -> tuple[str | None, str | None]:
    return old_normalise_url(url)


def old_resolve_link(base: str, href: str) -> tuple[str | None, str | None]:
    try:
        return old_normalise_link(urljoin(base, href.strip()))
    except ValueError:
        return None, "invalid_url"


# -- inputs -------------------------------------------------------------------------------------


def cell_tokens(rows: int) -> tuple[list[str], list[str]]:
    """(URL cells, their tokens split the new way) of the URL columns of a generated table."""
    from enrich_crawl.dataset import synth
    from enrich_crawl.urls import split_url_cell

    table, _ = synth.dirty_table(rows, seed=1)
    cells = [c for name in ("website", "profile_url") for c in table[name].to_pylist() if c]
    tokens = [t for cell in cells for t in split_url_cell(cell)]
    return cells, tokens


def links(count: int) -> list[tuple[str, str]]:
    """(page URL, href) pairs shaped like the links of documentation and shop pages."""
    hrefs = [
        "../library/os.html",
        "os.path.html#os.path.join",
        "/3/glossary.html",
        "#module-os",
        "https://docs.python.org/3/library/functions.html",
        "//cdn.example.net/static/app.js",
        "?page=2&sort=price",
        "/c/kueche/wasserkocher/?sort=price&page=1",
        "mailto:docs@python.org",
        "javascript:void(0)",
        "./a/../b/./c.html",
        "https://other.example/p/%7Euser/./x/../y",
        "contact,fr,7,5.cfm",
        "/item;jsessionid=A1B2?x=1",
        "https://www.example.com/é/ü?q=ö",
    ]
    out = []
    for i in range(count):
        base = f"https://site{i % 97}.example/docs/{i % 13}/page{i % 31}.html"
        out.append((base, hrefs[i % len(hrefs)]))
    return out


# -- conformance --------------------------------------------------------------------------------


def conformance(normalise: Callable[[str], tuple[str | None, str | None]]) -> dict[str, int]:
    data = json.loads(WPT.read_text(encoding="utf-8"))
    counts = {"cases": 0, "invalid_accepted": 0, "valid_changed": 0, "valid_refused": 0}
    for case in data["no_base"]:
        expected = case.get("current") or (None if case.get("failure") else case["href"])
        url, _ = normalise(case["input"])
        counts["cases"] += 1
        if expected is None:
            counts["invalid_accepted"] += url is not None
        elif url is None:
            counts["valid_refused"] += 1
        elif url != expected:
            counts["valid_changed"] += 1
    return counts


POLICY = "single-label host"  # enrich_crawl.urls.SINGLE_LABEL (the old code has no such rule)


def link_conformance(resolve: Callable[[str, str], tuple[str | None, str | None]]) -> dict:
    data = json.loads(WPT.read_text(encoding="utf-8"))
    counts = {"cases": 0, "differ_from_browser": 0}
    for case in data["base_relative"]:
        expected = case.get("current") or (None if case.get("failure") else case["href"])
        if expected is not None and not expected.startswith(("http:", "https:")):
            continue  # other schemes: refused by both, by policy
        url, reason = resolve(case["base"], case["input"])
        counts["cases"] += 1
        # documented policies of the product, not the parser: credentials, single-label hosts
        refused_by_policy = url is None and reason and ("credentials" in reason or POLICY in reason)
        if url != expected and not refused_by_policy:
            counts["differ_from_browser"] += 1
    return counts


# -- timing -------------------------------------------------------------------------------------


def _timed(fn: Callable[[], int]) -> tuple[float, int]:
    start = time.perf_counter()
    n = fn()
    return time.perf_counter() - start, n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_urls", description=__doc__)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--links", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--results", type=Path, default=RESULTS / "bench_urls.json")
    args = parser.parse_args(argv)

    import enrich_crawl.dataset.vector as vec
    from enrich_crawl import urls

    cells, tokens = cell_tokens(args.rows)
    distinct = pa.array(sorted(set(tokens)), pa.string())
    pairs = links(args.links)
    print(f"{len(cells):,} cells, {len(tokens):,} tokens ({len(distinct):,} distinct)", flush=True)

    def loader(rule: Callable) -> int:
        saved = vec.normalise_url
        vec.normalise_url = rule
        try:
            vec.normalise_tokens(distinct)
        finally:
            vec.normalise_url = saved
        return len(distinct)

    def resolve_all(resolve: Callable, clear: Callable) -> int:
        clear()
        for base, href in pairs:
            resolve(base, href)
        return len(pairs)

    cases: dict[str, Callable[[], int]] = {
        "cells/old": lambda: sum(1 for t in tokens if old_normalise_url(t)),
        "cells/new": lambda: sum(1 for t in tokens if urls.normalise_url(t)),
        "loader/old": lambda: loader(old_normalise_url),
        "loader/new": lambda: loader(urls.normalise_url),
        "links/old": lambda: resolve_all(old_resolve_link, old_normalise_link.cache_clear),
        "links/new": lambda: resolve_all(urls.resolve_link, urls.clear_link_caches),
        "split/old": lambda: sum(len(old_split_url_cell(c)) for c in cells),
        "split/new": lambda: sum(len(urls.split_url_cell(c)) for c in cells),
    }
    seconds: dict[str, list[float]] = {name: [] for name in cases}
    units: dict[str, int] = {}
    load_before = os.getloadavg()
    for round_ in range(args.repeats):
        order = list(cases) if round_ % 2 == 0 else list(reversed(cases))
        for name in order:
            took, n = _timed(cases[name])
            seconds[name].append(took)
            units[name] = n
        print(f"round {round_}: " + ", ".join(f"{k} {v[-1]:.3f}s" for k, v in seconds.items()))

    report: dict[str, Any] = {}
    for name, runs in seconds.items():
        median = statistics.median(runs)
        report[name] = {
            "units": units[name],
            "seconds": {"median": round(median, 4), "min": round(min(runs), 4)},
            "per_s": round(units[name] / median),
        }
    speedups = {
        kind: round(report[f"{kind}/new"]["per_s"] / report[f"{kind}/old"]["per_s"], 2)
        for kind in ("cells", "loader", "links", "split")
    }
    wpt = {"old": conformance(old_normalise_url), "new": conformance(urls.normalise_url)}
    wpt_links = {
        "old": link_conformance(old_resolve_link),
        "new": link_conformance(urls.resolve_link),
    }
    checks = {
        f"{kind}_no_slower": {
            "value": speedups[kind],
            "target": ">= 1.0",
            "ok": speedups[kind] >= 1,
        }
        for kind in ("cells", "loader", "links")
    }
    checks["wpt_no_invalid_accepted"] = {
        "value": wpt["new"]["invalid_accepted"],
        "target": 0,
        "ok": wpt["new"]["invalid_accepted"] == 0,
    }
    checks["wpt_no_valid_changed"] = {
        "value": wpt["new"]["valid_changed"],
        "target": 0,
        "ok": wpt["new"]["valid_changed"] == 0,
    }
    checks["wpt_links_as_browser"] = {
        "value": wpt_links["new"]["differ_from_browser"],
        "target": 0,
        "ok": wpt_links["new"]["differ_from_browser"] == 0,
    }
    results = {
        "benchmark": "urls",
        "when": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
        },
        "inputs": {
            "rows": args.rows,
            "cells": len(cells),
            "tokens": len(tokens),
            "distinct_tokens": len(distinct),
            "links": len(pairs),
            "repeats": args.repeats,
        },
        "cases": report,
        "speedup_new_over_old": speedups,
        "wpt_no_base": wpt,
        "wpt_base_relative": wpt_links,
        "checks": checks,
        "note": "per_s: tokens (cells, loader: distinct tokens; links: links; split: cells) per "
        "second of the median round; valid_refused counts the documented policy refusals "
        "(credentials, unresolvable and single-label host names) of the new code",
    }
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    print(json.dumps({"speedup_new_over_old": speedups, "wpt": wpt, "links": wpt_links}))
    print("checks: " + ", ".join(f"{k}={'ok' if v['ok'] else 'FAIL'}" for k, v in checks.items()))
    return 0 if all(c["ok"] for c in checks.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
