"""Extraction cost: the mapping engine against plain lxml doing the same work, on the Python docs.

    python -m bench.bench_extract [--rounds 6] [--pages N]

Corpus: every HTML page of Debian's python3.11-doc (530 pages, ~96 KB each), held in memory. Each
page is extracted for its first documented module (`#module-<name>` fragment, empty for pages
without one) by the `python_docs_module` mapping: title, synopsis, source path, added-in version
and the module-index link.

Cases, interleaved in each round (the machine is shared and noisy; the ratio of one round is the
figure, the median over rounds is reported with min-max):

- `lxml`: hand-written plain lxml: one parse per page (`lxml.html.document_fromstring` with an
  HTMLParser), the mapping's XPath expressions compiled once with `lxml.etree.XPath`, and the same
  post-processing in plain Python (`re`, links resolved as the product resolves them). Its output
  is checked to be identical to the engine's on every page, so both do the same work.
- `engine`: `Page(url, body)` (decoding by the HTML rules, parse) + `run_mapping` per matching
  mapping, as the crawl does.
- `engine_x3`: three mappings matching each page (copies of the mapping under other names): the
  page is still parsed once (the parse count is reported).

Target: engine time within 1.3x of plain lxml. Writes bench/results/bench_extract.json.
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import re
import statistics
import time
from pathlib import Path
from typing import Any

import lxml.etree
import lxml.html

from enrich_crawl.extract import page as page_module
from enrich_crawl.extract.mapping import MappingSet, compile_mapping, run_mapping
from enrich_crawl.extract.page import Page
from enrich_crawl.testing.pydocs import BASE_URL, ensure_corpus, read_inventory
from enrich_crawl.urls import join_url, resolve_link
from enrich_crawl.values import clean_text

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
MAPPING = REPO / "mappings" / "python_docs_module.json"
TARGET_RATIO = 1.3


def load_pages(html: Path, limit: int | None) -> list[tuple[str, str, bytes]]:
    """(url, fragment, body) of every HTML page, with its first module's fragment."""
    first_module: dict[str, str] = {}
    for entry in read_inventory(html / "objects.inv"):
        if entry.role == "py:module":
            page, _, fragment = entry.uri.partition("#")
            first_module.setdefault(page, fragment)
    pages = []
    for path in sorted(html.rglob("*.html")):
        relative = path.relative_to(html).as_posix()
        if relative.startswith("_"):
            continue
        pages.append((BASE_URL + relative, first_module.get(relative, ""), path.read_bytes()))
    return pages[:limit] if limit else pages


class PlainLxml:
    """The mapping's work written by hand with lxml, expressions taken from the mapping file."""

    def __init__(self, raw: dict[str, Any]):
        fields = {f["name"]: f["processors"] for f in raw["fields"]}

        def xp(processors: list[dict], index: int) -> lxml.etree.XPath:
            return lxml.etree.XPath(
                processors[index]["parameters"]["expression"], smart_strings=False
            )

        def param(processors: list[dict], index: int, key: str) -> str:
            return processors[index]["parameters"][key]

        title = fields["title"]
        self.section = xp(title, 0)
        self.heading = xp(title, 1)
        self.heading_text = xp(title, 2)
        synopsis = fields["synopsis"]
        self.link_title = xp(synopsis, 0)
        self.synopsis_re = re.compile(param(synopsis, 2, "pattern"))
        self.suffix_re = re.compile(param(synopsis, 3, "pattern"))
        source = fields["source_path"]
        self.source = xp(source, 1)
        self.source_filter = re.compile(param(source, 3, "pattern"))
        added = fields["added_in"]
        self.added = xp(added, 1)
        self.added_re = re.compile(param(added, 2, "pattern"))
        self.modindex = xp(raw["url_parsers"][0]["processors"], 0)
        self.base = lxml.etree.XPath("(//base/@href)[1]")
        self.string = lxml.etree.XPath("string()")
        self.parser = lxml.html.HTMLParser(remove_comments=True, huge_tree=True)

    def run(self, url: str, fragment: str, body: bytes) -> tuple[dict[str, Any], list[str]]:
        root = lxml.html.document_fromstring(body, parser=self.parser)
        out: dict[str, Any] = {}
        sections = self.section(root, fragment=fragment)
        section = sections[0] if sections else None
        if section is not None:
            for heading in self.heading(section)[:1]:
                text = clean_text("".join(self.heading_text(heading)))
                if text:
                    out["title"] = text
        titles = self.link_title(root, fragment=fragment)
        if titles:
            match = self.synopsis_re.search(titles[0])
            if match:
                text = clean_text(self.suffix_re.sub("", match.group(1)))
                if text:
                    out["synopsis"] = text
        if section is not None:
            for link in self.source(section):
                text = clean_text(self.string(link))
                if self.source_filter.search(text):
                    out["source_path"] = text
                    break
            for note in self.added(section):
                match = self.added_re.search(self.string(note))
                if match:
                    out["added_in"] = match.group(1)
                    break
        base = self.base(root)
        base_url = (join_url(url, base[0]) or url) if base else url
        links = []
        for href in self.modindex(root):
            link, _ = resolve_link(base_url, href)
            if link and link not in links:
                links.append(link)
        return out, links


def engine_run(mappings: MappingSet, url: str, fragment: str, body: bytes):
    page = Page(url, body, content_type="text/html")
    fields: dict[str, Any] = {}
    links: list[str] = []
    for mapping in mappings.matching(url + (f"#{fragment}" if fragment else "")):
        result = run_mapping(mapping, page, fragment=fragment, record_id="")
        for name, value in result.fields.items():
            fields.setdefault(name, value)
        links.extend(link for link in result.links if link not in links)
    return fields, links


def timed(func, pages) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of func over all pages."""
    wall, cpu = time.perf_counter(), time.process_time()
    for url, fragment, body in pages:
        func(url, fragment, body)
    return time.perf_counter() - wall, time.process_time() - cpu


def summary(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 4),
        "min": round(min(values), 4),
        "max": round(max(values), 4),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--pages", type=int, help="only the first N pages")
    args = parser.parse_args(argv)

    html = ensure_corpus()
    pages = load_pages(html, args.pages)
    raw = json.loads(MAPPING.read_text(encoding="utf-8"))
    one = MappingSet([compile_mapping(raw, MAPPING)])
    copies = []
    for i in range(3):
        twin = copy.deepcopy(raw)
        twin["name"] = f"{raw['name']}_{i}"
        copies.append(compile_mapping(twin, MAPPING))
    three = MappingSet(copies)
    plain = PlainLxml(raw)

    # same output on every page: both sides do the same work
    differences = []
    for url, fragment, body in pages:
        expected = plain.run(url, fragment, body)
        got = engine_run(one, url, fragment, body)
        if got != expected:
            differences.append({"url": url, "lxml": expected, "engine": got})
    if differences:
        print(json.dumps(differences[:3], indent=2, ensure_ascii=False))
        raise SystemExit(f"engine and plain lxml disagree on {len(differences)} page(s)")
    filled = sum(1 for u, f, b in pages if engine_run(one, u, f, b)[0])

    # one parse per page however many mappings match
    parses = 0
    original = page_module.lxml.html.document_fromstring

    def counting(*a, **k):
        nonlocal parses
        parses += 1
        return original(*a, **k)

    page_module.lxml.html.document_fromstring = counting
    try:
        for url, fragment, body in pages:
            engine_run(three, url, fragment, body)
    finally:
        page_module.lxml.html.document_fromstring = original

    cases = {
        "lxml": plain.run,
        "engine": lambda u, f, b: engine_run(one, u, f, b),
        "engine_x3": lambda u, f, b: engine_run(three, u, f, b),
    }
    rounds: list[dict[str, Any]] = []
    for number in range(args.rounds):
        order = list(cases)
        if number % 2:
            order.reverse()
        row: dict[str, Any] = {}
        for name in order:
            wall, cpu = timed(cases[name], pages)
            row[name] = {"wall": wall, "cpu": cpu}
        row["ratio"] = row["engine"]["cpu"] / row["lxml"]["cpu"]
        row["ratio_x3"] = row["engine_x3"]["cpu"] / row["lxml"]["cpu"]
        rounds.append(row)
        print(
            f"round {number + 1}: lxml {len(pages) / row['lxml']['cpu']:.0f} pages/s, "
            f"engine {len(pages) / row['engine']['cpu']:.0f} pages/s (x{row['ratio']:.3f}), "
            f"3 mappings {len(pages) / row['engine_x3']['cpu']:.0f} pages/s "
            f"(x{row['ratio_x3']:.3f})",
            flush=True,
        )

    n = len(pages)
    result = {
        "benchmark": "bench_extract",
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"python": platform.python_version(), "cpus": __import__("os").cpu_count()},
        "corpus": {"pages": n, "bytes": sum(len(b) for _, _, b in pages), "with_fields": filled},
        "rounds": args.rounds,
        "pages_per_s_cpu": {name: summary([n / r[name]["cpu"] for r in rounds]) for name in cases},
        "ms_per_page_cpu": {
            name: summary([1000 * r[name]["cpu"] / n for r in rounds]) for name in cases
        },
        "ratio_engine_vs_lxml": summary([r["ratio"] for r in rounds]),
        "ratio_engine_x3_vs_lxml": summary([r["ratio_x3"] for r in rounds]),
        "parses_with_3_mappings": parses,
        "target_ratio": TARGET_RATIO,
        "meets_target": statistics.median(r["ratio"] for r in rounds) <= TARGET_RATIO,
        "identical_output": True,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "bench_extract.json"
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({k: result[k] for k in list(result)[4:]}, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
