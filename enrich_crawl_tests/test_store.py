"""MongoResource and the store helpers: TLS/auth options reach pymongo, credentials never show."""

from __future__ import annotations

import pytest

from enrich_crawl.defs.resources import MongoResource
from enrich_crawl.store.merge import rerun_command
from enrich_crawl.store.mongo import redact_uri, scrub


@pytest.mark.parametrize(
    ("uri", "secrets", "shown"),
    [
        ("mongodb://user:pw@db.example:27017/", ["pw", "user:"], "mongodb://***@db.example:27017/"),
        # an unescaped '@' in the password: everything up to the last '@' is userinfo
        ("mongodb://u:p@ss@db.example/x", ["p@ss", "ss@"], "mongodb://***@db.example/x"),
        (
            "mongodb+srv://u:pw@cluster.example/?tls=true&tlsCertificateKeyFilePassword=kp9&w=1",
            ["pw@", "kp9"],
            "mongodb+srv://***@cluster.example/?tls=true&tlsCertificateKeyFilePassword=***&w=1",
        ),
        (
            "mongodb://h/?authMechanism=MONGODB-AWS&authMechanismProperties=AWS_SESSION_TOKEN:t0k",
            ["t0k"],
            "mongodb://h/?authMechanism=MONGODB-AWS&authMechanismProperties=***",
        ),
        ("mongodb://db.example:27017/", [], "mongodb://db.example:27017/"),
    ],
)
def test_redact_uri(uri, secrets, shown):
    assert redact_uri(uri) == shown
    for secret in secrets:
        assert secret not in redact_uri(uri)


def test_scrub_removes_credentials_from_any_text():
    uri = "mongodb://enrich:p%40ss%2Fw0rd@db.example/"
    text = (
        f"failed on {uri}: auth for enrich:p@ss/w0rd refused; key password k3y-pass; "
        "also mongodb://other:x@y/"
    )
    clean = scrub(text, uri, secrets=["k3y-pass"])
    for secret in ("p%40ss%2Fw0rd", "p@ss/w0rd", "k3y-pass", "other:x"):
        assert secret not in clean
    assert "db.example" in clean


def test_tls_and_auth_options_reach_pymongo(mongo_server):
    resource = MongoResource(
        uri=mongo_server.uri,
        tls=True,
        tls_allow_invalid_certificates=True,
        tls_allow_invalid_hostnames=True,
        username="enrich",
        password="pw-from-env",
        auth_source="admin",
        auth_mechanism="SCRAM-SHA-256",
        server_selection_timeout_ms=1234,
    )
    options = resource.client_options()
    assert options["tls"] is True and options["tlsAllowInvalidCertificates"] is True
    assert options["authSource"] == "admin" and options["serverSelectionTimeoutMS"] == 1234
    client = resource.client()  # pymongo validates the options here; nothing connects yet
    try:
        # pymongo keeps these on its pool options (no public accessor)
        assert client.options.pool_options._ssl_context is not None
        credentials = client.options.pool_options._credentials
        assert (credentials.username, credentials.source, credentials.mechanism) == (
            "enrich",
            "admin",
            "SCRAM-SHA-256",
        )
        assert client.options.server_selection_timeout == 1.234
    finally:
        client.close()
    # options left unset are not passed: the URI's own options apply
    assert set(MongoResource(uri=mongo_server.uri).client_options()) == {
        "serverSelectionTimeoutMS",
        "connectTimeoutMS",
    }


def test_credentials_never_in_what_the_resource_shows(monkeypatch):
    resource = MongoResource(
        uri="mongodb://enrich:S3cret@db.example:27017/?tlsCertificateKeyFilePassword=kp",
        password="pw-opt",
    )
    shown = resource.display_uri()
    assert "S3cret" not in shown and "=kp" not in shown
    assert "db.example:27017" in shown
    assert "S3cret" not in resource.scrub("error talking to enrich:S3cret@db.example")
    assert "pw-opt" not in resource.scrub("password pw-opt rejected")
    # from the environment (what definitions.py passes as EnvVar) the same holds
    monkeypatch.setenv("MONGODB_URI", "mongodb://u:EnvS3cret@db.example/")
    from_env = MongoResource()
    assert "EnvS3cret" not in from_env.display_uri()
    assert "EnvS3cret" not in from_env.scrub("mongodb://u:EnvS3cret@db.example/ refused")


def test_rerun_command_names_just_the_merge():
    assert rerun_command(["s03"]) == (
        "dagster asset materialize -m enrich_crawl.definitions --select enriched_records "
        "--partition s03"
    )
    assert rerun_command(["s03", "s04", "s05"]).endswith("--partition-range s03...s05")
