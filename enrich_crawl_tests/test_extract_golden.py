"""Golden files: `fixtures/mappings/<mapping>/<case>/{input.*, meta.json, output.json}`.

Each case is a saved page (`input.html` / `input.json`, or the file `meta.input` names) and how it
was fetched (`meta.json`: `url` with the record's fragment, `content_type` as the server sent it,
optional `id` ($id), `field_types` (the dataset's types) and `description`). `output.json` is what
`enrich-crawl mapping test` prints for it: `{"mappings", "fields", "links"}`. The mapping is
`mappings/<mapping>.json`, or `fixtures/mappings/<mapping>/mapping.json` for test-only mappings.

After an intended change of behaviour, regenerate with `ENRICH_UPDATE_GOLDEN=1 pytest -k golden`
and review the diff.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from enrich_crawl.extract.mapping import load_mapping_file, try_mappings
from enrich_crawl.extract.page import Page
from enrich_crawl.urls import fragment_of, without_fragment
from enrich_crawl_tests.conftest import FIXTURES, REPO

GOLDEN = FIXTURES / "mappings"


def _cases() -> list[Path]:
    return sorted(meta.parent for meta in GOLDEN.glob("*/*/meta.json"))


def _mapping_path(name: str) -> Path:
    local = GOLDEN / name / "mapping.json"
    return local if local.exists() else REPO / "mappings" / f"{name}.json"


def _input(case: Path, meta: dict) -> Path:
    if meta.get("input"):
        return (case / meta["input"]).resolve()
    found = sorted(case.glob("input.*"))
    assert len(found) == 1, f"{case}: expected one input.* file, found {found}"
    return found[0]


def run_case(case: Path) -> dict:
    meta = json.loads((case / "meta.json").read_text(encoding="utf-8"))
    mapping = load_mapping_file(_mapping_path(case.parent.name))
    page = Page(
        without_fragment(meta["url"]),
        _input(case, meta).read_bytes(),
        content_type=meta.get("content_type"),
    )
    output, _errors = try_mappings(
        [mapping],
        page,
        fragment=meta.get("fragment", fragment_of(meta["url"])),
        record_id=meta.get("id", ""),
        field_types=meta.get("field_types"),
    )
    return output


@pytest.mark.parametrize("case", _cases(), ids=lambda c: f"{c.parent.name}/{c.name}")
def test_golden(case: Path) -> None:
    output = json.loads(json.dumps(run_case(case), ensure_ascii=False))
    expected_path = case / "output.json"
    if os.environ.get("ENRICH_UPDATE_GOLDEN") == "1":
        expected_path.write_text(
            json.dumps(output, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
        )
    assert expected_path.exists(), f"{expected_path} missing (ENRICH_UPDATE_GOLDEN=1 writes it)"
    expected = json.loads(expected_path.read_text(encoding="utf-8"))
    assert output == expected


def test_golden_cases_cover_the_required_kinds() -> None:
    """Several encodings, broken HTML, a JSON API page and a JSON-LD page are all present."""
    metas = {c: json.loads((c / "meta.json").read_text(encoding="utf-8")) for c in _cases()}
    inputs = {c: _input(c, m).read_bytes() for c, m in metas.items()}
    assert any(b.startswith(b"\xff\xfe") for b in inputs.values()), "UTF-16 with BOM"
    assert any("shift_jis" in (m.get("content_type") or "").lower() for m in metas.values())
    assert any(b"windows-1252" in b for b in inputs.values())
    assert any((m.get("content_type") or "").startswith("application/json") for m in metas.values())
    assert any(b"application/ld+json" in b for b in inputs.values())
    assert any(c.name == "broken_html" for c in metas)
    for case in metas:  # every expected output extracts something or says why not
        expected = json.loads((case / "output.json").read_text(encoding="utf-8"))
        assert set(expected) == {"mappings", "fields", "links"}
