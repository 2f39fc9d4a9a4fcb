"""Run `enrich_job` through Dagster from the command line, with progress and a summary.

Used by `enrich-crawl run` and `enrich-crawl demo`: the run is a real Dagster run in the instance
of the home (DAGSTER_HOME, else the per-user `~/.local/share/enrich_crawl`, whatever the working
folder), visible afterwards in `enrich-crawl ui`.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from enrich_crawl.staging import DatasetStage

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
    from enrich_crawl import config as settings

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
    os.environ["DAGSTER_HOME"] = str(home)
    if initialise:
        initialise_instance(home)
    return home


def enrich_crawl_hint(arguments: str) -> str:
    """An `enrich-crawl ARGUMENTS` command to print, spelled so that it works when pasted: this
    home's variables in front, the console script as PATH finds it (enrich_crawl.console)."""
    from enrich_crawl.console import command

    return f"{home_prefix()}{command('enrich-crawl')} {arguments}"


def home_prefix() -> str:
    """What a printed command needs in front to reach this home: nothing for the default home,
    `DAGSTER_HOME=... ` (and `ENRICH_WORK_DIR=... `) when they were set, so hints work as printed
    from any shell."""
    from enrich_crawl import config as settings

    parts = []
    if settings.home() != settings.default_home():
        parts.append(f"DAGSTER_HOME={shlex.quote(str(settings.home()))}")
    if os.environ.get("ENRICH_WORK_DIR"):
        parts.append(f"ENRICH_WORK_DIR={shlex.quote(str(settings.work_dir()))}")
    return "".join(part + " " for part in parts)


def _config_digest(home: Path) -> str:
    import hashlib

    from enrich_crawl import config as settings

    try:
        text = (home / "dagster.yaml").read_bytes()
    except OSError:
        return ""
    # the storage HomeStorage picks (SQLite, or which PostgreSQL) is part of what was set up
    try:
        postgres = settings.postgres_settings() or {}
    except ValueError:
        postgres = {}
    where = "|".join(
        postgres.get(k, "") for k in ("DAGSTER_PG_HOST", "DAGSTER_PG_PORT", "DAGSTER_PG_DB")
    )
    return hashlib.sha1(text + where.encode()).hexdigest()


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


def _read(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text("utf-8"))
    except (OSError, ValueError):
        return None


@dataclass
class RunOutcome:
    success: bool
    run_id: str
    seconds: float
    summary: dict[str, Any] = field(default_factory=dict)
    failure: str = ""
    checks: list[dict[str, Any]] = field(default_factory=list)  # failed asset checks

    @property
    def error_checks(self) -> list[dict[str, Any]]:
        """Failed checks of severity ERROR: they fail the command (non-zero exit)."""
        return [c for c in self.checks if c["severity"] == "ERROR"]


POOL_CHECK_SECONDS = 5.0


class Progress:
    """Records and partitions done, pages/s: a bar on a terminal, a log line every 10 s otherwise.

    Read from the files the stages write (seed manifest, each crawl's progress/stats file), so it
    works whichever executor runs the steps."""

    def __init__(self, stage: DatasetStage, stream: TextIO, invocation: str = ""):
        self.stage = stage
        self.stream = stream
        self.invocation = invocation  # the run's tag: who holds the pool slots it waits for
        self._instance: Any = None
        self._run_id = ""
        self._pool_checked = -POOL_CHECK_SECONDS
        self._pool_note = ""
        self._holders_started: dict[str, float] = {}  # run id -> start time, for pool_wait
        self.tty = stream.isatty()
        self.started = time.monotonic()
        self.started_wall = time.time()
        self.last_line = 0.0

    def _fresh(self, data: dict[str, Any] | None) -> bool:
        return bool(data) and float(data.get("started_at", 0)) >= self.started_wall - 1

    def read(self) -> dict[str, Any]:
        manifest = _read(self.stage.seed_manifest)
        if manifest is None or not self._fresh({"started_at": _iso_ts(manifest.get("created_at"))}):
            return {"total": 0, "shards": 0, "partitions_done": 0, "records_done": 0, "pages": 0}
        state = {
            "total": manifest["profile"]["usable"],
            "shards": len(manifest["shards"]),
            "partitions_done": 0,
            "records_done": 0,
            "pages": 0,
        }
        for shard in manifest["shards"]:
            final = _read(self.stage.crawl_stats(shard))
            current = (
                final
                if self._fresh(final)
                else _read(self.stage.crawl_dir(shard) / "progress.json")
            )
            if not self._fresh(current):
                continue
            state["records_done"] += current.get("records_done", 0)
            state["pages"] += current.get("pages", 0)
            if current is final:
                state["partitions_done"] += 1
        if state["partitions_done"] < state["shards"]:
            state["waiting"] = self._pool_wait()
        return state

    def _pool_wait(self) -> str:
        """'waiting for the crawl pool: ...' while steps of this run wait for pool slots (asked
        of the instance at most every POOL_CHECK_SECONDS)."""
        if not self.invocation:
            return ""
        if time.monotonic() - self._pool_checked < POOL_CHECK_SECONDS:
            return self._pool_note
        self._pool_checked = time.monotonic()
        try:
            import dagster as dg

            from enrich_crawl.recovery import pool_wait

            if self._instance is None:
                self._instance = dg.DagsterInstance.get()
            if not self._run_id:
                runs = self._instance.get_runs(
                    filters=dg.RunsFilter(tags={"enrich_crawl/invocation": self.invocation}),
                    limit=1,
                )
                self._run_id = runs[0].run_id if runs else ""
            wait = (
                pool_wait(self._instance, self._run_id, started=self._holders_started)
                if self._run_id
                else None
            )
        except Exception:  # the progress line must never stop the run
            wait = None
        self._pool_note = wait.describe() if wait else ""
        return self._pool_note

    def show(self, final: bool = False) -> None:
        if not (self.tty or final) and time.monotonic() - self.last_line < 10:
            return  # no line due: nothing to read
        state = self.read()
        elapsed = max(time.monotonic() - self.started, 1e-6)
        rate = state["pages"] / elapsed
        if self.tty:
            width = 30
            frac = min(state["records_done"] / state["total"], 1.0) if state["total"] else 0.0
            filled = int(frac * width)
            self.stream.write(
                f"\r[{'#' * filled}{'-' * (width - filled)}] records {state['records_done']}/"
                f"{state['total']}  partitions {state['partitions_done']}/{state['shards']}  "
                f"{rate:.1f} pages/s  {elapsed:.0f}s "
                + (f" {state['waiting']} " if state.get("waiting") else "")
            )
            if final:
                self.stream.write("\n")
            self.stream.flush()
        else:
            self.last_line = time.monotonic()
            self.stream.write(
                f"progress: records {state['records_done']}/{state['total']}, partitions "
                f"{state['partitions_done']}/{state['shards']}, {state['pages']} pages "
                f"({rate:.1f}/s), {elapsed:.0f}s"
                + (f"; {state['waiting']}" if state.get("waiting") else "")
                + "\n"
            )
            self.stream.flush()


def _iso_ts(value: Any) -> float:
    import datetime as dt

    try:
        return dt.datetime.fromisoformat(str(value)).timestamp()
    except (TypeError, ValueError):
        return 0.0


def run_enrich_job(
    spec_path: Path,
    mappings_dir: Path | None = None,
    *,
    stream: TextIO = sys.stderr,
    verbose: bool = False,
    mongo_uri: str | None = None,
    mongo_database: str = "",
    learn: bool | None = None,
) -> RunOutcome:
    """Execute enrich_job for one dataset in the current instance; blocks until it ends.

    With `mongo_uri`, the results database is watched while the run goes on: lost for
    MONGO_LOST_AFTER seconds, the run is stopped and fails naming it (instead of crawling on with
    nowhere to put the results and failing minutes later at the merge)."""
    ensure_dagster_home()
    import dagster as dg

    from enrich_crawl import config
    from enrich_crawl.dataset.spec import load_spec
    from enrich_crawl.definitions import enrich_job_def

    spec = load_spec(spec_path)
    run_config = {
        "resources": {
            "dataset": {
                "config": {
                    "spec": str(spec.path),
                    "mappings": str(mappings_dir or config.mappings_dir()),
                    # `run --learn`: learn mappings first, whatever the spec's `learn` says
                    **({"learn": learn} if learn is not None else {}),
                }
            },
            # the progress display and the summary say what matters; the full event log and the
            # crawl logs stay in the instance (dagster dev) either way
            "crawler": {"config": {"log_level": "INFO" if verbose else "ERROR"}},
        },
        # failures reach the terminal as the summary's reason (the full traces go to the log
        # file it names, and stay in the run's event log): no stack traces on the terminal
        "loggers": {"console": {"config": {"log_level": "INFO" if verbose else "CRITICAL"}}},
    }
    stage = DatasetStage(config.work_dir(), spec.name)
    result: dict[str, Any] = {}
    from enrich_crawl.catalog import fingerprint
    from enrich_crawl.defs.partitions import DATASET_TAG, FINGERPRINT_TAG, TRIGGER_TAG
    from enrich_crawl.recovery import process_tags, report_dead_runs

    invocation = uuid.uuid4().hex
    progress = Progress(stage, stream, invocation)
    # runs killed with their process (kill -9, OOM, reboot) would hold the crawl pool for ever
    try:
        report_dead_runs(stream)
    except Exception as exc:  # the run's own executor checks again
        stream.write(f"could not check for dead runs: {exc}\n")
    tags = {
        **process_tags(),
        "enrich_crawl/invocation": invocation,
        DATASET_TAG: spec.name,
        TRIGGER_TAG: "cli",
        FINGERPRINT_TAG: fingerprint(spec),
    }
    done = threading.Event()

    def show_progress() -> None:
        while not done.wait(1.0):
            progress.show()

    # the run executes in this (main) thread so that Ctrl-C reaches Dagster's interrupt handling,
    # which stops every step and its crawl process tree; the UI's "Terminate" marks the run
    # CANCELING (this run has no launcher to call back): the watcher turns that into the same
    # interrupt
    watcher = threading.Thread(
        target=_interrupt_when_canceled, args=(invocation, done), name="cancel", daemon=True
    )
    shower = threading.Thread(target=show_progress, name="progress", daemon=True)
    shower.start()
    lost: dict[str, str] = {}
    mongo_watch = None
    if mongo_uri:
        mongo_watch = threading.Thread(
            target=_interrupt_when_mongo_lost,
            args=(mongo_uri, mongo_database, done, lost),
            name="mongo-watch",
            daemon=True,
        )
        mongo_watch.start()
    try:
        with dg.DagsterInstance.get() as instance:
            # started once this instance has set its storage up: two first openings of a new
            # SQLite instance at once race to create its tables
            watcher.start()
            run = dg.execute_job(
                dg.reconstructable(enrich_job_def),
                instance=instance,
                run_config=run_config,
                tags=tags,
                raise_on_error=False,
            )
            result.update(success=run.success, run_id=run.run_id)
            if not run.success:
                result["failure"] = _failure_reason(run)
    except KeyboardInterrupt:
        result.update(success=False, failure="interrupted: the run was terminated")
    except Exception as exc:  # reported in the summary, never swallowed
        result.update(success=False, failure=f"{type(exc).__name__}: {exc}")
    finally:
        done.set()
        shower.join(timeout=5)
        if watcher.is_alive():
            watcher.join(timeout=5)
    if lost:  # the root cause, whatever the interrupted steps said
        result.update(success=False, failure=lost["message"])
    if not result.get("run_id"):
        result["run_id"] = _run_id_of(invocation)
    progress.show(final=True)
    seconds = time.monotonic() - progress.started
    outcome = RunOutcome(
        bool(result.get("success")),
        result.get("run_id", ""),
        seconds,
        failure=result.get("failure", ""),
    )
    outcome.summary = summarize(stage)
    if outcome.run_id:
        try:
            outcome.checks = failed_checks(outcome.run_id)
        except Exception as exc:  # the summary says so rather than hiding the checks
            outcome.checks = [
                {
                    "check": "?",
                    "asset": "?",
                    "severity": "WARN",
                    "description": f"could not read the run's checks: {exc}",
                }
            ]
    return outcome


def _run_id_of(invocation: str) -> str:
    import dagster as dg

    with dg.DagsterInstance.get() as instance:
        runs = instance.get_runs(
            filters=dg.RunsFilter(tags={"enrich_crawl/invocation": invocation}), limit=1
        )
    return runs[0].run_id if runs else ""


def _interrupt_when_canceled(invocation: str, done: threading.Event, poll: float = 2.0) -> None:
    """Interrupt this process (as Ctrl-C would) when the run is marked CANCELING or CANCELED (the
    UI's Terminate and force-Terminate), so that the steps and their crawl processes stop."""
    import dagster as dg
    from dagster._utils import send_interrupt

    with dg.DagsterInstance.get() as instance:
        while not done.wait(poll):
            runs = instance.get_runs(
                filters=dg.RunsFilter(tags={"enrich_crawl/invocation": invocation}), limit=1
            )
            if runs and runs[0].status in (
                dg.DagsterRunStatus.CANCELING,
                dg.DagsterRunStatus.CANCELED,
            ):
                send_interrupt()
                return


# Dagster's wrappers around the exception that made a step fail: the reason is the cause inside
_WRAPPERS = (
    "DagsterExecutionStepExecutionError",
    "DagsterUserCodeExecutionError",
    "RetryRequestedFromPolicy",
    "RetryRequested",
)
_OWN_ERRORS = (
    "Failure",
    "DatasetError",
    "SpecError",
    "MergeError",
    "MappingLoadError",
    "EmbeddedMongoError",
    "ReadError",
)


def root_cause(error: Any) -> str:
    """The message of the exception a step raised (its first line), from Dagster's
    SerializableErrorInfo chain: not the wrapper's "Error occurred while executing op ..."."""
    while error is not None:
        cls = error.cls_name or ""
        head = (error.message or "").strip().split("\n", 1)[0]
        if cls not in _WRAPPERS and head:
            # messages read "module.Class: text"
            name, sep, text = head.partition(": ")
            if sep and name.rsplit(".", 1)[-1] == cls:
                head = text
            # our own errors name the file/key/service already; others say what they are
            return head if cls in _OWN_ERRORS else f"{cls}: {head}"
        error = error.cause or getattr(error, "context", None)
    return ""


# the results database unreachable this long (consecutive failed pings) stops the run
MONGO_LOST_AFTER = 15.0
MONGO_PING_EVERY = 3.0


def _interrupt_when_mongo_lost(
    uri: str, database: str, done: threading.Event, lost: dict[str, str]
) -> None:
    """Interrupt this process (as Ctrl-C would: every step and crawl process stops, what was
    crawled stays staged) when MongoDB at `uri` stops answering for MONGO_LOST_AFTER seconds."""
    import pymongo
    from dagster._utils import send_interrupt

    from enrich_crawl.store.mongo import redact_uri

    # one client for the whole run: a new one per ping (connection, handshake, monitor threads)
    # cost more CPU than the rest of a run waiting for the crawl pool; a lost server fails the
    # ping within the timeouts all the same, and the client reconnects when it answers again
    ms = 2000
    client: pymongo.MongoClient = pymongo.MongoClient(
        uri, serverSelectionTimeoutMS=ms, connectTimeoutMS=ms, socketTimeoutMS=ms, connect=False
    )
    failing_since: float | None = None
    try:
        while not done.wait(MONGO_PING_EVERY):
            if _mongo_answers(client):
                failing_since = None
                continue
            now = time.monotonic()
            failing_since = failing_since or now
            if now - failing_since >= MONGO_LOST_AFTER and not done.is_set():
                lost["message"] = (
                    f"MongoDB {redact_uri(uri)} (database {database}) lost mid-run: no answer for "
                    f"{MONGO_LOST_AFTER:.0f} s, the run was stopped. What was crawled stays staged "
                    "and in the crawl store: run the same command again when MongoDB is back."
                )
                send_interrupt()
                return
    finally:
        client.close()


def _mongo_answers(client: Any) -> bool:
    try:
        client.admin.command("ping")
        return True
    except Exception:  # whatever the reason, no answer
        return False


def _failure_reason(run: Any) -> str:
    """One line per failed step: its own exception's message; the full traces go to the log file
    (named on the last line)."""
    lines = []
    traces = []
    for event in run.all_events:
        if event.is_step_failure and event.step_failure_data and event.step_failure_data.error:
            error = event.step_failure_data.error
            reason = root_cause(error) or "failed"
            lines.append(f"step {event.step_key} failed: {reason}")
            traces.append(f"step {event.step_key} of run {run.run_id}:\n{error.to_string()}")
    if not lines:
        return "the run failed"
    log = _log_traces(traces)
    shown = list(dict.fromkeys(lines))[:3]
    if len(lines) > len(shown):
        shown.append(f"... {len(lines) - len(shown)} more failed step(s)")
    return "\n                    ".join(shown) + (f"\n  full traces       {log}" if log else "")


def _log_traces(traces: list[str]) -> str:
    import datetime as dt

    from enrich_crawl.preflight import log_file

    path = log_file()
    stamp = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as fh:
            for trace in traces:
                fh.write(f"--- {stamp} {trace}\n")
    except OSError:
        return ""
    return str(path)


def failed_checks(run_id: str) -> list[dict[str, Any]]:
    """The asset checks of the run that failed: [{check, asset, severity, description}]."""
    import dagster as dg

    failed = []
    with dg.DagsterInstance.get() as instance:
        records = instance.get_records_for_run(
            run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION, limit=1000
        ).records
        for record in records:
            event = record.event_log_entry.dagster_event
            evaluation = event.event_specific_data if event else None
            if evaluation is None or evaluation.passed:
                continue
            failed.append(
                {
                    "check": evaluation.check_name,
                    "asset": evaluation.asset_key.to_user_string(),
                    "severity": evaluation.severity.value,
                    "description": evaluation.description or "",
                }
            )
    # one line per check (a partitioned asset's check may be evaluated once per partition)
    return list({(c["asset"], c["check"]): c for c in failed}.values())


def summarize(stage: DatasetStage) -> dict[str, Any]:
    """The seed's figures (rows, usable records, rejected), and the staged fallbacks of the
    run's counts (used only when MongoDB cannot be read: enrich_crawl.counts is the definition)."""
    summary: dict[str, Any] = {"dataset": stage.dataset}
    manifest = _read(stage.seed_manifest)
    if manifest is None:
        return summary
    profile = manifest["profile"]
    summary.update(rows=profile["rows"], records=profile["usable"], rejected=profile["rejected"])
    from enrich_crawl.counts import pages_fetched

    summary["pages"] = pages_fetched(stage.crawl_stats(shard) for shard in manifest["shards"])
    return summary


def collection_status(mongo_uri: str, database: str, collection: str) -> dict[str, int]:
    """Documents per status in the results collection."""
    from enrich_crawl.store.mongo import connect

    client = connect(mongo_uri, serverSelectionTimeoutMS=5000)
    try:
        counts: Counter[str] = Counter()
        for doc in client[database][collection].find({}, {"status": 1}):
            counts[doc.get("status", "?")] += 1
        return dict(counts)
    finally:
        client.close()


def print_summary(
    outcome: RunOutcome,
    stream: TextIO,
    *,
    counts: dict[str, Any] | None = None,
    results: str | None = None,
) -> None:
    """The summary: records, status, the counts of enrich_crawl.counts, failed checks, reason."""
    s = outcome.summary
    out = stream.write
    verdict = "succeeded" if outcome.success else "FAILED"
    if outcome.success and outcome.error_checks:
        verdict = "succeeded, but ERROR check(s) failed"
    out(f"\nenrich_job {verdict}{'  run ' + outcome.run_id if outcome.run_id else ''}\n")
    if "records" in s:
        out(
            f"  records           {s['records']} usable of {s['rows']} rows "
            f"({s['rejected']} rejected, reasons in the seed_dataset metadata)\n"
        )
    if counts:
        out(
            "  status            "
            + (", ".join(f"{k} {v}" for k, v in counts["status"].items()) or "no documents")
            + "\n"
        )
        detail = ", ".join(f"{k} {v}" for k, v in sorted(counts["fields"].items()) if v)
        out(f"  fields resolved   {counts['fields_resolved']}" + (f" ({detail})" if detail else ""))
        out("\n")
        out(f"  pages fetched     {counts['pages']}\n")
        ratio = counts["pages_per_resolved_record"]
        out(
            "  pages/resolved    "
            + (f"{ratio:.2f}" if ratio is not None else "n/a")
            + "  (pages fetched / records resolved)\n"
        )
        errors = counts["errors"]
        out(
            "  errors by kind    "
            + (", ".join(f"{k} {v}" for k, v in errors.items()) or "none")
            + "\n"
        )
    elif "pages" in s:
        out(f"  pages fetched     {s['pages']}\n")
    for check in outcome.checks:
        out(
            f"  check failed      {check['check']} ({check['asset']}, {check['severity']}): "
            f"{check['description']}\n"
        )
    out(f"  time              {outcome.seconds:.1f} s\n")
    if not outcome.success:
        out(f"  reason            {outcome.failure}\n")
    if results:
        out(f"  results           {results}\n")
    out(f"  Dagster UI        {enrich_crawl_hint('ui')}   (http://127.0.0.1:3000)\n")
    stream.flush()
