"""Learning end to end through the console script (SPEC 3b): `mapping learn` then `run` on a small
multi-layout web with NO hand-written mapping; `run --learn` through Dagster (the asset
learned_mappings and its checks); `mapping evaluate` and the check mapping_agreement when a site
changes its layout between two runs. Real worker processes, the dataset's virtual web (its request
logs are the evidence of politeness and of what was fetched), a MongoDB-wire server."""

from __future__ import annotations

import itertools
import json
import shutil

import dagster as dg
import pytest

from enrich_crawl.quality import audit_request_log
from enrich_crawl.staging import read_jsonl
from enrich_crawl.testing.learnweb import FIELDS, build_learn_web, change_layout
from enrich_crawl_tests.conftest import REPO, product_env, run_cli

pytestmark = pytest.mark.slow

UA_PREFIX = "enrich_crawl"


def _env(tmp_path, mongo_server, db, shards=2):
    home = tmp_path / "dagster_home"
    home.mkdir(exist_ok=True)
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n", encoding="utf-8")
    return product_env(
        MONGODB_URI=mongo_server.uri,
        MONGODB_DB=db,
        DAGSTER_HOME=str(home),
        ENRICH_WORK_DIR=str(tmp_path / "work"),
        ENRICH_SHARDS=str(shards),
    )


def _pages(log):
    return [e for e in log if e.get("method") != "CONNECT" and e["path"] != "/robots.txt"]


def _too_close(log, delay):
    problems = []
    by_host = {}
    for e in log:
        if e.get("method") != "CONNECT":
            by_host.setdefault(e["host"], []).append(e)
    for host, reqs in by_host.items():
        reqs.sort(key=lambda e: e["t"])
        for prev, req in itertools.pairwise(reqs):
            gap = req["t"] - (prev["t"] + prev.get("dur", 0.0))
            if gap < delay - 0.05:
                problems.append(f"{host}{req['path']} {gap:.3f}s")
    return problems


def _anchored(expression: str) -> bool:
    """No absolute positional path (/html/body/div[3]/...) in a learned rule."""
    return not expression.startswith("/html") and "/body/" not in expression


def test_learn_then_run_fills_the_gaps_from_learned_mappings_without_refetching(
    tmp_path, mongo_server, mongo_client
):
    db = "t_learn_e2e"
    env = _env(tmp_path, mongo_server, db)
    built = build_learn_web(tmp_path / "corpus", hosts=3, records_per_host=24, crawl_delay=0.2)
    out = tmp_path / "learned"
    learn = run_cli(
        ["mapping", "learn", "--dataset", str(built.spec_path), "--out", str(out)],
        env,
        REPO,
        timeout=300,
    )
    assert learn.returncode == 0, learn.stdout + learn.stderr
    files = sorted(p for p in out.glob("*.json") if p.name != "learn-report.json")
    assert files, learn.stdout
    check = run_cli(["mapping", "check", str(out)], env, REPO, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    for path in files:
        mapping = json.loads(path.read_text())
        assert mapping["learned"]["learned_at"]
        for rule in mapping["fields"]:
            for step in rule["processors"]:
                expression = str(step.get("parameters", {}).get("expression", ""))
                assert _anchored(expression), (path.name, expression)
    report = json.loads((out / "learn-report.json").read_text())
    assert report["fetch"]["records_sampled"] > 0

    learn_log = list(
        read_jsonl(tmp_path / "work" / "_learn" / "orgs" / "collect" / "web-requests.jsonl")
    )
    learned_pages = {e["host"] + e["path"] for e in _pages(learn_log)}
    assert len(_pages(learn_log)) <= 1.2 * report["fetch"]["records_sampled"]
    assert audit_request_log(learn_log, built.web_root, UA_PREFIX) == []
    assert _too_close(learn_log, 0.2) == []

    run = run_cli(
        ["run", "--dataset", str(built.spec_path), "--mappings", str(out)], env, REPO, timeout=600
    )
    assert run.returncode == 0, run.stdout + run.stderr
    run_log = [
        e
        for p in (tmp_path / "work" / "orgs").glob("crawl/*/web-requests.jsonl")
        for e in read_jsonl(p)
    ]
    refetched = learned_pages & {e["host"] + e["path"] for e in _pages(run_log)}
    assert not refetched, sorted(refetched)
    assert audit_request_log(run_log, built.web_root, UA_PREFIX) == []
    assert _too_close(run_log, 0.2) == []

    docs = {d["_id"]: d for d in mongo_client[db]["orgs"].find()}
    names = {p.stem for p in files} | {json.loads(p.read_text())["name"] for p in files}
    missing = right = wrong = 0
    for rid, truth in built.truth.items():
        for name in FIELDS:
            if name in built.known[rid]:
                continue
            missing += 1
            got = docs[rid]["data"].get(name)
            if got is None:
                continue
            if str(got) == truth[name]:
                right += 1
            else:
                wrong += 1
            assert docs[rid]["lineage"][name]["mapping"] in names
    assert missing and right / missing >= 0.9, (right, wrong, missing)
    assert wrong == 0


def _check_results(home, run_index=0):
    with dg.DagsterInstance.from_config(str(home)) as instance:
        runs = instance.get_runs(limit=5)
        run = runs[run_index]
        evaluations = [
            e.dagster_event.event_specific_data
            for e in instance.all_logs(
                run.run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION
            )
        ]
        learned = instance.fetch_materializations(dg.AssetKey("learned_mappings"), limit=1)
        metadata = learned.records[0].asset_materialization.metadata if learned.records else {}
    return {e.check_name: e for e in evaluations}, metadata


def test_run_learn_then_mapping_agreement_fails_when_a_site_changes_layout(
    tmp_path, mongo_server, mongo_client
):
    db = "t_learn_agreement"
    # one crawl worker per crawl and a short Crawl-delay: what this test proves is what the
    # check says, not politeness or partitioning (the test above holds those)
    env = _env(tmp_path, mongo_server, db, shards=1)
    # pages are revalidated at every run (recrawl_ttl_hours 0): a layout change shows at once
    built = build_learn_web(
        tmp_path / "corpus", hosts=3, records_per_host=24, crawl_delay=0.05, recrawl_ttl_hours=0
    )
    none = tmp_path / "no_mappings"
    none.mkdir()
    first = run_cli(
        ["run", "--dataset", str(built.spec_path), "--mappings", str(none), "--learn"],
        env,
        REPO,
        timeout=600,
    )
    assert first.returncode == 0, first.stdout + first.stderr
    checks, metadata = _check_results(env["DAGSTER_HOME"])
    assert metadata["learning"].value == "on"
    assert metadata["mappings_learned"].value >= 1
    assert metadata["precision/status"].value >= 0.95
    assert checks["learned_precision"].passed, checks["learned_precision"].description
    assert checks["mapping_agreement"].passed, checks["mapping_agreement"].description
    learned_dir = tmp_path / "work" / "orgs" / "learned"
    learned_names = {json.loads(p.read_text())["name"] for p in learned_dir.glob("learned*.json")}
    docs = list(mongo_client[db]["orgs"].find())
    lineage = [e["mapping"] for d in docs for e in d.get("lineage", {}).values()]
    assert lineage and set(lineage) <= learned_names

    # the learned mappings, reviewed and kept as the dataset's own; then org-b changes its layout
    reviewed = tmp_path / "reviewed"
    shutil.copytree(learned_dir, reviewed)
    change_layout(built, "org-b.test")
    evaluate = run_cli(
        ["mapping", "evaluate", "--dataset", str(built.spec_path), "--mappings", str(reviewed)],
        env,
        REPO,
        timeout=300,
    )
    assert evaluate.returncode == 0, evaluate.stdout + evaluate.stderr
    result = json.loads(evaluate.stdout)
    org_b = [m for m in result["mappings"] if "org_b" in m]
    assert org_b, result["mappings"].keys()
    status = result["mappings"][org_b[0]]["status"]
    assert status["agreement"] < 0.5 and status["disagreements"], status
    assert all("org-b.test" in d["url"] for d in status["disagreements"])
    for mapping, fields in result["mappings"].items():
        if "org_b" not in mapping:
            assert all(f["agreement"] in (None, 1.0) for f in fields.values()), mapping

    second = run_cli(
        ["run", "--dataset", str(built.spec_path), "--mappings", str(reviewed)],
        env,
        REPO,
        timeout=600,
    )
    checks, _ = _check_results(env["DAGSTER_HOME"])
    agreement = checks["mapping_agreement"]
    assert not agreement.passed, second.stdout + second.stderr
    assert org_b[0] in agreement.description and "status" in agreement.description
