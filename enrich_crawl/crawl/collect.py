"""Collecting pages: the crawl worker's mode for learning and evaluating mappings (SPEC 3b).

`mapping learn`, `mapping evaluate` and the `mapping_agreement` check need the pages that a sample
of records' URLs lead to, fetched exactly as `run` fetches them (robots.txt first, Crawl-delay, one
request at a time per host, the shared limiter, the user agent). So they run the ordinary crawl
worker on a seed shard of the sampled records, with `WorkerParams.collect` set; the spider then
hands every page a record reaches to a PageCollector (this module: its only door into the spider
is `keep`, `links` and `close`), which

- writes one line per (record, page) to `pages.jsonl` and each distinct body once to
  `bodies/<sha1>` in the worker's output folder, for the learner to read;
- makes the spider keep every page's body in the crawled-URL store (not only those that fed a
  mapping), so that the `run` that follows serves them from there instead of fetching them again;
- below depth 0 (datasets whose values sit a link away), offers the spider a bounded number of the
  page's same-host links to follow, since no mapping says yet which links matter.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urljoin, urlsplit

if TYPE_CHECKING:
    from enrich_crawl.crawl.params import WorkerParams
    from enrich_crawl.extract.page import Page

PAGES_FILE = "pages.jsonl"
BODIES_DIR = "bodies"


@dataclass(frozen=True)
class CollectConfig:
    """`WorkerParams.collect`: empty for an ordinary crawl."""

    # same-host links a page offers for the next depth when no mapping's url_parser does
    links_per_page: int = 10
    # words of the fields sought (`vat_id` -> vat): links naming them are offered first
    field_words: tuple[str, ...] = ()

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> CollectConfig | None:
        if not data:
            return None
        return cls(
            links_per_page=int(data.get("links_per_page", cls.links_per_page)),
            field_words=tuple(str(w) for w in data.get("field_words") or ()),
        )

    def to_dict(self) -> dict[str, Any]:
        return {"links_per_page": self.links_per_page, "field_words": list(self.field_words)}


# Words of links to the pages where a site tells about the record's entity itself (who runs
# it, its registration, its people): the pages that hold the fields a record's own page lacks.
# Links to lists of posts, products, jobs, sorted or tagged views come after them.
ENTITY_PAGE_WORDS = frozenset(
    [
        "about",
        "team",
        "people",
        "staff",
        "leadership",
        "management",
        "board",
        "company",
        "imprint",
        "impressum",
        "legal",
        "registration",
        "registered",
        "contact",
        "profile",
        "details",
        "who",
    ]
)
_WORD = re.compile(r"[a-z]+")


def field_words(names: Any) -> tuple[str, ...]:
    """The words of field names (`vat_id` -> vat; `id` and one-letter words say nothing)."""
    out: list[str] = []
    for name in names:
        for word in _WORD.findall(str(name).lower()):
            if len(word) > 2 and word not in out:
                out.append(word)
    return tuple(out)


def _site(url: str) -> str:
    """The host: links to other hosts of one registrable domain (www.python.org from
    docs.python.org) rarely lead to a record's own values."""
    return (urlsplit(url).hostname or "").lower()


class PageCollector:
    """Keeps the pages of a collecting crawl (see the module docstring)."""

    def __init__(self, out_dir: Path, config: CollectConfig):
        self.config = config
        self.bodies_dir = Path(out_dir) / BODIES_DIR
        self.bodies_dir.mkdir(parents=True, exist_ok=True)
        self.lines = open(Path(out_dir) / PAGES_FILE, "w", encoding="utf-8")  # noqa: SIM115
        self.written: set[str] = set()  # body hashes on disk
        self.kept: set[tuple[str, str, str]] = set()  # (record, page key, fragment)
        self.stats = {"pages": 0, "bodies": 0, "body_bytes": 0, "links_offered": 0}

    @classmethod
    def for_params(cls, params: WorkerParams) -> PageCollector | None:
        config = CollectConfig.from_dict(params.collect)
        return None if config is None else cls(Path(params.out_dir), config)

    def keep(self, record: str, page: Page, *, fragment: str, depth: int) -> None:
        """Record that `record` reached `page` (with the record URL's fragment) at `depth`."""
        body = page.body
        if not body or page.known_useless:
            return
        key = (record, page.url, fragment)
        if key in self.kept:
            return
        self.kept.add(key)
        digest = page.content_hash or hashlib.sha1(body).hexdigest()
        if digest not in self.written:
            tmp = self.bodies_dir / f".{digest}.tmp"
            tmp.write_bytes(body)
            tmp.replace(self.bodies_dir / digest)
            self.written.add(digest)
            self.stats["bodies"] += 1
            self.stats["body_bytes"] += len(body)
        self.stats["pages"] += 1
        line = {
            "record": record,
            "url": page.url,
            "fragment": fragment,
            "depth": depth,
            "status": page.status,
            "content_type": page._header,
            "body": digest,
            "fetched_at": page.fetched_at,
        }
        self.lines.write(json.dumps(line, ensure_ascii=False) + "\n")

    def links(self, page: Page, allowed: Any) -> list[str]:
        """Up to `links_per_page` links of `page` to other pages of its own host that
        `allowed(url)` accepts (the crawl's URL policy): first those whose URL or text names a
        sought field, then those to the pages about the entity itself (ENTITY_PAGE_WORDS), then
        the others without a query string, then the rest; in document order within each rank.
        The budget then goes to the pages likely to hold what the record's own page lacks,
        not to a blog's tag views."""
        from enrich_crawl.urls import normalise_link, page_key

        tree = page.tree
        if self.config.links_per_page <= 0 or tree is None or not hasattr(tree, "xpath"):
            return []
        site = _site(page.url)
        here = page_key(page.url)
        sought = set(self.config.field_words)
        ranked: dict[str, int] = {}
        for anchor in tree.xpath("//a[@href]"):
            url, _ = normalise_link(urljoin(page.base_url, str(anchor.get("href")).strip()))
            if url is None or page_key(url) == here or _site(url) != site:
                continue
            parts = urlsplit(url)
            words = set(_WORD.findall(f"{parts.path} {anchor.text_content()}".lower()))
            if words & sought:
                rank = 0
            elif words & ENTITY_PAGE_WORDS:
                rank = 1
            else:
                rank = 2 if not parts.query else 3
            if rank < ranked.get(url, 4):
                ranked[url] = rank
        out: list[str] = []
        for url in sorted(ranked, key=ranked.__getitem__):  # stable: document order in a rank
            if allowed(url):
                out.append(url)
                if len(out) >= self.config.links_per_page:
                    break
        self.stats["links_offered"] += len(out)
        return out

    def close(self) -> dict[str, Any]:
        self.lines.close()
        return dict(self.stats)


def read_collected(out_dir: Path) -> list[dict[str, Any]]:
    """The lines of a collecting crawl's `pages.jsonl`, each with its `body` read back (bytes;
    pages of one body share one bytes object)."""
    from enrich_crawl.staging import read_jsonl

    out_dir = Path(out_dir)
    bodies: dict[str, bytes] = {}
    rows = []
    for row in read_jsonl(out_dir / PAGES_FILE):
        digest = row["body"]
        if digest not in bodies:
            try:
                bodies[digest] = (out_dir / BODIES_DIR / digest).read_bytes()
            except OSError:
                continue
        row["body"] = bodies[digest]
        rows.append(row)
    return rows
