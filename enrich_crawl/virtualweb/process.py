"""A virtual web in a subprocess (no shared GIL with what is measured; always killed on exit)::

with running_web(root) as web:
    requests.get("http://site.example/", proxies=web.proxies)
    by_host = requests_by_host(web.read_log())
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from enrich_crawl.virtualweb.requestlog import read_log


@dataclass
class WebHandle:
    """A virtual web running in a subprocess (see :func:`running_web`)."""

    port: int
    proxy_url: str
    log_path: Path
    ca_path: Path
    stderr_path: Path
    process: subprocess.Popen

    @property
    def proxies(self) -> dict[str, str]:
        """For ``requests``: ``requests.get(url, proxies=web.proxies, verify=False)``."""
        return {"http": self.proxy_url, "https": self.proxy_url}

    def proxy_env(self) -> dict[str, str]:
        """Environment variables that send a child process's HTTP(S) traffic here."""
        return {
            "http_proxy": self.proxy_url,
            "https_proxy": self.proxy_url,
            "HTTP_PROXY": self.proxy_url,
            "HTTPS_PROXY": self.proxy_url,
        }

    def read_log(self) -> list[dict]:
        return read_log(self.log_path)

    def server_log(self) -> str:
        """What the server wrote on stderr (config warnings, errors)."""
        try:
            return self.stderr_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM the server's process group, SIGKILL it if it lingers. Idempotent."""
        proc = self.process
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout)


def _accepts_connections(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


@contextlib.contextmanager
def running_web(
    root: str | os.PathLike,
    *,
    log_path: str | os.PathLike | None = None,
    seed: int | None = None,
    port: int = 0,
    env: dict[str, str] | None = None,
    startup_timeout: float = 20.0,
    idle_timeout: float | None = None,
) -> Iterator[WebHandle]:
    """Run ``python -m enrich_crawl.virtualweb ROOT`` in its own session until the block ends.

    ``log_path``: request log (default: a temporary file, removed on exit). ``seed``: latency seed
    (default: ``ROOT/_web.json`` ``"seed"``, else 0). ``env``: extra environment for the server.
    ``idle_timeout``: seconds after which the server closes an idle keep-alive connection (default
    120; real servers often close after 5). The server also exits by itself if this process dies.
    """
    tmp = Path(tempfile.mkdtemp(prefix="virtual-web-"))
    log_file = Path(log_path) if log_path is not None else tmp / "requests.jsonl"
    port_file, ca_file, stderr_path = tmp / "port", tmp / "ca.pem", tmp / "server.log"
    cmd = [
        sys.executable,
        "-m",
        "enrich_crawl.virtualweb",
        str(root),
        "--port",
        str(port),
        "--port-file",
        str(port_file),
        "--log",
        str(log_file),
        "--ca-file",
        str(ca_file),
        "--exit-with-parent",
    ]
    if seed is not None:
        cmd += ["--seed", str(seed)]
    if idle_timeout is not None:
        cmd += ["--idle-timeout", str(idle_timeout)]
    child_env = dict(os.environ)
    child_env.update(env or {})
    package_parent = str(Path(__file__).resolve().parents[2])
    child_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (package_parent, child_env.get("PYTHONPATH", "")) if p
    )
    proc = None
    try:
        with open(stderr_path, "wb") as err:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                env=child_env,
                start_new_session=True,
            )
        deadline = time.monotonic() + startup_timeout
        bound = 0
        while True:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"virtual web exited with {proc.returncode}: "
                    f"{stderr_path.read_text(errors='replace')[-2000:]}"
                )
            if not bound and port_file.exists():
                with contextlib.suppress(ValueError):
                    bound = int(port_file.read_text().strip())
            if bound and _accepts_connections(bound):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"virtual web did not start within {startup_timeout} s")
            time.sleep(0.02)
        handle = WebHandle(
            port=bound,
            proxy_url=f"http://127.0.0.1:{bound}",
            log_path=log_file,
            ca_path=ca_file,
            stderr_path=stderr_path,
            process=proc,
        )
        yield handle
    finally:
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        shutil.rmtree(tmp, ignore_errors=True)
