"""Render coordination (JavaScript, enrich_crawl.crawl.render): which pages are rendered, and
who waits for whom. Pages of `js` mappings are requested as render requests; a static page that an
`auto` mapping finds empty and that looks script-built is rendered from its static body. Records
wait for the rendered page (the static one is neither cached nor stored meanwhile); a failed render
falls back on the static page, with the reason on the records."""

from __future__ import annotations

import datetime as dt
import hashlib
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import scrapy

from enrich_crawl.crawl.extraction import Extractor
from enrich_crawl.crawl.frontier import Frontier, Waiter
from enrich_crawl.crawl.pagecache import PageCache
from enrich_crawl.crawl.render import (
    DOCUMENT,
    FETCHED,
    RENDER,
    RENDER_REASONS,
    WAIT_FOR,
    Document,
    looks_script_built,
)
from enrich_crawl.crawl.tally import Tally
from enrich_crawl.extract.mapping import Mapping
from enrich_crawl.extract.page import Page
from enrich_crawl.urls import page_key


class RenderCoordinator:
    """The render wait of every page key: `target` maps a page key to the key of the URL being
    rendered for it, `waiting` a rendered URL's key to the page keys waiting for it."""

    def __init__(
        self,
        *,
        enabled: bool,
        extractor: Extractor,
        frontier: Frontier,
        pages: PageCache,
        tally: Tally,
        callback: Callable[..., Any],
        errback: Callable[..., Any],
    ):
        self.enabled = enabled  # some mapping renders (js/auto)
        self.extractor = extractor
        self.frontier = frontier
        self.pages = pages
        self.counts: Counter[str] = tally.render
        self.counts_of_crawl = tally.counts
        self.errors_by_kind = tally.errors_by_kind
        self.callback = callback  # the spider's parse and on_error, for the render requests
        self.errback = errback
        self.target: dict[str, str] = {}  # page key -> key of the URL being rendered
        self.waiting: dict[str, list[str]] = {}  # rendered URL's key -> page keys
        self.done: OrderedDict[str, None] = OrderedDict()  # renders tried (this run)
        self.queue: list[scrapy.Request] = []  # render requests not yet handed to Scrapy
        if enabled:
            extractor.defer_to_render = self.should_render

    def cache(self, key: str, page: Page, *, stored: bool = False) -> None:
        """This run's copy of the page, unless its records wait for the rendered version;
        `stored`: the crawled-URL store keeps its body (under `key`)."""
        if key not in self.target:
            self.pages.put(key, page, stored=stored)

    def wait(self, key: str, target: str) -> None:
        """The records of page `key` wait for the render of URL `target` (a page key)."""
        self.target[key] = target
        keys = self.waiting.setdefault(target, [])
        if key not in keys:
            keys.append(key)

    def finished(self, key: str) -> list[str]:
        """The render requested for `key` is over: every page key that waited for it."""
        target = self.target.pop(key, None)
        if target is None:
            return [key]
        keys = self.waiting.pop(target, [])
        for other in keys:
            self.target.pop(other, None)
        self.done[target] = None
        if len(self.done) > 20000:
            self.done.popitem(last=False)
        return [key, *(k for k in keys if k != key)]

    def request_keys(self, request: scrapy.Request) -> list[str]:
        key = request.meta["page_key"]
        return self.finished(key) if request.meta.get(RENDER) else [key]

    def waited_keys(self, request: scrapy.Request) -> list[str] | None:
        """The page keys waiting for this render request's URL, None when it is no render that
        pages wait for."""
        key = request.meta.get("page_key")
        if request.meta.get(RENDER) and self.target.get(key) in self.waiting:
            return self.waiting[self.target[key]]
        return None

    def _render_mappings(self, key: str, url: str) -> Iterator[tuple[Mapping, Waiter]]:
        """(mapping, waiter) for the js/auto mappings matching `url` for the live waiters."""
        for waiter in self.frontier.live_waiters(key):
            matching = self.extractor.matching
            for mapping in matching(url + (f"#{waiter.fragment}" if waiter.fragment else "")):
                if mapping.render != "static":
                    yield mapping, waiter

    def js_before_fetch(self, key: str) -> tuple[bool, list[str]]:
        """Does a `js` mapping claim this URL (patterns are known before fetching)?"""
        js, waits = False, []
        for mapping, _ in self._render_mappings(key, key):
            if mapping.render == "js":
                js = True
                if mapping.wait_for and mapping.wait_for not in waits:
                    waits.append(mapping.wait_for)
        return js, waits

    def should_render(self, key: str, page: Page) -> bool:
        """Ask for a render of `page` (its records then wait for it) when a `js` mapping matches
        it, or an `auto` mapping finds none of its fields and the page looks script-built."""
        if page.rendered or page.render_tried or page.known_useless:
            return False
        target = page_key(page.url)
        if target in self.waiting:  # already on its way (a redirect to the same URL)
            self.wait(key, target)
            return True
        if target in self.done or page.status != 200 or page.kind != "html":
            return False
        mode, waits = self._verdict(key, page)
        if mode is None:
            return False
        task = self.frontier.tasks.get(key)
        depth = min((w.depth for w in task.waiters), default=0) if task else 0
        self.wait(key, target)
        self.queue.append(
            scrapy.Request(
                page.url,
                callback=self.callback,
                errback=self.errback,
                priority=task.priority if task else 0,
                dont_filter=True,
                meta={
                    "page_key": key,
                    "enrich_depth": depth,
                    RENDER: mode,
                    DOCUMENT: Document.of_page(page),
                    WAIT_FOR: waits,
                },
            )
        )
        return True

    def _verdict(self, key: str, page: Page) -> tuple[str | None, list[str]]:
        js, auto_empty, auto_found = False, False, False
        waits: list[str] = []
        for mapping, waiter in self._render_mappings(key, page.url):
            if mapping.wait_for and mapping.wait_for not in waits:
                waits.append(mapping.wait_for)
            if mapping.render == "js":
                js = True
            elif self.extractor.extract(page, mapping, waiter, mapping.field_names):
                auto_found = True
            else:
                auto_empty = True
        if js:
            return "js", waits
        if not auto_empty:
            if auto_found:
                self.counts["skipped/fields_found"] += 1
            return None, []
        verdict = looks_script_built(page)
        if not verdict:
            self.counts["skipped/not_script_built"] += 1
            return None, []
        for signal in verdict.signals:
            self.counts[f"signals/{signal}"] += 1
        return "auto", waits

    def fallback(
        self, request: scrapy.Request, keys: list[str], reason: str, detail: str
    ) -> Page | None:
        """A render request failed: the static page its records fall back on (the render's
        reason on them), or None when there is none (they fail as a static fetch would)."""
        document: Document | None = request.meta.get(DOCUMENT)
        if reason in RENDER_REASONS:
            self.counts[f"failed/{reason}"] += 1
        if document is None:  # nothing fetched: as a static fetch that failed
            return None
        self.errors_by_kind[reason] += 1
        for key in keys:
            for waiter in self.frontier.waiters(key):
                self.frontier.record_error(waiter, reason, detail)
        self.counts["fallbacks"] += 1
        page = Page(
            document.url, document.body, content_type=document.content_type, status=document.status
        )
        page.fetched_at = document.fetched_at or dt.datetime.now(dt.timezone.utc).isoformat()
        page.content_hash = document.content_hash or hashlib.sha1(document.body).hexdigest()
        page.rendered = False
        page.render_tried = True
        if request.meta.get(FETCHED):
            self.counts_of_crawl["pages"] += 1
            self.counts_of_crawl["bytes"] += len(document.body)
        return page

    def snapshot(self, browser: dict[str, Any] | None) -> dict[str, Any]:
        counts = self.counts
        out: dict[str, Any] = {
            "enabled": self.enabled,
            "rendered_js": counts["rendered_js"],
            "rendered_auto": counts["rendered_auto"],
            "skipped": {
                "fields_found": counts["skipped/fields_found"],
                "not_script_built": counts["skipped/not_script_built"],
            },
            "signals": {k.split("/", 1)[1]: v for k, v in counts.items() if "signals/" in k},
            "failed": {k.split("/", 1)[1]: v for k, v in counts.items() if "failed/" in k},
            "fallbacks": counts["fallbacks"],
            "pending": len(self.target),
        }
        if browser is not None:
            out["browser"] = browser
        return out
