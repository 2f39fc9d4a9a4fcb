"""The embedded MongoDB of production runs and the ephemeral services of tests and benchmarks."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pymongo
import pytest
from pymongo.errors import PyMongoError

from enrich_crawl.store.embedded import (
    LOG_FILE,
    STATE_FILE,
    EmbeddedMongoError,
    embedded_mongo_status,
    ensure_embedded_mongo,
    find_nx_27017,
    stop_embedded_mongo,
)
from enrich_crawl.testing import services
from enrich_crawl.testing.services import (
    MissingServiceBinary,
    ephemeral_mongo,
    ephemeral_postgres,
    ephemeral_redis,
    free_port,
    pid_alive,
)

REPO = Path(__file__).resolve().parents[1]


def _skip_if_missing(exc: MissingServiceBinary) -> None:
    pytest.skip(str(exc))


def _servers_serving(db_dir: Path) -> list[int]:
    """Pids of live processes whose command line names ``db_dir`` (Linux /proc)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            args = proc.joinpath("cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(db_dir).encode() in args and pid_alive(int(proc.name)):
            pids.append(int(proc.name))
    return pids


def _wait_gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while pid_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _port_accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


@pytest.fixture
def embedded_dir(tmp_path):
    try:
        find_nx_27017()
    except EmbeddedMongoError as exc:
        pytest.skip(str(exc))
    data_dir = tmp_path / "mongo"
    yield data_dir
    stop_embedded_mongo(data_dir)


# --------------------------------------------------------------------------------------------
# embedded MongoDB (production, MONGODB_URI unset)

_CALLER = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from enrich_crawl.store.embedded import embedded_mongo_status, ensure_embedded_mongo
    data_dir, ready, go = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    ready.touch()
    while not go.exists():
        time.sleep(0.002)
    uri = ensure_embedded_mongo(data_dir)
    print(json.dumps({"uri": uri, "pid": embedded_mongo_status(data_dir)["pid"]}))
    """
)


def test_embedded_mongo_starts_once_for_concurrent_processes(embedded_dir, tmp_path):
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    )
    go = tmp_path / "go"
    callers = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                _CALLER,
                str(embedded_dir),
                str(tmp_path / f"ready{i}"),
                str(go),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i in range(4)
    ]
    deadline = time.monotonic() + 20
    while not all((tmp_path / f"ready{i}").exists() for i in range(4)):
        assert time.monotonic() < deadline, "caller processes did not start"
        time.sleep(0.01)
    go.touch()  # all four call ensure_embedded_mongo at the same moment
    results = []
    for caller in callers:
        out, err = caller.communicate(timeout=30)
        assert caller.returncode == 0, err
        results.append(json.loads(out))

    assert len({r["uri"] for r in results}) == 1
    assert len({r["pid"] for r in results}) == 1
    server_pid = results[0]["pid"]
    # the callers have exited: the server outlives them, and it is the only one
    assert pid_alive(server_pid)
    assert _servers_serving(embedded_dir.resolve() / "db") == [server_pid]
    assert (embedded_dir / LOG_FILE).read_text().count("enrich_crawl.store.embedded") == 1

    # reused by a later caller
    assert ensure_embedded_mongo(embedded_dir) == results[0]["uri"]
    status = embedded_mongo_status(embedded_dir)
    assert status["pid"] == server_pid and status["responding"]
    assert {"pid", "port", "started_at"} <= status.keys()
    assert status["host"] == "127.0.0.1"

    assert stop_embedded_mongo(embedded_dir) is True
    assert _wait_gone(server_pid, timeout=1)
    assert embedded_mongo_status(embedded_dir) is None
    assert not (embedded_dir / STATE_FILE).exists()
    assert stop_embedded_mongo(embedded_dir) is False


def test_embedded_mongo_keeps_data_across_restarts(embedded_dir):
    uri = ensure_embedded_mongo(embedded_dir)
    first_pid = embedded_mongo_status(embedded_dir)["pid"]
    with pymongo.MongoClient(uri) as client:
        client.enrich_crawl.demo.insert_one({"_id": "r1", "data": {"summary": "kept"}})
    assert stop_embedded_mongo(embedded_dir)
    assert not pid_alive(first_pid)

    uri = ensure_embedded_mongo(embedded_dir)
    assert embedded_mongo_status(embedded_dir)["pid"] != first_pid
    with pymongo.MongoClient(uri) as client:
        assert client.enrich_crawl.demo.find_one({"_id": "r1"})["data"] == {"summary": "kept"}
    assert (embedded_dir / "db").is_dir()


def test_embedded_mongo_replaces_a_dead_server(embedded_dir):
    ensure_embedded_mongo(embedded_dir)
    crashed = embedded_mongo_status(embedded_dir)["pid"]
    os.kill(crashed, signal.SIGKILL)  # a crash: the state file still names it
    assert _wait_gone(crashed)

    uri = ensure_embedded_mongo(embedded_dir)
    status = embedded_mongo_status(embedded_dir)
    assert status["pid"] != crashed and status["responding"]
    assert status["uri"] == uri


def test_embedded_mongo_ignores_a_stale_state_file(embedded_dir):
    embedded_dir.mkdir(parents=True)
    # a recycled pid: alive, but not an nx-27017 serving this directory
    stale = {"pid": os.getpid(), "port": free_port(), "started_at": "2020-01-01T00:00:00+00:00"}
    (embedded_dir / STATE_FILE).write_text(json.dumps(stale))
    uri = ensure_embedded_mongo(embedded_dir)
    status = embedded_mongo_status(embedded_dir)
    assert status["pid"] != os.getpid() and status["responding"]
    assert pid_alive(os.getpid())
    assert uri.startswith("mongodb://127.0.0.1:")


def test_embedded_mongo_binds_loopback_only(tmp_path):
    with pytest.raises(ValueError, match="loopback"):
        ensure_embedded_mongo(tmp_path, host="0.0.0.0")
    assert not (tmp_path / STATE_FILE).exists()


def test_missing_nx_27017_says_how_to_install_it():
    with pytest.raises(EmbeddedMongoError, match=r"pip install nx-27017.*MONGODB_URI"):
        find_nx_27017(executable="/nonexistent/bin/python", path="")


# --------------------------------------------------------------------------------------------
# ephemeral services


def test_ephemeral_mongo_restarts_on_the_same_port_with_its_data(tmp_path):
    try:
        with ephemeral_mongo(data_dir=tmp_path / "db") as mongo:
            port, first_pid, workdir = mongo.port, mongo.pid, mongo.workdir
            client = pymongo.MongoClient(mongo.uri, serverSelectionTimeoutMS=1000)
            client.db.items.insert_one({"_id": 1})

            mongo.stop()  # an outage mid-merge
            assert not pid_alive(first_pid) and not _port_accepts(port)
            with pytest.raises(PyMongoError):
                client.db.items.insert_one({"_id": 2})

            mongo.start()
            assert mongo.port == port and mongo.pid != first_pid
            # the same client recovers, and the data survived
            client.db.items.insert_one({"_id": 3})
            assert sorted(d["_id"] for d in client.db.items.find()) == [1, 3]
            client.close()
            last_pid = mongo.pid
    except MissingServiceBinary as exc:
        _skip_if_missing(exc)
    assert not pid_alive(last_pid)
    assert not workdir.exists()
    assert (tmp_path / "db").is_dir()  # a caller's data_dir is the caller's


def test_ephemeral_mongo_in_memory():
    try:
        with ephemeral_mongo() as mongo:
            port = mongo.port
            with pymongo.MongoClient(mongo.uri) as client:
                client.db.items.insert_one({"_id": 1})
            mongo.stop()
            mongo.start()
            assert mongo.port == port
            with pymongo.MongoClient(mongo.uri) as client:
                assert client.db.items.count_documents({}) == 0  # memory: a restart forgets
            pid = mongo.pid
    except MissingServiceBinary as exc:
        _skip_if_missing(exc)
    assert not pid_alive(pid)


def _check_postgres(pg) -> None:
    import psycopg2

    assert pg.host == "127.0.0.1"
    assert pg.url == (
        f"postgresql+psycopg2://{pg.user}:{pg.password}@127.0.0.1:{pg.port}/{pg.database}"
    )
    assert pg.env == {
        "DAGSTER_PG_HOST": "127.0.0.1",
        "DAGSTER_PG_PORT": str(pg.port),
        "DAGSTER_PG_USER": pg.user,
        "DAGSTER_PG_PASSWORD": pg.password,
        "DAGSTER_PG_DB": pg.database,
    }
    # TCP logins need the password
    with pytest.raises(psycopg2.OperationalError, match="password"):
        psycopg2.connect(
            host=pg.host, port=pg.port, user=pg.user, password="wrong", dbname=pg.database
        )
    conn = psycopg2.connect(
        host=pg.host, port=pg.port, user=pg.user, password=pg.password, dbname=pg.database
    )
    with conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE runs (id int PRIMARY KEY, name text)")
        cur.execute("INSERT INTO runs VALUES (1, 'before restart')")
    conn.close()

    port, first_pid = pg.port, pg.pid
    pg.stop()
    assert not pid_alive(first_pid) and not _port_accepts(port)
    pg.start()
    assert pg.port == port and pg.pid != first_pid

    with pg.connect() as conn, conn.cursor() as cur:
        cur.execute("SELECT name FROM runs")
        assert cur.fetchall() == [("before restart",)]
    conn.close()


def test_ephemeral_postgres_password_restart_and_data():
    try:
        with ephemeral_postgres() as pg:
            _check_postgres(pg)
            pid, workdir = pg.pid, pg.workdir
            if os.geteuid() == 0:
                assert workdir.stat().st_uid == pg.run_as.pw_uid != 0
    except MissingServiceBinary as exc:
        _skip_if_missing(exc)
    assert not pid_alive(pid)
    assert not workdir.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="the fallback account only matters as root")
def test_ephemeral_postgres_as_root_falls_back_to_nobody(monkeypatch):
    import pwd

    monkeypatch.setattr(services.postgres, "_postgres_os_user", lambda: pwd.getpwnam("nobody"))
    try:
        with ephemeral_postgres(database="enrich test") as pg:
            assert pg.run_as.pw_name == "nobody"
            with pg.connect() as conn, conn.cursor() as cur:
                cur.execute("SELECT current_database()")
                assert cur.fetchone() == ("enrich test",)
            conn.close()
            pid = pg.pid
    except MissingServiceBinary as exc:
        _skip_if_missing(exc)
    assert not pid_alive(pid)


class _Boom(Exception):
    pass


def test_ephemeral_redis_ping_and_cleanup_on_error():
    try:
        with pytest.raises(_Boom), ephemeral_redis() as redis:
            assert redis.url == f"redis://127.0.0.1:{redis.port}/0"
            with socket.create_connection(("127.0.0.1", redis.port), timeout=2) as sock:
                sock.sendall(b"*1\r\n$4\r\nPING\r\n")
                assert sock.recv(16) == b"+PONG\r\n"
            pid, workdir = redis.pid, redis.workdir
            raise _Boom
    except MissingServiceBinary as exc:
        _skip_if_missing(exc)
    assert not pid_alive(pid)
    assert not workdir.exists()


def test_free_port_is_bindable():
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
