"""Run `enrich_job` through Dagster from the command line, with progress and a summary.

Used by `enrich-crawl run` and `enrich-crawl demo`: the run is a real Dagster run in the instance
of the home (enrich_crawl.home), visible afterwards in `enrich-crawl ui`. This process
orchestrates the run (the executor's loop); one watch thread beside it shows the progress
(enrich_crawl.progress), turns the UI's Terminate into an interrupt and stops the run when the
results database is lost. The summary is enrich_crawl.summary's.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, TextIO

from enrich_crawl.home import ensure_dagster_home, open_run_instance
from enrich_crawl.progress import Progress
from enrich_crawl.staging import DatasetStage
from enrich_crawl.summary import RunOutcome, failed_checks, failure_reason, summarize

INVOCATION_TAG = "enrich_crawl/invocation"
# the watch wakes this often; the progress shows every tick on a terminal, else every 10 s
WATCH_TICK = 1.0
# the run is asked whether the UI terminated it this often
CANCEL_CHECK_SECONDS = 2.0
# the results database unreachable this long (consecutive failed pings) stops the run
MONGO_LOST_AFTER = 15.0
MONGO_PING_EVERY = 3.0


def interrupt_this_process() -> None:
    """Interrupt this process as Ctrl-C would (SIGINT): Dagster's interrupt handling then stops
    every step and its crawl process tree."""
    os.kill(os.getpid(), signal.SIGINT)


class RunWatch:
    """The one thread that watches a run from the command line while this process orchestrates
    it: the progress display, the UI's Terminate (the run marked CANCELING or CANCELED: this run
    has no launcher to call back, so it is turned into an interrupt), and the results database
    (lost for MONGO_LOST_AFTER seconds: the run is stopped and fails naming it, instead of crawling
    on with nowhere to put the results and failing minutes later at the merge)."""

    def __init__(
        self,
        instance: Any,
        invocation: str,
        progress: Progress,
        *,
        mongo_uri: str | None = None,
        mongo_database: str = "",
    ):
        self.instance = instance
        self.invocation = invocation
        self.progress = progress
        self.mongo_uri = mongo_uri
        self.mongo_database = mongo_database
        self.lost = ""  # why the run was stopped (the results database lost)
        self._run_id = ""
        self._holders_started: dict[str, float] = {}  # run id -> start time (it never changes)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="run-watch", daemon=True)

    def run_id(self) -> str:
        """The run's id, once the run exists (found by its invocation tag)."""
        if not self._run_id:
            import dagster as dg

            runs = self.instance.get_runs(
                filters=dg.RunsFilter(tags={INVOCATION_TAG: self.invocation}), limit=1
            )
            self._run_id = runs[0].run_id if runs else ""
        return self._run_id

    def pool_note(self) -> str:
        """Who holds the crawl pool slots the run's steps wait for ("" when none waits)."""
        from enrich_crawl.recovery import pool_wait

        run_id = self.run_id()
        wait = (
            pool_wait(self.instance, run_id, started=self._holders_started) if run_id else None
        )
        return wait.describe() if wait else ""

    def __enter__(self) -> RunWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._done.set()
        self._thread.join(timeout=5)

    def _watch(self) -> None:
        mongo = _MongoWatch(self.mongo_uri) if self.mongo_uri else None
        next_cancel_check = next_ping = time.monotonic()
        try:
            while not self._done.wait(WATCH_TICK):
                self.progress.show()
                now = time.monotonic()
                if now >= next_cancel_check:
                    next_cancel_check = now + CANCEL_CHECK_SECONDS
                    if self._canceled():
                        interrupt_this_process()
                        return
                if mongo is not None and now >= next_ping:
                    next_ping = now + MONGO_PING_EVERY
                    silent = mongo.silent_for()
                    if silent >= MONGO_LOST_AFTER and not self._done.is_set():
                        self.lost = self._lost_message()
                        interrupt_this_process()
                        return
        finally:
            if mongo is not None:
                mongo.close()

    def _canceled(self) -> bool:
        import dagster as dg

        try:
            run_id = self.run_id()
            if not run_id:
                return False
            # a count, not the run itself: reading a run record costs its deserialisation
            return bool(
                self.instance.get_runs_count(
                    filters=dg.RunsFilter(
                        run_ids=[run_id],
                        statuses=[dg.DagsterRunStatus.CANCELING, dg.DagsterRunStatus.CANCELED],
                    )
                )
            )
        except Exception:  # a storage hiccup: ask again at the next check
            return False

    def _lost_message(self) -> str:
        from enrich_crawl.store.mongo import redact_uri

        return (
            f"MongoDB {redact_uri(self.mongo_uri or '')} (database {self.mongo_database}) lost "
            f"mid-run: no answer for {MONGO_LOST_AFTER:.0f} s, the run was stopped. What was "
            "crawled stays staged and in the crawl store: run the same command again when "
            "MongoDB is back."
        )


class _MongoWatch:
    """Pings the results database through one client (a client per ping costs its connection
    and monitor threads each time); says how long it has not answered."""

    def __init__(self, uri: str):
        from enrich_crawl.store.mongo import connect

        self.client = connect(
            uri, serverSelectionTimeoutMS=2000, connectTimeoutMS=2000, socketTimeoutMS=2000
        )
        self.failing_since: float | None = None

    def silent_for(self) -> float:
        try:
            self.client.admin.command("ping")
        except Exception:
            now = time.monotonic()
            self.failing_since = self.failing_since or now
            return now - self.failing_since
        self.failing_since = None
        return 0.0

    def close(self) -> None:
        self.client.close()


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

    With `mongo_uri`, the results database is watched while the run goes on (RunWatch)."""
    home = ensure_dagster_home()
    import dagster as dg

    from enrich_crawl import config
    from enrich_crawl.catalog import fingerprint
    from enrich_crawl.dataset.spec import load_spec
    from enrich_crawl.definitions import enrich_job_def
    from enrich_crawl.defs.partitions import DATASET_TAG, FINGERPRINT_TAG, TRIGGER_TAG
    from enrich_crawl.recovery import process_tags, report_dead_runs

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
    invocation = uuid.uuid4().hex
    # what is loaded by now (Dagster, the definitions) lives as long as the command: out of the
    # garbage collector's sight, its collections during the run do not traverse it again and again
    gc.collect()
    gc.freeze()
    gc.enable()
    tags = {
        **process_tags(),
        INVOCATION_TAG: invocation,
        DATASET_TAG: spec.name,
        TRIGGER_TAG: "cli",
        FINGERPRINT_TAG: fingerprint(spec),
    }
    result: dict[str, Any] = {}
    # one instance for the whole command: every opening of it costs its storages' set-up
    with open_run_instance(home) as instance:
        # runs killed with their process (kill -9, OOM, reboot) would hold the crawl pool for ever
        try:
            report_dead_runs(instance, stream)
        except Exception as exc:  # the run's own executor checks again
            stream.write(f"could not check for dead runs: {exc}\n")
        progress = Progress(stage, stream)
        watch = RunWatch(
            instance, invocation, progress, mongo_uri=mongo_uri, mongo_database=mongo_database
        )
        progress.pool_wait = watch.pool_note
        # the run executes in this (main) thread so that Ctrl-C reaches Dagster's interrupt
        # handling, which stops every step and its crawl process tree
        try:
            with watch:
                run = dg.execute_job(
                    dg.reconstructable(enrich_job_def),
                    instance=instance,
                    run_config=run_config,
                    tags=tags,
                    raise_on_error=False,
                )
                result.update(success=run.success, run_id=run.run_id)
                if not run.success:
                    result["failure"] = failure_reason(run)
        except KeyboardInterrupt:
            result.update(success=False, failure="interrupted: the run was terminated")
        except Exception as exc:  # reported in the summary, never swallowed
            result.update(success=False, failure=f"{type(exc).__name__}: {exc}")
        if watch.lost:  # the root cause, whatever the interrupted steps said
            result.update(success=False, failure=watch.lost)
        progress.show(final=True)
        outcome = RunOutcome(
            bool(result.get("success")),
            result.get("run_id") or watch.run_id(),
            time.monotonic() - progress.started,
            failure=result.get("failure", ""),
        )
        # `run --learn` or the spec's `learn: true`: the summary says what was learned
        outcome.summary = summarize(
            stage,
            learned=spec.learn if learn is None else learn,
            started_at=time.time() - outcome.seconds - 1.0,
        )
        if outcome.run_id:
            try:
                outcome.checks = failed_checks(instance, outcome.run_id)
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
