"""What the baselines share: the records of a dataset, RFC 9309 robots rules, naive link following,
extraction with the product's mappings, and the per-record output format.

Baselines read the same dataset spec and table as the product (its public formats), and extract with
the product's own mapping engine (``enrich_crawl.extract``), so only the crawling strategy differs.
"""

from __future__ import annotations

import csv
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import protego

from bench.e2e.agents import BFS_UA, FLOOR_UA, SEED_UA  # noqa: F401 (re-exported)
from enrich_crawl.dataset.shard import shard_for_urls, shard_keys
from enrich_crawl.dataset.spec import load_spec
from enrich_crawl.extract import MappingSet, Page, run_mapping
from enrich_crawl.urls import normalise_url, resolve_link, split_url_cell, without_fragment
from enrich_crawl.values import coerce, is_missing

DEFAULT_DELAY = 1.0
RETRY_CODES = (500, 502, 503, 504, 522, 524, 408, 429)
# what a crawler skips by extension (a subset of the product's deny list is enough here)
SKIP_EXTENSIONS = (
    ".jpg",
    ".jpeg",
    ".png",
    ".gif",
    ".svg",
    ".ico",
    ".css",
    ".js",
    ".pdf",
    ".zip",
    ".gz",
    ".mp4",
    ".mp3",
    ".woff",
    ".woff2",
)


@dataclass
class BenchRecord:
    id: str
    urls: list[str]  # normalised seed URLs (with fragments)
    missing: list[str]


def load_records(spec_path: str | Path) -> tuple[list[BenchRecord], dict[str, str]]:
    """The usable records of a dataset (same cleaning rules as the product: missing markers, types,
    URL cells split on whitespace , ;) and the field types. CSV sources only (what the bench writes).
    """
    spec = load_spec(spec_path)
    markers = frozenset(m.strip() for m in spec.missing_values) | frozenset(
        m.strip().lower() for m in spec.missing_values
    )
    field_types = spec.field_types()
    out: list[BenchRecord] = []
    seen: set[str] = set()
    with open(spec.source, newline="", encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            rid = (row.get(spec.id) or "").strip()
            if not rid or rid in seen:
                continue
            seen.add(rid)
            missing = []
            for name, ftype in field_types.items():
                value = row.get(name)
                if is_missing(value, markers):
                    missing.append(name)
                    continue
                try:
                    coerce(" ".join(str(value).split()), ftype)
                except ValueError:
                    missing.append(name)
            urls: list[str] = []
            for column in spec.urls:
                cell = row.get(column)
                if is_missing(cell, markers):
                    continue
                for token in split_url_cell(cell):
                    url, _reason = normalise_url(token)
                    if url is not None and url not in urls:
                        urls.append(url)
            out.append(BenchRecord(rid, urls, missing))
    return out, field_types


def records_of_shard(records: list[BenchRecord], index: int, count: int) -> list[BenchRecord]:
    """The records the product puts in shard ``index`` of ``count`` (same hash of the domain)."""
    keys = shard_keys(count)
    return [r for r in records if shard_for_urls(r.urls, keys) == keys[index]]


# --------------------------------------------------------------------------------------------------
# robots.txt, by the same rules as the product (RFC 9309, docs/crawling.md)


@dataclass
class RobotsRules:
    parser: Any | None  # protego.Protego, or None
    allow_all: bool = False
    disallow_all: bool = False

    @classmethod
    def from_response(cls, status: int | None, body: bytes) -> RobotsRules:
        """2xx: the rules; 4xx: allow all; 5xx or no answer (None): disallow all."""
        if status is None or status >= 500:
            return cls(None, disallow_all=True)
        if status >= 400:
            return cls(None, allow_all=True)
        try:
            text = body.decode("utf-8", errors="replace")
            return cls(protego.Protego.parse(text))
        except Exception:  # unparsable robots.txt: allow all, as Google does
            return cls(None, allow_all=True)

    def allowed(self, url: str, user_agent: str) -> bool:
        if self.disallow_all:
            return False
        if self.allow_all or self.parser is None:
            return True
        return self.parser.can_fetch(url, user_agent)

    def delay(self, user_agent: str, default: float) -> float:
        if self.parser is None:
            return default
        value = self.parser.crawl_delay(user_agent)
        return default if value is None else float(value)


def robots_url(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}/robots.txt"


def host_key(url: str) -> str:
    return (urlsplit(url).hostname or "").lower()


# --------------------------------------------------------------------------------------------------
# pages: naive links and extraction


def naive_links(page: Page) -> list[str]:
    """Every <a href> of the page on the page's own host, absolute, without fragment, deduplicated."""
    tree = page.tree
    if tree is None or page.kind != "html":
        return []
    base = page.base_url
    host = host_key(page.url)
    out: list[str] = []
    seen: set[str] = set()
    for href in tree.xpath("//a/@href"):
        href = str(href).strip()
        if not href or href.startswith(("#", "mailto:", "tel:", "javascript:")):
            continue
        url, _reason = resolve_link(base, href)
        if url is None:
            continue
        url = without_fragment(url)
        if host_key(url) != host or url in seen:
            continue
        if urlsplit(url).path.lower().endswith(SKIP_EXTENSIONS):
            continue
        seen.add(url)
        out.append(url)
    return out


class Extractor:
    """The dataset's mappings run on a page for one record (all matching mappings, every field)."""

    def __init__(self, mappings_dir: str | Path, field_types: dict[str, str]):
        self.mappings = MappingSet.load(mappings_dir, strict=False)
        self.field_types = field_types

    def extract(
        self, page: Page, *, fragment: str, record_id: str, wanted: list[str] | set[str]
    ) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for mapping in self.mappings.matching(page.url):
            result = run_mapping(
                mapping,
                page,
                fragment=fragment,
                record_id=record_id,
                field_types=self.field_types,
                only_fields=wanted,
                with_links=False,
            )
            for name, value in result.fields.items():
                found.setdefault(name, value)
        return found


@dataclass
class RecordResult:
    id: str
    missing: list[str]
    fields: dict[str, Any] = field(default_factory=dict)
    pages: int = 0
    errors: list[dict[str, str]] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    def line(self) -> str:
        return json.dumps(
            {
                "record": self.id,
                "fields": self.fields,
                "pages": self.pages,
                "errors": self.errors[:20],
                "seconds": round(time.monotonic() - self.started, 3),
            },
            default=str,
        )


def read_results(paths: list[Path]) -> dict[str, dict[str, Any]]:
    """Per-record result lines of the baselines: {record id: {"fields": {...}, "pages": n}}."""
    out: dict[str, dict[str, Any]] = {}
    for path in paths:
        if not path.exists():
            continue
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                if line.strip():
                    row = json.loads(line)
                    out[row["record"]] = row
    return out
