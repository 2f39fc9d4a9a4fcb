"""What the ephemeral services share: errors, a free loopback port, waiting until a service\naccepts connections, and a server run in the foreground as our child, in its own session."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from enrich_crawl.store.embedded import free_port as _free_port
from enrich_crawl.store.embedded import (
    log_tail,
)

LOOPBACK = "127.0.0.1"


class ServiceError(RuntimeError):
    """An ephemeral service failed to start or stop."""


class MissingServiceBinary(ServiceError):
    """The executable of a service is not installed."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    return _free_port(LOOPBACK)


def wait_ready(
    what: str, ready, *, timeout: float, log_file: Path, exited=lambda: None, interval=0.05
) -> None:
    """Poll ``ready()`` until true; fail fast if ``exited()`` returns an exit code."""
    deadline = time.monotonic() + timeout
    while True:
        if ready():
            return
        code = exited()
        if code is not None:
            raise ServiceError(
                f"{what} exited with code {code} while starting; log {log_file}:\n"
                f"{log_tail(log_file)}"
            )
        if time.monotonic() >= deadline:
            raise ServiceError(
                f"{what} did not accept connections within {timeout:.0f}s; log {log_file}:\n"
                f"{log_tail(log_file)}"
            )
        time.sleep(interval)


def _stop_process_group(proc: subprocess.Popen, timeout: float) -> None:
    """SIGTERM the process group led by ``proc``, SIGKILL it after ``timeout``; reap ``proc``."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    # stragglers of the group, if any
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


class ChildService:
    """A service run in the foreground as our child, in its own session."""

    name = "service"

    def __init__(self, *, port: int, workdir: Path) -> None:
        self.port = port
        self.workdir = workdir
        self.log_file = workdir / f"{self.name}.log"
        self._proc: subprocess.Popen | None = None

    def _command(self) -> list[str]:
        raise NotImplementedError

    def _ready(self) -> bool:
        raise NotImplementedError

    def _before_start(self) -> None:
        pass

    @property
    def pid(self) -> int | None:
        """Pid of the server process while it runs."""
        return self._proc.pid if self.running and self._proc else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, *, timeout: float = 30.0) -> None:
        """Start the server (no-op if running) and wait until it accepts connections."""
        if self.running:
            return
        self._before_start()
        with open(self.log_file, "ab") as log:
            self._proc = subprocess.Popen(
                self._command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                start_new_session=True,
            )
        proc = self._proc
        try:
            wait_ready(
                f"{self.name} on port {self.port}",
                self._ready,
                timeout=timeout,
                log_file=self.log_file,
                exited=proc.poll,
            )
        except BaseException:
            self.stop()
            raise

    def stop(self, *, timeout: float = 10.0) -> None:
        """Stop the server (SIGTERM, then SIGKILL after ``timeout``); no-op if not running."""
        proc, self._proc = self._proc, None
        if proc is not None:
            _stop_process_group(proc, timeout)


@contextlib.contextmanager
def started(handle: ChildService, *, timeout: float) -> Iterator[ChildService]:
    """The service running for the block; stopped and its working directory removed on exit,
    exceptions included."""
    try:
        handle.start(timeout=timeout)
        yield handle
    finally:
        try:
            handle.stop()
        finally:
            shutil.rmtree(handle.workdir, ignore_errors=True)
