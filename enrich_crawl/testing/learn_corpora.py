"""Corpora for learned mappings: real pages, a dataset with ~30% of each field's cells known, and a
ground truth that does not come from the learner.

    corpus = build_corpus("pydocs", root, known_fraction=0.3, seed=0)
    corpus.spec_path      # dataset YAML (+ CSV): known cells filled, the others blank
    corpus.web_root       # virtual-web folder ROOT/<hostname>/... (enrich_crawl/virtualweb/)
    corpus.truth          # record id -> {field: true value or None}; also truth.json
    corpus.hidden         # record id -> fields blank in the table whose truth is known; hidden.json

Corpora (the benchmarks add `synth`, the end-to-end benchmark's generated web:
`bench/e2e/synth_corpus.py`):

- `pydocs`: the module pages of Debian's python3.11-doc (`enrich_crawl.testing.pydocs`): one
  site, one template, pages serving several modules (`#module-x` fragments). Truth from the
  reStructuredText sources and objects.inv, never from the HTML.
- `structured`: real pages that packages ship as test fixtures (see
  `enrich_crawl.testing.structured_pages`), on the hosts they were saved from, carrying
  OpenGraph, JSON-LD or microdata. Truth from a second extractor, extruct.
- `djangodocs`: the Django 3.2 docs of Debian's python-django-doc (`enrich_crawl.testing.
  djangodocs`): pages, and settings, template tags and filters on pages serving many, with odd
  pages (an image, a script, empty, 6 MB, binary, missing) mixed in. Truth from objects.inv.

`WebFolder(web_root)` reads pages from such a folder as the crawler would get them (same path rules
as the virtual web server, robots.txt honoured, dead hosts dead), for in-process benchmarks.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from enrich_crawl.testing.corpus import Corpus, _split_cells, _write

CORPORA = ("pydocs", "structured", "djangodocs")
USER_AGENT_TOKEN = "enrich_crawl"


# -- pydocs ------------------------------------------------------------------------------------------


def _build_pydocs(root: Path, known_fraction: float, seed: int, scale: float) -> Corpus:
    from enrich_crawl.testing import pydocs

    html = pydocs.ensure_corpus()
    web_root = root / "web"
    pydocs.build_web(web_root, html=html)
    records = pydocs.module_records(html)
    rng = random.Random(f"pydocs:{seed}")
    if scale < 1:
        records = sorted(
            rng.sample(records, max(10, round(len(records) * scale))), key=lambda r: r["module"]
        )
    truth = {r["module"]: dict(r["truth"]) for r in records}
    for values in truth.values():  # a module that is not deprecated: the value is "false"
        values["deprecated"] = bool(values.get("deprecated"))
    field_types = dict(pydocs.FIELDS)
    known, cells, hidden = _split_cells(truth, field_types, known_fraction, rng)
    corpus = Corpus(
        name="pydocs",
        root=root,
        spec_path=root / "pydocs.yaml",
        web_root=web_root,
        field_types=field_types,
        id_column="module",
        url_columns=["doc_url"],
        urls={r["module"]: [r["doc_url"]] for r in records},
        known=known,
        truth=truth,
        hidden=hidden,
        depth=1,
        notes=["truth: the reStructuredText sources and objects.inv of python3.11-doc"],
    )
    _write(corpus, cells)
    return corpus


# -- structured --------------------------------------------------------------------------------------


def _build_structured(
    root: Path, known_fraction: float, seed: int, scale: float, sources: str = "all"
) -> Corpus:
    from enrich_crawl.testing import structured_pages

    return structured_pages.build(
        root, known_fraction=known_fraction, seed=seed, scale=scale, sources=sources
    )


def _build_djangodocs(root: Path, known_fraction: float, seed: int, scale: float) -> Corpus:
    from enrich_crawl.testing import djangodocs

    return djangodocs.build(root, known_fraction=known_fraction, seed=seed, scale=scale)


def build_corpus(
    name: str,
    root: str | Path,
    *,
    known_fraction: float = 0.3,
    seed: int = 0,
    scale: float = 1.0,
    more: dict[str, Callable[..., Corpus]] | None = None,
    **options: Any,
) -> Corpus:
    """Build corpus `name` into `root` (see the module docstring); `scale` < 1 builds a smaller
    one (tests); `options` go to that corpus's builder (structured: `sources="set-up"`, the
    packages that set-up fetched, for the tests). `more`: builders of other corpora by name
    (`builder(root, known_fraction, seed, scale)`), the benchmarks' `synth`."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    builders = {
        "pydocs": _build_pydocs,
        "structured": _build_structured,
        "djangodocs": _build_djangodocs,
        **(more or {}),
    }
    if name not in builders:
        raise ValueError(f"unknown corpus {name!r} (known: {', '.join(builders)})")
    if not 0 < known_fraction < 1:
        raise ValueError(f"known_fraction must be between 0 and 1, not {known_fraction}")
    return builders[name](root, known_fraction, seed, scale, **options)


# -- reading pages as the crawler gets them ------------------------------------------------------


class WebFolder:
    """Pages of a virtual-web folder, as the crawler would get them: the server's path rules
    (`/` -> index.html, `x` -> `x.html`), robots.txt (RFC 9309 via protego) for our product
    token, dead hosts (`unreachable`, or 5xx everywhere in `_web.json`) give nothing."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        config = self.root / "_web.json"
        raw = json.loads(config.read_text("utf-8")) if config.exists() else {}
        self.dead = {
            host
            for host, cfg in (raw.get("hosts") or {}).items()
            if cfg.get("unreachable") or ".*" in (cfg.get("status") or {})
        }
        self._robots: dict[str, Any] = {}
        self.fetched = 0
        self.refused = 0

    def _allowed(self, host: str, url: str) -> bool:
        if host not in self._robots:
            import protego

            path = self.root / host / "robots.txt"
            text = path.read_text("utf-8", "replace") if path.exists() else ""
            self._robots[host] = protego.Protego.parse(text) if text else None
        rules = self._robots[host]
        return rules is None or rules.can_fetch(url, USER_AGENT_TOKEN)

    def get(self, url: str) -> tuple[str, bytes, str] | None:
        """(url without fragment, body, content type) or None (missing, refused, dead)."""
        from enrich_crawl.virtualweb import guess_content_type

        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
        if not host or host in self.dead or parts.scheme not in ("http", "https"):
            return None
        if not self._allowed(host, url):
            self.refused += 1
            return None
        decoded = unquote(parts.path or "/")
        segments = [s for s in decoded.split("/") if s not in ("", ".", "..")]
        as_dir = decoded.endswith("/") or not segments
        rel = "/".join(segments)
        name = f"{rel}/index.html" if as_dir and rel else ("index.html" if as_dir else rel)
        base = self.root / host
        candidates = []
        if parts.query:
            candidates.append(base / f"{name}?{parts.query}")
        candidates += [base / name, base / (name + ".html")]
        for path in candidates:
            if path.is_file():
                body = path.read_bytes()
                self.fetched += 1
                clean = parts._replace(fragment="").geturl()
                return clean, body, guess_content_type(path.name, body)
        return None


# -- in-process learning and scoring (tests and bench/bench_learn.py) ----------------------------


def template_of(url: str) -> str:
    """host + first path segment: the unit a fetcher samples example records by."""
    parts = urlsplit(url)
    segments = [s for s in (parts.path or "/").split("/")[:-1] if s]
    return (parts.hostname or "") + ("/" + segments[0] if segments else "")


class PageSource:
    """Pages for the learner from a `WebFolder`, each read once however many records use it."""

    def __init__(self, web: WebFolder):
        self.web = web
        self.cache: dict[str, tuple[str, bytes, str] | None] = {}

    def get(self, url: str) -> tuple[str, bytes, str] | None:
        key = url.split("#", 1)[0]
        if key not in self.cache:
            self.cache[key] = self.web.get(key)
        return self.cache[key]


def _seed_urls(urls: list[str]) -> list[str]:
    from enrich_crawl.urls import normalise_url, split_url_cell

    out = []
    for cell in urls:
        for token in split_url_cell(cell):
            url, _reason = normalise_url(token)
            if url and url not in out:
                out.append(url)
    return out


def record_pages(
    source: PageSource,
    urls: list[str],
    depth: int,
    *,
    wide: bool = False,
    mappings: Any = None,
    record_id: str = "",
    max_pages: int = 250,
) -> list[Any]:
    """The ExamplePages a record's URLs lead to: its seed pages (depth 0), then, up to `depth`,
    every same-host link (`wide`: a probe), or the links the `mappings`' url_parsers give (the
    crawl's way)."""
    from enrich_crawl.extract.learn import ExamplePage
    from enrich_crawl.extract.learn.facts import PageFacts
    from enrich_crawl.extract.mapping import run_mapping
    from enrich_crawl.urls import fragment_of, without_fragment

    pages: list[Any] = []
    seen: set[str] = set()
    linked: set[str] = set()
    frontier = [(url, 0) for url in _seed_urls(urls)]
    while frontier and len(pages) < max_pages:
        url, level = frontier.pop(0)
        key = without_fragment(url)
        if key in seen:
            continue
        seen.add(key)
        got = source.get(key)
        if got is None:
            continue
        final, body, ctype = got
        page = ExamplePage(final, body, ctype, fragment=fragment_of(url), depth=level)
        pages.append(page)
        if level >= depth:
            continue
        if wide:
            # every same-host link of the seed page; deeper, only the links that earlier pages
            # did not have (the menus repeat on every page of a site)
            host = urlsplit(final).hostname
            links = [
                u
                for u in PageFacts(page).links()
                if urlsplit(u).hostname == host and (level == 0 or u not in linked)
            ]
            linked.update(links)
        elif mappings is not None:
            facts = PageFacts(page)
            links = []
            for mapping in mappings.matching(url):
                result = run_mapping(
                    mapping,
                    facts.page,
                    fragment=page.fragment,
                    record_id=record_id,
                    only_fields=(),
                )
                links.extend(result.links)
        else:
            links = []
        frontier.extend((link, level + 1) for link in links if without_fragment(link) not in seen)
    return pages


def offline_fill(
    corpus: Corpus, source: PageSource, mappings: Any, record_ids: list[str]
) -> dict[str, dict[str, tuple[Any, str]]]:
    """What a goal-directed crawl with `mappings` fills for the records' blank cells: per record,
    field -> (value, mapping); shallowest page first, then highest priority (the resolver's
    order)."""
    from enrich_crawl.extract.mapping import run_mapping

    filled: dict[str, dict[str, tuple[Any, str]]] = {}
    for record_id in record_ids:
        wanted = [f for f in corpus.field_types if f not in corpus.known.get(record_id, {})]
        found: dict[str, tuple[Any, str]] = {}
        pages = record_pages(
            source, corpus.urls[record_id], corpus.depth, mappings=mappings, record_id=record_id
        )
        from enrich_crawl.extract.page import Page

        for example_page in pages:
            if all(f in found for f in wanted):
                break
            page = Page(example_page.url, example_page.body, content_type=example_page.content_type)
            url = page.url + (f"#{example_page.fragment}" if example_page.fragment else "")
            for mapping in mappings.matching(url):
                result = run_mapping(
                    mapping,
                    page,
                    fragment=example_page.fragment,
                    record_id=record_id,
                    field_types=corpus.field_types,
                    only_fields=wanted,
                    with_links=False,
                )
                for name, value in result.fields.items():
                    found.setdefault(name, (value, mapping.name))
        filled[record_id] = found
    return filled


def score(corpus: Corpus, filled: dict[str, dict[str, tuple[Any, str]]]) -> dict[str, Any]:
    """Accuracy on the hidden cells a crawler can reach (found: right values in them / findable
    hidden cells) and
    precision of what was filled into blank cells (correct / filled; a value where the truth has
    none is wrong), overall and per field, with a few mistakes."""
    from enrich_crawl.extract.learn import same_value

    per_field = {
        f: {"hidden": 0, "findable": 0, "filled": 0, "correct": 0, "wrong": 0, "found": 0}
        for f in corpus.field_types
    }
    mistakes: list[dict[str, Any]] = []
    for record_id, found in filled.items():
        hidden = set(corpus.hidden.get(record_id, []))
        unreachable = corpus.unfindable.get(record_id, {})
        for fname, ftype in corpus.field_types.items():
            if fname in corpus.known.get(record_id, {}):
                continue
            stats = per_field[fname]
            truth = corpus.truth[record_id].get(fname)
            if fname in hidden:
                stats["hidden"] += 1
                if fname not in unreachable:
                    stats["findable"] += 1
            if fname not in found:
                continue
            value, mapping = found[fname]
            stats["filled"] += 1
            if truth is not None and same_value(value, truth, ftype):
                stats["correct"] += 1
                stats["found"] += fname in hidden and fname not in unreachable
            else:
                stats["wrong"] += 1
                if len(mistakes) < 20:
                    mistakes.append(
                        {
                            "record": record_id,
                            "field": fname,
                            "truth": truth,
                            "value": value,
                            "mapping": mapping,
                        }
                    )
    total = {k: sum(s[k] for s in per_field.values()) for k in next(iter(per_field.values()))}

    def rates(stats: dict[str, int]) -> dict[str, Any]:
        return {
            **stats,
            "accuracy": round(stats["correct"] / stats["findable"], 4)
            if stats["findable"]
            else None,
            "precision": round(stats["correct"] / stats["filled"], 4) if stats["filled"] else None,
        }

    return {
        "records": len(filled),
        **rates(total),
        "per_field": {f: rates(s) for f, s in per_field.items()},
        "mistakes": mistakes,
    }
