"""Credentials and exposure: a whole `enrich-crawl run` with a MongoDB password in MONGODB_URI and
a PostgreSQL (Dagster instance) password in DAGSTER_PG_PASSWORD, after which every log, every
file the run wrote, the instance's event log / run records / metadata, the results database and
the command lines of the machine's processes are searched for both passwords: none may appear.
What the crawl and the UI listen on is loopback only, by default.

Covered elsewhere: the TLS and authentication options reaching pymongo's MongoClient, and the
redaction helpers (test_store.py); the MongoDB outage message without credentials
(test_merge_outage.py).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid

import psutil
import pymongo
import pytest

from enrich_crawl.testing.politeweb import build_polite_dataset
from enrich_crawl.testing.services import free_port
from enrich_crawl_tests.conftest import REPO, product_env, start_cli_run, wait_for_dagster_dev

pytestmark = pytest.mark.slow


def _loopback(address: str) -> bool:
    return ipaddress.ip_address(address.split("%", 1)[0]).is_loopback


def _tree(root: psutil.Process) -> list[psutil.Process]:
    with contextlib.suppress(psutil.Error):
        return [root, *root.children(recursive=True)]
    return []


def _listening(processes: list[psutil.Process]) -> dict[str, str]:
    """{"address:port": command} of the TCP sockets these processes listen on."""
    found = {}
    for process in processes:
        with contextlib.suppress(psutil.Error):
            for conn in process.net_connections(kind="inet"):
                if conn.status == psutil.CONN_LISTEN:
                    found[f"{conn.laddr.ip}:{conn.laddr.port}"] = " ".join(process.cmdline()[:4])
    return found


def _command_lines() -> list[str]:
    lines = []
    for process in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            lines.append(" ".join(process.info["cmdline"] or []))
    return lines


def _postgres_dump(pg) -> dict[str, str]:
    """Every row of every table of the instance's database, as text, by table."""
    dump = {}
    with pg.connect() as conn, conn.cursor() as cursor:
        cursor.execute("select tablename from pg_tables where schemaname = 'public'")
        for (table,) in cursor.fetchall():
            cursor.execute(f'select t::text from "{table}" t')
            dump[table] = "\n".join(row[0] for row in cursor.fetchall())
    return dump


def _leaks(secret: str, sources: dict[str, str | bytes]) -> list[str]:
    found = []
    for where, text in sources.items():
        needle = secret.encode() if isinstance(text, bytes) else secret
        if needle in text:
            found.append(where)
    return found


def test_passwords_never_reach_logs_metadata_files_or_command_lines(
    tmp_path, postgres_server, mongo_server
):
    name = f"sec_{uuid.uuid4().hex[:6]}"
    built = build_polite_dataset(
        tmp_path / "polite", shards=2, records_per_host=3, crawl_delay=0.2, name=name
    )
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")  # PostgreSQL storage, password auth
    work = tmp_path / "work"
    mongo_secret = f"M0ngoPw-{uuid.uuid4().hex}"
    # nx-27017 accepts any PLAIN login: the password travels exactly as with a real server
    uri = mongo_server.uri.replace("mongodb://", f"mongodb://enrich:{mongo_secret}@")
    uri += "&authMechanism=PLAIN&authSource=admin"
    db = f"sec_{uuid.uuid4().hex[:8]}"
    env = product_env(
        MONGODB_URI=uri,
        MONGODB_DB=db,
        DAGSTER_HOME=str(home),
        ENRICH_WORK_DIR=str(work),
        ENRICH_SHARDS="2",
        **postgres_server.env,
    )
    secrets = {"MongoDB": mongo_secret, "PostgreSQL": postgres_server.password}
    # -v: Dagster's and the crawl's own logs too
    cli = start_cli_run(built, env, "-v", merge_stderr=False, text=False)
    command_lines: set[str] = set()
    listening: dict[str, str] = {}
    root = psutil.Process(cli.pid)
    try:
        # while it runs: what every process of the machine shows in `ps`, what the run listens on
        out_chunks: list[bytes] = []
        deadline = time.monotonic() + 400
        while cli.poll() is None and time.monotonic() < deadline:
            command_lines.update(_command_lines())
            listening.update(_listening(_tree(root)))
            time.sleep(0.5)
        out, err = cli.communicate(timeout=60)
        out_chunks += [out, err]
    finally:
        if cli.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                cli.send_signal(signal.SIGKILL)
            cli.wait(timeout=30)
    output = b"\n".join(out_chunks)
    assert cli.returncode == 0, output[-4000:].decode(errors="replace")

    # the run really used both credentials: its results are in MongoDB, its events in PostgreSQL
    client = pymongo.MongoClient(uri, serverSelectionTimeoutMS=5000)
    try:
        assert client[db][name].count_documents({}) == built.records
        results = {
            f"mongo {db}.{coll}": json.dumps(list(client[db][coll].find()), default=str)
            for coll in client[db].list_collection_names()
        }
    finally:
        client.close()
    dump = _postgres_dump(postgres_server)
    assert name in dump["run_tags"] and "enrich_job" in dump["runs"]
    assert "STEP_SUCCESS" in dump["event_logs"]
    # what is shown instead of the URI: its redacted form
    assert b"mongodb://***@127.0.0.1" in output

    sources: dict[str, str | bytes] = {"enrich-crawl run output": output, **results}
    sources.update({f"postgres table {table}": text for table, text in dump.items()})
    for folder in (home, work, tmp_path / "polite"):
        for path in folder.rglob("*"):
            if path.is_file():
                sources[str(path)] = path.read_bytes()
    sources["command lines of every process"] = "\n".join(sorted(command_lines))
    assert len(sources) > 20 and any("compute_logs" in s or "storage" in s for s in sources)
    for service, secret in secrets.items():
        leaks = _leaks(secret, sources)
        assert not leaks, f"the {service} password appears in: {leaks}"

    # every socket the run listened on (the crawls' virtual webs, ...) is on loopback
    assert listening, "the run listened on nothing: the sampling saw no process"
    exposed = {
        addr: cmd for addr, cmd in listening.items() if not _loopback(addr.rsplit(":", 1)[0])
    }
    assert not exposed, exposed


def test_secrets_come_from_the_environment_only():
    """The definitions keep MONGODB_URI as an EnvVar (shown by name in the UI, read at run time),
    and the production instance reads every PostgreSQL setting from the environment."""
    probe = (
        "import dagster as dg\n"
        "from enrich_crawl import definitions\n"
        "mongo = definitions.defs.resources['mongo']\n"
        "print(isinstance(mongo.__dict__['uri'], dg.EnvVar), repr(mongo.__dict__))\n"
    )
    env = product_env(MONGODB_URI="mongodb://enrich:EnvOnly-S3cret@db.example:27017/")
    result = subprocess.run(
        [sys.executable, "-c", probe],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("True "), result.stdout
    assert "EnvOnly-S3cret" not in result.stdout + result.stderr
    # the instance file names no PostgreSQL setting at all: the storage class reads every one of
    # them from the environment when the instance starts
    text = (REPO / "dagster.yaml").read_text("utf-8")
    config_lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    for key in ("hostname", "username", "password", "db_name", "postgres_url"):
        assert not any(f"{key}:" in line for line in config_lines), key
    probe = (
        "from enrich_crawl import config\n"
        "print(sorted((config.postgres_settings() or {}).items()))\n"
    )
    pg = {
        "DAGSTER_PG_HOST": "pg.example",
        "DAGSTER_PG_PORT": "6543",
        "DAGSTER_PG_USER": "enrich",
        "DAGSTER_PG_PASSWORD": "Pg-S3cret",
        "DAGSTER_PG_DB": "dagster",
    }
    result = subprocess.run(
        [sys.executable, "-c", probe],
        env=product_env(**pg),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == repr(sorted(pg.items())), result.stdout


def test_the_ui_listens_on_loopback_by_default(tmp_path, mongo_server):
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n", encoding="utf-8")
    port = free_port()
    env = product_env(DAGSTER_HOME=str(home), MONGODB_URI=mongo_server.uri)
    log = open(tmp_path / "dagster-dev.log", "wb")  # noqa: SIM115 - closed below
    # `dagster dev` as the README says to start it: no host given
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dagster",
            "dev",
            "-w",
            str(REPO / "workspace.yaml"),
            "-p",
            str(port),
        ],
        env=env,
        cwd=tmp_path,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_for_dagster_dev(process, f"http://127.0.0.1:{port}", tmp_path / "dagster-dev.log")
        listening = _listening(_tree(psutil.Process(process.pid)))
        assert any(addr.endswith(f":{port}") for addr in listening), listening
        exposed = {a: c for a, c in listening.items() if not _loopback(a.rsplit(":", 1)[0])}
        assert not exposed, exposed
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
        log.close()
