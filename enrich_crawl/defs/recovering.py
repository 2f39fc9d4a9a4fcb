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
from dagster._core.execution.plan.instance_concurrency_context import InstanceConcurrencyContext

from enrich_crawl import recovery

# A round of the multiprocess executor's loop over steps that all wait for pool slots sleeps this
# long in total (see PatientConcurrencyContext)
CLAIM_ROUND_SECONDS = 0.25


class PatientConcurrencyContext(InstanceConcurrencyContext):
    """Dagster's concurrency context, without the busy wait of a run whose steps all wait for
    pool slots: the multiprocess executor asks for a claim again at once after a refusal, and
    with no step running nothing in its loop ever sleeps (100 % of a core while a dead run held
    the slots). A refused claim sleeps a share of CLAIM_ROUND_SECONDS, never past the time
    Dagster would check the pool again, so the run takes its slots as soon as they free up."""

    def claim(self, concurrency_key: str, step_key: str, step_priority: int = 0) -> bool:
        claimed = super().claim(concurrency_key, step_key, step_priority)
        if not claimed and step_key in self._pending_timeouts:
            left = self._pending_timeouts[step_key] - time.time()
            share = CLAIM_ROUND_SECONDS / max(len(self._pending_claims), 1)
            if left > 0:
                time.sleep(min(left, share))
        return claimed


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
