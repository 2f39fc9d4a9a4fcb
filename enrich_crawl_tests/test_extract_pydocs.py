"""The Python-docs mappings on the real corpus (Debian's python3.11-doc), against a ground truth
taken from the reStructuredText sources and Sphinx's inventory, never from the pages."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from enrich_crawl.extract.mapping import MappingSet
from enrich_crawl.testing import pydocs
from enrich_crawl.virtualweb import running_web
from enrich_crawl_tests.conftest import REPO, product_env, run_cli

REQUIRED_ACCURACY = 0.97


@pytest.fixture(scope="session")
def pydocs_html() -> Path:
    """The corpus, downloaded into the cache on first use (`apt-get download python3.11-doc`)."""
    try:
        return pydocs.ensure_corpus()
    except pydocs.CorpusUnavailable as exc:
        if os.environ.get("ENRICH_REQUIRE_SERVICES") == "1":
            pytest.fail(f"Python-docs corpus unavailable: {exc}")
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def records(pydocs_html) -> list[dict]:
    return pydocs.module_records(pydocs_html)


def test_records_come_from_the_inventory_with_independent_truth(pydocs_html, records):
    inventory = [e for e in pydocs.read_inventory(pydocs_html / "objects.inv")]
    modules = {e.name for e in inventory if e.role == "py:module"}
    assert len(records) == len(modules) >= 300
    by_name = {r["module"]: r for r in records}
    assert (
        by_name["json"]["doc_url"] == "https://docs.python.org/3.11/library/json.html#module-json"
    )
    assert by_name["json"]["truth"] == {
        "title": "json — JSON encoder and decoder",
        "synopsis": "Encode and decode the JSON format.",
        "source_path": "Lib/json/__init__.py",
        "added_in": None,
        "deprecated": False,
    }
    assert by_name["importlib.abc"]["fragment"] == "module-importlib.abc"
    assert by_name["asyncore"]["truth"]["deprecated"] is True
    assert by_name["zipapp"]["truth"]["added_in"] == "3.5"
    # the interpreter confirms the source paths (distributions may leave a few packages out)
    paths = [r["truth"]["source_path"] for r in records if r["truth"]["source_path"]]
    assert sum(map(pydocs.stdlib_source_exists, paths)) >= 0.9 * len(paths)
    filled = {f: sum(r["truth"][f] not in (None, False) for r in records) for f in pydocs.FIELDS}
    assert filled["title"] > 300 and filled["synopsis"] > 300 and filled["source_path"] > 150
    assert filled["added_in"] > 20 and filled["deprecated"] > 10


def test_mappings_reach_the_required_field_accuracy(pydocs_html, records, capsys):
    mappings = MappingSet.load(REPO / "mappings")
    values = pydocs.extract_offline(records, mappings, html=pydocs_html)
    report = pydocs.evaluate(records, values)
    lines = [
        f"Python-docs corpus: {report['records']} modules x {len(pydocs.FIELDS)} fields: "
        f"field accuracy {report['accuracy']:.2%} (all cells), "
        f"{report['accuracy_present']:.2%} (cells with a value in the truth or the extraction)"
    ]
    for name, stats in report["per_field"].items():
        lines.append(
            f"  {name:<12} {stats['accuracy_present']:.2%} of {stats['present']} non-empty, "
            f"{stats['accuracy']:.2%} of {stats['cells']}"
        )
    lines += [f"  mistake: {m}" for m in report["mistakes"][:10]]
    with capsys.disabled():
        print("\n" + "\n".join(lines))
    assert report["accuracy_present"] >= REQUIRED_ACCURACY, "\n".join(lines)
    for name, stats in report["per_field"].items():
        assert stats["accuracy_present"] >= 0.9, (name, stats)


def test_evaluate_counts_mistakes_and_empty_cells():
    records = [
        {"module": "a", "truth": {"title": "A", "deprecated": False, "added_in": None}},
        {"module": "b", "truth": {"title": "B  x", "deprecated": True, "added_in": "3.1"}},
    ]
    values = {"a": {"title": "A", "added_in": "3.2"}, "b": {"title": "B x", "deprecated": True}}
    report = pydocs.evaluate(records, values, fields=["title", "deprecated", "added_in"])
    assert report["cells"] == 6
    assert report["accuracy"] == pytest.approx(4 / 6)
    # present cells: a.title, b.title, b.deprecated, a.added_in (extracted), b.added_in (truth)
    assert report["accuracy_present"] == pytest.approx(3 / 5)
    assert {(m["module"], m["field"]) for m in report["mistakes"]} == {
        ("a", "added_in"),
        ("b", "added_in"),
    }


def test_rst_truth_follows_sphinx_rendering():
    assert (
        pydocs.rst_inline_text(":mod:`!importlib` --- The implementation of :keyword:`!import`")
        == "importlib — The implementation of import"
    )
    assert pydocs.rst_inline_text(":mod:`distutils.log` --- Simple :pep:`282`-style logging") == (
        "distutils.log — Simple PEP 282-style logging"
    )
    assert pydocs.rst_inline_text(":mod:`reprlib` --- Alternate :func:`repr` implementation") == (
        "reprlib — Alternate repr() implementation"
    )
    assert pydocs.rst_inline_text(":mod:`x` -- ``literal`` and :class:`~a.b.C`") == (
        "x – literal and C"
    )
    source = """
=================================
 Using :mod:`!importlib.metadata`
=================================

.. module:: importlib.metadata
   :synopsis: The implementation
      of the importlib metadata.
   :deprecated:

.. versionadded:: 3.8

**Source code:** :source:`Lib/importlib/metadata/__init__.py`

Text.

.. function:: version(name)

   .. versionadded:: 3.9
"""
    assert pydocs.module_truth(source, "importlib.metadata") == {
        "title": "Using importlib.metadata",
        "synopsis": "The implementation of the importlib metadata.",
        "source_path": "Lib/importlib/metadata/__init__.py",
        "added_in": "3.8",
        "deprecated": True,
    }
    assert pydocs.module_truth(source, "importlib") is None


def test_dataset_written_for_the_records_is_a_valid_spec(tmp_path, records):
    from enrich_crawl.dataset.spec import load_spec

    spec_path = pydocs.write_dataset(tmp_path, records[:5])
    spec = load_spec(spec_path)
    assert spec.name == "pymodules"
    assert spec.field_types() == pydocs.FIELDS
    lines = (tmp_path / "pymodules.csv").read_text(encoding="utf-8").splitlines()
    assert lines[0] == "module,doc_url,title,synopsis,source_path,added_in,deprecated"
    assert len(lines) == 6


def test_mapping_test_fetches_the_docs_from_the_virtual_web(tmp_path, pydocs_html):
    """`enrich-crawl mapping test --url` as a user runs it, against docs.python.org served by the
    virtual web over HTTPS (its CA trusted through SSL_CERT_FILE), following the proxy."""
    host = pydocs.build_web(tmp_path / "web", html=pydocs_html)
    assert (tmp_path / "web" / host / "3.11" / "library" / "json.html").exists()
    with running_web(tmp_path / "web", log_path=tmp_path / "requests.jsonl") as web:
        env = product_env(**web.proxy_env(), SSL_CERT_FILE=str(web.ca_path))
        url = "https://docs.python.org/3.11/library/importlib.html#module-importlib.abc"
        proc = run_cli(["mapping", "test", "mappings", "--url", url], env, REPO, timeout=120)
        assert proc.returncode == 0, proc.stderr
        output = json.loads(proc.stdout)
        index = run_cli(
            [
                "mapping",
                "test",
                "mappings/python_docs_modindex.json",
                "--url",
                "https://docs.python.org/3.11/py-modindex.html",
                "--id",
                "asyncore",
            ],
            env,
            REPO,
            timeout=120,
        )
        log = web.read_log()
    assert output == {
        "mappings": ["python_docs_module"],
        "fields": {
            "title": "importlib.abc – Abstract base classes related to import",
            "synopsis": "Abstract base classes related to import",
            "source_path": "Lib/importlib/abc.py",
        },
        "links": ["https://docs.python.org/3.11/py-modindex.html"],
    }
    assert index.returncode == 0, index.stderr
    assert json.loads(index.stdout)["fields"] == {
        "synopsis": "A base class for developing asynchronous socket handling services.",
        "deprecated": True,
    }
    fetched = [(r["host"], r["path"]) for r in log if r["method"] == "GET"]
    assert ("docs.python.org", "/3.11/library/importlib.html") in fetched  # without the fragment
