"""An ephemeral MongoDB-wire server (nx-27017)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from enrich_crawl.store.embedded import (
    EmbeddedMongoError,
    find_nx_27017,
    mongo_ping,
    mongo_uri,
    port_open,
)
from enrich_crawl.testing.services.common import (
    LOOPBACK,
    ChildService,
    MissingServiceBinary,
    free_port,
    started,
)


class MongoHandle(ChildService):
    """An nx-27017 server on ``127.0.0.1:port``; data in memory or in ``data_dir``."""

    name = "nx-27017"

    def __init__(self, *, port: int, workdir: Path, data_dir: Path | None, executable: str) -> None:
        super().__init__(port=port, workdir=workdir)
        self.data_dir = data_dir
        self.executable = executable

    @property
    def uri(self) -> str:
        return mongo_uri(LOOPBACK, self.port)

    def _command(self) -> list[str]:
        return [
            self.executable,
            "--host",
            LOOPBACK,
            "-p",
            str(self.port),
            "--data-dir",
            str(self.data_dir) if self.data_dir else "memory",
            "--log-file",
            os.devnull,  # its log lines also go to stderr, i.e. self.log_file
            "--pid-file",
            str(self.workdir / "nx-27017.pid"),
        ]

    def _before_start(self) -> None:
        # nx-27017 refuses to start while its pid file names a live process
        with contextlib.suppress(FileNotFoundError):
            (self.workdir / "nx-27017.pid").unlink()

    def _ready(self) -> bool:
        return port_open(LOOPBACK, self.port) and mongo_ping(self.uri, timeout=2.0)


@contextlib.contextmanager
def ephemeral_mongo(
    *, data_dir: Path | str | None = None, timeout: float = 30.0
) -> Iterator[MongoHandle]:
    """An nx-27017 server for the duration of the block.

    Data lives in memory (lost on ``stop()``) unless ``data_dir`` is given; that directory is kept.
    """
    try:
        executable = find_nx_27017()
    except EmbeddedMongoError as exc:
        raise MissingServiceBinary(str(exc)) from None
    workdir = Path(tempfile.mkdtemp(prefix="enrich-mongo-"))
    if data_dir is not None:
        data_dir = Path(data_dir).resolve()
        data_dir.mkdir(parents=True, exist_ok=True)
    handle = MongoHandle(
        port=free_port(), workdir=workdir, data_dir=data_dir, executable=executable
    )
    with started(handle, timeout=timeout):
        yield handle
