"""The repository's dagster.yaml, read as `dagster dev` reads it in the project root without
DAGSTER_HOME (a temporary folder as the instance's base, the root as its config folder): SQLite in
the per-user home with nothing set, PostgreSQL (a real one) with DAGSTER_PG_* set; telemetry and
the "join the community" pop-up off either way."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from contextlib import contextmanager
from pathlib import Path

import dagster as dg
import pytest
from dagster._cli.utils import TMP_DAGSTER_HOME_PREFIX
from dagster._core.instance.ref import InstanceRef

from enrich_crawl import config
from enrich_crawl_tests.conftest import REPO


@contextmanager
def _environ(**values: str | None):
    saved = {key: os.environ.get(key) for key in values}
    try:
        for key, value in values.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextmanager
def _root_instance():
    with tempfile.TemporaryDirectory() as temporary:
        ref = InstanceRef.from_dir(temporary, config_dir=str(REPO))
        with dg.DagsterInstance.from_ref(ref) as instance:
            yield instance, Path(temporary)


NO_PG = dict.fromkeys(config.POSTGRES_VARIABLES)


def test_nothing_set_means_sqlite_in_the_per_user_home(tmp_path):
    with _environ(DAGSTER_HOME=None, XDG_DATA_HOME=str(tmp_path / "xdg"), **NO_PG):
        home = tmp_path / "xdg" / "enrich_crawl"
        assert config.home() == home and config.work_dir() == home / "storage" / "enrich_crawl"
        with _root_instance() as (instance, temporary):
            assert type(instance.run_storage).__name__ == "SqliteRunStorage"
            assert instance.storage_directory() == str(home / "storage")
            assert not str(instance.storage_directory()).startswith(str(temporary))
            assert instance.get_settings("nux") == {"enabled": False}
            assert instance.get_settings("telemetry") == {"enabled": False}
            instance.get_runs(limit=1)
        assert (home / "history" / "runs.db").exists()


def test_dagster_pg_set_means_postgres(tmp_path, postgres_server):
    env = {key: postgres_server.env.get(key) for key in config.POSTGRES_VARIABLES}
    assert all(env.values())
    with (
        _environ(DAGSTER_HOME=None, XDG_DATA_HOME=str(tmp_path / "xdg"), **env),
        _root_instance() as (instance, _),
    ):
        assert type(instance.run_storage).__name__ == "PostgresRunStorage"
        instance.get_runs(limit=1)


def test_dagster_pg_partly_set_is_an_error_naming_what_is_missing(tmp_path):
    partial = {**NO_PG, "DAGSTER_PG_HOST": "db.example"}
    with _environ(DAGSTER_HOME=None, XDG_DATA_HOME=str(tmp_path / "xdg"), **partial):
        with (
            pytest.raises(Exception, match="DAGSTER_PG_PORT") as raised,
            _root_instance() as (instance, _),
        ):
            instance.get_runs(limit=1)
        assert "DAGSTER_PG_USER" in str(raised.value)


def test_the_reason_of_a_failed_step_is_its_own_error_not_dagsters_wrapper(tmp_path):
    from enrich_crawl.dataset.load import DatasetError
    from enrich_crawl.summary import failure_reason

    @dg.asset
    def table_asset():
        raise DatasetError("/data/t.csv: cannot read the table: permission denied")

    @dg.asset(retry_policy=dg.RetryPolicy(max_retries=1))
    def merge_asset():
        raise dg.Failure(description="MongoDB lost (database results)", allow_retries=False)

    @dg.asset
    def plain_asset():
        raise KeyError("city")

    with _environ(XDG_DATA_HOME=str(tmp_path / "xdg")), dg.instance_for_test() as instance:
        for asset, expected in (
            (table_asset, "/data/t.csv: cannot read the table: permission denied"),
            (merge_asset, "MongoDB lost (database results)"),
            (plain_asset, "KeyError: 'city'"),
        ):
            result = dg.materialize([asset], instance=instance, raise_on_error=False)
            reason = failure_reason(result)
            first = reason.splitlines()[0]
            assert first == f"step {asset.key.to_user_string()} failed: {expected}", reason
            assert "Error occurred while executing" not in reason
            # the home is the test instance's (instance_for_test sets DAGSTER_HOME)
            log = config.home() / "logs" / "enrich-crawl.log"
            assert reason.splitlines()[-1].split()[-1] == str(log)
        assert "Stack Trace" in log.read_text() and "KeyError" in log.read_text()


def test_the_folder_dagster_dev_leaves_in_the_root_is_ignored_by_git():
    """With no DAGSTER_HOME, Dagster's commands keep a throw-away instance in a folder of the
    working directory (`.tmp_dagster_home_*`), left behind when the command is killed: a clone
    must not offer it for commit."""
    git = shutil.which("git")
    if git is None or subprocess.run([git, "-C", str(REPO), "rev-parse"]).returncode != 0:
        pytest.skip("not a git checkout")
    with tempfile.TemporaryDirectory(prefix=TMP_DAGSTER_HOME_PREFIX, dir=REPO) as left:
        (Path(left) / "dagster.yaml").write_text("", encoding="utf-8")
        ignored = subprocess.run(
            [git, "-C", str(REPO), "check-ignore", "-q", str(Path(left) / "dagster.yaml")]
        )
    assert ignored.returncode == 0, f"{TMP_DAGSTER_HOME_PREFIX}* is not in .gitignore"


def test_a_home_set_up_once_is_opened_without_schema_checks_and_keeps_its_runs(tmp_path):
    """After `initialise_instance` the SQLite databases at the recorded schema head are opened
    directly (no per-database migration check), and a new run's database is still created."""
    from enrich_crawl.defs.instance import SCHEMA_MARK, schema_head
    from enrich_crawl.home import ensure_dagster_home

    home = tmp_path / "home"
    with _environ(DAGSTER_HOME=str(home), **{name: None for name in config.POSTGRES_VARIABLES}):
        ensure_dagster_home()
        assert (home / SCHEMA_MARK).exists() and schema_head() in (home / SCHEMA_MARK).read_text()

        @dg.asset
        def tiny() -> int:
            return 1

        for _ in range(2):  # the second opening takes the recorded-head path
            with dg.DagsterInstance.get() as instance:
                assert type(instance.run_storage).__name__ == "_HeadRunStorage"
                result = dg.materialize([tiny], instance=instance)
                assert result.success
        with dg.DagsterInstance.get() as instance:
            assert len(instance.get_runs()) == 2
            assert instance.get_latest_materialization_event(dg.AssetKey("tiny")) is not None


CAPTURE = """
import subprocess, sys
import psutil
from enrich_crawl.defs.instance import HomeComputeLogManager

manager = HomeComputeLogManager(sys.argv[1])
with manager.capture_logs(["run", "compute_logs", "step"]):
    print("out of the step", flush=True)
    print("err of the step", file=sys.stderr, flush=True)
    subprocess.run([sys.executable, "-c", "import sys; print('child'); sys.stderr.write('e')"])
    assert not psutil.Process().children()  # no tail process beside the step
print("after the step", flush=True)
"""


def test_step_output_is_captured_to_the_compute_log_by_a_thread_with_its_children(tmp_path):
    """A step's stdout/stderr and its child processes' reach the compute-log files and still the
    step's own streams, without the `tail` processes Dagster starts per stream."""
    import subprocess
    import sys

    from enrich_crawl.defs.instance import HomeComputeLogManager

    shown = subprocess.run(
        [sys.executable, "-c", CAPTURE, str(tmp_path)], capture_output=True, text=True, check=True
    )
    assert shown.stdout == "out of the step\nchild\nafter the step\n"
    assert shown.stderr == "err of the step\ne"
    manager = HomeComputeLogManager(str(tmp_path))
    key = ["run", "compute_logs", "step"]
    assert (
        Path(manager.get_captured_local_path(key, "out")).read_text() == "out of the step\nchild\n"
    )
    assert Path(manager.get_captured_local_path(key, "err")).read_text() == "err of the step\ne"
    assert Path(manager.complete_artifact_path(key)).exists()


def test_a_run_of_the_cli_opens_the_home_at_info_unless_its_dagster_yaml_sets_a_level(tmp_path):
    """`enrich-crawl run` opens its instance with python_log_level INFO when dagster.yaml sets
    none (the repository's file, copied into a DAGSTER_HOME): each step process's own console
    logger is then at INFO, so Dagster's DEBUG engine events stay off the terminal (the run's log
    keeps them: test_run_summary.py). The rest of `python_logs`, and a level the file sets, are
    kept."""
    from enrich_crawl.home import open_run_instance

    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    with _environ(DAGSTER_HOME=str(home), **NO_PG), open_run_instance(home) as instance:
        assert instance.python_log_level == "INFO"
        assert instance.get_ref().settings["python_logs"] == {"python_log_level": "INFO"}
        assert instance.get_ref().settings["telemetry"] == {"enabled": False}
        assert instance.storage_directory() == str(home / "storage")
    (home / "dagster.yaml").write_text(
        "python_logs:\n  python_log_level: WARNING\n  managed_python_loggers: [my_logger]\n",
        encoding="utf-8",
    )
    with _environ(DAGSTER_HOME=str(home), **NO_PG), open_run_instance(home) as instance:
        assert instance.python_log_level == "WARNING"
        assert instance.managed_python_loggers == ["my_logger"]
    (home / "dagster.yaml").write_text(
        "python_logs:\n  managed_python_loggers: [my_logger]\n", encoding="utf-8"
    )
    with _environ(DAGSTER_HOME=str(home), **NO_PG), open_run_instance(home) as instance:
        assert instance.python_log_level == "INFO"
        assert instance.managed_python_loggers == ["my_logger"]
