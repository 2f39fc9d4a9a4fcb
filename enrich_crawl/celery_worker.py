"""`enrich-crawl worker`: a Celery worker for enrich_job's steps, as the process that is signalled.

`dagster-celery worker start` runs `celery worker` as its child and waits: SIGTERM to the command
an operator started (or a service manager, or a container runtime) ends only that wrapper, and
the real worker lives on under PID 1 taking tasks. This command prepares the same configuration
(the `execution.config` block of a YAML file: broker, backend, config_source) and then *becomes*
the Celery worker (exec): its pid is the worker's, SIGTERM is Celery's warm shutdown (the step
running finishes, nothing new is taken), SIGQUIT its cold shutdown.

The worker app is `enrich_crawl.defs.celery_app` (dagster-celery's tasks, late acknowledgement,
no tasks reserved ahead, stale tasks of ended runs skipped).
"""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

APP = "enrich_crawl.defs.celery_app"


class WorkerConfigError(Exception):
    """The worker cannot start: its YAML is missing or invalid, or celery is not installed."""


def worker_command(
    config_yaml: Path | None, name: str | None, queues: list[str], loglevel: str, extra: list[str]
) -> tuple[list[str], dict[str, str]]:
    """The celery command line and environment of the worker (the config module written)."""
    from dagster_celery.cli import get_config_dir

    if config_yaml is not None and not config_yaml.is_file():
        raise WorkerConfigError(f"{config_yaml}: no such file (the executor's YAML: broker, ...)")
    env = dict(os.environ)
    try:
        config_dir = get_config_dir(str(config_yaml) if config_yaml else None)
    except Exception as exc:  # dagster's config errors name the keys at fault
        raise WorkerConfigError(f"{config_yaml}: {exc}") from None
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), config_dir) if p)
    command = ["celery", "-A", APP, "worker", "--prefetch-multiplier=1", "--loglevel", loglevel]
    for queue in queues:
        command += ["-Q", queue]
    command += ["-n", name or f"enrich-{socket.gethostname()}-{os.getpid()}"]
    return command + extra, env


def exec_worker(
    config_yaml: Path | None,
    name: str | None,
    queues: list[str],
    loglevel: str = "INFO",
    extra: list[str] | None = None,
) -> None:
    """Replace this process with the Celery worker (never returns)."""
    command, env = worker_command(config_yaml, name, queues, loglevel, list(extra or []))
    executable = shutil.which("celery", path=env.get("PATH"))
    if executable is None:
        raise WorkerConfigError("`celery` not found (pip install -e .[celery])")
    os.execve(executable, command, env)
