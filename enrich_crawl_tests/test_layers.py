"""The layers of the house: production code never imports the testing package (test helpers and
oracles live there; the virtual web, a runtime feature, lives in enrich_crawl.virtualweb)."""

from __future__ import annotations

import ast
from pathlib import Path

import enrich_crawl

PACKAGE = Path(enrich_crawl.__file__).parent


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_production_code_does_not_import_the_testing_package():
    production = [
        path for path in PACKAGE.rglob("*.py") if (PACKAGE / "testing") not in path.parents
    ]
    assert len(production) > 50  # the walk really found the package
    arrows = {
        str(path.relative_to(PACKAGE)): sorted(
            m for m in _imported_modules(path) if m.startswith("enrich_crawl.testing")
        )
        for path in production
    }
    assert {name: mods for name, mods in arrows.items() if mods} == {}


def _environment_reads(path: Path) -> list[int]:
    """Lines that read a variable of the environment: os.environ.get(...), os.getenv(...),
    os.environ[...] not assigned to (passing the whole environment on, dict(os.environ), is no
    read of a variable)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    stores = {
        id(target)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete))
        for target in (
            node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
        )
    }

    def is_environ(node: ast.AST) -> bool:
        return ast.unparse(node) == "os.environ"

    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = ast.unparse(node.func)
            if name in ("os.environ.get", "os.getenv"):
                lines.append(node.lineno)
        elif isinstance(node, ast.Subscript) and is_environ(node.value) and id(node) not in stores:
            lines.append(node.lineno)
    return lines


def test_the_environment_is_read_only_in_config():
    """Settings have one home (enrich_crawl/config.py: each variable, its parsing and default);
    Dagster resources read theirs through config or EnvVar."""
    production = [
        path
        for path in PACKAGE.rglob("*.py")
        if (PACKAGE / "testing") not in path.parents and path != PACKAGE / "config.py"
    ]
    reads = {
        str(path.relative_to(PACKAGE)): lines
        for path in production
        if (lines := _environment_reads(path))
    }
    assert reads == {}
    assert _environment_reads(PACKAGE / "config.py")  # the scan does see reads


# the spider's rooms, lowest first: each imports only rooms before it, and none the spider
SPIDER_ROOMS = ["tally", "outcomes", "extraction", "rendering", "sources", "feed", "report"]


def test_the_spider_rooms_import_one_another_one_way():
    crawl = PACKAGE / "crawl"
    arrows = {}
    for index, room in enumerate(SPIDER_ROOMS):
        imported = _imported_modules(crawl / f"{room}.py")
        later = [*SPIDER_ROOMS[index + 1 :], "spider"]
        arrows[room] = sorted(m for m in later if f"enrich_crawl.crawl.{m}" in imported)
    assert {room: later for room, later in arrows.items() if later} == {}
    spider = _imported_modules(crawl / "spider.py")
    assert all(f"enrich_crawl.crawl.{room}" in spider for room in SPIDER_ROOMS[1:])


def test_crawl_components_never_reach_through_the_spider():
    """The scheduler, downloader, middlewares and the spider's rooms find what they share in
    CrawlContext (crawl/context.py), never as `crawler.spider` or `getattr(spider, ...)`; only the
    worker, which runs the crawl, reads the finished spider's statistics."""
    crawl = PACKAGE / "crawl"
    reaches = {}
    for path in crawl.rglob("*.py"):
        if path.name == "worker.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        lines = [
            node.lineno
            for node in ast.walk(tree)
            if (isinstance(node, ast.Attribute) and node.attr == "spider")
            or (
                isinstance(node, ast.Call)
                and ast.unparse(node.func) == "getattr"
                and node.args
                and ast.unparse(node.args[0]) == "spider"
            )
        ]
        if lines:
            reaches[str(path.relative_to(PACKAGE))] = lines
    assert reaches == {}
    assert any(
        isinstance(node, ast.Attribute) and node.attr == "spider"
        for node in ast.walk(ast.parse((crawl / "worker.py").read_text(encoding="utf-8")))
    )  # the scan does see such a reach
