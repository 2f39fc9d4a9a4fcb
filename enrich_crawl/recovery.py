"""Runs whose process died, closed before another run is launched (README: crash recovery).

A run killed with its process (OOM kill, reboot, `kill -9`, a closed laptop) stays STARTED in the
instance for ever: it keeps its `crawl` pool slots, so the next run waits on them without end, and
its dataset tag keeps the run queue from launching another run of the same dataset. Dagster's run
monitoring cannot tell: the default run launcher has no health check, and `enrich-crawl run` or
`dagster job execute` runs have no launcher at all.

So the process that orchestrates a run records where it runs (tags: host, pid and the pid's start
time) and keeps a heartbeat tag fresh while it lives. A STARTED/STARTING run is dead when

- it runs on this host and that process is gone (or the pid now belongs to another process), or
- its heartbeat is older than `ENRICH_RUN_DEAD_AFTER` seconds (default 300): the only evidence
  there is for a run on another machine.

`close_dead_runs` marks such runs failed with the reason, and frees every `crawl` pool slot held
by a run that is not running any more (dead or finished). It is called before `enrich-crawl run`
launches, when any enrich_job run starts executing (the executor), and by the `dead_runs` sensor
where a daemon runs. What a dead run crawled stays in the crawled-page store: the next run reuses
it instead of fetching it again.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

HOST_TAG = "enrich_crawl/run_host"
PID_TAG = "enrich_crawl/run_pid"
PID_STARTED_TAG = "enrich_crawl/run_pid_started"  # the pid's start time: pids are reused
HEARTBEAT_TAG = "enrich_crawl/run_heartbeat"
BOOT_TAG = "enrich_crawl/run_boot"  # the kernel's boot id: a reboot ends every process of it

HEARTBEAT_SECONDS = 30.0
DEFAULT_DEAD_AFTER = 300.0
POOL = "crawl"


def dead_after_seconds() -> float:
    """ENRICH_RUN_DEAD_AFTER: seconds without a heartbeat after which a run counts as dead."""
    from enrich_crawl import config

    given = config.run_dead_after()
    value = DEFAULT_DEAD_AFTER if given is None else given
    # a heartbeat is written every HEARTBEAT_SECONDS: never judge a run on less than three
    return max(value, 3 * HEARTBEAT_SECONDS)


def _process_started(pid: int) -> float | None:
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def _read_id(path: str) -> str:
    try:
        with open(path, encoding="ascii") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def boot_id() -> str:
    """`<machine id>:<boot id>` of this machine (Linux; elsewhere empty). Two machines that
    share a hostname never share a boot id, so a pid is only judged on the boot that ran it; the
    same machine id with another boot id means the machine restarted since."""
    boot = _read_id("/proc/sys/kernel/random/boot_id")
    return f"{_read_id('/etc/machine-id')}:{boot}" if boot else ""


def process_tags(pid: int | None = None) -> dict[str, str]:
    """The tags that say which process orchestrates a run (this one by default)."""
    pid = pid or os.getpid()
    started = _process_started(pid) or 0.0
    return {
        HOST_TAG: socket.gethostname(),
        BOOT_TAG: boot_id(),
        PID_TAG: str(pid),
        PID_STARTED_TAG: f"{started:.2f}",
        HEARTBEAT_TAG: f"{time.time():.0f}",
    }


def why_dead(tags: dict[str, str], now: float | None = None) -> str | None:
    """Why the run with these tags is dead, or None while it may be alive (or cannot be judged:
    a run that never recorded its process is left to Dagster's run monitoring)."""
    now = time.time() if now is None else now
    host, pid = tags.get(HOST_TAG), tags.get(PID_TAG, "")
    if not host or not pid.isdigit():
        return None
    boot, mine = tags.get(BOOT_TAG, ""), boot_id()
    same_host = host == socket.gethostname()
    if same_host and boot and boot != mine:
        machine = boot.partition(":")[0]
        if machine and machine == mine.partition(":")[0]:
            return f"its machine ({host}) restarted since it ran (pid {pid}): killed with it"
        same_host = False  # the same hostname, another machine: judged by its heartbeat
    if same_host:
        started = _process_started(int(pid))
        recorded = float(tags.get(PID_STARTED_TAG) or 0)
        if started is None:
            return f"its process (pid {pid} on {host}) is gone: killed or crashed"
        if recorded and abs(started - recorded) > 2.0:
            return f"its process (pid {pid} on {host}) is gone (the pid now names another process)"
        return None
    beat = float(tags.get(HEARTBEAT_TAG) or 0)
    silent = now - beat
    if beat and silent > dead_after_seconds():
        return (
            f"its process (pid {pid} on {host}) sent no heartbeat for {silent:.0f} s "
            f"(ENRICH_RUN_DEAD_AFTER={dead_after_seconds():.0f})"
        )
    return None


@dataclass
class ClosedRun:
    run_id: str
    reason: str
    slots_freed: int


def close_dead_runs(instance: Any, *, skip_run_id: str | None = None) -> list[ClosedRun]:
    """Mark dead runs of this instance failed (with the reason) and free the pool slots of every
    run that no longer runs. Returns the runs closed and the slots freed by each."""
    import dagster as dg

    closed: list[ClosedRun] = []
    runs = instance.get_runs(
        filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.STARTING])
    )
    for run in runs:
        if run.run_id == skip_run_id:
            continue
        reason = why_dead(run.tags)
        if reason is None:
            continue
        message = (
            f"run {run.run_id} marked failed: {reason}. Found by "
            f"{socket.gethostname()}:{os.getpid()} at {time.strftime('%Y-%m-%d %H:%M:%S')}; "
            "its crawl pool slots are freed and its crawled pages are reused by the next run."
        )
        # re-read: the run may have ended on its own meanwhile
        current = instance.get_run_by_id(run.run_id)
        if current is None or current.status not in (
            dg.DagsterRunStatus.STARTED,
            dg.DagsterRunStatus.STARTING,
        ):
            continue
        instance.report_run_failed(current, message)
        closed.append(ClosedRun(run.run_id, reason, _free_slots(instance, run.run_id)))
    _free_slots_of_ended_runs(instance, closed)
    return closed


def _free_slots(instance: Any, run_id: str) -> int:
    storage = instance.event_log_storage
    if not storage.supports_global_concurrency_limits:
        return 0
    held = 0
    for pool in storage.get_concurrency_keys():
        held += sum(s.run_id == run_id for s in storage.get_concurrency_info(pool).claimed_slots)
    storage.free_concurrency_slots_for_run(run_id)  # its pending claims too
    return held


def _free_slots_of_ended_runs(instance: Any, closed: list[ClosedRun]) -> None:
    """Slots (and pending claims) of runs that have ended: a run killed with its orchestrator
    leaves them behind, whatever marked it failed afterwards."""
    import dagster as dg

    storage = instance.event_log_storage
    if not storage.supports_global_concurrency_limits:
        return
    run_ids = storage.get_concurrency_run_ids()
    if not run_ids:
        return
    done = {c.run_id for c in closed}
    finished = instance.get_runs(
        filters=dg.RunsFilter(
            run_ids=sorted(run_ids - done),
            statuses=[
                dg.DagsterRunStatus.SUCCESS,
                dg.DagsterRunStatus.FAILURE,
                dg.DagsterRunStatus.CANCELED,
            ],
        )
    )
    for run in finished:
        freed = _free_slots(instance, run.run_id)
        if freed:  # pending claims alone are removed silently
            closed.append(ClosedRun(run.run_id, f"it had ended ({run.status.value})", freed))


@dataclass
class PoolWait:
    """Who holds the slots a run waits for."""

    pool: str
    limit: int
    held: int
    holders: dict[str, int]  # run id -> slots
    started: dict[str, float]  # run id -> start time (epoch)

    def describe(self) -> str:
        parts = []
        for run_id, slots in sorted(self.holders.items(), key=lambda kv: -kv[1]):
            when = self.started.get(run_id)
            since = f", started {time.strftime('%H:%M', time.localtime(when))}" if when else ""
            parts.append(f"{slots} by run {run_id[:8]}{since}")
        held = "; ".join(parts) or "none held (waiting for the next check)"
        return f"waiting for the {self.pool} pool: {self.held} of {self.limit} slots held: {held}"


def pool_wait(
    instance: Any, run_id: str, pool: str = POOL, started: dict[str, float] | None = None
) -> PoolWait | None:
    """The pool's holders when `run_id` has steps waiting for its slots, else None. `started`:
    holders' start times known from earlier calls (a run's never changes; one query a holder
    saved per call), filled in."""
    storage = instance.event_log_storage
    if not storage.supports_global_concurrency_limits:
        return None
    info = storage.get_concurrency_info(pool)
    waiting = [s for s in info.pending_steps if s.run_id == run_id and s.assigned_timestamp is None]
    if not waiting:
        return None
    holders: dict[str, int] = {}
    for slot in info.claimed_slots:
        holders[slot.run_id] = holders.get(slot.run_id, 0) + 1
    known = {} if started is None else started
    for holder in holders:
        if holder not in known:
            record = instance.get_run_record_by_id(holder)
            if record is not None and record.start_time:
                known[holder] = float(record.start_time)
    when = {holder: known[holder] for holder in holders if holder in known}
    limit = info.slot_count if info.limit is None else info.limit
    return PoolWait(pool, int(limit or 0), len(info.claimed_slots), holders, when)


class Heartbeat:
    """Records this process as the run's orchestrator and refreshes its heartbeat tag until
    stopped (a daemon thread: it dies with the process, which is the point)."""

    def __init__(self, instance: Any, run_id: str, interval: float = HEARTBEAT_SECONDS):
        self.instance = instance
        self.run_id = run_id
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="run-heartbeat", daemon=True)

    def __enter__(self) -> Heartbeat:
        self.instance.add_run_tags(self.run_id, process_tags())
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _beat(self) -> None:
        while not self._stop.wait(self.interval):
            # a storage hiccup must not end the run: the next beat tries again
            with contextlib.suppress(Exception):
                self.instance.add_run_tags(self.run_id, {HEARTBEAT_TAG: f"{time.time():.0f}"})


def report_dead_runs(instance: Any, stream: Any) -> list[ClosedRun]:
    """close_dead_runs on `instance`, each closed run told on `stream` (used before
    `enrich-crawl run` launches)."""
    closed = close_dead_runs(instance)
    for run in closed:
        stream.write(
            f"closed run {run.run_id}: {run.reason} (marked failed; {run.slots_freed} crawl pool "
            "slot(s) freed)\n"
        )
    return closed
