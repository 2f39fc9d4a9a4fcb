"""Loading mappings: the JSON Schema, errors naming file + JSON path + reason, the folder rules."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest

from enrich_crawl.extract.errors import MappingError
from enrich_crawl.extract.mapping import (
    MappingLoadError,
    MappingSet,
    compile_mapping,
    load_mapping_file,
)
from enrich_crawl.extract.schema import build_schema, schema_text
from enrich_crawl_tests.conftest import FIXTURES, REPO

SCHEMA_FILE = REPO / "mappings" / "mapping.schema.json"


def minimal(**extra) -> dict:
    raw = {
        "name": "m",
        "url_patterns": [{"type": "regex", "pattern": "^https://x\\.example/"}],
        "fields": [
            {"name": "f", "processors": [{"type": "xpath", "parameters": {"expression": "//a"}}]}
        ],
    }
    raw.update(extra)
    return raw


def write(directory: Path, name: str, content) -> Path:
    path = directory / name
    path.write_text(
        content if isinstance(content, str) else json.dumps(content, indent=2), encoding="utf-8"
    )
    return path


def problems_of(raw, path: Path | None = None) -> list[tuple[str, str]]:
    with pytest.raises(MappingError) as caught:
        compile_mapping(raw, path)
    return caught.value.problems


def test_shipped_schema_file_is_up_to_date_and_a_valid_schema():
    assert SCHEMA_FILE.read_text(encoding="utf-8") == schema_text(), (
        "regenerate: python -m enrich_crawl.extract.schema mappings/mapping.schema.json"
    )
    jsonschema.Draft202012Validator.check_schema(json.loads(SCHEMA_FILE.read_text()))


def test_every_shipped_and_fixture_mapping_is_valid_for_the_schema_and_the_loader():
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA_FILE.read_text()))
    paths = sorted((REPO / "mappings").glob("*.json")) + sorted(
        (FIXTURES / "mappings").glob("*/mapping.json")
    )
    paths = [p for p in paths if not p.name.endswith(".schema.json")]
    assert len(paths) >= 10
    for path in paths:
        raw = json.loads(path.read_text(encoding="utf-8"))
        assert not list(validator.iter_errors(raw)), path  # what an editor would check
        load_mapping_file(path)
    assert (
        len(MappingSet.load(REPO / "mappings")) == len(list((REPO / "mappings").glob("*.json"))) - 1
    )


def test_every_processor_is_in_the_docs_table():
    from enrich_crawl.extract.processors import REGISTRY

    section = (REPO / "docs" / "mappings.md").read_text(encoding="utf-8")
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    documented = {name for row in rows for name in re.findall(r"`(\w+)`", row.split("|")[1])}
    assert set(REGISTRY) <= documented, set(REGISTRY) - documented


def test_the_schema_refuses_what_the_loader_refuses():
    validator = jsonschema.Draft202012Validator(build_schema())
    bad = minimal(fields=[{"name": "f", "processors": [{"type": "regex", "parameters": {}}]}])
    assert list(validator.iter_errors(bad))
    assert list(validator.iter_errors(minimal(render="sometimes")))
    assert list(validator.iter_errors(minimal(priority="high")))
    assert not list(validator.iter_errors(minimal(priority=-3, render="auto", wait_for="#x")))


@pytest.mark.parametrize(
    ("raw", "where", "reason"),
    [
        ([], "$", "expected an object"),
        ({"url_patterns": ["x"], "fields": []}, "$.name", "required key 'name'"),
        (minimal(name="has space"), "$.name", "letters, digits"),
        (minimal(name=""), "$.name", "letters, digits"),
        (minimal(url_patterns=[]), "$.url_patterns", "must not be an empty list"),
        (minimal(url_patterns="^x"), "$.url_patterns", "expected a list"),
        (minimal(url_patterns=[{"pattern": "("}]), "$.url_patterns[0].pattern", "invalid regular"),
        (
            minimal(url_patterns=[{"type": "regexp", "pattern": "x"}]),
            "$.url_patterns[0].type",
            "did you mean 'regex'",
        ),
        (minimal(url_patterns=[{"type": "glob"}]), "$.url_patterns[0].pattern", "required"),
        (minimal(url_patterns=[""]), "$.url_patterns[0]", "must not be empty"),
        (minimal(render="sometimes"), "$.render", "unknown render mode"),
        (minimal(priority=1.5), "$.priority", "expected an integer"),
        (minimal(priority=True), "$.priority", "expected an integer"),
        (minimal(wait_for=""), "$.wait_for", "must not be empty"),
        (minimal(feilds=[]), "$.feilds", "did you mean 'fields'"),
        (minimal(fields=[], url_parsers=[]), "$", "needs fields or url_parsers"),
        (minimal(fields={"f": []}), "$.fields", "expected a list"),
        (minimal(fields=[{"processors": []}]), "$.fields[0].name", "required key 'name'"),
        (minimal(fields=[{"name": "f"}]), "$.fields[0].processors", "required key"),
        (minimal(fields=[{"name": "f", "processors": []}]), "$.fields[0].processors", "empty"),
        (
            minimal(fields=[{"name": "f", "type": "int", "processors": [{"type": "first"}]}]),
            "$.fields[0].type",
            "unknown field type",
        ),
        (
            minimal(fields=[{"name": "f", "processors": [{"type": "xpth"}]}]),
            "$.fields[0].processors[0].type",
            "unknown processor type",
        ),
        (
            minimal(url_parsers=[{"processors": [{"type": "css", "parameters": {}}]}]),
            "$.url_parsers[0].processors[0].parameters.expression",
            "required key 'expression'",
        ),
        (
            minimal(url_parsers=[{"descr": "x", "processors": [{"type": "first"}]}]),
            "$.url_parsers[0].descr",
            "unknown key",
        ),
    ],
)
def test_invalid_mappings_name_the_json_path_and_reason(raw, where, reason):
    problems = problems_of(raw)
    assert any(w == where and reason in r for w, r in problems), problems


def test_all_problems_of_a_file_are_reported_with_the_file(tmp_path):
    raw = minimal(
        renderr="js",
        fields=[
            {"name": "a", "processors": [{"type": "xpath", "parameters": {"expresion": "//a"}}]},
            {"name": "b", "processors": [{"type": "regex", "parameters": {"pattern": "(a+)+"}}]},
            {"name": "c", "processors": [{"type": "jsonpath", "parameters": {"expression": "$["}}]},
            {"name": "a", "processors": [{"type": "css", "parameters": {"expression": "a[["}}]},
        ],
    )
    path = write(tmp_path, "bad.json", raw)
    with pytest.raises(MappingError) as caught:
        load_mapping_file(path)
    errors = caught.value.errors
    assert all(e.startswith(f"{path}: $") for e in errors), errors
    wheres = {e.split(": ")[1] for e in errors}
    assert {
        "$.renderr",
        "$.fields[0].processors[0].parameters.expresion",
        "$.fields[1].processors[0].parameters.pattern",
        "$.fields[2].processors[0].parameters.expression",
        "$.fields[3].name",
        "$.fields[3].processors[0].parameters.expression",
    } <= wheres
    assert any("defined twice" in e for e in errors)


def test_file_level_errors(tmp_path):
    cases = {
        "syntax.json": (
            '{"name": "x",\n  "url_patterns": [}',
            "not valid JSON: Expecting value at line 2",
        ),
        "latin1.json": (None, "not UTF-8"),
    }
    (tmp_path / "latin1.json").write_bytes('{"name": "caf\xe9"}'.encode("latin-1"))
    write(tmp_path, "syntax.json", cases["syntax.json"][0])
    for name, (_, reason) in cases.items():
        with pytest.raises(MappingError) as caught:
            load_mapping_file(tmp_path / name)
        assert caught.value.where == f"{tmp_path / name}: $"
        assert reason in caught.value.reason
    with pytest.raises(MappingError, match="cannot read"):
        load_mapping_file(tmp_path / "missing.json")


def test_folder_duplicate_names_strict_and_lenient(tmp_path):
    write(tmp_path, "a.json", minimal(name="same"))
    write(tmp_path, "b.json", minimal(name="same"))
    write(tmp_path, "c.json", minimal(name="broken", render="never"))
    write(tmp_path, "ok.json", minimal(name="ok", priority=5))
    write(tmp_path, "mapping.schema.json", build_schema())  # never read as a mapping
    (tmp_path / "notes.txt").write_text("not a mapping")
    with pytest.raises(MappingLoadError) as caught:
        MappingSet.load(tmp_path)
    assert any(
        "b.json: $.name: duplicate mapping name 'same' (also in a.json)" in e
        for e in caught.value.errors
    )
    assert any("c.json: $.render" in e for e in caught.value.errors)
    lenient = MappingSet.load(tmp_path, strict=False)
    assert [m.name for m in lenient] == ["ok", "same"]  # priority first, then name
    assert len(lenient.errors) == 2
    with pytest.raises(MappingLoadError, match="not found"):
        MappingSet.load(tmp_path / "nope")


def test_a_single_file_loads_as_a_set(tmp_path):
    path = write(tmp_path, "one.json", minimal(name="one"))
    assert [m.name for m in MappingSet.load(path)] == ["one"]


def test_schema_reference_and_descriptions_are_allowed(tmp_path):
    raw = minimal(description="what it is for")
    raw["$schema"] = "./mapping.schema.json"
    raw["fields"][0]["description"] = "why"
    raw["fields"][0]["processors"][0]["description"] = "how"
    mapping = compile_mapping(raw)
    assert mapping.description == "what it is for"


def test_mapping_attributes_the_crawler_uses():
    raw = minimal(
        render="auto",
        priority=7,
        wait_for="#main",
        url_parsers=[
            {
                "description": "next",
                "processors": [{"type": "xpath", "parameters": {"expression": "//a/@href"}}],
            }
        ],
    )
    mapping = compile_mapping(raw, Path("/x/m.json"))
    assert (mapping.name, mapping.render, mapping.priority, mapping.wait_for) == (
        "m",
        "auto",
        7,
        "#main",
    )
    assert mapping.path == Path("/x/m.json")
    assert mapping.field_names == ["f"]
    assert mapping.fields[0].name == "f"
    assert mapping.url_parsers[0].description == "next"
    assert not mapping.uses_fragment and not mapping.uses_id


def test_uses_fragment_and_id_are_detected_from_expressions_and_templates():
    def uses(processors):
        m = compile_mapping(minimal(fields=[{"name": "f", "processors": processors}]))
        return m.uses_fragment, m.uses_id

    xp = lambda e: {"type": "xpath", "parameters": {"expression": e}}  # noqa: E731
    assert uses([xp("//section[@id=$fragment]")]) == (True, False)
    assert uses([xp("//tr[td=$id]")]) == (False, True)
    assert uses([xp("//tr[td='$id']")]) == (False, True)  # conservative: may read it
    assert uses([xp("//a"), {"type": "format", "parameters": {"template": "{id}/{value}"}}]) == (
        False,
        True,
    )
    assert uses([xp("//a"), {"type": "format", "parameters": {"template": "{{id}}"}}]) == (
        False,
        False,
    )
    assert uses([xp("//a"), {"type": "regex", "parameters": {"pattern": "$fragment"}}]) == (
        False,
        False,
    )


def test_url_patterns_regex_glob_prefix_on_the_final_url_with_fragment():
    mapping = compile_mapping(
        minimal(
            url_patterns=[
                "^https?://a\\.example/item/\\d+(?:#.*)?$",
                {"type": "glob", "pattern": "https://b.example/*/about"},
                {"type": "prefix", "pattern": "https://c.example/docs/"},
            ]
        )
    )
    assert mapping.matches("https://a.example/item/12")
    assert mapping.matches("http://a.example/item/12#section-3")
    assert not mapping.matches("https://a.example/item/x")
    assert mapping.matches("https://b.example/acme/about")
    assert not mapping.matches("https://b.example/acme/about/more")
    assert mapping.matches("https://c.example/docs/x?y=1")
    assert not mapping.matches("https://c.example/blog/")


def test_matching_returns_the_highest_priority_first(tmp_path):
    for name, priority in (("low", -1), ("high", 10), ("mid", 0), ("also_mid", 0)):
        write(tmp_path, f"{name}.json", minimal(name=name, priority=priority))
    mappings = MappingSet.load(tmp_path)
    assert [m.name for m in mappings.matching("https://x.example/p")] == [
        "high",
        "also_mid",
        "mid",
        "low",
    ]
    assert mappings.matching("https://other.example/") == []
