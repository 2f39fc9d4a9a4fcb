"""Small messages that save a user's time: a misspelt spec key gets a "did you mean", broken mapping
JSON is reported where the comma is missing, a bad XPath says where it breaks, and `mapping test`
says why a page gave no field when the fragment or the record id is not on it."""

from __future__ import annotations

import json

import pytest

from enrich_crawl.dataset.spec import SpecError, load_spec
from enrich_crawl.extract.mapping import MappingError, load_mapping_file
from enrich_crawl_tests.conftest import product_env, run_cli

SPEC = "name: orgs\nsource: orgs.csv\nid: id\nurls: [url]\nfields:\n  employees: {type: integer}\n"


def _spec_error(tmp_path, text: str) -> str:
    (tmp_path / "orgs.csv").write_text("id,url,employees\n1,http://a.example/,\n")
    (tmp_path / "orgs.yaml").write_text(text, encoding="utf-8")
    with pytest.raises(SpecError) as caught:
        load_spec(tmp_path / "orgs.yaml")
    return str(caught.value)


@pytest.mark.parametrize(
    "text,expected",
    [
        (SPEC.replace("fields:", "feilds:"), "feilds: unknown key (known: "),
        (SPEC + "missing_value: ['-']\n", "missing_value: unknown key"),
        (SPEC + "crawl: {detph: 2}\n", "crawl.detph: unknown crawl setting (known: "),
        (SPEC.replace("{type: integer}", "{tpye: integer}"), "fields.employees.tpye: unknown"),
        (SPEC.replace("{type: integer}", "{type: interger}"), "unknown type 'interger'"),
        (SPEC + "format: {delimeter: ';'}\n", "format.delimeter: unknown option"),
        (SPEC + "stale: {colum: checked, days: 30}\n", "stale.colum: unknown option"),
        (SPEC + "stale: {column: c, days: 3, fields: [employes]}\n", "'employes' is not one"),
    ],
)
def test_a_misspelt_spec_key_gets_did_you_mean(tmp_path, text, expected):
    message = _spec_error(tmp_path, text)
    assert str(tmp_path / "orgs.yaml") in message
    assert expected in message
    suggestion = {
        "feilds": "fields",
        "missing_value": "missing_values",
        "detph": "depth",
        "tpye": "type",
        "interger": "integer",
        "delimeter": "delimiter",
        "colum": "column",
        "employes": "employees",
    }
    wanted = next(right for wrong, right in suggestion.items() if wrong in expected)
    assert message.endswith(f"; did you mean {wanted!r}?"), message


def test_a_spec_key_far_from_any_known_one_gets_no_guess(tmp_path):
    message = _spec_error(tmp_path, SPEC + "colour: red\n")
    assert "colour: unknown key (known: " in message
    assert "did you mean" not in message


def test_the_cli_shows_the_suggestion_in_a_few_lines(tmp_path):
    (tmp_path / "orgs.csv").write_text("id,url,employees\n1,http://a.example/,\n")
    (tmp_path / "orgs.yaml").write_text(SPEC + "crawl: {detph: 2}\n", encoding="utf-8")
    proc = run_cli(["run", "--dataset", "orgs.yaml"], product_env(), tmp_path, timeout=120)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) <= 5 and "Traceback" not in proc.stderr
    assert "orgs.yaml: crawl.detph: unknown crawl setting" in proc.stderr
    assert "did you mean 'depth'?" in proc.stderr


BROKEN = """{
  "name": "shop",
  "url_patterns": ["^https://shop\\\\.example/"]
  "fields": [{"name": "price", "processors": [{"type": "number"}]}]
}
"""


def test_broken_json_is_reported_where_the_comma_is_missing(tmp_path):
    path = tmp_path / "shop.json"
    path.write_text(BROKEN, encoding="utf-8")
    with pytest.raises(MappingError) as caught:
        load_mapping_file(path)
    # the comma belongs at the end of line 3 (after `]`), not at line 4 where the parser stopped
    line3 = BROKEN.splitlines()[2]
    assert caught.value.where == f"{path}: $"
    assert caught.value.reason.startswith(
        f"not valid JSON: a ',' is missing at line 3 column {len(line3) + 1}, after the value"
    )
    assert "line 4 column 3" in caught.value.reason  # where the next value starts

    proc = run_cli(["mapping", "check", str(tmp_path)], product_env(), tmp_path, timeout=120)
    assert proc.returncode != 0
    assert f"shop.json: $: not valid JSON: a ',' is missing at line 3 column {len(line3) + 1}" in (
        proc.stdout + proc.stderr
    )


def test_a_trailing_comma_is_reported_at_the_comma(tmp_path):
    path = tmp_path / "shop.json"
    path.write_text('{"name": "shop",\n "url_patterns": ["^x",],\n}', encoding="utf-8")
    with pytest.raises(MappingError) as caught:
        load_mapping_file(path)
    assert caught.value.reason.startswith("not valid JSON: trailing comma at line 2 column 23")


def _mapping_with_xpath(tmp_path, expression: str):
    path = tmp_path / "shop.json"
    path.write_text(
        json.dumps(
            {
                "name": "shop",
                "url_patterns": ["^https://shop\\.example/"],
                "fields": [
                    {"name": "city", "processors": [{"type": "trim"}]},
                    {
                        "name": "price",
                        "processors": [{"type": "xpath", "parameters": {"expression": expression}}],
                    },
                ],
            }
        ),
        encoding="utf-8",
    )
    with pytest.raises(MappingError) as caught:
        load_mapping_file(path)
    return path, caught.value


def test_a_bad_xpath_says_the_file_the_json_path_the_expression_and_the_position(tmp_path):
    path, error = _mapping_with_xpath(tmp_path, "//dd[@class=]/text()")
    assert error.where == f"{path}: $.fields[1].processors[0].parameters.expression"
    assert error.reason == (
        "invalid XPath '//dd[@class=]/text()': Invalid expression at character 13, "
        "after '//dd[@class='"
    )
    _, error = _mapping_with_xpath(tmp_path, "//dd[@class='price'")
    assert error.reason.startswith("invalid XPath \"//dd[@class='price'\": Invalid predicate")
    assert error.reason.endswith(
        "at the end of the expression (an unclosed bracket, parenthesis or quote?)"
    )


PAGE = """<html><body>
<section id="module-json"><h2>json</h2><p class="summary">Encode and decode JSON.</p></section>
<section id="module-pickle"><h2>pickle</h2><p class="summary">Python object serialization.</p></section>
</body></html>"""


def _mapping_test(tmp_path, *extra: str):
    (tmp_path / "page.html").write_text(PAGE, encoding="utf-8")
    (tmp_path / "docs.json").write_text(
        json.dumps(
            {
                "name": "docs",
                "url_patterns": ["^https://docs\\.example/"],
                "fields": [
                    {
                        "name": "summary",
                        "processors": [
                            {
                                "type": "xpath",
                                "parameters": {"expression": "//*[@id=$fragment]//p"},
                            }
                        ],
                    }
                ],
            }
        ),
        encoding="utf-8",
    )
    proc = run_cli(
        [
            "mapping",
            "test",
            "docs.json",
            "--file",
            "page.html",
            "--base-url",
            "https://docs.example/library.html",
            *extra,
        ],
        product_env(),
        tmp_path,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), proc.stderr


def test_mapping_test_names_the_ids_near_a_fragment_that_is_not_on_the_page(tmp_path):
    found, notes = _mapping_test(tmp_path, "--fragment", "module-json")
    assert found["fields"] == {"summary": "Encode and decode JSON."}
    assert notes == ""

    output, notes = _mapping_test(tmp_path, "--fragment", "module-jsn")
    assert output["fields"] == {}
    assert (
        "note: no element of the page has the id 'module-jsn' ($fragment); "
        "ids nearby: module-json, module-pickle"
    ) in notes

    output, notes = _mapping_test(tmp_path, "--fragment", "zzz", "--id", "R-77")
    assert output["fields"] == {}
    assert "the id 'zzz' ($fragment); 2 ids on the page, e.g. module-json, module-pickle" in notes
    assert "the record id 'R-77' ($id) does not occur in the page's text" in notes


def test_a_printed_command_works_when_pasted_with_or_without_the_venv_on_path(
    monkeypatch, tmp_path
):
    import os
    import subprocess
    import sys
    from pathlib import Path

    from enrich_crawl.console import command

    bindir = Path(sys.executable).parent
    assert (bindir / "dagster").is_file()  # installed beside this Python, as setup.sh does
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}/usr/bin:/bin")
    assert command("dagster") == "dagster"
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # a venv that is not activated
    monkeypatch.chdir(tmp_path)
    spelled = command("dagster")
    assert spelled != "dagster"
    ran = subprocess.run([spelled, "--version"], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0 and "dagster" in ran.stdout.lower()
    assert command("no-such-command-here") == "no-such-command-here"
