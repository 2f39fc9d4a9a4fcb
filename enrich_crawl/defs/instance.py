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

import os

from dagster._core.storage.base_storage import DagsterStorage
from dagster._core.storage.local_compute_log_manager import LocalComputeLogManager
from dagster._core.storage.root import LocalArtifactStorage
from dagster._serdes import ConfigurableClass, ConfigurableClassData

from enrich_crawl import config


def _base_dir(config_value: dict | None) -> str:
    given = (config_value or {}).get("base_dir")
    return str(given) if given else str(config.home())


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
            from dagster._core.storage.sqlite_storage import DagsterSqliteStorage

            return DagsterSqliteStorage.from_local(_base_dir(config_value), inst_data=inst_data)
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
    """The steps' stdout/stderr under <home>/storage, where `dagster dev` shows them from."""

    @classmethod
    def config_type(cls):
        return {"base_dir": dg_field_optional_string()}

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData | None, config_value):
        return LocalComputeLogManager(
            os.path.join(_base_dir(config_value), "storage"), inst_data=inst_data
        )


def dg_field_optional_string():
    from dagster import Field, StringSource

    return Field(StringSource, is_required=False)
