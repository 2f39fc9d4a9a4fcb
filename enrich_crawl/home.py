"""The home of enrich_crawl: the Dagster instance that every command shares (docs/running.md
"The home"), its dagster.yaml, its storage set up once, and the hints that reach it from any shell.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

from enrich_crawl import config as settings

LOCAL_INSTANCE_YAML = """\
# The instance of enrich_crawl's home, written by enrich-crawl (docs/running.md "The home").
# Storage: SQLite in this folder, or PostgreSQL when DAGSTER_PG_* are set
# (enrich_crawl.defs.instance.HomeStorage); the runs' files and step logs in this folder too.
storage:
  custom:
    module: enrich_crawl.defs.instance
    class: HomeStorage
    config: {}
local_artifact_storage:
  module: enrich_crawl.defs.instance
  class: HomeArtifactStorage
  config: {}
compute_logs:
  module: enrich_crawl.defs.instance
  class: HomeComputeLogManager
  config: {}
telemetry:
  enabled: false
# no "join the community" pop-up over the UI
nux:
  enabled: false
python_logs:
  python_log_level: INFO
concurrency:
  runs:
    # runs launched from the UI, the schedule or the sensor wait in the queue (dagster dev)
    max_concurrent_runs: 2
    tag_concurrency_limits:
      # never two runs of one dataset at once: they would share its staging area
      - key: enrich_crawl/dataset
        value:
          applyLimitPerUniqueValue: true
        limit: 1
  pools:
    # crawl processes at once across all runs (every crawl step is in the pool `crawl`)
    default_limit: 8
"""


def instance_yaml(home: Path) -> str:
    """LOCAL_INSTANCE_YAML naming `home` itself: the instance is the same whoever opens it
    (`DagsterInstance.from_config(home)` from a process with another DAGSTER_HOME, or none)."""
    return LOCAL_INSTANCE_YAML.replace(
        "config: {}", f"config: {{base_dir: {json.dumps(str(home))}}}"
    )


INIT_MARK = ".enrich_crawl_initialised"  # in the home: storage set up for this dagster.yaml
INIT_LOCK = ".enrich_crawl_init.lock"


def ensure_dagster_home(*, initialise: bool = True) -> Path:
    """The home (DAGSTER_HOME, else the per-user default of `config.home()`), created with its
    dagster.yaml when new, and exported as DAGSTER_HOME for the processes of the run.

    With `initialise`, the instance's storage is set up once, here, before anything uses it
    concurrently: several processes opening a new SQLite instance at once (two `enrich-crawl run`,
    the run and its step processes) race to create its tables and stamp its migrations ("table
    alembic_version already exists", "more than one head"). A file lock makes one process do it;
    a mark (the hash of dagster.yaml) spares the others and later calls the work."""
    home = settings.home()
    home.mkdir(parents=True, exist_ok=True)
    config = home / "dagster.yaml"
    if not config.exists():
        # written whole under a temporary name: a concurrent reader never sees half a file
        tmp = home / f".dagster.yaml.{os.getpid()}.tmp"
        tmp.write_text(instance_yaml(home), encoding="utf-8")
        if not config.exists():
            tmp.replace(config)
        else:
            tmp.unlink(missing_ok=True)
    settings.use_home(home)
    if initialise:
        initialise_instance(home)
    return home


# the level of the Dagster log lines a run's step processes write on the terminal of `enrich-crawl
# run` when the home's dagster.yaml sets none (the one written here sets the same)
RUN_PYTHON_LOG_LEVEL = "INFO"


def open_run_instance(home: Path):
    """The instance of `home` as `enrich-crawl run` opens it to execute a run (a
    DagsterInstance, to be closed): a dagster.yaml that sets no `python_logs: python_log_level`
    (the repository's, one copied from it, a minimal one) gets RUN_PYTHON_LOG_LEVEL.

    Without it, Dagster gives each step process a console logger at DEBUG of its own, outside the
    run config's loggers, and its engine events (`STEP_WORKER_STARTED ... Executing step in
    subprocess`) reach the terminal whatever `-v` says. The events themselves are stored either
    way (the run's log in the UI has them); a level the file sets is kept."""
    from dagster import DagsterInstance
    from dagster._core.instance.ref import InstanceRef

    ref = InstanceRef.from_dir(str(home))
    python_logs = dict(ref.settings.get("python_logs") or {})
    if not python_logs.get("python_log_level"):
        python_logs["python_log_level"] = RUN_PYTHON_LOG_LEVEL
        ref = ref._replace(settings={**ref.settings, "python_logs": python_logs})
    return DagsterInstance.from_ref(ref)


def enrich_crawl_hint(arguments: str) -> str:
    """An `enrich-crawl ARGUMENTS` command to print, spelled so that it works when pasted: this
    home's variables in front, the console script as PATH finds it (enrich_crawl.console)."""
    from enrich_crawl.console import command

    return f"{home_prefix()}{command('enrich-crawl')} {arguments}"


def home_prefix() -> str:
    """What a printed command needs in front to reach this home: nothing for the default home,
    `DAGSTER_HOME=... ` (and `ENRICH_WORK_DIR=... `) when they were set, so hints work as printed
    from any shell."""
    parts = []
    if settings.home() != settings.default_home():
        parts.append(f"DAGSTER_HOME={shlex.quote(str(settings.home()))}")
    if settings.work_dir_given():
        parts.append(f"ENRICH_WORK_DIR={shlex.quote(str(settings.work_dir()))}")
    return "".join(part + " " for part in parts)


def _postgres() -> dict[str, str] | None:
    try:
        return settings.postgres_settings()
    except ValueError:
        return None


def _config_digest(home: Path) -> str:
    import hashlib

    try:
        text = (home / "dagster.yaml").read_bytes()
    except OSError:
        return ""
    # the storage HomeStorage picks (SQLite, or which PostgreSQL) is part of what was set up
    postgres = _postgres() or {}
    where = "|".join(
        postgres.get(k, "") for k in ("DAGSTER_PG_HOST", "DAGSTER_PG_PORT", "DAGSTER_PG_DB")
    )
    # another Dagster may bring another schema: set up again (defs/instance.py records its head)
    import dagster

    return hashlib.sha1(text + where.encode() + dagster.__version__.encode()).hexdigest()


def initialise_instance(home: Path) -> bool:
    """Create the storage of the instance in `home` (runs, event logs, schedules) unless it was
    already done for its current dagster.yaml; True when this call did it."""
    digest = _config_digest(home)
    mark = home / INIT_MARK
    if _read_text(mark) == digest:
        return False
    import fcntl

    with open(home / INIT_LOCK, "a+", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if _read_text(mark) == digest:  # another process did it while we waited
            return False
        import dagster as dg

        try:
            with dg.DagsterInstance.from_config(str(home)) as instance:
                # each call opens (and so creates and migrates) one of the storages
                instance.get_runs(limit=1)
                instance.get_backfills()
                instance.all_asset_keys()
                instance.all_instigator_state()
            if _postgres() is None:
                # later openings skip Dagster's per-database schema checks (defs/instance.py)
                from enrich_crawl.defs.instance import record_schema_head

                record_schema_head(str(home))
        except Exception as exc:  # e.g. a PostgreSQL instance not reachable: whoever uses the
            # instance next reports it; commands that do not need it (export) go on
            sys.stderr.write(f"Dagster instance in {home} not initialised: {exc}\n")
            return False
        mark.write_text(digest, encoding="utf-8")
        return True


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text("utf-8")
    except OSError:
        return None
