"""The embedded MongoDB-wire server used when ``MONGODB_URI`` is unset.

The server is nx-27017 (MongoDB wire protocol on SQLite). Every process of a run (Dagster step
processes of the multiprocess executor, crawl worker subprocesses) calls
:func:`ensure_embedded_mongo` with the same ``data_dir``; exactly one server is started per
``data_dir`` and the others reuse it. Coordination is an ``fcntl.flock`` on ``embedded.lock`` plus a
state file ``embedded.json`` ({pid, port, started_at, ...}) written atomically.

Layout of ``data_dir``::

    embedded.lock   flock'ed while a process checks, starts or stops the server
    embedded.json   state of the running server
    embedded.log    the server's stdout/stderr (its log lines and any traceback), appended
    embedded.pid    nx-27017's own pid file
    db/             the data: one SQLite file per logical database (nx-27017 --data-dir)

The server runs detached in its own session, so it outlives the step that started it and is not hit
by the signals a run's termination sends to its step processes. It only ever binds loopback.

nx-27017 gaps callers must live with: ``find_one_and_update(upsert=True)`` ignores
``$setOnInsert``; ``{"$exists": True}`` misses fields holding null; ``$lookup``/``$facet`` do not
work; datetimes may come back as ISO strings.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import fcntl
import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "EmbeddedMongoError",
    "embedded_mongo_status",
    "ensure_embedded_mongo",
    "find_nx_27017",
    "stop_embedded_mongo",
]

LOCK_FILE = "embedded.lock"
STATE_FILE = "embedded.json"
LOG_FILE = "embedded.log"
PID_FILE = "embedded.pid"
DB_DIR = "db"

NX_EXECUTABLE = "nx-27017"
# embedded.log is appended to across restarts; rotated once at start beyond this size
LOG_ROTATE_BYTES = 20 * 1024 * 1024
# attempts to start on a fresh free port when the one picked was taken meanwhile
START_ATTEMPTS = 3
# a live server that does not answer a ping at once may be busy (nx-27017 serves requests on one
# event loop, so a large bulk write delays a ping): give it this long before replacing it
BUSY_GRACE_SECONDS = 30.0


class EmbeddedMongoError(RuntimeError):
    """The embedded MongoDB-wire server cannot be found, started, or reached."""


# Popen objects of the servers this process started, so that stop() can reap them (no zombies)
_STARTED: dict[int, subprocess.Popen] = {}


# --------------------------------------------------------------------------------------------
# helpers shared with enrich_crawl.testing.services


def find_nx_27017(
    *, executable: str | None = None, path: str | None = None, names: tuple[str, ...] = ()
) -> str:
    """Path of the nx-27017 executable: next to ``sys.executable`` (same venv) first, then PATH.

    Raises :class:`EmbeddedMongoError` telling how to install it when missing.
    """
    executable = executable or sys.executable
    names = names or (NX_EXECUTABLE, "nx_27017")
    bindir = Path(executable).parent
    for name in names:
        candidate = bindir / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    for name in names:
        found = shutil.which(name, path=path)
        if found:
            return found
    raise EmbeddedMongoError(
        f"the embedded MongoDB-wire server {NX_EXECUTABLE!r} was not found next to {executable} "
        "nor on PATH: install it with `pip install nx-27017` in this environment, "
        "or set MONGODB_URI to use an existing MongoDB"
    )


def pid_alive(pid: int | None) -> bool:
    """True if process ``pid`` exists and is not a zombie."""
    if not pid or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no procfs: trust kill(0)
    # the state follows the parenthesised command name, which may itself contain spaces
    state = stat.rpartition(")")[2].split()[:1]
    return state != ["Z"] and state != ["X"]


def log_tail(path: Path | str, lines: int = 20) -> str:
    """The last ``lines`` lines of a log file ("" when unreadable)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 16384))
            data = fh.read()
    except OSError:
        return ""
    return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])


def mongo_ping(uri: str, timeout: float = 2.0) -> bool:
    """True if the server at ``uri`` answers a ``ping`` within ``timeout`` seconds."""
    import pymongo  # local import: keeps `import enrich_crawl.store.embedded` cheap

    ms = max(1, int(timeout * 1000))
    client = pymongo.MongoClient(
        uri, serverSelectionTimeoutMS=ms, connectTimeoutMS=ms, socketTimeoutMS=ms, connect=False
    )
    try:
        client.admin.command("ping")
        return True
    except Exception:
        return False
    finally:
        client.close()


def check_loopback(host: str) -> None:
    """Refuse anything but a loopback address."""
    if host == "localhost":
        return
    try:
        if ipaddress.ip_address(host).is_loopback:
            return
    except ValueError:
        pass
    raise ValueError(f"refusing to bind {host!r}: only loopback addresses are allowed")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now (the kernel's pick)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def port_open(host: str, port: int, timeout: float = 0.2) -> bool:
    """True if something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def mongo_uri(host: str, port: int) -> str:
    netloc = f"[{host}]" if ":" in host else host
    return f"mongodb://{netloc}:{port}/?directConnection=true"


def terminate_pid(pid: int, *, timeout: float = 10.0, group: bool = False) -> None:
    """SIGTERM ``pid`` (or its process group), then SIGKILL if still alive after ``timeout``."""
    proc = _STARTED.pop(pid, None)

    def send(sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            if group:
                os.killpg(pid, sig)
            else:
                os.kill(pid, sig)

    def gone_within(seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while True:
            if proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=0.05)
                if proc.returncode is not None:
                    return True
            elif not pid_alive(pid):
                return True
            else:
                time.sleep(0.05)
            if time.monotonic() >= deadline:
                return False

    send(signal.SIGTERM)
    if gone_within(timeout):
        return
    send(signal.SIGKILL)
    if not gone_within(5.0):
        raise EmbeddedMongoError(f"process {pid} survived SIGKILL")


# --------------------------------------------------------------------------------------------
# state and lock


@contextlib.contextmanager
def _locked(data_dir: Path, timeout: float) -> Iterator[None]:
    fd = os.open(data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    raise
                if time.monotonic() >= deadline:
                    raise EmbeddedMongoError(
                        f"timed out after {timeout:.0f}s waiting for {data_dir / LOCK_FILE} "
                        "(another process is starting or stopping the embedded MongoDB)"
                    ) from None
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _read_state(data_dir: Path) -> dict[str, Any] | None:
    try:
        state = json.loads((data_dir / STATE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(state, dict) or not isinstance(state.get("pid"), int):
        return None
    if not isinstance(state.get("port"), int):
        return None
    return state


def _write_state(data_dir: Path, state: dict[str, Any]) -> None:
    tmp = data_dir / f".{STATE_FILE}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(state, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, data_dir / STATE_FILE)


def _is_our_server(pid: int, db_dir: Path) -> bool:
    """Whether ``pid`` is an nx-27017 serving ``db_dir`` (guards against recycled pids)."""
    if not pid_alive(pid):
        return False
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return True  # no procfs: cannot tell, the ping decides
    decoded = [a.decode("utf-8", "replace") for a in args]
    return any("nx" in a and "27017" in a for a in decoded) and str(db_dir) in decoded


def _nx_pid_file_pid(data_dir: Path) -> int | None:
    try:
        return int((data_dir / PID_FILE).read_text().strip())
    except (OSError, ValueError):
        return None


# --------------------------------------------------------------------------------------------
# public API


def ensure_embedded_mongo(
    data_dir: Path | str,
    *,
    host: str = "127.0.0.1",
    start_timeout: float = 30.0,
    lock_timeout: float = 120.0,
) -> str:
    """URI of the embedded server for ``data_dir``, starting it if none is running.

    Safe to call concurrently from many processes: one server per ``data_dir``. A running server
    (recorded pid alive and answering ``ping``) is reused; otherwise a new one is started on a free
    loopback port, with its data in ``data_dir/db`` (kept across restarts).
    """
    check_loopback(host)
    data_dir = Path(data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    db_dir = data_dir / DB_DIR
    with _locked(data_dir, lock_timeout):
        state = _read_state(data_dir)
        if state is not None and _is_our_server(state["pid"], db_dir):
            uri = mongo_uri(state.get("host", host), state["port"])
            if mongo_ping(uri, timeout=2.0) or _ping_while_alive(
                uri, state["pid"], BUSY_GRACE_SECONDS
            ):
                return uri
            _note(data_dir, f"server pid {state['pid']} alive but not answering: replacing it")
            terminate_pid(state["pid"], timeout=10.0)
        # a server whose state file was lost still holds the data files: stop it first
        orphan = _nx_pid_file_pid(data_dir)
        if orphan and _is_our_server(orphan, db_dir):
            _note(data_dir, f"stopping server pid {orphan} that has no state file")
            terminate_pid(orphan, timeout=10.0)
        with contextlib.suppress(FileNotFoundError):
            (data_dir / STATE_FILE).unlink()
        return _start(data_dir, host, start_timeout)


def stop_embedded_mongo(data_dir: Path | str, *, timeout: float = 10.0) -> bool:
    """Stop the embedded server of ``data_dir`` (SIGTERM, SIGKILL after ``timeout`` seconds).

    Returns True if a running server was stopped, False if none was running. The data stays.
    """
    data_dir = Path(data_dir).resolve()
    if not data_dir.is_dir():
        return False
    db_dir = data_dir / DB_DIR
    stopped = False
    with _locked(data_dir, timeout + 60.0):
        state = _read_state(data_dir)
        pids = [state["pid"]] if state else []
        pids.append(_nx_pid_file_pid(data_dir))
        for pid in dict.fromkeys(p for p in pids if p):
            if _is_our_server(pid, db_dir):
                terminate_pid(pid, timeout=timeout)
                stopped = True
        for name in (STATE_FILE, PID_FILE):
            with contextlib.suppress(FileNotFoundError):
                (data_dir / name).unlink()
    if stopped:
        _note(data_dir, "stopped")
    return stopped


def embedded_mongo_status(data_dir: Path | str) -> dict[str, Any] | None:
    """The state of the running embedded server of ``data_dir``, or None if none is running.

    The dict holds the state file's keys (pid, port, started_at, host, uri, ...) and
    ``responding``: whether it answered a ping just now.
    """
    data_dir = Path(data_dir).resolve()
    state = _read_state(data_dir)
    if state is None or not _is_our_server(state["pid"], data_dir / DB_DIR):
        return None
    state = dict(state)
    state["uri"] = mongo_uri(state.get("host", "127.0.0.1"), state["port"])
    state["responding"] = mongo_ping(state["uri"], timeout=2.0)
    return state


# --------------------------------------------------------------------------------------------
# internals


def _ping_while_alive(uri: str, pid: int, grace: float) -> bool:
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return False
        if mongo_ping(uri, timeout=2.0):
            return True
        time.sleep(0.2)
    return False


def _note(data_dir: Path, message: str) -> None:
    """A line of ours in embedded.log, so the log tells the server's whole story."""
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    with contextlib.suppress(OSError), open(data_dir / LOG_FILE, "a", encoding="utf-8") as fh:
        fh.write(f"{stamp} - enrich_crawl.store.embedded - [{os.getpid()}] - {message}\n")


def _rotate_log(log_file: Path) -> None:
    with contextlib.suppress(OSError):
        if log_file.stat().st_size > LOG_ROTATE_BYTES:
            os.replace(log_file, log_file.with_name(log_file.name + ".1"))


def _start(data_dir: Path, host: str, timeout: float) -> str:
    executable = find_nx_27017()
    db_dir = data_dir / DB_DIR
    db_dir.mkdir(parents=True, exist_ok=True)
    log_file = data_dir / LOG_FILE
    _rotate_log(log_file)
    # nx-27017 refuses to start while its pid file names a live process, even an unrelated one
    with contextlib.suppress(FileNotFoundError):
        (data_dir / PID_FILE).unlink()
    for attempt in range(1, START_ATTEMPTS + 1):
        port = free_port(host)
        uri = mongo_uri(host, port)
        _note(data_dir, f"starting {executable} on {host}:{port}, data in {db_dir}")
        command = [
            executable,
            "--host",
            host,
            "-p",
            str(port),
            "--data-dir",
            str(db_dir),
            # its log lines also go to stderr, which lands in embedded.log: no second copy
            "--log-file",
            os.devnull,
            "--pid-file",
            str(data_dir / PID_FILE),
        ]
        with open(log_file, "ab") as log:
            proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=data_dir,
                start_new_session=True,
                close_fds=True,
            )
        _STARTED[proc.pid] = proc
        deadline = time.monotonic() + timeout
        while True:
            if port_open(host, port) and mongo_ping(uri, timeout=2.0):
                _write_state(
                    data_dir,
                    {
                        "pid": proc.pid,
                        "port": port,
                        "host": host,
                        "started_at": dt.datetime.now(dt.timezone.utc).isoformat(),
                        "started_by": os.getpid(),
                        "executable": executable,
                        "db_dir": str(db_dir),
                        "log_file": str(log_file),
                    },
                )
                return uri
            if proc.poll() is not None:
                _STARTED.pop(proc.pid, None)
                tail = log_tail(log_file)
                if "address already in use" in tail.lower() and attempt < START_ATTEMPTS:
                    break  # the port was taken since we picked it: try another
                raise EmbeddedMongoError(
                    f"the embedded MongoDB ({executable}) exited with code {proc.returncode} "
                    f"while starting on {host}:{port}; see {log_file}:\n{tail}"
                )
            if time.monotonic() >= deadline:
                terminate_pid(proc.pid, timeout=5.0)
                raise EmbeddedMongoError(
                    f"the embedded MongoDB ({executable}) did not answer a ping on {host}:{port} "
                    f"within {timeout:.0f}s; see {log_file}:\n{log_tail(log_file)}"
                )
            time.sleep(0.05)
    raise AssertionError("unreachable")  # pragma: no cover
