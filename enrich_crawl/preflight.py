"""Preflight: what a run needs, checked in a few seconds before it starts.

`enrich-crawl run` / `demo` call `preflight()` before launching the Dagster run, so that a missing
table, a misspelt column, a broken mapping or a service that is down is reported at once, in a few
lines naming the file, key or service and the reason, instead of minutes later as a failed step.
Checks, in order (the first failure stops): the dataset spec; the source table (exists, readable,
its id/url columns present); the mappings (valid, and at least one unless the run learns them);
PostgreSQL when DAGSTER_PG_* configure the instance; MongoDB (MONGODB_URI answering, or the
embedded server started); Chromium when a mapping renders. What is worth a look but does not stop
the run (a field named almost like a column: a typo?) comes back as `warnings`, printed before it.

Plain code: nothing here imports Dagster, Scrapy or Twisted.
"""

from __future__ import annotations

import datetime as dt
import os
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from enrich_crawl import config

# at most this many problems of one kind are printed (the rest are counted)
MAX_PROBLEMS_SHOWN = 3
SERVICE_TIMEOUT_SECONDS = 5.0


class PreflightError(Exception):
    """A run cannot start: `check` says what was checked, the message says where and why."""

    def __init__(self, check: str, message: str):
        super().__init__(message)
        self.check = check


@dataclass
class Preflight:
    """What the preflight found (handed to the run so nothing is loaded twice)."""

    spec: Any
    mappings_dir: Path
    mongo_uri: str
    mongo_database: str
    seconds: float = 0.0
    checks: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # shown on the terminal before the run


def log_file() -> Path:
    """Where the CLI writes full tracebacks (the terminal gets a few lines naming this file)."""
    return config.home() / "logs" / "enrich-crawl.log"


def log_exception(exc: BaseException, context: str = "") -> Path:
    """Append `exc`'s traceback to the log file; returns its path (or a temporary one)."""
    path = log_file()
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    stamp = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    entry = f"--- {stamp} pid {os.getpid()} {context}\n{text}\n"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(entry)
    except OSError:
        fd, name = tempfile.mkstemp(prefix="enrich-crawl-", suffix=".log")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(entry)
        path = Path(name)
    return path


def first_line(text: str, limit: int = 300) -> str:
    line = str(text).strip().splitlines()[0] if str(text).strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def check_spec(spec_path: Path):
    from enrich_crawl.dataset.spec import SpecError, load_spec

    try:
        return load_spec(spec_path)
    except SpecError as exc:
        raise PreflightError("spec", str(exc)) from None


def check_source(spec) -> list[str]:
    """The table exists, can be read, and has the spec's id/url columns; returns its columns."""
    from enrich_crawl.dataset.columns import DatasetError, check_columns
    from enrich_crawl.dataset.read import ReadError, open_reader

    source = Path(spec.source)
    if not source.exists():
        raise PreflightError(
            "source", f"{source}: source table not found (named by `source:` in {spec.path})"
        )
    if not source.is_file():
        raise PreflightError("source", f"{source}: not a file (named by {spec.path})")
    try:
        with open(source, "rb") as fh:
            fh.read(1)
    except OSError as exc:
        raise PreflightError(
            "source", f"{source}: cannot read the table: {exc.strerror or exc}"
        ) from None
    with tempfile.TemporaryDirectory(prefix="enrich-preflight-") as scratch:
        try:
            reader = open_reader(spec, work_dir=Path(scratch))
            columns = list(reader.columns)
            close = getattr(reader, "close", None)
            if callable(close):
                close()
        except ReadError as exc:
            raise PreflightError("source", first_line(str(exc))) from None
        except (OSError, ValueError, UnicodeError) as exc:
            raise PreflightError(
                "source", f"{source}: cannot read the table: {first_line(str(exc))}"
            ) from None
        except Exception as exc:  # Arrow's own errors: still a table we cannot read
            raise PreflightError(
                "source",
                f"{source}: cannot read the table: {type(exc).__name__}: {first_line(str(exc))}",
            ) from None
    if columns:
        try:
            check_columns(spec, columns)
        except DatasetError as exc:
            raise PreflightError("source", first_line(str(exc), 400)) from None
    return columns


def check_mappings(mappings_dir: Path):
    from enrich_crawl.extract.mapping import MappingLoadError, MappingSet

    try:
        return MappingSet.load(mappings_dir)
    except MappingLoadError as exc:
        shown = exc.errors[:MAX_PROBLEMS_SHOWN]
        more = len(exc.errors) - len(shown)
        lines = [*shown]
        tail = f"enrich-crawl mapping check {mappings_dir}"
        lines.append(
            f"({more} more problem(s): {tail})"
            if more > 0
            else f"(refused; check them with: {tail})"
        )
        raise PreflightError("mappings", "\n".join(lines)) from None


def check_some_mappings(mappings, mappings_dir: Path, spec, *, learn: bool) -> None:
    """Refuse a crawl that could fill nothing: no mapping file, and no learning to make some."""
    if len(mappings) or learn or spec.learn:
        return
    raise PreflightError(
        "mappings",
        f"{mappings_dir}: no mapping files (*.json), so the crawl could fill no field of "
        f"{spec.name}.\n"
        "  Write mappings there (docs/mappings.md) or name a folder that has some with "
        "--mappings, or learn\n"
        "  them from the values the table already holds: `enrich-crawl run --learn`, set "
        f"`learn: true` in\n  {spec.path}, or run `enrich-crawl mapping learn --dataset "
        f"{spec.path} --out DIR` (docs/learning.md).",
    )


def check_postgres() -> str | None:
    """The instance's PostgreSQL answers (when DAGSTER_PG_* are set); returns where it is."""
    try:
        settings = config.postgres_settings()
    except ValueError as exc:
        raise PreflightError("postgres", str(exc)) from None
    if settings is None:
        return None
    where = (
        f"PostgreSQL {settings['DAGSTER_PG_HOST']}:{settings['DAGSTER_PG_PORT']} database "
        f"{settings['DAGSTER_PG_DB']} (DAGSTER_PG_*, the Dagster instance)"
    )
    try:
        import psycopg2

        conn = psycopg2.connect(
            host=settings["DAGSTER_PG_HOST"],
            port=settings["DAGSTER_PG_PORT"],
            user=settings["DAGSTER_PG_USER"],
            password=settings["DAGSTER_PG_PASSWORD"],
            dbname=settings["DAGSTER_PG_DB"],
            connect_timeout=int(SERVICE_TIMEOUT_SECONDS),
        )
        conn.close()
    except Exception as exc:
        reason = first_line(str(exc))
        password = settings["DAGSTER_PG_PASSWORD"]
        if len(password) >= 4:  # shorter ones would blank out ordinary words
            reason = reason.replace(password, "***")
        raise PreflightError("postgres", f"{where} not reachable: {reason}") from None
    return where


def check_mongo(database: str) -> str:
    """MONGODB_URI answers a ping, or the embedded server is started; returns the URI to use."""
    from enrich_crawl.store.embedded import EmbeddedMongoError
    from enrich_crawl.store.mongo import connect, redact_uri, resolve_uri, scrub

    given = config.mongodb_uri()
    try:
        uri = resolve_uri(given, config.work_dir() / "mongo")
    except EmbeddedMongoError as exc:
        raise PreflightError(
            "mongodb",
            f"the embedded MongoDB (database {database}) did not start: {first_line(str(exc))}",
        ) from None
    ms = int(SERVICE_TIMEOUT_SECONDS * 1000)
    client = connect(uri, serverSelectionTimeoutMS=ms, connectTimeoutMS=ms, socketTimeoutMS=ms)
    try:
        client.admin.command("ping")
    except Exception as exc:
        text = str(exc).split(", Timeout:")[0].split(" (configured timeouts")[0]
        reason = first_line(scrub(text, given))
        raise PreflightError(
            "mongodb",
            f"MongoDB {redact_uri(uri)} (database {database}, MONGODB_URI) not reachable: {reason}",
        ) from None
    finally:
        client.close()
    return uri


def check_chromium(mappings) -> str | None:
    """The browser exists when a mapping renders pages (`render`: js or auto)."""
    rendering = [m.name for m in mappings if getattr(m, "render", "static") != "static"]
    if not rendering:
        return None
    path = config.chromium_path()
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise PreflightError(
            "chromium",
            f"Chromium {path} (ENRICH_CHROMIUM) not found or not executable; mapping(s) "
            f"{', '.join(rendering[:3])} render pages in the browser",
        )
    return path


def preflight(
    spec_path: Path, mappings_dir: Path | None = None, *, learn: bool = False
) -> Preflight:
    """Every check, in order; raises PreflightError at the first that fails. `learn`: the run
    learns mappings first (`run --learn`), as the spec's `learn: true` says."""
    from enrich_crawl.dataset.columns import near_miss_warnings

    started = time.monotonic()
    spec = check_spec(Path(spec_path))
    columns = check_source(spec)
    warnings = near_miss_warnings(spec, columns) if columns else []
    mappings_dir = Path(mappings_dir or config.mappings_dir())
    mappings = check_mappings(mappings_dir)
    check_some_mappings(mappings, mappings_dir, spec, learn=learn)
    checks = ["spec", "source", "mappings"]
    if check_postgres():
        checks.append("postgres")
    database = config.mongodb_db()
    uri = check_mongo(database)
    checks.append("mongodb")
    if check_chromium(mappings):
        checks.append("chromium")
    return Preflight(
        spec=spec,
        mappings_dir=mappings_dir,
        mongo_uri=uri,
        mongo_database=database,
        seconds=time.monotonic() - started,
        checks=checks,
        warnings=warnings,
    )
