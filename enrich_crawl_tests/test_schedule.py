"""`nightly_enrich`, evaluated with build_schedule_context: one enrich_job run per dataset that has
something due (never enriched, new records, or older than its recrawl TTL), none otherwise."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import time
import uuid

import dagster as dg
from dagster._core.events import DagsterEvent, DagsterEventType

from enrich_crawl.catalog import scan_specs
from enrich_crawl.defs.resources import DatasetResource
from enrich_crawl.defs.schedules import nightly_enrich
from enrich_crawl.demo import DEMO_SPEC
from enrich_crawl.testing.politeweb import build_polite_dataset

UTC = dt.timezone.utc


def _evaluate(instance, when: dt.datetime, **resource):
    context = dg.build_schedule_context(
        instance=instance,
        scheduled_execution_time=when,
        resources={"dataset": DatasetResource(**resource)},
    )
    return nightly_enrich.evaluate_tick(context)


def _record_success(instance, dataset: str, fingerprint: str, ended: dt.datetime) -> None:
    """A finished enrich_job run of `dataset`, as the run storage would hold it."""
    run = instance.add_run(
        dg.DagsterRun(
            job_name="enrich_job",
            run_id=str(uuid.uuid4()),
            status=dg.DagsterRunStatus.NOT_STARTED,
            tags={"enrich_crawl/dataset": dataset, "enrich_crawl/fingerprint": fingerprint},
        )
    )
    for kind, at in (
        (DagsterEventType.RUN_START, ended - dt.timedelta(minutes=10)),
        (DagsterEventType.RUN_SUCCESS, ended),
    ):
        instance.report_dagster_event(
            DagsterEvent(event_type_value=kind.value, job_name="enrich_job"),
            run_id=run.run_id,
            timestamp=at.timestamp(),
        )


def test_one_run_per_due_dataset(tmp_path):
    folder = tmp_path / "datasets"
    build_polite_dataset(folder / "alpha", shards=2, records_per_host=2, name="alpha")
    build_polite_dataset(folder / "beta", shards=2, records_per_host=2, name="beta")
    specs = {s.name: s for s in scan_specs(folder)[0]}
    tonight = dt.datetime(2031, 3, 4, 2, 0, tzinfo=UTC)
    with dg.instance_for_test() as instance:
        # never enriched: both are due
        data = _evaluate(instance, tonight, watch_dir=str(folder))
        requests = {r.tags["enrich_crawl/dataset"]: r for r in data.run_requests}
        assert set(requests) == {"alpha", "beta"}
        alpha = requests["alpha"]
        assert alpha.run_config["resources"]["dataset"]["config"]["spec"] == str(
            specs["alpha"].path
        )
        assert alpha.tags["enrich_crawl/trigger"] == "nightly"
        assert alpha.tags["enrich_crawl/fingerprint"] == specs["alpha"].fingerprint
        assert alpha.run_key == "nightly:alpha:2031-03-04T02:00"

        # alpha enriched two hours ago, table unchanged: only beta is due
        _record_success(
            instance, "alpha", specs["alpha"].fingerprint, tonight - dt.timedelta(hours=2)
        )
        data = _evaluate(instance, tonight, watch_dir=str(folder))
        assert [r.tags["enrich_crawl/dataset"] for r in data.run_requests] == ["beta"]

        # beta enriched too: nothing is due tonight
        _record_success(
            instance, "beta", specs["beta"].fingerprint, tonight - dt.timedelta(hours=1)
        )
        data = _evaluate(instance, tonight, watch_dir=str(folder))
        assert not data.run_requests
        assert "nothing due" in data.skip_message

        # the next night, past the recrawl TTL (20 h by default), both are due again
        tomorrow = tonight + dt.timedelta(days=1)
        data = _evaluate(instance, tomorrow, watch_dir=str(folder))
        reasons = {
            r.tags["enrich_crawl/dataset"]: r.tags["enrich_crawl/due"] for r in data.run_requests
        }
        assert set(reasons) == {"alpha", "beta"} and "recrawl TTL" in reasons["alpha"]

        # new records in alpha's table: due at once, within the TTL
        time.sleep(0.01)
        with open(folder / "alpha" / "alpha.csv", "a", encoding="utf-8") as table:
            table.write("brand-new,http://site-0000.test/rec-0.html,\n")
        data = _evaluate(instance, tonight, watch_dir=str(folder))
        due = {
            r.tags["enrich_crawl/dataset"]: r.tags["enrich_crawl/due"] for r in data.run_requests
        }
        assert set(due) == {"alpha"} and "new or changed records" in due["alpha"]


def test_without_a_watched_folder_the_configured_dataset_runs(monkeypatch):
    monkeypatch.delenv("ENRICH_DATASETS_DIR", raising=False)
    monkeypatch.delenv("ENRICH_DATASET", raising=False)
    with dg.instance_for_test() as instance:
        data = _evaluate(instance, dt.datetime(2031, 3, 4, 2, 0, tzinfo=UTC))
        (request,) = data.run_requests
        assert request.tags["enrich_crawl/dataset"] == "demo_orgs"
        assert request.run_config["resources"]["dataset"]["config"]["spec"] == str(DEMO_SPEC)


def test_cron_and_timezone_come_from_the_environment():
    code = (
        "from enrich_crawl.definitions import defs; "
        "s = defs.resolve_schedule_def('nightly_enrich'); "
        "print(s.cron_schedule, s.execution_timezone, s.default_status.value, s.job_name)"
    )
    env = {
        **os.environ,
        "ENRICH_SCHEDULE_CRON": "30 3 * * 1-5",
        "ENRICH_SCHEDULE_TZ": "Europe/Paris",
        "ENRICH_SCHEDULE_RUNNING": "1",
    }
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == ["30", "3", "*", "*", "1-5", "Europe/Paris", "RUNNING", "enrich_job"]
