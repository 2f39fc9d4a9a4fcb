"""An ephemeral Redis (no persistence)."""

from __future__ import annotations

import contextlib
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

from enrich_crawl.testing.services.common import (
    LOOPBACK,
    ChildService,
    MissingServiceBinary,
    free_port,
    started,
)


def _redis_ping(port: int) -> bool:
    """PING over RESP on a raw socket (the redis package may not be installed)."""
    try:
        with socket.create_connection((LOOPBACK, port), timeout=1.0) as sock:
            sock.sendall(b"*1\r\n$4\r\nPING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisHandle(ChildService):
    """A redis-server on ``127.0.0.1:port`` without persistence."""

    name = "redis-server"

    def __init__(self, *, port: int, workdir: Path, executable: str) -> None:
        super().__init__(port=port, workdir=workdir)
        self.executable = executable

    @property
    def url(self) -> str:
        return f"redis://{LOOPBACK}:{self.port}/0"

    def ping(self) -> bool:
        return _redis_ping(self.port)

    def _command(self) -> list[str]:
        return [
            self.executable,
            "--port",
            str(self.port),
            "--bind",
            LOOPBACK,
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.workdir),
            "--daemonize",
            "no",
            "--logfile",
            "",
        ]

    def _ready(self) -> bool:
        return _redis_ping(self.port)


@contextlib.contextmanager
def ephemeral_redis(*, timeout: float = 30.0) -> Iterator[RedisHandle]:
    """A redis-server (no persistence) for the duration of the block."""
    executable = shutil.which("redis-server")
    if executable is None:
        raise MissingServiceBinary(
            "redis-server not found on PATH: install it with `apt-get install redis-server`"
        )
    workdir = Path(tempfile.mkdtemp(prefix="enrich-redis-"))
    handle = RedisHandle(port=free_port(), workdir=workdir, executable=executable)
    with started(handle, timeout=timeout):
        yield handle
