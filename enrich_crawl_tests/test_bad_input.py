"""Bad input, all of it in one `enrich-crawl run`: a dirty table (ragged rows, NUL bytes, a cp1252
line in a UTF-8 file, duplicate and missing ids, malformed / non-http / private URLs) pointing at a
hostile virtual web (redirect loop, huge page, gzip bomb, slowloris, a server that never answers,
robots.txt that is huge, binary junk or an HTML page, pages in unexpected encodings, resets, no
DNS, a 500). The run succeeds; every row of the table ends either as one MongoDB document with its
value or its reason, or in `rejected.jsonl` with its reason: nothing is lost, nothing crashes.

Invalid dataset specs and mappings (bad JSON, bad XPath, catastrophic regex) stop the command
before anything runs, with the file, the place and the reason, never a traceback.

Covered elsewhere, not repeated here: the loader's every case (test_dataset_dirty.py), the
mapping loader (test_mapping_load.py), regex safety (test_processors_regex.py), each web edge case
in one crawl with retries and memory bounds (test_crawl_edge_cases.py), robots.txt rules
(test_robots.py), names resolving to private addresses (test_crawl_private.py).
"""

from __future__ import annotations

import json
import uuid
from collections import Counter

import pymongo
import pytest

from enrich_crawl.testing.hostileweb import CRAWL, build_hostile_dataset
from enrich_crawl.virtualweb import read_log, requests_by_host
from enrich_crawl_tests.conftest import REPO, product_env, run_cli

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory, mongo_server):
    base = tmp_path_factory.mktemp("hostile")
    built = build_hostile_dataset(base / "data", name=f"hostile_{uuid.uuid4().hex[:6]}")
    home = base / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n", encoding="utf-8")
    db = f"bad_{uuid.uuid4().hex[:8]}"
    env = product_env(
        MONGODB_URI=mongo_server.uri,
        MONGODB_DB=db,
        DAGSTER_HOME=str(home),
        ENRICH_WORK_DIR=str(base / "work"),
        ENRICH_SHARDS="2",
    )
    result = run_cli(
        ["run", "--dataset", str(built.spec), "--mappings", str(built.mappings)],
        env,
        REPO,
        timeout=420,
    )
    client = pymongo.MongoClient(mongo_server.uri, serverSelectionTimeoutMS=5000)
    docs = list(client[db][built.name].find())
    client.close()
    stage = base / "work" / built.name
    log = [e for path in sorted(stage.glob("crawl/*/web-requests.jsonl")) for e in read_log(path)]
    return built, result, docs, stage, log


def test_the_run_succeeds_and_no_row_is_lost(hostile_run):
    built, result, docs, stage, _log = hostile_run
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "Traceback" not in result.stdout + result.stderr
    ids = [doc["_id"] for doc in docs]
    assert len(ids) == len(set(ids)), "a record was written twice"
    assert set(ids) == set(built.expected)
    rejected = [
        json.loads(line)
        for line in (stage / "seed" / "rejected.jsonl").read_text("utf-8").splitlines()
    ]
    assert {r["row"]: r["reason"] for r in rejected}.keys() == built.rejected.keys()
    for row in rejected:
        assert row["reason"].startswith(built.rejected[row["row"]]), row
    # every row of the table is a document or a rejected row: nothing dropped silently
    table_rows = len(built.spec.with_suffix(".csv").read_bytes().splitlines()) - 1
    assert len(ids) + len(rejected) == table_rows


@pytest.mark.parametrize(
    "rid",
    [
        "ok",
        "nulid",
        "café-1",
        "badport",
        "ftp",
        "js",
        "spaced",
        "nourl",
        "private",
        "loopback",
        "hexip",
        "metadata",
        "loop",
        "huge",
        "bomb",
        "slowloris",
        "hang",
        "s500",
        "down",
        "nodns",
        "robots_big_early",
        "robots_big_late",
        "robots_junk",
        "robots_html",
        "cp1252",
        "sjis",
        "utf16",
    ],
)
def test_each_record_ends_with_its_value_or_its_reason(hostile_run, rid):
    built, _result, docs, _stage, _log = hostile_run
    expect = built.expected[rid]
    (doc,) = [d for d in docs if d["_id"] == rid]
    assert doc["status"] == expect.status, doc
    if expect.value is not None:
        assert doc["data"]["value"] == expect.value
        assert doc["lineage"]["value"]["value"] == expect.value
    if expect.reason is not None:
        assert doc["data"].get("value") is None
        reasons = {e["reason"] for e in doc["errors"]}
        assert expect.reason in reasons, doc["errors"]
        # each reason names its URL; a record without any has `no_url` and says where it looked
        assert all(e.get("url") or e["reason"] == "no_url" for e in doc["errors"]), doc["errors"]
    if rid == "spaced":
        (refused,) = [e for e in doc["errors"] if e["reason"] == "invalid_url"]
        assert refused["url"] == "http://exa" and "single-label host 'exa'" in refused["detail"]
    if rid == "nourl":
        assert doc["errors"] == [
            {"url": "", "reason": "no_url", "detail": "no URL in column 'url'"}
        ]


def test_the_dirty_table_is_read_and_reported(hostile_run):
    _built, _result, docs, stage, _log = hostile_run
    profile = json.loads((stage / "seed" / "manifest.json").read_text("utf-8"))["profile"]
    reading = profile["reading"]
    # the cp1252 line inside the UTF-8 file was decoded, not lost or mangled
    assert reading["decoded_lines"] == 1 and reading["undecodable_lines"] == 0
    assert profile["duplicate_ids"] == 1 and profile["missing_ids"] == 1
    assert profile["invalid_urls"] == 4
    assert profile["records_without_urls"] == 4  # badport, ftp, js (invalid URLs), nourl (none)
    # the NUL bytes are gone from the id and the values (the raw cells: test_dataset_dirty.py)
    nul = next(d for d in docs if d["_id"] == "nulid")
    assert "\x00" not in json.dumps(nul["data"])


def test_the_summary_counts_every_reason_the_documents_hold(hostile_run):
    """Errors by kind in the summary are the documents' reasons, `no_url` included."""
    _built, result, docs, _stage, _log = hostile_run
    line = next(x for x in result.stdout.splitlines() if x.strip().startswith("errors by kind"))
    parts = line.split("errors by kind", 1)[1].strip().split(", ")
    shown = {kind: int(n) for kind, n in (part.rsplit(" ", 1) for part in parts)}
    held = Counter(e["reason"] for d in docs for e in d.get("errors") or [])
    assert shown == dict(held) and shown["no_url"] == 1, (line, held)


def test_the_hostile_web_cost_bounded_time_and_bytes(hostile_run):
    _built, _result, _docs, _stage, log = hostile_run
    by_host = requests_by_host(log)
    timeout = CRAWL["download_timeout"]
    # a slowloris answer or a server that never answers is cut at the download timeout
    for host in ("h-slowloris.test", "h-hang.test"):
        pages = [e for e in by_host[host] if e["path"] != "/robots.txt"]
        assert pages and len(pages) <= 1 + CRAWL["retries"], pages
        assert all(e["dur"] < timeout + 1.5 for e in pages), pages
    # the huge page was cut long before its 20 MB were sent
    (huge,) = [e for e in by_host["h-huge.test"] if e["path"] == "/"]
    assert huge["bytes"] < 20_000_000
    # robots.txt was asked first on every host, and the huge file's early rule was obeyed
    for host, entries in by_host.items():
        assert entries[0]["path"] == "/robots.txt", (host, entries[0])
    assert not [e for e in by_host["h-rbig.test"] if e["path"].startswith("/early/")]
    # the redirect loop was stopped at once, not followed up to a redirect limit
    assert len(by_host["h-loop.test"]) <= 4, by_host["h-loop.test"]


# -- refused before anything runs ----------------------------------------------------------------


def _bad_mappings(folder):
    folder.mkdir()
    good = {
        "name": "good",
        "url_patterns": ["^https?://x\\.test/"],
        "fields": [
            {
                "name": "value",
                "processors": [{"type": "xpath", "parameters": {"expression": "//p"}}],
            }
        ],
    }
    (folder / "good.json").write_text(json.dumps(good), encoding="utf-8")
    (folder / "broken_json.json").write_text('{"name": "broken", "url_patterns": [', "utf-8")
    bad_xpath = dict(good, name="bad_xpath")
    bad_xpath["fields"] = [
        {
            "name": "value",
            "processors": [{"type": "xpath", "parameters": {"expression": "//span[@id='v'"}}],
        }
    ]
    (folder / "bad_xpath.json").write_text(json.dumps(bad_xpath), encoding="utf-8")
    evil = dict(good, name="evil_regex")
    evil["fields"] = [
        {"name": "value", "processors": [{"type": "regex", "parameters": {"pattern": "(a+)+$"}}]}
    ]
    (folder / "evil_regex.json").write_text(json.dumps(evil), encoding="utf-8")


def test_invalid_mappings_stop_the_run_before_it_starts_naming_each_problem(tmp_path):
    built = build_hostile_dataset(tmp_path / "data")
    _bad_mappings(tmp_path / "bad")
    env = product_env(
        MONGODB_URI="mongodb://127.0.0.1:1/",  # never reached
        DAGSTER_HOME=str(tmp_path / "home"),
        ENRICH_WORK_DIR=str(tmp_path / "work"),
    )
    result = run_cli(
        ["run", "--dataset", str(built.spec), "--mappings", str(tmp_path / "bad")],
        env,
        REPO,
        timeout=120,
    )
    err = result.stdout + result.stderr
    assert result.returncode != 0
    assert "Traceback" not in err
    assert "broken_json.json: $: not valid JSON" in err
    assert "bad_xpath.json: $.fields[0].processors[0].parameters.expression: invalid XPath" in err
    assert "evil_regex.json: $.fields[0].processors[0].parameters.pattern" in err
    assert "refused" in err
    assert not (tmp_path / "work").exists() or not list((tmp_path / "work").rglob("crawl"))


@pytest.mark.parametrize(
    "spec, where",
    [
        ("name: x\nsource: t.csv\nid: id\nurls: [url]\nfields:\n  v: {type: integr}\n", "v.type"),
        (
            "name: x\nsource: t.csv\nid: id\nurls: [url]\nfields:\n  v: {}\ncrawl:\n  dpeth: 2\n",
            "dpeth",
        ),
        ("name: x\nsource: t.csv\nurls: [url]\nfields:\n  v: {}\n", "id"),
        ("name: x\nsource: t.csv\nid: id\nurls: [url\nfields: {}\n", "t.yaml"),
    ],
    ids=["unknown type", "unknown crawl key", "no id", "not yaml"],
)
def test_an_invalid_spec_is_a_clear_error_naming_the_file_and_key(tmp_path, spec, where):
    (tmp_path / "t.csv").write_text("id,url,v\n1,http://x.test/,\n", encoding="utf-8")
    path = tmp_path / "t.yaml"
    path.write_text(spec, encoding="utf-8")
    env = product_env(DAGSTER_HOME=str(tmp_path / "home"), ENRICH_WORK_DIR=str(tmp_path / "w"))
    result = run_cli(["run", "--dataset", str(path)], env, REPO, timeout=120)
    err = result.stdout + result.stderr
    assert result.returncode != 0
    assert "Traceback" not in err
    assert str(path) in err and where in err, err
