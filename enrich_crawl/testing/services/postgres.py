"""An ephemeral PostgreSQL cluster.

PostgreSQL refuses to run as root: as root, initdb and the server run as the ``postgres`` system user
when it exists, else as ``nobody``; the temporary directory is chown'ed to that user.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

from enrich_crawl.store.embedded import (
    log_tail,
    pid_alive,
)
from enrich_crawl.testing.services.common import (
    LOOPBACK,
    MissingServiceBinary,
    ServiceError,
    free_port,
    wait_ready,
)

_PG_TOOLS = ("initdb", "pg_ctl", "postgres")


def find_postgres_bindir() -> Path:
    """Directory of initdb/pg_ctl/postgres: `pg_config --bindir`, /usr/lib/postgresql/*/bin, PATH."""

    def complete(directory: Path) -> bool:
        return all(os.access(directory / tool, os.X_OK) for tool in _PG_TOOLS)

    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, timeout=10, check=True
            ).stdout.strip()
            if out and complete(Path(out)):
                return Path(out)

    def version(path: str) -> tuple[int, ...]:
        return tuple(int(n) for n in re.findall(r"\d+", Path(path).parent.name))

    for directory in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version, reverse=True):
        if complete(Path(directory)):
            return Path(directory)
    initdb = shutil.which("initdb")
    if initdb and complete(Path(initdb).parent):
        return Path(initdb).parent
    raise MissingServiceBinary(
        "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found via `pg_config --bindir`, "
        "/usr/lib/postgresql/*/bin or PATH: install them with `apt-get install postgresql`"
    )


class PgHandle:
    """A PostgreSQL cluster on ``127.0.0.1:port`` with password authentication over TCP."""

    host = LOOPBACK

    def __init__(
        self,
        *,
        port: int,
        workdir: Path,
        bindir: Path,
        user: str,
        password: str,
        database: str,
        run_as: pwd.struct_passwd | None,
    ) -> None:
        self.port = port
        self.workdir = workdir
        self.bindir = bindir
        self.user = user
        self.password = password
        self.database = database
        self.run_as = run_as  # OS account running the server when we are root
        self.data_dir = workdir / "data"
        self.log_file = workdir / "postgres.log"
        self.socket_dir = workdir

    @property
    def url(self) -> str:
        """SQLAlchemy URL."""
        return (
            f"postgresql+psycopg2://{quote(self.user, safe='')}:{quote(self.password, safe='')}"
            f"@{self.host}:{self.port}/{quote(self.database, safe='')}"
        )

    @property
    def env(self) -> dict[str, str]:
        """The DAGSTER_PG_* variables dagster.yaml reads."""
        return {
            "DAGSTER_PG_HOST": self.host,
            "DAGSTER_PG_PORT": str(self.port),
            "DAGSTER_PG_USER": self.user,
            "DAGSTER_PG_PASSWORD": self.password,
            "DAGSTER_PG_DB": self.database,
        }

    def connect(self, database: str | None = None, **kwargs):
        """A psycopg2 connection over TCP with the password."""
        import psycopg2

        return psycopg2.connect(
            host=self.host,
            port=self.port,
            user=self.user,
            password=self.password,
            dbname=database or self.database,
            connect_timeout=kwargs.pop("connect_timeout", 5),
            **kwargs,
        )

    @property
    def pid(self) -> int | None:
        """Pid of the postmaster while it runs."""
        try:
            pid = int((self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None
        return pid if pid_alive(pid) else None

    @property
    def running(self) -> bool:
        return self.pid is not None

    # -- internals

    def _run(self, args: list[str], *, timeout: float) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["LC_ALL"] = "C"
        kwargs: dict = {}
        if self.run_as is not None:
            env["HOME"] = str(self.workdir)
            env["USER"] = env["LOGNAME"] = self.run_as.pw_name
            kwargs = {
                "user": self.run_as.pw_uid,
                "group": self.run_as.pw_gid,
                "extra_groups": [],
            }
        try:
            result = subprocess.run(
                args,
                cwd=self.workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout,
                start_new_session=True,
                **kwargs,
            )
        except subprocess.TimeoutExpired as exc:
            raise ServiceError(
                f"{Path(args[0]).name} timed out after {timeout:.0f}s; log {self.log_file}:\n"
                f"{log_tail(self.log_file)}"
            ) from exc
        if result.returncode != 0:
            raise ServiceError(
                f"{' '.join(args)} failed with code {result.returncode}:\n"
                f"{(result.stdout + result.stderr).strip()[-3000:]}\n"
                f"log {self.log_file}:\n{log_tail(self.log_file)}"
            )
        return result

    def _init(self, *, timeout: float) -> None:
        pwfile = self.workdir / "pwfile"
        pwfile.write_text(self.password + "\n")
        if self.run_as is not None:
            os.chown(pwfile, self.run_as.pw_uid, self.run_as.pw_gid)
        pwfile.chmod(0o600)
        version = self._run([str(self.bindir / "initdb"), "--version"], timeout=30).stdout
        major = int((re.findall(r"\d+", version) or ["0"])[0])
        # scram is the default password encryption from PostgreSQL 14; before, md5
        host_auth = "scram-sha-256" if major >= 14 else "md5"
        try:
            self._run(
                [
                    str(self.bindir / "initdb"),
                    "-D",
                    str(self.data_dir),
                    "--username",
                    self.user,
                    "--pwfile",
                    str(pwfile),
                    "--auth-local",
                    "trust",
                    "--auth-host",
                    host_auth,
                    "--encoding",
                    "UTF8",
                    "--locale",
                    "C",
                    "--no-sync",
                ],
                timeout=timeout,
            )
        finally:
            pwfile.unlink()
        settings = {
            "port": str(self.port),
            "listen_addresses": f"'{self.host}'",
            "unix_socket_directories": f"'{self.socket_dir}'",
            # throwaway cluster: durability across OS crashes is not needed (a clean stop still
            # checkpoints, so stop()/start() keeps every committed row)
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "max_connections": "200",
            "shared_buffers": "32MB",
            "logging_collector": "off",
        }
        with open(self.data_dir / "postgresql.conf", "a", encoding="utf-8") as conf:
            conf.write("\n# enrich_crawl.testing.services\n")
            conf.writelines(f"{key} = {value}\n" for key, value in settings.items())

    def _create_database(self) -> None:
        from psycopg2 import sql

        conn = self.connect(database="postgres")
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (self.database,))
                if cur.fetchone() is None:
                    cur.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.database)))
        finally:
            conn.close()

    def _accepts_password_login(self) -> bool:
        try:
            self.connect(database="postgres", connect_timeout=2).close()
            return True
        except Exception:
            return False

    # -- public

    def start(self, *, timeout: float = 60.0) -> None:
        """Start the server (no-op if running) and wait until it accepts password logins."""
        if self.running:
            return
        self._run(
            [
                str(self.bindir / "pg_ctl"),
                "start",
                "-D",
                str(self.data_dir),
                "-l",
                str(self.log_file),
                "-w",
                "-t",
                str(int(timeout)),
            ],
            timeout=timeout + 10,
        )
        wait_ready(
            f"postgres on port {self.port}",
            self._accepts_password_login,
            timeout=timeout,
            log_file=self.log_file,
            exited=lambda: None if self.running else "(postmaster gone)",
            interval=0.1,
        )

    def stop(self, *, timeout: float = 30.0) -> None:
        """Fast shutdown (checkpoints, keeps the data); immediate, then SIGKILL, if it hangs."""
        pid = self.pid
        if pid is None:
            return
        with contextlib.suppress(ServiceError):
            self._run(
                [
                    str(self.bindir / "pg_ctl"),
                    "stop",
                    "-D",
                    str(self.data_dir),
                    "-m",
                    "fast",
                    "-w",
                    "-t",
                    str(int(timeout)),
                ],
                timeout=timeout + 10,
            )
        for sig, grace in ((signal.SIGQUIT, 10.0), (signal.SIGKILL, 10.0)):
            deadline = time.monotonic() + grace
            if not pid_alive(pid):
                break
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
            while pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
        if pid_alive(pid):
            raise ServiceError(f"postgres (pid {pid}) survived SIGKILL")


def _postgres_os_user() -> pwd.struct_passwd | None:
    """The unprivileged account to run PostgreSQL as, when we are root (it refuses root)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise ServiceError("running as root and neither a 'postgres' nor a 'nobody' user exists")


@contextlib.contextmanager
def ephemeral_postgres(
    *,
    user: str = "dagster",
    database: str = "dagster",
    password: str | None = None,
    timeout: float = 60.0,
) -> Iterator[PgHandle]:
    """A fresh PostgreSQL cluster (``database`` created) for the duration of the block."""
    bindir = find_postgres_bindir()
    run_as = _postgres_os_user()
    parent = Path(tempfile.gettempdir())
    if run_as is not None and not parent.stat().st_mode & 0o001:
        parent = Path("/tmp")  # the server's account must be able to reach its directory
    workdir = Path(tempfile.mkdtemp(prefix="enrich-pg-", dir=parent))
    if run_as is not None:
        os.chown(workdir, run_as.pw_uid, run_as.pw_gid)
    handle = PgHandle(
        port=free_port(),
        workdir=workdir,
        bindir=bindir,
        user=user,
        password=password or secrets.token_urlsafe(16),
        database=database,
        run_as=run_as,
    )
    if len(str(handle.socket_dir)) > 80:  # unix socket paths are limited to ~107 bytes
        handle.socket_dir = Path(tempfile.mkdtemp(prefix="pgs-", dir="/tmp"))
        if run_as is not None:
            os.chown(handle.socket_dir, run_as.pw_uid, run_as.pw_gid)
    try:
        handle._init(timeout=timeout)
        handle.start(timeout=timeout)
        handle._create_database()
        yield handle
    finally:
        try:
            handle.stop()
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
            if handle.socket_dir != workdir:
                shutil.rmtree(handle.socket_dir, ignore_errors=True)
