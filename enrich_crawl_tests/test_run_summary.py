"""What `enrich-crawl run` tells a user around a run, in one real run (Dagster, crawl worker
processes, the dataset's virtual web, a MongoDB-wire server): the preflight's warning of a field
named almost like a column, before the run and once (the seed step's copy is in the run's log, not
on the terminal again); no Dagster DEBUG engine events without -v; a run with no mapping file that
learns (`--learn`) is not refused; the summary names the file that keeps the rejected rows, and
says what was learned and where the learned mapping files were written."""

from __future__ import annotations

import json
import logging
import re

import dagster as dg

from enrich_crawl.testing.learnweb import build_learn_web
from enrich_crawl_tests.conftest import REPO, product_env, run_cli


def test_the_summary_names_the_rejected_rows_file_and_what_was_learned(tmp_path, mongo_server):
    built = build_learn_web(tmp_path / "corpus", hosts=2, records_per_host=16, crawl_delay=0.1)
    table = built.root / "orgs.csv"
    lines = table.read_text(encoding="utf-8").splitlines()
    duplicate = lines[1].split(",")[0]
    table.write_text("\n".join([*lines, lines[1]]) + "\n", encoding="utf-8")  # rejected
    spec = built.spec_path
    # `citty` beside the `city` column: most likely a typo
    spec.write_text(
        spec.read_text(encoding="utf-8").replace("  city: {}\n", "  city: {}\n  citty: {}\n"),
        encoding="utf-8",
    )
    none = tmp_path / "no_mappings"
    none.mkdir()
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n", encoding="utf-8")
    work = tmp_path / "work"
    env = product_env(
        DAGSTER_HOME=str(home),
        ENRICH_WORK_DIR=str(work),
        ENRICH_SHARDS="2",
        MONGODB_URI=mongo_server.uri,
        MONGODB_DB="t_run_summary",
    )
    result = run_cli(
        ["run", "--dataset", str(spec), "--mappings", str(none), "--learn"],
        env,
        REPO,
        timeout=600,
    )
    out, err = result.stdout, result.stderr
    assert result.returncode == 0, out + err

    # the preflight's warning, on the terminal before the run starts
    err_lines = err.splitlines()
    warning = (
        f"warning: {spec}: fields.citty: 'citty' is not a column of orgs.csv (did you mean "
        "'city'?); it is filled as a new column (write `citty: {new: true}` under `fields` to "
        "say it is meant)"
    )
    assert warning in err_lines, err
    started = next(i for i, line in enumerate(err_lines) if line.startswith("enrich_job:"))
    assert err_lines.index(warning) < started
    # ... and only there: the seed step's own copy goes to the run's log (the UI), not to the
    # terminal a second time
    said = warning.removeprefix("warning: ")
    assert (out + err).count(said) == 1, err
    run_id = re.search(r"^enrich_job succeeded  run (\S+)$", out, re.M).group(1)
    with dg.DagsterInstance.from_config(str(home)) as instance:
        logged = [
            entry
            for entry in instance.all_logs(run_id)
            if entry.dagster_event is None and said in entry.user_message
        ]
    assert [(e.step_key, e.level) for e in logged] == [("seed_dataset", logging.WARNING)], logged
    # without -v, none of Dagster's DEBUG engine events (this home's dagster.yaml sets no
    # python_log_level: each step process's own console logger would be at DEBUG)
    assert "STEP_WORKER_STARTED" not in out + err, err
    assert " - DEBUG - " not in out + err, err

    # the rejected row: counted, and the file holding it named
    rejected = work / "orgs" / "seed" / "rejected.jsonl"
    assert f"(1 rejected, rows and reasons in {rejected})" in out, out
    kept = [json.loads(line) for line in rejected.read_text(encoding="utf-8").splitlines()]
    assert len(kept) == 1 and duplicate in json.dumps(kept[0]), kept

    # what was learned, and where
    learned = work / "orgs" / "learned"
    files = sorted(p.name for p in learned.glob("*.json") if p.name != "learn-report.json")
    assert files, out
    head = re.search(r"^  learned           (\d+) mapping file\(s\) in (\S+): fields (.*)$", out, re.M)
    assert head, out
    assert int(head.group(1)) == len(files) and head.group(2) == str(learned)
    report = json.loads((learned / "learn-report.json").read_text(encoding="utf-8"))
    learned_fields = {
        rule["name"]
        for name in files
        for rule in json.loads((learned / name).read_text(encoding="utf-8"))["fields"]
    }
    assert learned_fields, files
    for field in learned_fields:
        assert f"{field} (" in head.group(3), (field, head.group(0))
    assert "citty" not in learned_fields and "citty" in report["fields"]
    assert re.search(r"^ {20}nothing for citty: \S", out, re.M), out
    assert f"report {learned / 'learn-report.json'}" in out, out


def test_a_learn_report_of_an_earlier_run_is_not_this_runs(tmp_path):
    """A run that ended before learning (a failed seed) must not show an earlier run's report as
    what it learned."""
    import os
    import time

    from enrich_crawl.summary import _learned_lines, learned_summary

    folder = tmp_path / "learned"
    folder.mkdir()
    report = folder / "learn-report.json"
    report.write_text(json.dumps({"fields": {"city": {"why_nothing": "no rule"}}}))
    assert _learned_lines(learned_summary(folder, since=time.time() - 60)) == [
        f"no mapping (no rule kept above the precision bar), in {folder}",
        "nothing for city: no rule",
        f"report {report}",
    ]
    os.utime(report, (time.time() - 3600, time.time() - 3600))
    assert _learned_lines(learned_summary(folder, since=time.time() - 60)) == [
        "nothing: the run ended before learning did"
    ]
