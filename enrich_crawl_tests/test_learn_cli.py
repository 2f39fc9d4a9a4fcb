"""`enrich-crawl mapping learn`, `mapping evaluate` and `run --learn` (SPEC 3b) through the console
script, as a user runs them: real crawl worker processes, the dataset's virtual web, a
MongoDB-wire server, a Dagster instance of the test's own."""

from __future__ import annotations

import json

from enrich_crawl.testing.learnweb import build_learn_web
from enrich_crawl_tests.conftest import REPO, product_env, run_cli


def _env(tmp_path, mongo_server=None, db="t_learn"):
    home = tmp_path / "dagster_home"
    home.mkdir(exist_ok=True)
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n", encoding="utf-8")
    extra = {"MONGODB_URI": mongo_server.uri, "MONGODB_DB": db} if mongo_server else {}
    return product_env(
        DAGSTER_HOME=str(home), ENRICH_WORK_DIR=str(tmp_path / "work"), ENRICH_SHARDS="2", **extra
    )


def test_learn_and_evaluate_refuse_bad_input_with_a_clear_reason(tmp_path):
    env = _env(tmp_path)
    built = build_learn_web(tmp_path / "corpus", hosts=1, records_per_host=3)
    spec = str(built.spec_path)
    out = str(tmp_path / "learned")

    def refused(args: list[str], *needles: str) -> None:
        result = run_cli(args, env, REPO, timeout=120)
        assert result.returncode == 2, result.stdout + result.stderr
        assert "Traceback" not in result.stderr, result.stderr
        for needle in needles:
            assert needle in result.stderr, f"{needle!r} not in: {result.stderr}"

    missing = str(tmp_path / "nope.yaml")
    refused(["mapping", "learn", "--dataset", missing, "--out", out], missing, "not found")
    refused(["mapping", "evaluate", "--dataset", missing], missing, "not found")

    bad_learn = tmp_path / "corpus" / "bad.yaml"
    bad_learn.write_text(built.spec_path.read_text().replace("fields:", "learn: maybe\nfields:"))
    refused(["mapping", "learn", "--dataset", str(bad_learn), "--out", out], "learn", "bad.yaml")

    no_table = tmp_path / "corpus" / "no_table.yaml"
    no_table.write_text(built.spec_path.read_text().replace("orgs.csv", "gone.csv"))
    refused(["mapping", "learn", "--dataset", str(no_table), "--out", out], "gone.csv")

    refused(
        ["mapping", "learn", "--dataset", spec, "--out", out, "--min-precision", "1.5"],
        "--min-precision",
    )
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    refused(["mapping", "learn", "--dataset", spec, "--out", str(a_file)], str(a_file))

    bad_mappings = tmp_path / "bad_mappings"
    bad_mappings.mkdir()
    (bad_mappings / "broken.json").write_text('{"name": "broken", "fields": [')
    refused(
        ["mapping", "learn", "--dataset", spec, "--out", out, "--mappings", str(bad_mappings)],
        "broken.json",
    )
    refused(
        ["mapping", "evaluate", "--dataset", spec, "--mappings", str(bad_mappings)],
        "broken.json",
    )
    refused(["mapping", "evaluate", "--dataset", spec, "--sample", "0"], "--sample")
    assert not (tmp_path / "learned").exists() or not any((tmp_path / "learned").iterdir())


def test_learn_with_nothing_learnable_exits_0_and_the_report_says_why(tmp_path, mongo_server):
    env = _env(tmp_path, mongo_server, db="t_nothing")
    built = build_learn_web(tmp_path / "corpus", hosts=1, records_per_host=4, known_fraction=0.0)
    out = tmp_path / "learned"
    result = run_cli(
        ["mapping", "learn", "--dataset", str(built.spec_path), "--out", str(out)],
        env,
        REPO,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads((out / "learn-report.json").read_text())
    assert sorted(report["fields"]) == ["city", "founded", "status"]
    for entry in report["fields"].values():
        assert "no record" in json.dumps(entry), entry
    assert [p.name for p in out.iterdir()] == ["learn-report.json"]
    assert "nothing learned" in result.stdout
    # the folder is a valid --mappings folder as it stands (the loader skips the report)
    check = run_cli(["mapping", "check", str(out), "--json"], env, REPO, timeout=60)
    assert check.returncode == 1 and "learn-report.json" not in check.stdout + check.stderr
