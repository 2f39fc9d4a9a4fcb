"""The Python-docs corpus: real pages with an independent ground truth, for tests and benchmarks.

The HTML documentation of Python 3.11 as Debian ships it (package `python3.11-doc`: 530 pages,
Sphinx output, ~100 KB each) is a realistic site: big pages, navigation, one page per module, some
pages documenting several modules (addressed by `#module-<name>` fragments), and a module index.

    html = ensure_corpus()                 # download once (apt-get download) into the cache
    host = build_web(root)                 # serve it on the virtual web as docs.python.org/3.11/
    records = module_records()             # one record per stdlib module, with ground truth
    spec = write_dataset(directory)        # the records as a dataset (fields all missing) + spec
    report = evaluate(records, values)     # field accuracy of extracted values against the truth

Ground truth comes from what the HTML pages are generated from, never from the pages: the module
list and URLs from Sphinx's inventory `objects.inv`, the fields from the reStructuredText sources
(`_sources/*.rst.txt`, shipped in the package): the `.. module::` directive's `:synopsis:` and
`:deprecated:` options, the section title above it, the `**Source code:** :source:` line and the
module-level `.. versionadded::` of its preamble. The interpreter confirms the source paths name
real standard-library files (`stdlib_source_exists`).

The cache is `$ENRICH_CACHE` or `~/.cache/enrich_crawl`; `ENRICH_PYDOCS_DEB=/path/to.deb` uses a
downloaded package instead of `apt-get download`. Command line (CI prefetch):
`python -m enrich_crawl.testing.pydocs fetch`.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEB_PACKAGE = "python3.11-doc"
HTML_IN_DEB = "usr/share/doc/python3.11/html"
HOST = "docs.python.org"
VERSION = "3.11"
BASE_URL = f"https://{HOST}/{VERSION}/"
DATASET_NAME = "pymodules"
FIELDS: dict[str, str] = {
    "title": "string",
    "synopsis": "string",
    "source_path": "string",
    "added_in": "string",
    "deprecated": "boolean",
}
_SKIPPED_DIRS = ("_images/", "_downloads/")


class CorpusUnavailable(RuntimeError):
    """The Debian package could not be obtained (no apt, no network, no cached copy)."""


def cache_dir() -> Path:
    return Path(os.environ.get("ENRICH_CACHE") or Path.home() / ".cache" / "enrich_crawl")


def corpus_dir() -> Path:
    return cache_dir() / "pydocs" / DEB_PACKAGE


# -- getting the corpus ---------------------------------------------------------------------------


def ensure_corpus(*, download: bool = True) -> Path:
    """The `html/` folder of the extracted python3.11-doc package, fetched on first use."""
    root = corpus_dir()
    html = root / "html"
    if (root / ".complete").exists() and (html / "objects.inv").exists():
        return html
    if not download:
        raise CorpusUnavailable(f"{html}: not fetched yet (python -m {__name__} fetch)")
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / ".lock"):
        if (root / ".complete").exists() and (html / "objects.inv").exists():
            return html
        with tempfile.TemporaryDirectory(dir=root) as tmp:
            deb = (
                Path(os.environ["ENRICH_PYDOCS_DEB"])
                if os.environ.get("ENRICH_PYDOCS_DEB")
                else None
            )
            if deb is None:
                deb = _apt_download(Path(tmp))
            staged = Path(tmp) / "html"
            _extract_deb(deb, staged)
            if not (staged / "objects.inv").exists():
                raise CorpusUnavailable(f"{deb}: no {HTML_IN_DEB}/objects.inv in the package")
            if html.exists():
                shutil.rmtree(html)
            staged.rename(html)
        (root / ".complete").write_text(DEB_PACKAGE + "\n", encoding="utf-8")
    return html


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    import fcntl

    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _apt_download(directory: Path) -> Path:
    if shutil.which("apt-get") is None:
        raise CorpusUnavailable(
            f"apt-get not found: download the Debian package {DEB_PACKAGE} yourself and set "
            "ENRICH_PYDOCS_DEB=/path/to/it.deb"
        )
    try:
        proc = subprocess.run(
            ["apt-get", "download", DEB_PACKAGE],
            cwd=directory,
            capture_output=True,
            text=True,
            timeout=600,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CorpusUnavailable(f"apt-get download {DEB_PACKAGE}: {exc}") from exc
    debs = sorted(directory.glob(f"{DEB_PACKAGE}_*.deb"))
    if proc.returncode != 0 or not debs:
        detail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise CorpusUnavailable(
            f"apt-get download {DEB_PACKAGE} failed ({'; '.join(detail)}); on a fresh machine run "
            "`sudo apt-get update` first, or set ENRICH_PYDOCS_DEB=/path/to/it.deb"
        )
    return debs[-1]


def _ar_members(data: bytes) -> Iterator[tuple[str, bytes]]:
    if not data.startswith(b"!<arch>\n"):
        raise CorpusUnavailable("not a Debian package (ar archive)")
    position = 8
    while position + 60 <= len(data):
        header = data[position : position + 60]
        name = header[:16].decode("ascii", "replace").strip().rstrip("/")
        size = int(header[48:58].decode("ascii").strip())
        start = position + 60
        yield name, data[start : start + size]
        position = start + size + (size % 2)


def _extract_deb(deb: Path, target: Path) -> None:
    """Extract the package's html folder (regular files only, not _images/_downloads)."""
    try:
        data = deb.read_bytes()
    except OSError as exc:
        raise CorpusUnavailable(f"{deb}: cannot read the package: {exc.strerror or exc}") from exc
    payload = None
    for name, member in _ar_members(data):
        if name.startswith("data.tar"):
            payload = (name, member)
    if payload is None:
        raise CorpusUnavailable(f"{deb}: no data.tar.* member")
    name, member = payload
    if name.endswith(".zst"):
        if shutil.which("dpkg-deb") is None:
            raise CorpusUnavailable(f"{deb}: zstd-compressed and dpkg-deb not available")
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run(["dpkg-deb", "-x", str(deb), tmp], check=True, timeout=600)
            shutil.copytree(
                Path(tmp) / HTML_IN_DEB, target, symlinks=False, ignore_dangling_symlinks=True
            )
        return
    prefix = "./" + HTML_IN_DEB + "/"
    with tarfile.open(fileobj=io.BytesIO(member), mode="r:*") as archive:
        for info in archive:
            path = info.name if info.name.startswith("./") else "./" + info.name
            if not path.startswith(prefix) or not info.isfile():
                continue
            relative = path[len(prefix) :]
            if relative.startswith(_SKIPPED_DIRS) or ".." in relative.split("/"):
                continue
            destination = target / relative
            destination.parent.mkdir(parents=True, exist_ok=True)
            source = archive.extractfile(info)
            if source is not None:
                destination.write_bytes(source.read())


# -- the virtual web ------------------------------------------------------------------------------


def build_web(root: str | Path, *, html: Path | None = None, host: str = HOST) -> str:
    """Make `root/<host>/` serve the docs as `https://<host>/3.11/...` on the virtual web
    (a symlink to the cached corpus, plus a permissive robots.txt); returns the host name."""
    html = html or ensure_corpus()
    site = Path(root) / host
    site.mkdir(parents=True, exist_ok=True)
    (site / "robots.txt").write_text("User-agent: *\nAllow: /\n", encoding="utf-8")
    link = site / VERSION
    if link.is_symlink() or link.exists():
        if link.is_symlink() and Path(os.readlink(link)) == html:
            return host
        if link.is_symlink() or link.is_file():
            link.unlink()
        else:
            shutil.rmtree(link)
    try:
        link.symlink_to(html, target_is_directory=True)
    except OSError:  # no symlinks here: copy
        shutil.copytree(html, link)
    return host


# -- the inventory ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class InventoryEntry:
    name: str
    role: str  # "py:module", "std:doc", ...
    priority: int
    uri: str  # relative to the docs root, `$` expanded
    display: str  # "-" means "same as name"


_INVENTORY_LINE = re.compile(r"(.+?)\s+(\S+:\S+)\s+(-?\d+)\s+(\S*)\s+(.*)")


def read_inventory(path: Path) -> list[InventoryEntry]:
    """Entries of a Sphinx `objects.inv` (version 2: four header lines, then zlib)."""
    data = path.read_bytes()
    lines = data.split(b"\n", 4)
    if len(lines) < 5 or not lines[0].startswith(b"# Sphinx inventory version 2"):
        raise ValueError(f"{path}: not a Sphinx inventory version 2")
    entries = []
    for line in zlib.decompress(lines[4]).decode("utf-8").splitlines():
        match = _INVENTORY_LINE.match(line)
        if not match:
            continue
        name, role, priority, uri, display = match.groups()
        if uri.endswith("$"):
            uri = uri[:-1] + name
        entries.append(InventoryEntry(name, role, int(priority), uri, display))
    return entries


# -- ground truth from the reStructuredText sources ----------------------------------------------

_UNDERLINE = re.compile(r"^([=\-~^\"'`#*+<>_:.])\1{2,}\s*$")
_DESCRIPTION = re.compile(
    r"^\.\. (?:py:)?(?:function|class|data|exception|method|attribute|decorator|classmethod|"
    r"staticmethod|module|opcode|cmdoption|option|describe|envvar|program|coroutinefunction|"
    r"abstractmethod|awaitablefunction)::"
)
_ROLE = re.compile(r":([\w:.-]+):`([^`]*)`")
_SOURCE = re.compile(r"\*\*Source code:\*\*\s*:source:`([^`]+)`")
_VERSIONADDED = re.compile(r"^\.\. versionadded:: *(\S+)", re.M)


def rst_inline_text(text: str) -> str:
    """The text a Sphinx title renders to: roles reduced to their text, literals unquoted,
    `---`/`--` as em/en dashes, escapes dropped."""

    def role(match: re.Match) -> str:
        name, content = match.group(1), match.group(2)
        target = re.match(r"^(.*?)\s*<[^<>]+>$", content, re.S)
        if target and target.group(1):
            return target.group(1)
        content = content.lstrip("!")
        if content.startswith("~"):
            content = content[1:].rsplit(".", 1)[-1]
        if name in ("pep", "rfc"):  # :pep:`8` renders as "PEP 8"
            return f"{name.upper()} {content}"
        if name in ("func", "meth", "py:func", "py:meth") and not content.endswith(")"):
            return content + "()"  # Sphinx's add_function_parentheses
        return content

    text = _ROLE.sub(role, text)
    text = re.sub(r"``(.+?)``", r"\1", text)
    text = re.sub(r"\*\*(.+?)\*\*", r"\1", text)
    text = re.sub(r"(?<!\w)\*(\S.*?)\*(?!\w)", r"\1", text)
    text = re.sub(r"`([^`]+)`_?", r"\1", text)
    text = text.replace("---", "\u2014").replace("--", "\u2013").replace("\\ ", "")
    text = text.replace("\\", "")
    return " ".join(text.split())


def _is_title(lines: list[str], index: int) -> bool:
    """A section title: text over an underline (indented text needs an overline too)."""
    line = lines[index]
    overlined = index > 0 and bool(_UNDERLINE.match(lines[index - 1]))
    return (
        bool(line.strip())
        and not _UNDERLINE.match(line)
        and not line.startswith("..")
        and (overlined or not line.startswith(" "))
        and index + 1 < len(lines)
        and bool(_UNDERLINE.match(lines[index + 1]))
        and len(lines[index + 1].rstrip()) >= len(line.rstrip())
    )


def module_truth(rst: str, module: str) -> dict[str, Any] | None:
    """The ground-truth fields of `module` from the source of the page documenting it."""
    lines = rst.splitlines()
    directive = re.compile(r"^\.\. (?:py:)?module:: +" + re.escape(module) + r"\s*$")
    found = [i for i, line in enumerate(lines) if directive.match(line)]
    if not found:
        return None
    start = found[0]
    options: dict[str, str] = {}
    key = None
    end = start + 1
    while end < len(lines) and lines[end].startswith((" ", "\t")):
        option = re.match(r"^\s+:(\w+):\s*(.*)$", lines[end])
        if option:
            key = option.group(1)
            options[key] = option.group(2)
        elif key:
            options[key] += " " + lines[end].strip()
        end += 1
    title = None
    for index in range(start - 1, -1, -1):
        if _is_title(lines, index):
            title = rst_inline_text(lines[index])
            break
    preamble = []
    for index in range(end, len(lines)):
        if _DESCRIPTION.match(lines[index]) or _is_title(lines, index):
            break
        preamble.append(lines[index])
    text = "\n".join(preamble)
    source = _SOURCE.search(text)
    added = _VERSIONADDED.search(text)
    synopsis = " ".join(options.get("synopsis", "").split())
    return {
        "title": title,
        "synopsis": synopsis or None,
        "source_path": source.group(1).strip() if source else None,
        "added_in": added.group(1).rstrip(".") if added else None,
        "deprecated": "deprecated" in options,
    }


def module_records(html: Path | None = None, *, base_url: str = BASE_URL) -> list[dict[str, Any]]:
    """One record per module of the inventory: `{"module", "doc_url", "page", "fragment",
    "truth": {field: value or None}}`, sorted by module name."""
    html = html or ensure_corpus()
    records = []
    sources: dict[str, str] = {}
    for entry in read_inventory(html / "objects.inv"):
        if entry.role != "py:module":
            continue
        page, _, fragment = entry.uri.partition("#")
        rst_path = html / "_sources" / (page.removesuffix(".html") + ".rst.txt")
        if page not in sources:
            try:
                sources[page] = rst_path.read_text(encoding="utf-8")
            except OSError:
                sources[page] = ""
        truth = module_truth(sources[page], entry.name)
        if truth is None:
            continue
        records.append(
            {
                "module": entry.name,
                "doc_url": base_url + entry.uri,
                "page": page,
                "fragment": fragment,
                "truth": truth,
            }
        )
    return sorted(records, key=lambda r: r["module"])


def stdlib_source_exists(source_path: str) -> bool:
    """Does the interpreter's standard library have this `Lib/...` file (distributions may split
    some packages out, e.g. Debian's distutils and lib2to3)?"""
    relative = source_path.removeprefix("Lib/").rstrip("/")
    return (Path(sysconfig.get_paths()["stdlib"]) / relative).exists()


# -- datasets and scoring ---------------------------------------------------------------------------


def write_dataset(
    directory: str | Path,
    records: Iterable[dict[str, Any]] | None = None,
    *,
    name: str = DATASET_NAME,
    fields: dict[str, str] | None = None,
) -> Path:
    """Write `<name>.csv` (module, doc_url, the fields empty) and `<name>.yaml`; returns the spec."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    records = list(records) if records is not None else module_records()
    fields = fields or FIELDS
    with open(directory / f"{name}.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["module", "doc_url", *fields])
        for record in records:
            writer.writerow([record["module"], record["doc_url"], *([""] * len(fields))])
    lines = [
        f"name: {name}",
        f"source: {name}.csv",
        "id: module",
        "urls: [doc_url]",
        "fields:",
        *(f"  {field}: {{type: {ftype}}}" for field, ftype in fields.items()),
        "crawl:",
        "  depth: 1",
        "",
    ]
    spec = directory / f"{name}.yaml"
    spec.write_text("\n".join(lines), encoding="utf-8")
    return spec


_TYPOGRAPHIC = str.maketrans({"\u201c": '"', "\u201d": '"', "\u2018": "'", "\u2019": "'"})


def _comparable(value: Any) -> Any:
    """Whitespace collapsed; typographic quotes as ASCII quotes (Sphinx renders the sources'
    straight quotes as curly ones: the same text)."""
    if isinstance(value, str):
        return " ".join(value.translate(_TYPOGRAPHIC).split()) or None
    return value


def evaluate(
    records: Iterable[dict[str, Any]],
    values: dict[str, dict[str, Any]],
    fields: Iterable[str] | None = None,
) -> dict[str, Any]:
    """Compare extracted `values` ({module: {field: value}}) with the records' truth.

    A cell is correct when the value equals the truth (whitespace collapsed), or when both are
    missing; `deprecated` counts a missing value as false. `accuracy` is over every cell;
    `accuracy_present` over the cells where the truth or the extraction has a value (the honest
    figure: cells that are trivially empty on both sides do not count)."""
    fields = list(fields or FIELDS)
    per_field: dict[str, dict[str, int]] = {
        f: {"cells": 0, "correct": 0, "present": 0, "present_correct": 0} for f in fields
    }
    mistakes: list[dict[str, Any]] = []
    records_seen = 0
    for record in records:
        records_seen += 1
        got = values.get(record["module"], {})
        for field in fields:
            truth = _comparable(record["truth"].get(field))
            value = _comparable(got.get(field))
            if FIELDS.get(field) == "boolean":
                truth, value = bool(truth), bool(value)
            stats = per_field[field]
            stats["cells"] += 1
            ok = truth == value
            stats["correct"] += ok
            if truth not in (None, False) or value not in (None, False):
                stats["present"] += 1
                stats["present_correct"] += ok
            if not ok:
                mistakes.append(
                    {"module": record["module"], "field": field, "truth": truth, "value": value}
                )
    cells = sum(s["cells"] for s in per_field.values())
    correct = sum(s["correct"] for s in per_field.values())
    present = sum(s["present"] for s in per_field.values())
    present_correct = sum(s["present_correct"] for s in per_field.values())
    return {
        "records": records_seen,
        "cells": cells,
        "accuracy": correct / cells if cells else 0.0,
        "accuracy_present": present_correct / present if present else 0.0,
        "per_field": {
            f: {
                **s,
                "accuracy": s["correct"] / s["cells"] if s["cells"] else 0.0,
                "accuracy_present": s["present_correct"] / s["present"] if s["present"] else 1.0,
            }
            for f, s in per_field.items()
        },
        "mistakes": mistakes,
    }


def extract_offline(
    records: Iterable[dict[str, Any]],
    mappings: Any,
    *,
    html: Path | None = None,
    base_url: str = BASE_URL,
    depth: int = 1,
    field_types: dict[str, str] | None = None,
) -> dict[str, dict[str, Any]]:
    """What a goal-directed crawl of the records would resolve, without a network: pages come
    from the corpus (parsed once each), the record's URL at depth 0, the url_parsers' links up to
    `depth` while fields are missing; a field takes the first value found, highest mapping
    priority first within a depth (the rule of `enrich_crawl.resolve`)."""
    from enrich_crawl.extract.mapping import run_mapping
    from enrich_crawl.extract.page import Page
    from enrich_crawl.urls import fragment_of, without_fragment

    html = html or ensure_corpus()
    field_types = field_types or FIELDS
    pages: dict[str, Page | None] = {}

    def page_at(url: str) -> Page | None:
        key = without_fragment(url)
        if key not in pages:
            if not key.startswith(base_url):
                pages[key] = None
            else:
                path = html / key[len(base_url) :]
                try:
                    pages[key] = Page(key, path.read_bytes(), content_type="text/html")
                except OSError:
                    pages[key] = None
        return pages[key]

    results: dict[str, dict[str, Any]] = {}
    for record in records:
        wanted = set(field_types)
        found: dict[str, Any] = {}
        frontier = [record["doc_url"]]
        seen: set[str] = set()
        for _level in range(depth + 1):
            next_frontier: list[str] = []
            for url in frontier:
                if url in seen or not (wanted - set(found)):
                    continue
                seen.add(url)
                page = page_at(url)
                if page is None:
                    continue
                fragment = fragment_of(url)
                matched = mappings.matching(page.url + (f"#{fragment}" if fragment else ""))
                for mapping in matched:
                    result = run_mapping(
                        mapping,
                        page,
                        fragment=fragment,
                        record_id=record["module"],
                        field_types=dict(field_types),
                    )
                    for name, value in result.fields.items():
                        if name in wanted and name not in found:
                            found[name] = value
                    next_frontier.extend(result.links)
            frontier = next_frontier
        results[record["module"]] = found
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the Python-docs corpus")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("fetch", help="download and extract the corpus into the cache")
    web = sub.add_parser("web", help="write the virtual-web host folder")
    web.add_argument("root")
    data = sub.add_parser("dataset", help="write the dataset (CSV + spec)")
    data.add_argument("directory")
    args = parser.parse_args(argv)
    try:
        html = ensure_corpus()
    except CorpusUnavailable as exc:
        sys.stderr.write(f"pydocs: {exc}\n")
        return 1
    if args.command == "fetch":
        sys.stdout.write(f"{html}\n")
    elif args.command == "web":
        sys.stdout.write(f"{Path(args.root) / build_web(args.root, html=html)}\n")
    else:
        sys.stdout.write(f"{write_dataset(args.directory)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
