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
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

import dagster as dg
from dagster_pipes import PipesDefaultMessageWriter
from pydantic import Field

from enrich_crawl.crawl.params import WorkerParams

logger = logging.getLogger(__name__)


def _tree(pid: int) -> list[Any]:
    import psutil

    try:
        parent = psutil.Process(pid)
        return [parent, *parent.children(recursive=True)]
    except psutil.Error:
        return []


def terminate_tree(process: subprocess.Popen, timeout: float) -> None:
    """SIGINT to the worker's process group, wait up to `timeout`, then SIGKILL everything left.

    The worker runs in its own session (process group = its pid): SIGINT starts Scrapy's clean
    shutdown (statistics written, browser closed). Its descendants (Chromium and its helpers) are
    collected while it shuts down, since those that outlive it are re-parented and could no longer
    be found from it; whatever is still alive at the end is killed, in or out of the group.
    """
    import psutil

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


# the message file is read again after POLL_MIN seconds, then less and less often while it stays
# quiet, up to POLL_MAX: a crawl reports every few seconds
POLL_MIN = 0.01
POLL_MAX = 0.5
# once the crawl is over, the step waits for the reader to hand over the messages it still holds
# for as long as it gets through them, and gives up when none was handled for READER_GRACE
# seconds: a handler stuck on the run's storage (a run being torn down by Ctrl-C or SIGTERM) must
# not keep the step, and with it `dagster job execute`, from ending
READER_GRACE = 30.0


class PatientFileMessageReader(dg.PipesMessageReader):
    """Reads the worker's Pipes messages from a temporary file, like Dagster's
    PipesTempFileMessageReader, without its busy wait: Dagster's tails the file every 10 ms for as
    long as the crawl runs (100 wake-ups a second per crawl step, about 1 % of a core each). This
    reader backs off to POLL_MAX while the file stays quiet, wakes at once when the session closes
    (then reads what is left), and keeps a line the worker has not finished writing for the next
    read. Built on the public reader interface only (read_messages, no_messages_debug_text)."""

    def __init__(self, path: str | None = None, grace: float = READER_GRACE) -> None:
        self._path = path  # None: a temporary file per session
        self._grace = grace

    @contextlib.contextmanager
    def read_messages(self, handler: dg.PipesMessageHandler) -> Iterator[dict[str, Any]]:
        with contextlib.ExitStack() as stack:
            path = self._path or os.path.join(
                stack.enter_context(tempfile.TemporaryDirectory()), "messages"
            )
            open(path, "w", encoding="utf-8").close()
            closed = threading.Event()
            handled = [time.monotonic()]  # when the reader last handled a message
            thread = threading.Thread(
                target=self._read,
                args=(path, handler, closed, handled),
                name="pipes-reader",
                daemon=True,
            )
            thread.start()
            try:
                # what the worker's default message writer (dagster_pipes) reads: append to a file
                yield {
                    PipesDefaultMessageWriter.FILE_PATH_KEY: path,
                    PipesDefaultMessageWriter.INCLUDE_STDIO_IN_MESSAGES_KEY: False,
                }
            finally:
                closed.set()
                handled[0] = time.monotonic()
                while thread.is_alive():
                    thread.join(min(1.0, self._grace))
                    if thread.is_alive() and time.monotonic() - handled[0] > self._grace:
                        logger.warning(
                            "the crawl's Pipes reader handled no message for %.0f s after the "
                            "crawl ended (%s): the step goes on without the rest",
                            self._grace,
                            path,
                        )
                        break

    def no_messages_debug_text(self) -> str:
        return "Attempted to read messages from a temporary file written by the crawl worker."

    def _read(
        self,
        path: str,
        handler: dg.PipesMessageHandler,
        closed: threading.Event,
        handled: list[float],
    ) -> None:
        try:
            for line in self.lines(path, closed):
                handler.handle_message(json.loads(line))
                handled[0] = time.monotonic()
        except BaseException:
            handler.report_pipes_framework_exception(
                f"{self.__class__.__name__} reader thread", sys.exc_info()
            )
            raise

    @staticmethod
    def lines(path: str, closed: threading.Event) -> Iterator[str]:
        """The file's complete lines as they are written, until `closed` is set and every line
        written by then was read."""
        pause = POLL_MIN
        partial = ""
        with open(path, encoding="utf-8") as stream:
            while True:
                line = stream.readline()
                if line:
                    if not line.endswith("\n"):
                        partial += line
                        continue
                    yield partial + line
                    partial, pause = "", POLL_MIN
                    continue
                if closed.is_set():
                    if partial.strip():
                        yield partial
                    return
                closed.wait(pause)
                pause = min(pause * 2, POLL_MAX)


class CrawlTerminated(BaseException):
    """The step process was asked to terminate (SIGTERM) while its crawl was running."""


class _StopSignals:
    """While a crawl runs, the first SIGINT or SIGTERM to the step process stops it waiting for
    the crawl, which it then stops (`terminate_tree`); every later one is only recorded.

    One Ctrl-C reaches a step twice: from the terminal, then from the run's termination handling
    (Dagster interrupts its steps). A second interrupt raised while the step stops its crawl tree
    would cut that short and let the kernel kill the crawl (PR_SET_PDEATHSIG) before it writes its
    statistics. The handler is in place before the first signal comes and turns itself off as it
    raises, so there is no window between the two. SIGINT raises what the step's own handler
    raises (Dagster's interrupt error); SIGTERM (a run worker or Celery worker being shut down)
    raises CrawlTerminated instead of killing the step at once and leaving the crawl behind.
    """

    def __init__(self) -> None:
        self.stopping = False
        self.received: list[int] = []
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _StopSignals:
        import threading

        if threading.current_thread() is threading.main_thread():
            self._previous = {
                sig: signal.signal(sig, self._handle) for sig in (signal.SIGINT, signal.SIGTERM)
            }
        return self

    def __exit__(self, *exc_info: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: Any) -> None:
        self.received.append(signum)
        if self.stopping:
            return
        self.stopping = True
        previous = self._previous.get(signum)
        if signum == signal.SIGINT and callable(previous):
            previous(signum, frame)  # Dagster's: raises its interrupt error
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise CrawlTerminated()


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


class Superseded(Exception):
    """The crawl's attempt no longer owns its shard (see CrawlProcessClient.run_crawl)."""


class StaleCrawl(dg.Failure):
    """A crawl attempt that must not touch its shard's files (staging.claim_shard): it fails
    without retries and without writing anything, not even its failure."""


def _wait(process: subprocess.Popen, still_wanted: Any, check_every: float) -> int:
    if still_wanted is None:
        return process.wait()
    while True:
        try:
            return process.wait(timeout=check_every)
        except subprocess.TimeoutExpired:
            reason = still_wanted()
            if reason:
                raise Superseded(reason) from None


class CrawlProcessClient(dg.ConfigurableResource):
    """Launches `python -m enrich_crawl.crawl.worker` for one shard, or for several shards
    crawled at once in that one process, and streams its progress."""

    termination_timeout_seconds: float = Field(
        default=20.0, description="Grace period after SIGINT before the crawl tree is killed."
    )

    def run_crawl(
        self,
        *,
        context: dg.OpExecutionContext,
        params: WorkerParams,
        env: dict[str, str] | None = None,
        still_wanted: Any = None,
        check_every: float = 10.0,
    ) -> dict[str, Any]:
        """The crawl's final statistics. `still_wanted()`, asked every `check_every` seconds
        while the crawl runs, may say why it must stop (its attempt was superseded: a retry
        elsewhere owns the shard's files now); the crawl tree is then stopped and the step
        fails without retries."""
        (result,) = self.run_crawls(
            context=context,
            shards=[params],
            env=env,
            still_wanted=still_wanted,
            check_every=check_every,
        ).values()
        if isinstance(result, str):
            raise dg.Failure(description=result, metadata={"shard": params.partition})
        return result

    def run_crawls(
        self,
        *,
        context: dg.OpExecutionContext,
        shards: list[WorkerParams],
        env: dict[str, str] | None = None,
        still_wanted: Any = None,
        check_every: float = 10.0,
    ) -> dict[str, dict[str, Any] | str]:
        """The shards' crawls in one process: per shard (in the order given), its final
        statistics, or why it has none (a str). The process failing as a whole (killed,
        crashed before any crawl ended) fails the step; `still_wanted()` as in `run_crawl`."""
        names = ", ".join(p.partition for p in shards)
        what = f"shard {names}" if len(shards) == 1 else f"shards {names}"
        command = [sys.executable, "-m", "enrich_crawl.crawl.worker"]
        extras: dict[str, Any] = (
            {"params": shards[0].to_dict()}
            if len(shards) == 1
            else {"shards": [p.to_dict() for p in shards]}
        )
        with (
            dg.open_pipes_session(
                context=context,
                context_injector=dg.PipesTempFileContextInjector(),
                message_reader=PatientFileMessageReader(),
                extras=extras,
            ) as session,
            _StopSignals() as signals,
        ):
            process = subprocess.Popen(
                command,
                env={**os.environ, **(env or {}), **session.get_bootstrap_env_vars()},
                start_new_session=True,
                preexec_fn=_parent_death_signal(),
            )
            try:
                context.log.info(f"crawl of {what} started (pid {process.pid})")
                returncode = _wait(process, still_wanted, check_every)
            except Superseded as exc:
                signals.stopping = True
                terminate_tree(process, self.termination_timeout_seconds)
                raise StaleCrawl(
                    description=f"crawl of {what} stopped: {exc}",
                    allow_retries=False,
                ) from None
            except BaseException:
                signals.stopping = True  # whatever stopped the wait: later signals are recorded
                # first stop the tree (logging may fail in a run that is going away)
                terminate_tree(process, self.termination_timeout_seconds)
                with contextlib.suppress(BaseException):
                    context.log.warning(
                        f"run interrupted: stopped the crawl of {what} "
                        f"(pid {process.pid}) and its children"
                    )
                raise
        messages = [m for m in session.get_custom_messages() if isinstance(m, dict)]
        finals = {
            m["stats"].get("partition"): m["stats"]
            for m in messages
            if m.get("kind") == "final" and isinstance(m.get("stats"), dict)
        }
        failed = {
            m.get("partition"): str(m.get("error")) for m in messages if m.get("kind") == "failed"
        }
        if returncode != 0 and not finals and not failed:
            raise dg.Failure(
                description=f"crawl process of {what} exited with code {returncode}",
                metadata={"shard": names, "exit_code": returncode},
            )
        results: dict[str, dict[str, Any] | str] = {}
        for params in shards:
            key = params.partition
            if key in finals:
                results[key] = finals[key]
            elif key in failed:
                results[key] = f"crawl of shard {key} failed: {failed[key]}"
            elif returncode != 0:
                results[key] = f"crawl process of shard {key} exited with code {returncode}"
            else:
                results[key] = f"crawl of shard {key} reported no result"
        return results
