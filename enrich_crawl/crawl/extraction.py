"""Extraction: a page served to the records waiting on it. The mappings matching each URL (memo),
the values each mapping gives on a page (memo shared by every record the page serves alike), the
candidates written, and the links each record follows next (mapping url_parsers, learning's probe,
generic links)."""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from enrich_crawl.crawl.frontier import (
    PRIORITY_GENERIC_LINK,
    PRIORITY_PARSER_LINK,
    FetchOrder,
    Frontier,
    Waiter,
)
from enrich_crawl.crawl.policy import UrlPolicy
from enrich_crawl.crawl.tally import Tally
from enrich_crawl.extract.mapping import Mapping, MappingResult, MappingSet, run_mapping
from enrich_crawl.extract.page import Page
from enrich_crawl.urls import resolve_link

if TYPE_CHECKING:
    from enrich_crawl.config import CrawlConfig
    from enrich_crawl.crawl.collect import PageCollector
    from enrich_crawl.crawl.outcomes import OutputFiles

logger = logging.getLogger(__name__)

MATCH_CACHE = 4096  # URLs whose matching mappings a crawl remembers (most recently used)


class _Extraction:
    """One mapping on one page for one (fragment, record id) key, filled on demand."""

    __slots__ = ("links", "tried", "values")

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}  # field -> value (fields that gave one)
        self.tried: set[str] = set()  # fields whose processors ran
        self.links: list[str] | None = None  # the url_parsers' links, once run


class Extractor:
    def __init__(
        self,
        *,
        config: CrawlConfig,
        mappings: MappingSet,
        field_types: dict[str, str],
        frontier: Frontier,
        allow_private: bool,
        out: OutputFiles,
        tally: Tally,
        collector: PageCollector | None = None,
    ):
        self.config = config
        self.mappings = mappings
        self.field_types = field_types
        self.frontier = frontier
        # the URL policy of followed links; a URL some mapping claims passes the huge-sites list
        self.policy = UrlPolicy(config, allow_private=allow_private, claimed=self.claims)
        self.out = out
        self.tally = tally
        self.collector = collector
        self.goal_directed = config.strategy != "bfs"
        self.extraction_cache: OrderedDict[str, _Extraction] = OrderedDict()
        # URL -> its mappings, for the URLs in play: a page's URL is matched when its request
        # leaves and again when it is processed, and the requests waiting meanwhile are a few
        # hundred per crawl
        self.match_cache: OrderedDict[str, tuple[Mapping, ...]] = OrderedDict()
        # each distinct answer is one tuple, shared by the URLs that give it (the URLs of a site
        # match the same few mappings); keyed by the mappings' identities, which the crawl's
        # MappingSet (never changed once built) holds for its whole life
        self._answers: dict[tuple[int, ...], tuple[Mapping, ...]] = {(): ()}
        # the render gate (rendering.py), when some mapping renders: True when the page's records
        # wait for its rendered version instead
        self.defer_to_render: Callable[[str, Page], bool] | None = None

    def matching(self, url: str) -> tuple[Mapping, ...]:
        mappings = self.match_cache.get(url)
        if mappings is None:
            found = tuple(self.mappings.matching(url))
            key = tuple(map(id, found))
            mappings = self._answers.get(key)
            if mappings is None:
                if len(self._answers) >= MATCH_CACHE:  # never more answers than URLs
                    self._answers = {(): ()}
                mappings = self._answers[key] = found
            self.match_cache[url] = mappings
            if len(self.match_cache) > MATCH_CACHE:
                self.match_cache.popitem(last=False)
        else:
            self.match_cache.move_to_end(url)
        return mappings

    def claims(self, url: str) -> bool:
        """Some mapping handles this URL (such URLs pass the huge-sites deny list)."""
        return bool(self.matching(url))

    def extraction(self, page: Page, mapping: Mapping, waiter: Waiter) -> _Extraction:
        """What `mapping` gave so far on `page` for this waiter's (fragment, record): shared by
        every record the page serves alike (same fragment and id, when the mapping reads them)."""
        key = "\x00".join(
            (
                page.url,
                page.content_hash or "",
                mapping.name,
                waiter.fragment if mapping.uses_fragment else "",
                waiter.record if mapping.uses_id else "",
            )
        )
        entry = self.extraction_cache.get(key)
        if entry is None:
            entry = self.extraction_cache[key] = _Extraction()
            if len(self.extraction_cache) > 1024:  # a page's waiters come together
                self.extraction_cache.popitem(last=False)
        return entry

    def extract(
        self, page: Page, mapping: Mapping, waiter: Waiter, fields: Iterable[str]
    ) -> dict[str, Any]:
        """The values of `fields` (those the mapping has) on the page: each field's processors
        run once per page and waiter key, and only for fields some record asks for."""
        entry = self.extraction(page, mapping, waiter)
        todo = [name for name in fields if name not in entry.tried and name in mapping.field_set]
        if todo:
            entry.values.update(self._run_mapping(page, mapping, waiter, todo, links=False).fields)
            entry.tried.update(todo)
        return {name: entry.values[name] for name in fields if name in entry.values}

    def links(self, page: Page, mapping: Mapping, waiter: Waiter) -> list[str]:
        """The mapping's url_parsers on the page, run when a record follows them (not for a
        record done with this page, nor at the depth limit)."""
        entry = self.extraction(page, mapping, waiter)
        if entry.links is None:
            entry.links = self._run_mapping(page, mapping, waiter, (), links=True).links
        return entry.links

    def _run_mapping(
        self, page: Page, mapping: Mapping, waiter: Waiter, fields: Iterable[str], *, links: bool
    ) -> MappingResult:
        result = run_mapping(
            mapping,
            page,
            fragment=waiter.fragment,
            record_id=waiter.record,
            field_types=self.field_types,
            only_fields=fields,
            with_links=links,
        )
        if result.errors:
            self.tally.counts["extraction_errors"] += len(result.errors)
        return result

    def _generic_links(self, page: Page) -> list[str]:
        if page.known_useless:
            return []
        tree = page.tree
        if tree is None or not hasattr(tree, "xpath"):
            return []
        links = []
        seen = set()
        for href in tree.xpath("//a/@href"):
            url, _ = resolve_link(page.base_url, str(href))
            if url is None or url in seen:
                continue
            seen.add(url)
            # generic links are nobody's seed: refused ones are skipped silently
            if self.policy.check(url) is None:
                links.append(url)
        return links

    def process(self, key: str, page: Page) -> tuple[list[FetchOrder], bool]:
        """Extract the page for every record waiting on it; (pages to fetch next, fed a mapping).
        A page that must be rendered first is left to its waiters' render (nothing to fetch)."""
        if self.defer_to_render is not None and self.defer_to_render(key, page):
            return [], False
        orders: list[FetchOrder] = []
        useful = False
        for waiter in self.frontier.take(key):
            try:
                waiter_orders, waiter_useful = self._process_waiter(page, waiter)
            except Exception as exc:  # one bad page never stops the crawl or the record
                logger.exception("processing %s for record %s failed", page.url, waiter.record)
                self.tally.errors_by_kind["error"] += 1
                self.frontier.record_error(waiter, "error", f"internal error: {exc}"[:300])
                self.frontier.release(waiter)
                continue
            orders.extend(waiter_orders)
            useful = useful or waiter_useful
        return orders, useful

    def _process_waiter(self, page: Page, waiter: Waiter) -> tuple[list[FetchOrder], bool]:
        orders: list[FetchOrder] = []
        useful = False
        state = self.frontier.records.get(waiter.record)
        if state is None:  # finished while this page was on its way
            return orders, useful
        url = page.url + (f"#{waiter.fragment}" if waiter.fragment else "")
        if self.collector is not None:
            self.collector.keep(waiter.record, page, fragment=waiter.fragment, depth=waiter.depth)
        mappings = () if page.known_useless else self.matching(url)
        if mappings:
            useful = True
        if not mappings and waiter.depth == 0:
            state.errors.append({"url": waiter.url, "reason": "no_mapping"})
        needed_now = set(state.needed) if self.goal_directed else set(state.wanted)
        found: set[str] = set()
        on_page: set[str] = set()
        for mapping in mappings:
            # the record's wanted fields only: the others would be dropped here anyway
            for name, value in self.extract(page, mapping, waiter, state.wanted).items():
                if name not in needed_now:
                    on_page.add(name)
                    continue
                found.add(name)
                self.tally.counts["candidates"] += 1
                self.out.write_candidate(
                    {
                        "record": waiter.record,
                        "field": name,
                        "value": value,
                        "url": url,
                        "mapping": mapping.name,
                        "priority": mapping.priority,
                        "depth": waiter.depth,
                        "fetched_at": page.fetched_at,
                        "http_status": page.status,
                        "content_hash": page.content_hash,
                        "rendered": page.rendered,
                    }
                )
        self.frontier.record_found(waiter, found, on_page)
        follow = bool(state.needed) or not self.goal_directed
        if follow and waiter.depth < self.config.depth:

            def want(links, priority: int) -> None:
                for link in links:
                    orders.extend(
                        self.frontier.want(
                            waiter.record,
                            link,
                            depth=waiter.depth + 1,
                            seed=waiter.seed,
                            priority=priority,
                        )
                    )

            want(
                [link for m in mappings for link in self.links(page, m, waiter)],
                PRIORITY_PARSER_LINK,
            )
            if self.collector is not None:
                want(
                    self.collector.links(page, lambda u: self.policy.check(u) is None),
                    PRIORITY_GENERIC_LINK,
                )
            if self.config.follow_all_links or not self.goal_directed:
                want(self._generic_links(page), PRIORITY_GENERIC_LINK)
        self.frontier.release(waiter)
        return orders, useful
