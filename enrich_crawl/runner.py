"""Run `enrich_job` through Dagster from the command line, with progress and a summary.

Used by `enrich-crawl run` and `enrich-crawl demo`: the run is a real Dagster run in the instance
(DAGSTER_HOME; a project-local SQLite instance `.dagster_home/` when unset), visible afterwards in
`dagster dev`.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from enrich_crawl.staging import DatasetStage, read_jsonl

LOCAL_HOME = ".dagster_home"
LOCAL_INSTANCE_YAML = """\
# Local instance created by enrich-crawl (SQLite storage under this folder).
# For production use the repository's dagster.yaml (PostgreSQL), see docs/operations.md.
telemetry:
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


INIT_MARK = ".enrich_crawl_initialised"  # in the home: storage set up for this dagster.yaml
INIT_LOCK = ".enrich_crawl_init.lock"


def ensure_dagster_home(*, initialise: bool = True) -> Path:
    """DAGSTER_HOME, or a project-local `.dagster_home` (created) when unset.

    With `initialise`, the instance's storage is set up once, here, before anything uses it
    concurrently: several processes opening a new SQLite instance at once (two `enrich-crawl run`,
    the run and its step processes) race to create its tables and stamp its migrations ("table
    alembic_version already exists", "more than one head"). A file lock makes one process do it;
    a mark (the hash of dagster.yaml) spares the others and later calls the work."""
    raw = os.environ.get("DAGSTER_HOME")
    home = Path(raw).expanduser().resolve() if raw else (Path.cwd() / LOCAL_HOME).resolve()
    home.mkdir(parents=True, exist_ok=True)
    config = home / "dagster.yaml"
    if not config.exists():
        # written whole under a temporary name: a concurrent reader never sees half a file
        tmp = home / f".dagster.yaml.{os.getpid()}.tmp"
        tmp.write_text(LOCAL_INSTANCE_YAML, encoding="utf-8")
        if not config.exists():
            tmp.replace(config)
        else:
            tmp.unlink(missing_ok=True)
    os.environ["DAGSTER_HOME"] = str(home)
    if initialise:
        initialise_instance(home)
    return home


def _config_digest(home: Path) -> str:
    import hashlib

    try:
        return hashlib.sha1((home / "dagster.yaml").read_bytes()).hexdigest()
    except OSError:
        return ""


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
            wait = pool_wait(self._instance, self._run_id) if self._run_id else None
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
    learn: bool | None = None,
) -> RunOutcome:
    """Execute enrich_job for one dataset in the current instance; blocks until it ends."""
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
        "loggers": {"console": {"config": {"log_level": "INFO" if verbose else "ERROR"}}},
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


def _failure_reason(run: Any) -> str:
    lines = []
    for event in run.all_events:
        if event.is_step_failure and event.step_failure_data and event.step_failure_data.error:
            error = event.step_failure_data.error
            lines.append(f"step {event.step_key} failed: {error.message.strip()}")
    return "\n".join(lines[:10]) or "the run failed"


def summarize(stage: DatasetStage) -> dict[str, Any]:
    """Records, fields resolved, pages fetched and errors by kind, from the staged results."""
    summary: dict[str, Any] = {"dataset": stage.dataset}
    manifest = _read(stage.seed_manifest)
    if manifest is None:
        return summary
    profile = manifest["profile"]
    summary.update(rows=profile["rows"], records=profile["usable"], rejected=profile["rejected"])
    errors: Counter[str] = Counter()
    fields_resolved: Counter[str] = Counter()
    pages = 0
    for shard in manifest["shards"]:
        pages += (_read(stage.crawl_stats(shard)) or {}).get("pages", 0)
        for line in read_jsonl(stage.resolved(shard)):
            for error in line.get("errors", []):
                errors[error.get("reason", "error")] += 1
            for name in line.get("fields", {}):
                fields_resolved[name] += 1
    summary.update(
        pages=pages,
        fields_resolved=sum(fields_resolved.values()),
        fields=dict(fields_resolved),
        errors=dict(errors),
    )
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
    status: dict[str, int] | None = None,
    results: str | None = None,
) -> None:
    s = outcome.summary
    out = stream.write
    out(
        f"\nenrich_job {'succeeded' if outcome.success else 'FAILED'}"
        f"{'  run ' + outcome.run_id if outcome.run_id else ''}\n"
    )
    if "records" in s:
        resolved = (status or {}).get("resolved", 0)
        out(
            f"  records           {s['records']} usable of {s['rows']} rows "
            f"({s['rejected']} rejected, reasons in the seed_dataset metadata)\n"
        )
        if status:
            out(
                "  status            "
                + ", ".join(f"{k} {v}" for k, v in sorted(status.items()))
                + "\n"
            )
        detail = ", ".join(f"{k} {v}" for k, v in sorted(s.get("fields", {}).items()))
        out(
            f"  fields resolved   {s.get('fields_resolved', 0)}"
            + (f" ({detail})" if detail else "")
            + "\n"
        )
        out(f"  pages fetched     {s.get('pages', 0)}\n")
        out(
            "  pages/resolved    "
            + (f"{s.get('pages', 0) / resolved:.2f}" if resolved else "n/a")
            + "\n"
        )
        errors = s.get("errors") or {}
        out(
            "  errors by kind    "
            + (", ".join(f"{k} {v}" for k, v in sorted(errors.items())) or "none")
            + "\n"
        )
    out(f"  time              {outcome.seconds:.1f} s\n")
    if not outcome.success:
        out(f"  reason            {outcome.failure}\n")
    if results:
        out(f"  results           {results}\n")
    home = os.environ.get("DAGSTER_HOME", "")
    out(f"  Dagster UI        DAGSTER_HOME={home} dagster dev   (http://127.0.0.1:3000)\n")
    stream.flush()
