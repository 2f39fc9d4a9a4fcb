"""Bad input and absent services, each in one `enrich-crawl run` as a user types it: the command
ends within seconds with at most 5 lines on the terminal naming the file, key or service and the
reason, never a traceback. The garbage URL column is the exception that proves the rule: the run
completes, and its summary shows the failed data-quality check (severity ERROR: non-zero exit)."""

from __future__ import annotations

import csv
import json
import shutil
import time
from pathlib import Path

import pytest

from enrich_crawl.demo import DEMO_DIR
from enrich_crawl_tests.conftest import REPO, product_env, run_cli

GOOD_MAPPING = {
    "name": "t_site",
    "url_patterns": [{"type": "regex", "pattern": "^https?://t\\.example/.*$"}],
    "fields": [
        {"name": "city", "processors": [{"type": "xpath", "parameters": {"expression": "//p"}}]}
    ],
}


def _dataset(root: Path, spec: str | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "t.csv").write_text(
        "id,url,city\n1,http://t.example/a.html,\n2,http://t.example/b.html,Oslo\n",
        encoding="utf-8",
    )
    path = root / "t.yaml"
    path.write_text(
        spec or "name: t\nsource: t.csv\nid: id\nurls: [url]\nfields:\n  city: {}\n",
        encoding="utf-8",
    )
    return path


def _mappings(root: Path, extra: dict[str, str] | None = None) -> Path:
    folder = root / "mappings"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "t_site.json").write_text(json.dumps(GOOD_MAPPING), encoding="utf-8")
    for name, text in (extra or {}).items():
        (folder / name).write_text(text, encoding="utf-8")
    return folder


def _broken(processor: dict) -> str:
    mapping = dict(GOOD_MAPPING, name="broken")
    mapping["fields"] = [{"name": "city", "processors": [processor]}]
    return json.dumps(mapping)


def _case_missing_source(tmp: Path) -> tuple[list[str], dict, str]:
    spec = _dataset(tmp)
    (tmp / "t.csv").unlink()
    return ["--dataset", str(spec)], {}, "t.csv"


def _case_unreadable_table(tmp: Path):
    spec = _dataset(tmp, "name: t\nsource: t.parquet\nid: id\nurls: [url]\nfields:\n  city: {}\n")
    (tmp / "t.parquet").write_bytes(b"this is not parquet\x00\x01" * 10)
    return ["--dataset", str(spec)], {}, "t.parquet"


def _case_misspelt_id(tmp: Path):
    spec = _dataset(tmp, "name: t\nsource: t.csv\nid: idd\nurls: [url]\nfields:\n  city: {}\n")
    return ["--dataset", str(spec)], {}, "'idd'"


def _case_misspelt_url_column(tmp: Path):
    spec = _dataset(tmp, "name: t\nsource: t.csv\nid: id\nurls: [ulr]\nfields:\n  city: {}\n")
    return ["--dataset", str(spec)], {}, "'ulr'"


def _case_spec_key_typo(tmp: Path):
    spec = _dataset(tmp, "name: t\nsource: t.csv\nid: id\nurls: [url]\nfeilds:\n  city: {}\n")
    return ["--dataset", str(spec)], {}, "feilds"


def _case_broken_mapping_json(tmp: Path):
    folder = _mappings(tmp, {"broken.json": '{"name": "broken" "url_patterns": []}'})
    return ["--dataset", str(_dataset(tmp)), "--mappings", str(folder)], {}, "broken.json"


def _case_bad_xpath(tmp: Path):
    bad = _broken({"type": "xpath", "parameters": {"expression": "//p[@class='x'"}})
    folder = _mappings(tmp, {"broken.json": bad})
    return ["--dataset", str(_dataset(tmp)), "--mappings", str(folder)], {}, "broken.json"


def _case_unknown_processor(tmp: Path):
    folder = _mappings(tmp, {"broken.json": _broken({"type": "xpaht", "parameters": {}})})
    return ["--dataset", str(_dataset(tmp)), "--mappings", str(folder)], {}, "xpaht"


def _case_mongodb_down(tmp: Path):
    env = {"MONGODB_URI": "mongodb://127.0.0.1:1/"}
    return ["--dataset", str(_dataset(tmp)), "--mappings", str(_mappings(tmp))], env, "MongoDB"


def _case_postgres_down(tmp: Path):
    env = {
        "DAGSTER_PG_HOST": "127.0.0.1",
        "DAGSTER_PG_PORT": "1",
        "DAGSTER_PG_USER": "dagster",
        "DAGSTER_PG_PASSWORD": "secret-pw",
        "DAGSTER_PG_DB": "dagster",
    }
    args = ["--dataset", str(_dataset(tmp)), "--mappings", str(_mappings(tmp))]
    return args, env, "PostgreSQL 127.0.0.1:1"


def _case_chromium_missing(tmp: Path):
    rendering = dict(GOOD_MAPPING, name="rendered", render="js")
    folder = _mappings(tmp, {"rendered.json": json.dumps(rendering)})
    env = {"ENRICH_CHROMIUM": str(tmp / "no-such-chromium")}
    return ["--dataset", str(_dataset(tmp)), "--mappings", str(folder)], env, "Chromium"


CASES = {
    "missing source": _case_missing_source,
    "unreadable table": _case_unreadable_table,
    "misspelt id column": _case_misspelt_id,
    "misspelt url column": _case_misspelt_url_column,
    "spec key typo": _case_spec_key_typo,
    "broken mapping JSON": _case_broken_mapping_json,
    "bad XPath": _case_bad_xpath,
    "unknown processor": _case_unknown_processor,
    "MongoDB down": _case_mongodb_down,
    "Postgres down": _case_postgres_down,
    "Chromium missing": _case_chromium_missing,
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_bad_input_ends_in_a_few_lines_naming_where_and_why(tmp_path, mongo_server, case):
    args, env_extra, named = CASES[case](tmp_path / "data")
    env = product_env(
        **{
            "MONGODB_URI": mongo_server.uri,
            "XDG_DATA_HOME": str(tmp_path / "xdg"),
            "ENRICH_SHARDS": "2",
            **env_extra,
        }
    )
    started = time.monotonic()
    result = run_cli(["run", *args], env, tmp_path, timeout=60)
    seconds = time.monotonic() - started
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert result.returncode != 0, lines
    assert seconds < 30, seconds
    assert "Traceback" not in result.stderr + result.stdout, lines
    assert 1 <= len(lines) <= 5, lines
    assert any(named in line for line in lines), (named, lines)
    # nothing ran: no staged crawl
    assert not list((tmp_path / "xdg").rglob("crawl/*/stats.json"))
    assert "secret-pw" not in result.stderr


def test_a_garbage_url_column_completes_and_the_summary_shows_the_failed_check(
    tmp_path, mongo_server, mongo_db_name
):
    data = tmp_path / "data"
    data.mkdir()
    with open(DEMO_DIR / "demo_orgs.csv", encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh))
    for number, row in enumerate(rows):
        # most URL cells are not URLs at all (a wrong column, mangled by a spreadsheet)
        if number % 6:
            row["website"] = f"call us ({number})"
            row["profile_url"] = ""
    with open(data / "orgs.csv", "w", encoding="utf-8", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    spec = (DEMO_DIR / "demo.yaml").read_text(encoding="utf-8")
    spec = spec.replace("name: demo_orgs", "name: garbage_orgs")
    spec = spec.replace("source: demo_orgs.csv", "source: orgs.csv")
    spec = spec.replace("virtual_web: web", f"virtual_web: {DEMO_DIR / 'web'}")
    (data / "orgs.yaml").write_text(spec, encoding="utf-8")
    shutil.copytree(REPO / "mappings", data / "mappings")
    env = product_env(
        MONGODB_URI=mongo_server.uri,
        MONGODB_DB=mongo_db_name,
        XDG_DATA_HOME=str(tmp_path / "xdg"),
        ENRICH_SHARDS="2",
    )
    args = ["run", "--dataset", str(data / "orgs.yaml"), "--mappings", str(data / "mappings")]
    result = run_cli(args, env, tmp_path, timeout=300)
    out = result.stdout
    assert "Traceback" not in result.stdout + result.stderr
    assert "enrich_job succeeded, but ERROR check(s) failed" in out, out + result.stderr
    check = [line for line in out.splitlines() if "check failed" in line]
    assert any("seed_data_quality" in line and "ERROR" in line for line in check), out
    assert any("invalid URL rate" in line for line in check), out
    assert result.returncode == 3


def test_an_empty_mappings_folder_is_refused_unless_the_run_learns(
    tmp_path, mongo_server, monkeypatch
):
    """A crawl without mappings could fill nothing: the run is refused before it starts, naming
    the folder and the ways out; with learning on (`--learn`, `learn: true`) it is fine."""
    from enrich_crawl.preflight import PreflightError, preflight

    spec = _dataset(tmp_path / "data")
    empty = tmp_path / "data" / "empty_mappings"
    empty.mkdir()
    # what learning writes beside its mappings is no mapping
    (empty / "learn-report.json").write_text("{}", encoding="utf-8")
    env = product_env(MONGODB_URI=mongo_server.uri, XDG_DATA_HOME=str(tmp_path / "xdg"))
    started = time.monotonic()
    result = run_cli(
        ["run", "--dataset", str(spec), "--mappings", str(empty)], env, tmp_path, timeout=60
    )
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert result.returncode == 2, lines
    assert time.monotonic() - started < 30
    assert "Traceback" not in result.stderr + result.stdout, lines
    assert 1 <= len(lines) <= 5, lines
    assert lines[0].startswith(f"enrich-crawl: {empty}: no mapping files (*.json)"), lines
    said = " ".join(line.strip() for line in lines)
    for way in (
        "--mappings",
        "`enrich-crawl run --learn`",
        f"`learn: true` in {spec}",
        f"`enrich-crawl mapping learn --dataset {spec} --out DIR`",
    ):
        assert way in said, (way, lines)
    assert not list((tmp_path / "xdg").rglob("crawl/*/stats.json"))

    # learning on: the same folder passes (the learned mappings will fill the fields)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    with pytest.raises(PreflightError) as refused:
        preflight(spec, empty)
    assert refused.value.check == "mappings"
    assert preflight(spec, empty, learn=True).checks[:3] == ["spec", "source", "mappings"]
    learning = _dataset(
        tmp_path / "learning",
        "name: t\nsource: t.csv\nid: id\nurls: [url]\nlearn: true\nfields:\n  city: {}\n",
    )
    assert preflight(learning, empty).mappings_dir == empty


def test_the_preflight_warns_of_a_field_named_almost_like_a_column(
    tmp_path, mongo_server, monkeypatch
):
    """`citty` beside a `city` column is most likely a typo: the preflight says so (the run goes
    on: a new column to fill is legitimate; the CLI prints it before the run, see
    test_run_summary.py), and `new: true` on the field silences it."""
    from enrich_crawl.preflight import preflight

    head = "name: t\nsource: t.csv\nid: id\nurls: [url]\nfields:\n  city: {}\n"
    data = tmp_path / "data"
    spec = _dataset(data, head + "  citty: {}\n  category: {}\n")
    folder = _mappings(data)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    monkeypatch.setenv("MONGODB_URI", mongo_server.uri)
    # `category` is far from every column: a new column, no warning
    assert preflight(spec, folder).warnings == [
        f"{spec}: fields.citty: 'citty' is not a column of t.csv (did you mean 'city'?); it is "
        "filled as a new column (write `citty: {new: true}` under `fields` to say it is meant)"
    ]
    spec.write_text(head + "  citty: {new: true}\n  category: {}\n", encoding="utf-8")
    assert preflight(spec, folder).warnings == []
