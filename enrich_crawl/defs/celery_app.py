"""The Celery app of enrich_crawl's workers (`enrich-crawl worker`, or `celery -A
enrich_crawl.defs.celery_app worker`): dagster-celery's app and tasks, plus

- the settings that make a lost worker a retried step (celery_recovery.WORKER_SETTINGS; the
  worker's `config_source` overrides them),
- GuardedTask: a step task whose run has ended (a task handed out again long after its worker
  was lost) does nothing, instead of running a step of a finished run against shared files.
"""

from __future__ import annotations

import logging
from typing import Any

import celery
from dagster_celery.make_app import make_app
from dagster_celery.tasks import create_execute_job_task, create_resume_job_task, create_task

from enrich_crawl.defs.celery_recovery import WORKER_SETTINGS

log = logging.getLogger("enrich_crawl.celery")


def run_is_over(execute_step_args_packed: dict) -> str | None:
    """Why the run of this step task has ended (so the task must not run), else None."""
    import dagster as dg
    from dagster._grpc.types import ExecuteStepArgs
    from dagster._serdes import unpack_value

    args = unpack_value(execute_step_args_packed, as_type=ExecuteStepArgs)
    with dg.DagsterInstance.from_ref(args.instance_ref) as instance:
        run = instance.get_run_by_id(args.run_id)
    if run is None:
        return f"run {args.run_id} does not exist"
    if run.is_finished or run.status == dg.DagsterRunStatus.CANCELING:
        return f"run {args.run_id} has ended ({run.status.value})"
    return None


class GuardedTask(celery.Task):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        packed = kwargs.get("execute_step_args_packed")
        if packed is not None:
            reason = run_is_over(packed)
            if reason:
                log.warning("task %s not run: %s", self.request.id, reason)
                return []
        return super().__call__(*args, **kwargs)


def _apply_worker_settings(app: celery.Celery) -> None:
    """WORKER_SETTINGS, except those the worker's own config (the `config_source` of its YAML,
    which dagster-celery writes into the module `dagster_celery_config`) sets."""
    try:
        import dagster_celery_config as own  # written by `enrich-crawl worker`
    except ImportError:
        own = None
    for key, value in WORKER_SETTINGS.items():
        if own is not None and hasattr(own, key):
            continue
        if isinstance(value, dict):
            value = {**(app.conf.get(key) or {}), **value}
        app.conf[key] = value


app = make_app()
_apply_worker_settings(app)

execute_plan = create_task(app, base=GuardedTask)
execute_job = create_execute_job_task(app)
resume_job = create_resume_job_task(app)
