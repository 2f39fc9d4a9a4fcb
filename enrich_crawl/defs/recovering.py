"""Executors that close dead runs before they start, say where they run, and wait for pool slots
without spinning (plain code in enrich_crawl/recovery.py).

Whatever launches an enrich_job run (`enrich-crawl run`, `dagster job execute`, the UI through
the daemon), its orchestrating process runs the executor: so that is where the run records its
host, pid and heartbeat (recovery.Heartbeat) and where earlier runs whose process is gone are
marked failed and their `crawl` pool slots freed, before this run claims any.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import dagster as dg
from dagster._core.execution.plan.instance_concurrency_context import (
    InstanceConcurrencyContext,
    _calculate_timeout_interval,
)

from enrich_crawl import recovery

# A round of the multiprocess executor's loop over steps that all wait for pool slots sleeps this
# long in total (see PatientConcurrencyContext)
CLAIM_ROUND_SECONDS = 0.25
# A waiting step's slot is checked on Dagster's schedule (1 s, then 10 % longer each time, at most
# 15 s) with one query; the full claim, which also reloads the pool limits (a limit removed while
# the run waits), at most this often: Dagster's longest interval
FULL_CLAIM_SECONDS = 15.0


class PatientConcurrencyContext(InstanceConcurrencyContext):
    """Dagster's concurrency context, without the busy wait of a run whose steps all wait for
    pool slots, and with cheaper checks while they wait.

    - The multiprocess executor asks for a claim again at once after a refusal, and with no step
      running nothing in its loop ever sleeps (100 % of a core while a dead run held the slots). A
      refused claim sleeps a share of CLAIM_ROUND_SECONDS, never past the time Dagster would check
      the pool again, so the run takes its slots as soon as they free up.
    - Each check of Dagster's is a full claim: the pool limits reloaded, then two queries, four on
      SQLite connections opened for each (~17 ms of CPU), most of a waiting run's CPU. Between
      full claims (FULL_CLAIM_SECONDS) a check asks only whether the step's pending claim has been
      given a slot (`check_concurrency_claim`, one query): whoever frees a slot, or raises the
      limit, assigns it to the next pending step, so the run starts as soon as Dagster's own
      schedule would have started it, and makes the full claim then."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._full_claim_at: dict[str, float] = {}  # step key -> time.monotonic()

    def claim(self, concurrency_key: str, step_key: str, step_priority: int = 0) -> bool:
        if self._still_pending(concurrency_key, step_key):
            claimed = False
        else:
            counted = self._pending_claim_counts[step_key]
            claimed = super().claim(concurrency_key, step_key, step_priority)
            if self._pending_claim_counts[step_key] != counted:  # asked the storage: refused
                self._full_claim_at[step_key] = time.monotonic()
        if not claimed and step_key in self._pending_timeouts:
            left = self._pending_timeouts[step_key] - time.time()
            share = CLAIM_ROUND_SECONDS / max(len(self._pending_claims), 1)
            if left > 0:
                time.sleep(min(left, share))
        return claimed

    def _still_pending(self, concurrency_key: str, step_key: str) -> bool:
        """True when the step waits, its check is due, a full claim was made less than
        FULL_CLAIM_SECONDS ago and the storage says the step still has no slot (the next check
        then scheduled as Dagster would); False when a full claim is to be made."""
        due = self._pending_timeouts.get(step_key, 0.0)
        if step_key not in self._pending_claims or time.time() <= due:
            return False  # not waiting, or not due: Dagster's claim answers without a query
        full = self._full_claim_at.get(step_key)
        if full is None or time.monotonic() - full >= FULL_CLAIM_SECONDS:
            return False
        status = self._instance.event_log_storage.check_concurrency_claim(
            concurrency_key, self._run_id, step_key
        )
        if status.is_assigned or status.enqueued_timestamp is None:
            return False  # given a slot (or no longer queued): the full claim takes it
        count = self._pending_claim_counts[step_key]
        interval = _calculate_timeout_interval(status.sleep_interval, count)
        self._pending_timeouts[step_key] = time.time() + interval
        self._pending_claim_counts[step_key] = count + 1
        return True


def install_patient_claims() -> None:
    """Make the multiprocess executor use PatientConcurrencyContext (idempotent)."""
    from dagster._core.executor import multiprocess

    multiprocess.InstanceConcurrencyContext = PatientConcurrencyContext


class RecoveringExecutor(dg.Executor):
    """Wraps an executor: closes dead runs, then runs the plan with a heartbeat."""

    def __init__(self, inner: dg.Executor):
        self.inner = inner

    @property
    def retries(self):
        return self.inner.retries

    @property
    def step_dependency_config(self):
        return self.inner.step_dependency_config

    def __getattr__(self, name: str) -> Any:  # executor-specific attributes (app_args, ...)
        return getattr(self.inner, name)

    def execute(self, plan_context: Any, execution_plan: Any) -> Iterator[dg.DagsterEvent]:
        instance = plan_context.instance
        run_id = plan_context.dagster_run.run_id
        with recovery.Heartbeat(instance, run_id):
            try:
                closed = recovery.close_dead_runs(instance, skip_run_id=run_id)
            except Exception as exc:  # never stops this run: the next launch tries again
                closed = []
                plan_context.log.warning(f"could not check for dead runs: {exc}")
            for run in closed:
                plan_context.log.warning(
                    f"run {run.run_id} closed: {run.reason}; {run.slots_freed} pool slot(s) freed"
                )
            yield from self.inner.execute(plan_context, execution_plan)


def with_recovery(executor_def: dg.ExecutorDefinition) -> dg.ExecutorDefinition:
    """`executor_def` (configured or not), its executors wrapped in RecoveringExecutor."""
    create = executor_def.executor_creation_fn
    assert create is not None
    return dg.ExecutorDefinition(
        name=executor_def.name,
        config_schema=executor_def.config_schema,
        executor_creation_fn=lambda init_context: RecoveringExecutor(create(init_context)),
        description=executor_def.description,
        requirements=executor_def.get_requirements,
    )
