"""Run a crawl worker process through Dagster Pipes, and never leave it (or its browser) behind.

Like `PipesSubprocessClient`, but the worker runs in its own process session, and when the run is
terminated (interrupt, or SIGTERM to the step process) the whole process tree gets SIGINT (Scrapy's
clean shutdown), then SIGKILL after a bound: no orphaned crawler or Chromium survives a terminated
run. Should the step process itself die abruptly, the kernel kills its crawl process
(PR_SET_PDEATHSIG on Linux), whose browser goes with it (Playwright closes it when its driver's
pipe closes).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from typing import Any

import dagster as dg
from dagster._core.pipes.utils import (
    PipesTempFileContextInjector,
    PipesTempFileMessageReader,
    open_pipes_session,
)
from pydantic import Field

from enrich_crawl.crawl.params import WorkerParams


def _tree(pid: int) -> list[Any]:
    import psutil

    try:
        parent = psutil.Process(pid)
        return [parent, *parent.children(recursive=True)]
    except psutil.Error:
        return []


@contextlib.contextmanager
def _interrupts_deferred():
    """SIGINT and SIGTERM are only recorded while the crawl tree is being stopped: one Ctrl-C
    reaches a step twice (from the terminal, then from the run's termination handling), and a
    second interrupt must not cut the cleanup short and leave processes behind."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def record(signum, frame):
        pass

    previous = {sig: signal.signal(sig, record) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def terminate_tree(process: subprocess.Popen, timeout: float) -> None:
    """SIGINT to the worker's process group, wait up to `timeout`, then SIGKILL everything left.

    The worker runs in its own session (process group = its pid): SIGINT starts Scrapy's clean
    shutdown (statistics written, browser closed). Its descendants (Chromium and its helpers) are
    collected while it shuts down, since those that outlive it are re-parented and could no longer
    be found from it; whatever is still alive at the end is killed, in or out of the group.
    """
    import psutil

    with _interrupts_deferred():
        members = {p.pid: p for p in _tree(process.pid)}
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGINT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and process.poll() is None:
            members.update((p.pid, p) for p in _tree(process.pid))
            time.sleep(0.1)
        members.update((p.pid, p) for p in _tree(process.pid))
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        for member in members.values():
            with contextlib.suppress(psutil.Error):
                member.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=5)
        psutil.wait_procs(list(members.values()), timeout=5)


class CrawlTerminated(BaseException):
    """The step process was asked to terminate (SIGTERM) while its crawl was running."""


@contextlib.contextmanager
def _terminate_raises():
    """While the crawl runs, SIGTERM to the step process (a run worker or Celery worker being shut
    down) stops the crawl tree like an interrupt does, instead of killing the step at once and
    leaving the crawl behind."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise CrawlTerminated()

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _parent_death_signal():
    """A function for the crawl process to call between fork and exec: if the step process that
    launched it dies without stopping it (SIGKILL, a crash), the kernel kills it too (Linux
    PR_SET_PDEATHSIG). libc is looked up here, in the parent: a child forked from a threaded
    process must not load libraries."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def preexec() -> None:
        prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1

    return preexec


class CrawlProcessClient(dg.ConfigurableResource):
    """Launches `python -m enrich_crawl.crawl.worker` for one shard and streams its progress."""

    termination_timeout_seconds: float = Field(
        default=20.0, description="Grace period after SIGINT before the crawl tree is killed."
    )

    def run_crawl(
        self,
        *,
        context: dg.OpExecutionContext,
        params: WorkerParams,
        env: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        command = [sys.executable, "-m", "enrich_crawl.crawl.worker"]
        with (
            open_pipes_session(
                context=context,
                context_injector=PipesTempFileContextInjector(),
                message_reader=PipesTempFileMessageReader(),
                extras={"params": params.to_dict()},
            ) as session,
            _terminate_raises(),
        ):
            process = subprocess.Popen(
                command,
                env={**os.environ, **(env or {}), **session.get_bootstrap_env_vars()},
                start_new_session=True,
                preexec_fn=_parent_death_signal(),
            )
            try:
                context.log.info(f"crawl of shard {params.partition} started (pid {process.pid})")
                returncode = process.wait()
            except BaseException:
                # first stop the tree (logging may fail in a run that is going away)
                terminate_tree(process, self.termination_timeout_seconds)
                with contextlib.suppress(BaseException):
                    context.log.warning(
                        f"run interrupted: stopped the crawl of shard {params.partition} "
                        f"(pid {process.pid}) and its children"
                    )
                raise
        if returncode != 0:
            raise dg.Failure(
                description=f"crawl process of shard {params.partition} exited with code "
                f"{returncode}",
                metadata={"shard": params.partition, "exit_code": returncode},
            )
        finals = [
            m
            for m in session.get_custom_messages()
            if isinstance(m, dict) and m.get("kind") == "final"
        ]
        if not finals:
            raise dg.Failure(description=f"crawl of shard {params.partition} reported no result")
        return finals[-1]["stats"]
