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
