"""The Dagster instance of enrich_crawl, as dagster.yaml names it: one home, two storages.

dagster.yaml (the repository's, and the one `enrich-crawl` writes into its home) names these classes
instead of a fixed storage, so that the same file works everywhere:

- `HomeStorage`: PostgreSQL through dagster-postgres when DAGSTER_PG_* are set (production, several
  machines); otherwise SQLite under the home (`enrich_crawl.config.home()`: DAGSTER_HOME, else the
  per-user `~/.local/share/enrich_crawl`).
- `HomeArtifactStorage`, `HomeComputeLogManager`: the run's files and step logs under that home.

Why not Dagster's defaults: `dagster dev` / `dagster job execute` run in the project root without
DAGSTER_HOME read ./dagster.yaml but keep everything else in a temporary folder deleted on exit;
runs would vanish and would not be those of `enrich-crawl run`. With these classes, every command
(from any folder, with or without DAGSTER_HOME) reads and writes the same instance.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sqlite3
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import sqlalchemy
from dagster._core.storage.base_storage import DagsterStorage
from dagster._core.storage.event_log.sqlite.sqlite_event_log import SqliteEventLogStorage
from dagster._core.storage.local_compute_log_manager import LocalComputeLogManager
from dagster._core.storage.root import LocalArtifactStorage
from dagster._core.storage.runs.sqlite.sqlite_run_storage import SqliteRunStorage
from dagster._core.storage.schedules.sqlite.sqlite_schedule_storage import SqliteScheduleStorage
from dagster._core.storage.sqlite import SQLITE_BUSY_TIMEOUT_SECONDS, create_db_conn_string
from dagster._core.storage.sqlite_storage import DagsterSqliteStorage
from dagster._serdes import ConfigurableClass, ConfigurableClassData
from sqlalchemy.pool import NullPool

from enrich_crawl import config

# Dagster offers no public interface for an instance's storage: the classes a dagster.yaml names
# (`storage: custom:`) derive from its storage classes, imported from their modules here.

SCHEMA_MARK = ".enrich_crawl_schema.json"  # in the home: Dagster's schema head, once checked


def _base_dir(config_value: dict | None) -> str:
    given = (config_value or {}).get("base_dir")
    return str(given) if given else str(config.home())


def schema_head() -> str:
    """The head revision of Dagster's storage schema (its alembic scripts, read: ~30 ms)."""
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    alembic = Config()
    alembic.set_main_option("script_location", "dagster:_core/storage/alembic")
    return str(ScriptDirectory.from_config(alembic).get_current_head())


def record_schema_head(base_dir: str) -> None:
    """Remember that the SQLite databases under `base_dir` were set up by this Dagster at its
    schema head (called once the instance's storage was initialised)."""
    import dagster

    mark = {"dagster": dagster.__version__, "head": schema_head()}
    Path(base_dir, SCHEMA_MARK).write_text(json.dumps(mark), encoding="utf-8")


def _recorded_head(base_dir: str) -> str | None:
    import dagster

    try:
        mark = json.loads(Path(base_dir, SCHEMA_MARK).read_text("utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(mark, dict) or mark.get("dagster") != dagster.__version__:
        return None  # another Dagster: its own checks (and migrations) apply
    return mark.get("head") or None


def _revision(db_file: str) -> str | None:
    """The schema revision an SQLite database of Dagster's is stamped with (None: no database)."""
    if not os.path.isfile(db_file):
        return None
    try:
        with sqlite3.connect(f"file:{db_file}?mode=ro", uri=True, timeout=15) as conn:
            row = conn.execute("SELECT version_num FROM alembic_version").fetchone()
    except sqlite3.Error:
        return None
    return row[0] if row else None


def _engine(conn_string: str, **connect_args: Any):
    return sqlalchemy.create_engine(conn_string, poolclass=NullPool, connect_args=connect_args)


class _HeadEventLogStorage(SqliteEventLogStorage):
    """SqliteEventLogStorage that skips the schema check of a run's database already at `head`,
    and keeps one engine per database: Dagster's makes an engine for every event it writes and
    every query, and so compiles each statement anew (a new engine's statement cache is empty).
    Connections are still opened per use (NullPool), under the storage's lock, as Dagster's."""

    def __init__(self, base_dir: str, head: str, inst_data: ConfigurableClassData | None = None):
        self._head = head
        self._engines: dict[str, Any] = {}
        super().__init__(base_dir, inst_data=inst_data)

    def _initdb(self, engine, for_index_shard=False) -> None:
        if _revision(str(engine.url.database)) != self._head:
            super()._initdb(engine, for_index_shard=for_index_shard)

    @contextlib.contextmanager
    def _connect(self, shard: str) -> Iterator[Any]:
        with self._db_lock:
            engine = self._engines.get(shard)
            if engine is None:
                engine = _engine(
                    self.conn_string_for_shard(shard), timeout=SQLITE_BUSY_TIMEOUT_SECONDS
                )
                if shard not in self._initialized_dbs:
                    self._initdb(engine)
                    self._initialized_dbs.add(shard)
                self._engines[shard] = engine
            with engine.connect() as conn, conn.begin():
                yield conn


class _HeadRunStorage(SqliteRunStorage):
    """SqliteRunStorage with one engine (and its statement cache) instead of one per query."""

    @functools.cached_property
    def _engine(self):
        return _engine(self._conn_string)

    @contextlib.contextmanager
    def connect(self) -> Iterator[Any]:
        with self._engine.connect() as conn, conn.begin():
            yield conn


class _HeadSqliteStorage(DagsterSqliteStorage):
    """DagsterSqliteStorage over databases known to be at Dagster's schema head.

    Dagster checks every SQLite database against its schema each time a process opens the
    instance, and each check reads its ~90 migration scripts: 40 % of the CPU of a step process
    that does little else (four checks: runs, schedules, the event index and the run's events),
    and of every other opening. Here a database stamped with the head revision recorded when the
    home was initialised (`record_schema_head`, same Dagster version) is opened without it; any
    other goes through Dagster's own check (and creation)."""

    def __init__(self, base_dir: str, head: str, inst_data: ConfigurableClassData | None = None):
        self.base_dir = base_dir
        runs = os.path.join(base_dir, "history", "")
        schedules = os.path.join(base_dir, "schedules")
        self._run_storage = (
            _HeadRunStorage(create_db_conn_string(runs, "runs"))
            if _revision(os.path.join(runs, "runs.db")) == head
            else SqliteRunStorage.from_local(runs)
        )
        self._event_log_storage = _HeadEventLogStorage(
            os.path.join(base_dir, "history", "runs", ""), head
        )
        self._schedule_storage = (
            SqliteScheduleStorage(create_db_conn_string(schedules, "schedules"))
            if _revision(os.path.join(schedules, "schedules.db")) == head
            else SqliteScheduleStorage.from_local(schedules)
        )
        self._inst_data = inst_data
        DagsterStorage.__init__(self)


class HomeStorage(DagsterStorage, ConfigurableClass):
    """Runs, event logs and schedules: PostgreSQL when DAGSTER_PG_* are set, else SQLite under the
    home. Never instantiated itself: `from_config_value` returns the chosen Dagster storage."""

    @classmethod
    def config_type(cls):
        return {"base_dir": dg_field_optional_string()}

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData | None, config_value):
        settings = config.postgres_settings()
        if settings is None:
            base_dir = _base_dir(config_value)
            head = _recorded_head(base_dir)
            if head is not None:
                return _HeadSqliteStorage(base_dir, head, inst_data=inst_data)
            return DagsterSqliteStorage.from_local(base_dir, inst_data=inst_data)
        from dagster_postgres import DagsterPostgresStorage
        from dagster_postgres.utils import get_conn_string

        url = get_conn_string(
            username=settings["DAGSTER_PG_USER"],
            password=settings["DAGSTER_PG_PASSWORD"],
            hostname=settings["DAGSTER_PG_HOST"],
            db_name=settings["DAGSTER_PG_DB"],
            port=settings["DAGSTER_PG_PORT"],
            # SQLAlchemy 2.1 needs the driver named explicitly
            scheme="postgresql+psycopg2",
        )
        return DagsterPostgresStorage(url, inst_data=inst_data)


class HomeArtifactStorage(LocalArtifactStorage):
    """The run's files (IO manager outputs) under the home, not under a temporary folder."""

    @classmethod
    def config_type(cls):
        return {"base_dir": dg_field_optional_string()}

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData | None, config_value):
        return LocalArtifactStorage(_base_dir(config_value), inst_data=inst_data)


class HomeComputeLogManager(LocalComputeLogManager):
    """The steps' stdout/stderr under <home>/storage, where `dagster dev` shows them from.

    Captured by a thread of the step process (`_mirrored`) instead of Dagster's `tail -F` process
    and its watcher process per stream: four processes started by every step, a tenth of a step's
    CPU. The files and where the output also goes (the terminal) are the same."""

    @classmethod
    def config_type(cls):
        return {"base_dir": dg_field_optional_string()}

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData | None, config_value):
        return HomeComputeLogManager(
            os.path.join(_base_dir(config_value), "storage"), inst_data=inst_data
        )

    @contextlib.contextmanager
    def capture_logs(self, log_key: Sequence[str]) -> Iterator[Any]:
        from dagster._core.storage.compute_log_manager import CapturedLogContext, ComputeIOType
        from dagster._core.storage.local_compute_log_manager import IO_TYPE_EXTENSION

        out = self.get_captured_local_path(log_key, IO_TYPE_EXTENSION[ComputeIOType.STDOUT])
        err = self.get_captured_local_path(log_key, IO_TYPE_EXTENSION[ComputeIOType.STDERR])
        with _mirrored(sys.stdout, out), _mirrored(sys.stderr, err):
            yield CapturedLogContext(log_key)
        # the mark Dagster leaves when a capture is complete
        Path(self.complete_artifact_path(log_key)).touch()


# a process that still holds the capture's pipe after its step (it should not) is not waited for
MIRROR_DRAIN_SECONDS = 5.0


@contextlib.contextmanager
def _mirrored(stream: Any, path: str) -> Iterator[None]:
    """Whatever this process and the processes it starts write to `stream`'s file descriptor is
    appended to `path` and still written where it went before, by a thread."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        yield  # not a real file (a test's captured stream): nothing to capture, as Dagster does
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    stream.flush()
    original = os.dup(fd)
    read_end, write_end = os.pipe()
    os.dup2(write_end, fd)
    os.close(write_end)
    log = open(path, "ab", buffering=0)  # noqa: SIM115 (closed by the copying thread)

    def copy() -> None:
        try:
            while data := os.read(read_end, 65536):
                log.write(data)
                view = memoryview(data)
                while view:
                    try:
                        view = view[os.write(original, view) :]
                    except OSError:  # where it went is gone: the file still has it
                        break
        finally:
            os.close(read_end)
            log.close()

    copier = threading.Thread(target=copy, name="compute-log", daemon=True)
    copier.start()
    try:
        yield
    finally:
        stream.flush()
        os.dup2(original, fd)  # the pipe's last writer in this process is gone
        copier.join(MIRROR_DRAIN_SECONDS)
        if not copier.is_alive():
            os.close(original)


def dg_field_optional_string():
    from dagster import Field, StringSource

    return Field(StringSource, is_required=False)
