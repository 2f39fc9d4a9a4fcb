"""The pages of this run: processed once, reused by every later record that needs them.

A bounded in-memory LRU of pages (bodies); only the few most recently used keep their parsed form
(an lxml tree weighs ten times its page), the others are parsed again if a record needs them. Pages
the LRU evicts go to a scratch SQLite file on local disk, unless the crawled-URL store keeps their
body (`put(..., stored=True)`: the spider then finds them there, as it finds the pages of earlier
runs), and so does every page that failed: a page needed again later in the run is never fetched
twice, and memory stays flat however many pages the run touches. The file is deleted when the
crawl ends.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import tempfile
from collections import OrderedDict
from pathlib import Path

from enrich_crawl.crawl.state import BoundedSet, decompress, stored_body
from enrich_crawl.extract.page import Page

# cached_property values of a Page that hold its parsed form (recomputed on demand)
_PARSED = ("tree", "json", "base_url")


class PageCache:
    def __init__(
        self,
        max_bytes: int = 32 * 1024 * 1024,
        spill_dir: str | None = None,
        max_parsed: int = 16,
    ):
        self.max_bytes = max_bytes
        self.max_parsed = max_parsed
        self.bytes = 0
        self.pages: OrderedDict[str, Page] = OrderedDict()
        self.weights: dict[str, int] = {}  # bytes counted for each page in memory
        self.in_store: set[str] = set()  # keys of pages in memory whose body the store keeps
        # hashes of the keys of pages that left memory for the store alone (the most recent ones:
        # memory stays flat; an older one is looked up like a page of an earlier run, or fetched
        # again; a hash collision costs one look-up of the store)
        self.dropped_keys: BoundedSet[int] = BoundedSet(100_000)
        self.parsed: OrderedDict[str, Page] = OrderedDict()
        self._dir = Path(tempfile.mkdtemp(prefix="enrich-crawl-pages-", dir=spill_dir))
        self.db = sqlite3.connect(self._dir / "pages.sqlite", isolation_level=None)
        self.db.execute("PRAGMA journal_mode=OFF")
        self.db.execute("PRAGMA synchronous=OFF")
        # SQLite's own page cache (2 MiB by default, per crawl) would hold what the system's file
        # cache holds anyway: the file is written once per page and read back rarely
        self.db.execute("PRAGMA cache_size=-64")
        self.db.execute(
            "CREATE TABLE pages (key TEXT PRIMARY KEY, url TEXT, status INTEGER, ctype TEXT, "
            "fetched_at TEXT, content_hash TEXT, rendered INTEGER, body BLOB, reason TEXT)"
        )
        self.db.execute("CREATE TABLE robots (origin TEXT PRIMARY KEY, doc TEXT)")
        self.spilled = 0
        self.dropped = 0  # evicted without a spill: the crawled-URL store has them
        self.reloaded = 0
        # hashes of the keys the scratch file holds (pages and failures): most keys asked for
        # were never spilled, and a set look-up spares them a query (a hash collision only costs
        # one); 8 bytes and a set slot per spilled page
        self.on_disk: set[int] = set()

    def get(self, key: str) -> Page | None:
        page = self.pages.get(key)
        if page is not None:
            self.pages.move_to_end(key)
            self._parsed(key, page)
            return page
        if hash(key) not in self.on_disk:
            return None
        row = self.db.execute(
            "SELECT url, status, ctype, fetched_at, content_hash, rendered, body FROM pages "
            "WHERE key = ? AND reason IS NULL",
            (key,),
        ).fetchone()
        if row is None:
            return None
        url, status, ctype, fetched_at, content_hash, rendered, body = row
        page = Page(url, decompress(body), content_type=ctype or None, status=status)
        page.stored_body = body  # compressed already (state.stored_body)
        page.fetched_at = fetched_at
        page.content_hash = content_hash
        page.rendered = bool(rendered)
        self.reloaded += 1
        self._remember(key, page)
        return page

    def in_store_only(self, key: str) -> bool:
        """This run's page `key` left memory for the crawled-URL store (ask the store for it)."""
        return hash(key) in self.dropped_keys

    def failure(self, key: str) -> str | None:
        """The reason the page failed earlier in this run, or None."""
        if hash(key) not in self.on_disk:
            return None
        row = self.db.execute(
            "SELECT reason FROM pages WHERE key = ? AND reason IS NOT NULL", (key,)
        ).fetchone()
        return row[0] if row else None

    def put(self, key: str, page: Page, *, stored: bool = False) -> None:
        """Keep `page` for this run; `stored`: the crawled-URL store has its body (under `key`),
        so it need not be spilled when memory is short."""
        if key in self.pages:
            return
        if stored:
            self.in_store.add(key)
        self._remember(key, page)

    def put_failure(self, key: str, reason: str) -> None:
        self.on_disk.add(hash(key))
        self.db.execute(
            "INSERT OR REPLACE INTO pages (key, reason) VALUES (?, ?)", (key, reason or "error")
        )

    def _parsed(self, key: str, page: Page) -> None:
        """Keep the parsed form of the most recently used pages only."""
        self.parsed[key] = page
        self.parsed.move_to_end(key)
        while len(self.parsed) > self.max_parsed:
            _, old = self.parsed.popitem(last=False)
            strip_parsed(old)

    def _remember(self, key: str, page: Page) -> None:
        self.pages[key] = page
        self._parsed(key, page)
        weight = self.weights[key] = page_weight(page)
        self.bytes += weight
        while self.bytes > self.max_bytes and len(self.pages) > 1:
            old_key, old = self.pages.popitem(last=False)
            self.bytes -= self.weights.pop(old_key)
            if self.parsed.pop(old_key, None) is not None:
                strip_parsed(old)
            if old_key in self.in_store:
                self.in_store.discard(old_key)
                self.dropped_keys.add(hash(old_key))
                self.dropped += 1
            else:
                self._spill(old_key, old)

    def _spill(self, key: str, page: Page) -> None:
        self.on_disk.add(hash(key))
        self.db.execute(
            "INSERT OR IGNORE INTO pages VALUES (?, ?, ?, ?, ?, ?, ?, ?, NULL)",
            (
                key,
                page.url,
                page.status,
                page._header,
                page.fetched_at,
                page.content_hash,
                int(page.rendered),
                stored_body(page),  # made once, shared with the crawled-URL store
            ),
        )
        self.spilled += 1

    def put_robots(self, doc: dict) -> None:
        """robots.txt verdicts evicted from memory (a run fetches each robots.txt once)."""
        self.db.execute(
            "INSERT OR REPLACE INTO robots VALUES (?, ?)", (doc["_id"], json.dumps(doc))
        )

    def get_robots(self, origin: str) -> dict | None:
        row = self.db.execute("SELECT doc FROM robots WHERE origin = ?", (origin,)).fetchone()
        return json.loads(row[0]) if row else None

    def close(self) -> None:
        try:
            self.db.close()
        finally:
            shutil.rmtree(self._dir, ignore_errors=True)


ENTRY_OVERHEAD = 4096  # bytes a cached page holds besides its body and text (object, caches)


def strip_parsed(page: Page) -> None:
    """Drop the parsed tree of a page and what selectors cached on it (recomputed on next use)."""
    for name in _PARSED:
        page.__dict__.pop(name, None)
    page.selector_cache.clear()


def page_weight(page: Page) -> int:
    """Bytes a cached page holds: its body (and its compressed copy, when it has one), its
    decoded text and a fixed overhead."""
    compressed = len(page.stored_body or b"")
    return len(page.body) + compressed + len(page.text) + ENTRY_OVERHEAD
