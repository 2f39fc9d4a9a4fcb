"""The bundled demo dataset (`enrich-crawl demo`): a dirty CSV, its spec, its virtual web, its truth.

`DEMO_DIR/web/<hostname>/...` is served by `enrich_crawl.virtualweb`; `expected.json` holds the exact
outcome the demo must reach (see README.md in this folder).
"""

from pathlib import Path

__all__ = ["DEMO_DIR", "DEMO_SPEC"]

DEMO_DIR = Path(__file__).resolve().parent
DEMO_SPEC = DEMO_DIR / "demo.yaml"
