"""dagster-celery, with lost workers turned into retried steps (docs/crash-recovery.md).

Stock dagster-celery waits for a step's Celery result for ever: a worker machine that dies while
it runs a step (SIGKILL, power loss, OOM of the whole container) never sends one, so the run
stays STARTED with nothing running, its RetryPolicy never fires and the steps after the fan-in
(resolve, merge) never run.

Here the run's process watches the workers that run its steps:

- workers acknowledge a task late and reserve nothing ahead (WORKER_SETTINGS, applied by the
  worker app `enrich_crawl.defs.celery_app` and `enrich-crawl worker`): a lost worker takes at
  most the steps it was running with it, never tasks it had only reserved;
- a step's task reports STARTED with the worker's name (track_started); the run pings the workers
  running its steps every `ENRICH_WORKER_PING_SECONDS` (default 10) through the broker's control
  channel, which the worker's main process answers whatever its step is doing;
- a worker that has not answered for `ENRICH_WORKER_LOST_SECONDS` (default 60) is lost: its
  tasks are revoked, and each of its steps is retried (STEP_UP_FOR_RETRY) on the workers left,
  within its RetryPolicy plus `ENRICH_LOST_STEP_RETRIES` (default 1) retries of its own; past
  that the step fails. A crawl step retried past its policy gives up cleanly (crawl_ops), so the
  other shards are still resolved and merged.

A task that comes back later anyway (Redis hands an unacknowledged task out again after its
visibility timeout) finds its run ended and does nothing (celery_app.GuardedTask), and a crawl
attempt never touches the files of a newer attempt or another run (staging.claim_shard).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import Any

import dagster as dg
from dagster._core.events import DagsterEvent, EngineEventData
from dagster._core.execution.plan.instance_concurrency_context import InstanceConcurrencyContext
from dagster._core.execution.plan.objects import StepFailureData, StepRetryData
from dagster._utils.error import SerializableErrorInfo, serializable_error_info_from_exc_info
from dagster_celery.executor import CELERY_CONFIG, CeleryExecutor, _submit_task

from enrich_crawl import config

# Celery settings every worker and the run's app use (a user's config_source overrides them)
WORKER_SETTINGS: dict[str, Any] = {
    # the task's message is acknowledged when it ends, not when it starts: a worker that dies
    # mid-step leaves it unacknowledged (the broker keeps it) instead of silently dropping it
    "task_acks_late": True,
    # a pool process killed under its task (OOM killer): the task fails at once (WorkerLostError,
    # retried by the run like a lost worker) instead of being handed out again behind its back
    "task_reject_on_worker_lost": False,
    # the task says which worker runs it: the run watches that worker
    "task_track_started": True,
    # with late acks, a worker then holds only the tasks it runs (none reserved ahead)
    "worker_prefetch_multiplier": 1,
    # Redis hands an unacknowledged task out again after this long; lost workers are detected
    # by the run long before, so this only has to exceed the longest step (a stale copy handed
    # out later finds its run ended and does nothing)
    "broker_transport_options": {"visibility_timeout": 6 * 3600},
}

DELEGATE_MARKER = "celery_queue_wait"
TICK_SECONDS = 1.0


def lost_after_seconds() -> float:
    return config.worker_lost_seconds()


def ping_every_seconds() -> float:
    return config.worker_ping_seconds()


def lost_step_retries() -> int:
    return config.lost_step_retries()


def with_worker_settings(config_source: dict | None) -> dict:
    """The executor's config_source: WORKER_SETTINGS under the user's, the transport options
    merged with dagster-celery's (its publish retries)."""
    from dagster_celery.config import DEFAULT_CONFIG

    own = dict(config_source or {})
    transport = {
        **DEFAULT_CONFIG["broker_transport_options"],
        **WORKER_SETTINGS["broker_transport_options"],
        **(own.pop("broker_transport_options", None) or {}),
    }
    return {**WORKER_SETTINGS, **own, "broker_transport_options": transport}


class RecoveringCeleryExecutor(CeleryExecutor):
    def execute(self, plan_context: Any, execution_plan: Any) -> Iterator[DagsterEvent]:
        return celery_loop_with_lost_workers(plan_context, execution_plan)


@dg.executor(
    name="celery",
    config_schema=CELERY_CONFIG,
    requirements=dg.multiple_process_executor_requirements(),
)
def recovering_celery_executor(init_context):
    """dagster-celery's executor (same configuration), a lost worker's steps retried."""
    from dagster._core.execution.retries import RetryMode

    config = init_context.executor_config
    return RecoveringCeleryExecutor(
        broker=config.get("broker"),
        backend=config.get("backend"),
        config_source=with_worker_settings(config.get("config_source")),
        include=config.get("include"),
        retries=RetryMode.from_config(config["retries"]),
    )


class _Watch:
    """Which worker runs each step, and when each worker last answered."""

    def __init__(self, app: Any, lost_after: float, ping_every: float):
        self.app = app
        self.lost_after = lost_after
        self.ping_every = ping_every
        self.worker_of: dict[str, str] = {}
        self.started_at: dict[str, float] = {}
        self.last_seen: dict[str, float] = {}
        self.last_ping = 0.0
        self.waiting_since: float | None = None
        self.warned = 0.0

    def note(self, step_key: str, result: Any) -> None:
        if step_key in self.worker_of:
            return
        try:
            if result.state != "STARTED":
                return
            info = result.info
        except Exception:  # a backend hiccup: look again next tick
            return
        worker = info.get("hostname") if isinstance(info, dict) else None
        if worker:
            now = time.monotonic()
            self.worker_of[step_key] = worker
            self.started_at[step_key] = now
            self.last_seen.setdefault(worker, now)

    def forget(self, step_key: str) -> None:
        self.worker_of.pop(step_key, None)
        self.started_at.pop(step_key, None)

    def nobody_home(self, waiting: int) -> str | None:
        """A warning, once per `lost_after`, while steps wait and no worker answers at all (the
        steps would wait for ever: every worker gone, or none started)."""
        now = time.monotonic()
        if not waiting:
            self.waiting_since = None
            return None
        if self.waiting_since is None:
            self.waiting_since = now
        if now - self.waiting_since < self.lost_after or now - self.warned < self.lost_after:
            return None
        try:
            replies = self.app.control.ping(timeout=2.0) or []
        except Exception:
            replies = []
        self.warned = time.monotonic()
        if replies:
            return None
        return (
            f"{waiting} step(s) wait for a Celery worker and no worker answers on the broker "
            f"({now - self.waiting_since:.0f} s): start one with `enrich-crawl worker -y "
            "<the executor's YAML>`"
        )

    def lost_steps(self) -> list[tuple[str, str, float]]:
        """(step, worker, seconds silent) for steps whose worker stopped answering."""
        now = time.monotonic()
        if not self.worker_of or now - self.last_ping < self.ping_every:
            return []
        self.last_ping = now
        workers = sorted(set(self.worker_of.values()))
        try:
            replies = self.app.control.ping(destination=workers, timeout=2.0) or []
        except Exception:  # the broker itself is unreachable: judge nobody on that
            return []
        answered = time.monotonic()
        for reply in replies:
            for worker in reply:
                self.last_seen[worker] = answered
        lost = []
        for step_key, worker in self.worker_of.items():
            silent = answered - max(self.last_seen.get(worker, 0.0), self.started_at[step_key])
            if silent > self.lost_after:
                lost.append((step_key, worker, silent))
        return lost


def _lost_step_event(plan_context: Any, active_execution: Any, step_key: str, message: str):
    """STEP_UP_FOR_RETRY while the step has retries (its policy's plus the lost-worker ones),
    else STEP_FAILURE."""
    step = active_execution.get_step_by_key(step_key)
    step_context = plan_context.for_step(step)
    error = SerializableErrorInfo(message=message, stack=[], cls_name="CeleryWorkerLost")
    attempts = active_execution.get_known_state().get_retry_state().get_attempt_count(step_key)
    policy = step_context.op_retry_policy
    allowed = (policy.max_retries if policy else 0) + lost_step_retries()
    if attempts < allowed and not plan_context.executor.retries.disabled:
        return DagsterEvent.step_retry_event(step_context, StepRetryData(error, seconds_to_wait=0))
    return DagsterEvent.step_failure_event(
        step_context, StepFailureData(error=error, user_failure_data=None)
    )


def _lose_step(
    plan_context: Any, active_execution: Any, step_key: str, message: str, worker: str = ""
) -> Iterator[DagsterEvent]:
    step = active_execution.get_step_by_key(step_key)
    yield DagsterEvent.engine_event(
        plan_context.for_step(step),
        message,
        EngineEventData({"worker": worker} if worker else {}, marker_end=DELEGATE_MARKER),
    )
    event = _lost_step_event(plan_context, active_execution, step_key, message)
    yield event
    active_execution.handle_event(event)


def celery_loop_with_lost_workers(plan_context: Any, execution_plan: Any):
    """dagster_celery.core_execution_loop.core_celery_execution_loop (same submission, priorities
    and interruption), plus the watch of the workers running the steps."""
    from celery.exceptions import TaskRevokedError, WorkerLostError
    from dagster._core.errors import DagsterSubprocessError
    from dagster_celery.core_execution_loop import _get_step_priority
    from dagster_celery.make_app import make_app
    from dagster_celery.tags import DAGSTER_CELERY_QUEUE_TAG
    from dagster_shared.serdes import deserialize_value

    if len(execution_plan.step_keys_to_execute) > 0:
        assert execution_plan.artifacts_persisted, (
            "Cannot use in-memory storage with Celery: use a filesystem shared by all workers"
        )
    app = make_app(plan_context.executor.app_args())
    default_priority = app.conf.task_default_priority
    default_queue = app.conf.task_default_queue
    watch = _Watch(app, lost_after_seconds(), ping_every_seconds())
    step_results: dict[str, Any] = {}
    step_errors: dict[str, SerializableErrorInfo] = {}

    with (
        InstanceConcurrencyContext(
            plan_context.instance, plan_context.dagster_run
        ) as concurrency_context,
        execution_plan.start(
            retry_mode=plan_context.executor.retries,
            sort_key_fn=lambda step: -_get_step_priority(plan_context, step, default_priority),
            instance_concurrency_context=concurrency_context,
        ) as active_execution,
    ):
        stopping = False
        while (not active_execution.is_complete and not stopping) or step_results:
            if active_execution.check_for_interrupts():
                yield DagsterEvent.engine_event(
                    plan_context,
                    "Celery executor: received termination signal - revoking active tasks",
                    EngineEventData.interrupted(list(step_results.keys())),
                )
                stopping = True
                active_execution.mark_interrupted()
                for result in step_results.values():
                    result.revoke()
            done = []
            for step_key, result in list(step_results.items()):
                if not result.ready():
                    watch.note(step_key, result)
                    continue
                try:
                    step_events = result.get()
                except TaskRevokedError:
                    step_events = []
                    step = active_execution.get_step_by_key(step_key)
                    yield DagsterEvent.engine_event(
                        plan_context.for_step(step),
                        f'celery task for running step "{step_key}" was revoked.',
                        EngineEventData(marker_end=DELEGATE_MARKER),
                    )
                except WorkerLostError as exc:
                    # the pool process died under the step, its worker lives on: a lost step
                    step_events = []
                    yield from _lose_step(
                        plan_context,
                        active_execution,
                        step_key,
                        f"the process running step {step_key} died under its worker: {exc}",
                    )
                except Exception:
                    step_events = []
                    step_errors[step_key] = serializable_error_info_from_exc_info(sys.exc_info())
                for step_event in step_events:
                    event = deserialize_value(step_event, DagsterEvent)
                    yield event
                    active_execution.handle_event(event)
                done.append(step_key)
            for step_key in done:
                step_results.pop(step_key, None)
                watch.forget(step_key)
                active_execution.verify_complete(plan_context, step_key)

            for step_key, worker, silent in watch.lost_steps():
                result = step_results.pop(step_key)
                watch.forget(step_key)
                result.revoke()  # workers alive now drop it, should it be handed out again
                message = (
                    f"celery worker {worker} lost: no answer for {silent:.0f} s "
                    f"(ENRICH_WORKER_LOST_SECONDS={watch.lost_after:g}) while it ran step "
                    f"{step_key}"
                )
                yield from _lose_step(plan_context, active_execution, step_key, message, worker)

            warning = watch.nobody_home(sum(k not in watch.worker_of for k in step_results))
            if warning:
                plan_context.log.warning(warning)

            yield from active_execution.plan_events_iterator(plan_context)
            if stopping or step_errors:
                if step_results:
                    time.sleep(TICK_SECONDS)
                continue
            for step in active_execution.get_steps_to_execute():
                queue = step.tags.get(DAGSTER_CELERY_QUEUE_TAG, default_queue)
                yield DagsterEvent.engine_event(
                    plan_context.for_step(step),
                    f'Submitting celery task for step "{step.key}" to queue "{queue}".',
                    EngineEventData(marker_start=DELEGATE_MARKER),
                )
                step_results[step.key] = _submit_task(
                    app,
                    plan_context,
                    step,
                    queue,
                    _get_step_priority(plan_context, step, default_priority),
                    active_execution.get_known_state(),
                )
            time.sleep(TICK_SECONDS)

        if step_errors:
            raise DagsterSubprocessError(
                "During celery execution errors occurred in workers:\n"
                + "\n".join(f"[{key}]: {err.to_string()}" for key, err in step_errors.items()),
                subprocess_error_infos=list(step_errors.values()),
            )
