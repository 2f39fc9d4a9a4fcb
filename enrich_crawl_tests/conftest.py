"""Shared fixtures: real services on free ports (MongoDB-wire server, PostgreSQL, Redis), a local
Dagster instance per test, and helpers to run the product's commands as a user would.

With ENRICH_REQUIRE_SERVICES=1 (set by .ci/run) a missing service binary fails the test instead of
skipping it: CI must prove everything, not skip it.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pymongo
import pytest

from enrich_crawl.testing.services import (
    MissingServiceBinary,
    ephemeral_mongo,
    ephemeral_postgres,
    ephemeral_redis,
)

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"

LOCAL_INSTANCE = """\
telemetry:
  enabled: false
python_logs:
  python_log_level: INFO
"""


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    """Each phase's report on the test item (`item.rep_setup`, `rep_call`, `rep_teardown`), so that
    a fixture can tell in its teardown whether its test failed (the UI tests keep a screenshot)."""
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


def _missing(exc: MissingServiceBinary) -> None:
    if os.environ.get("ENRICH_REQUIRE_SERVICES") == "1":
        pytest.fail(f"required service missing: {exc}")
    pytest.skip(str(exc))


@pytest.fixture(scope="session")
def mongo_server() -> Iterator:
    """One nx-27017 server for the session (in memory); tests use their own databases."""
    try:
        with ephemeral_mongo() as handle:
            yield handle
    except MissingServiceBinary as exc:
        _missing(exc)


@pytest.fixture
def mongo_db_name() -> str:
    return f"t_{uuid.uuid4().hex[:12]}"


@pytest.fixture
def mongo_client(mongo_server) -> Iterator[pymongo.MongoClient]:
    client = pymongo.MongoClient(mongo_server.uri, serverSelectionTimeoutMS=5000)
    yield client
    client.close()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator:
    try:
        with ephemeral_postgres() as handle:
            yield handle
    except MissingServiceBinary as exc:
        _missing(exc)


@pytest.fixture(scope="session")
def redis_server() -> Iterator:
    try:
        with ephemeral_redis() as handle:
            yield handle
    except MissingServiceBinary as exc:
        _missing(exc)


@pytest.fixture
def dagster_home(tmp_path: Path) -> Path:
    """A fresh local (SQLite) Dagster instance."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text(LOCAL_INSTANCE, encoding="utf-8")
    return home


def product_env(**overrides: str) -> dict[str, str]:
    """The environment a user would run the product with; proxies of the host machine removed."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k.lower() not in ("http_proxy", "https_proxy", "no_proxy", "all_proxy")
    }
    for key in (
        "MONGODB_URI",
        "MONGODB_DB",
        "ENRICH_DATASET",
        "ENRICH_MAPPINGS",
        "DAGSTER_HOME",
        "ENRICH_WORK_DIR",
        "ENRICH_SHARDS",
        "ENRICH_CRAWL_PROCESSES",
        "ENRICH_EXECUTOR",
    ):
        env.pop(key, None)
    env.update(overrides)
    return env


def run_cli(
    args: list[str], env: dict[str, str], cwd: Path, timeout: float = 600
) -> subprocess.CompletedProcess:
    """Run `enrich-crawl ARGS` as a separate process, as a user would."""
    return subprocess.run(
        [sys.executable, "-m", "enrich_crawl.cli", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


class LoggedRun(subprocess.Popen):
    """A command whose output goes to files, not pipes: a test that waits for something while the
    command runs reads nothing meanwhile, and a full pipe (64 KB) would block the command's
    logging, and with it its crawls' Pipes messages. `communicate()` waits, then returns what the
    command wrote, as a pipe would."""

    def __init__(self, args: list[str], *, merge_stderr: bool, text: bool, **kwargs: Any):
        import tempfile

        self._out = tempfile.TemporaryFile()  # noqa: SIM115 (closed by communicate/__del__)
        self._err = None if merge_stderr else tempfile.TemporaryFile()  # noqa: SIM115
        self._as_text = text
        super().__init__(
            args,
            stdout=self._out,
            stderr=subprocess.STDOUT if merge_stderr else self._err,
            **kwargs,
        )

    def _read(self, handle: Any) -> Any:
        if handle is None:
            return None
        handle.seek(0)
        data = handle.read()
        return data.decode("utf-8", "replace") if self._as_text else data

    def communicate(self, input: Any = None, timeout: float | None = None) -> tuple[Any, Any]:
        try:
            self.wait(timeout)
        except subprocess.TimeoutExpired as exc:
            out = self._read(self._out)
            raise _TimedOut(exc.cmd, exc.timeout, out) from None
        return self._read(self._out), self._read(self._err)


class _TimedOut(subprocess.TimeoutExpired):
    """A LoggedRun that did not end in time; the failure shows the end of what it wrote."""

    def __str__(self) -> str:
        out = self.output
        tail = out.decode("utf-8", "replace") if isinstance(out, bytes) else (out or "")
        return f"{super().__str__()}; its output ends with:\n{tail[-4000:]}"


def start_cli_run(
    built: Any, env: dict[str, str], *flags: str, merge_stderr: bool = True, text: bool = True
) -> LoggedRun:
    """Start `enrich-crawl run [FLAGS] --dataset SPEC --mappings DIR` of a built virtual-web
    dataset in the background, in its own session (a test can kill its whole tree), as a user
    would."""
    return LoggedRun(
        [
            sys.executable,
            "-m",
            "enrich_crawl.cli",
            "run",
            *flags,
            "--dataset",
            str(built.spec),
            "--mappings",
            str(built.mappings),
        ],
        env=env,
        cwd=REPO,
        merge_stderr=merge_stderr,
        text=text,
        start_new_session=True,
    )


def wait_for_dagster_dev(process: subprocess.Popen, url: str, log: Path, timeout: float = 180) -> None:
    """Wait until `dagster dev` (started by a test, output in `log`) answers on `url`; fail with
    the end of its log if it dies or does not come up within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        assert process.poll() is None, log.read_text()[-3000:]
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(f"{url}/server_info", timeout=2) as response,
        ):
            if response.status == 200:
                return
        assert time.monotonic() < deadline, "dagster dev did not come up"
        time.sleep(0.25)


def load_json(path: Path):
    return json.loads(path.read_text(encoding="utf-8"))
