"""Dagster resources: the dataset, the staging area, the crawler's identity, and MongoDB.

Secrets and endpoints come from the environment through `EnvVar` (read at run time, hidden in the
UI). Optional settings that have a documented default when unset (docs/configuration.md) are read from the
environment at run time by `enrich_crawl.config`, not at import.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import Field

from enrich_crawl import config
from enrich_crawl.dataset.spec import DatasetSpec, load_spec
from enrich_crawl.staging import DatasetStage


class DatasetResource(dg.ConfigurableResource):
    """The dataset spec to enrich (ENRICH_DATASET, else the bundled demo) and the mappings folder."""

    spec: str | None = Field(
        default=None,
        description="Dataset spec YAML; default ENRICH_DATASET or the bundled demo dataset.",
    )
    mappings: str | None = Field(
        default=None, description="Mappings folder; default ENRICH_MAPPINGS or ./mappings."
    )
    watch_dir: str | None = Field(
        default=None,
        description="Folder of dataset specs (*.yaml) watched by the sensor `dataset_specs` and "
        "enriched nightly by `nightly_enrich`, one run per dataset; default ENRICH_DATASETS_DIR "
        "(unset: only the one configured dataset).",
    )

    learn: bool | None = Field(
        default=None,
        description="Learn mappings from the dataset's known values before crawling; default: "
        "the spec's `learn` key (`enrich-crawl run --learn` sets it for one run).",
    )

    def spec_path(self) -> Path:
        return (
            Path(self.spec).expanduser().resolve() if self.spec else config.default_dataset_spec()
        )

    def load(self) -> DatasetSpec:
        spec = load_spec(self.spec_path())
        if self.learn is not None and self.learn != spec.learn:
            import dataclasses

            spec = dataclasses.replace(spec, learn=self.learn)
        return spec

    def mappings_dir(self) -> Path:
        return (
            Path(self.mappings).expanduser().resolve() if self.mappings else config.mappings_dir()
        )

    def watched_dir(self) -> Path | None:
        if self.watch_dir:
            return Path(self.watch_dir).expanduser().resolve()
        return config.datasets_dir()


class StagingResource(dg.ConfigurableResource):
    """Where the stages exchange files (ENRICH_WORK_DIR, default $DAGSTER_HOME/storage/enrich_crawl).
    With several machines it must be a shared volume, like Dagster's own filesystem storage."""

    root: str | None = Field(default=None, description="Staging folder.")

    def root_dir(self) -> Path:
        return Path(self.root).expanduser().resolve() if self.root else config.work_dir()

    def stage(self, dataset: str) -> DatasetStage:
        return DatasetStage(self.root_dir(), dataset)


class CrawlerResource(dg.ConfigurableResource):
    """The crawler's identity and reach (ENRICH_USER_AGENT, ENRICH_ALLOW_PRIVATE, http_proxy)."""

    user_agent: str | None = Field(default=None, description="Default ENRICH_USER_AGENT.")
    allow_private: bool | None = Field(default=None, description="Default ENRICH_ALLOW_PRIVATE.")
    proxy: str | None = Field(default=None, description="Default http_proxy.")
    max_active_records: int = Field(
        default=2000, description="Records in flight per crawl process."
    )
    log_level: str = Field(default="INFO", description="Log level of the crawl processes (Scrapy).")
    time_budget_seconds: float | None = Field(
        default=None,
        description="Stop each partition's crawl cleanly after this many seconds "
        "(what was found is still merged); default: the dataset's crawl.time_budget_seconds.",
    )
    crawl_processes: int | None = Field(
        default=None,
        description="Crawl processes (crawl steps) a run's shards are dealt out into; fewer "
        "than the shards: several shards' crawls share a process (one Scrapy crawler each); "
        "0: one per shard; default ENRICH_CRAWL_PROCESSES (unset: the machine's cores, one per "
        "shard with Celery).",
    )
    run_time_budget_seconds: float | None = Field(
        default=None,
        description="Budget of the whole run's crawl: a shard's crawl gets at most what is left "
        "of it when it starts (counted from the run's start), stops cleanly when it is spent, "
        "and what it found is still merged; default ENRICH_RUN_TIME_BUDGET (unset: none).",
    )

    def processes_for(self, shards: int) -> int:
        """How many crawl processes a run of `shards` shards uses."""
        if self.crawl_processes is None:
            return config.crawl_processes(shards)
        return config.processes_for(self.crawl_processes, shards)

    def run_budget(self) -> float | None:
        """The per-run crawl budget in seconds, or None."""
        if self.run_time_budget_seconds is not None:
            return self.run_time_budget_seconds if self.run_time_budget_seconds > 0 else None
        return config.run_time_budget()

    def environment(self) -> dict[str, Any]:
        return {
            "user_agent": self.user_agent or config.user_agent(),
            "allow_private": config.allow_private()
            if self.allow_private is None
            else self.allow_private,
            "proxy": self.proxy or config.http_proxy(),
            "chromium": config.chromium_path(),
        }


class VirtualWebResource(dg.ConfigurableResource):
    """Serves a dataset's own web (its spec's `virtual_web` folder: the demo, offline tests,
    benchmarks) through enrich_crawl.virtualweb, one server per crawl; the server's request log is
    the evidence the robots check audits."""

    startup_timeout_seconds: float = Field(
        default=20.0, description="How long the server may take to start (s)."
    )

    @contextlib.contextmanager
    def serve(self, root: Path, log_path: Path) -> Iterator[Any]:
        """The running server (its `proxy_url` is the crawl's proxy) until the block ends."""
        from enrich_crawl.virtualweb import running_web

        with running_web(
            root, log_path=log_path, startup_timeout=self.startup_timeout_seconds
        ) as web:
            yield web


class MongoResource(dg.ConfigurableResource):
    """MongoDB where results go (MONGODB_URI; unset: an embedded server, data under the instance's
    home). TLS and auth options are passed to pymongo as given. Credentials (in the URI or in
    `password`) come from the environment through EnvVar; they are never logged or shown: metadata
    shows `display_uri()` and error messages go through `scrub()`."""

    uri: str | None = Field(default=None, description="MongoDB URI (set from MONGODB_URI).")
    database: str | None = Field(
        default=None, description="Database (MONGODB_DB, default enrich_crawl)."
    )
    tls: bool | None = Field(default=None, description="Force TLS on/off.")
    tls_ca_file: str | None = Field(default=None, description="CA bundle for TLS (tlsCAFile).")
    tls_certificate_key_file: str | None = Field(
        default=None, description="Client certificate and key, PEM (tlsCertificateKeyFile)."
    )
    tls_certificate_key_file_password: str | None = Field(
        default=None, description="Password of the client key; use an EnvVar."
    )
    tls_crl_file: str | None = Field(default=None, description="Certificate revocation list.")
    tls_allow_invalid_certificates: bool | None = Field(default=None)
    tls_allow_invalid_hostnames: bool | None = Field(default=None)
    username: str | None = Field(default=None, description="User, when not in the URI.")
    password: str | None = Field(
        default=None, description="Password, when not in the URI; use an EnvVar."
    )
    auth_source: str | None = Field(default=None, description="authSource (e.g. admin).")
    auth_mechanism: str | None = Field(
        default=None, description="authMechanism (SCRAM-SHA-256, MONGODB-X509, MONGODB-AWS, ...)."
    )
    replica_set: str | None = Field(default=None, description="replicaSet name.")
    direct_connection: bool | None = Field(default=None, description="directConnection.")
    # a lost database fails the run within a minute (5 tries x 5 s + 7.5 s of waits), while an
    # outage of a few seconds (a restart, a primary election) is ridden out
    server_selection_timeout_ms: int = Field(
        default=5000, description="How long one attempt waits for a server (ms)."
    )
    connect_timeout_ms: int = Field(default=10000, description="TCP connect timeout (ms).")
    batch_size: int = Field(default=2000, description="Documents per bulk write of the merge.")
    retry_attempts: int = Field(
        default=4, description="Retries of a failed read or bulk write (transient errors only)."
    )
    retry_initial_delay: float = Field(
        default=0.5, description="First wait before a retry (s); doubled each time."
    )
    retry_max_delay: float = Field(default=8.0, description="Longest wait between retries (s).")
    embedded_dir: str | None = Field(
        default=None,
        description="Data folder of the embedded "
        "server (default $DAGSTER_HOME/storage/enrich_crawl/mongo).",
    )

    def effective_uri(self) -> str:
        from enrich_crawl.store.mongo import resolve_uri

        uri = self.uri or config.mongodb_uri()
        embedded = Path(self.embedded_dir) if self.embedded_dir else config.work_dir() / "mongo"
        return resolve_uri(uri, embedded)

    def database_name(self) -> str:
        return self.database or config.mongodb_db()

    def client_options(self) -> dict[str, Any]:
        """pymongo keyword options (only those set: the URI's own options apply otherwise)."""
        given = {
            "tls": self.tls,
            "tlsCAFile": self.tls_ca_file,
            "tlsCertificateKeyFile": self.tls_certificate_key_file,
            "tlsCertificateKeyFilePassword": self.tls_certificate_key_file_password,
            "tlsCRLFile": self.tls_crl_file,
            "tlsAllowInvalidCertificates": self.tls_allow_invalid_certificates,
            "tlsAllowInvalidHostnames": self.tls_allow_invalid_hostnames,
            "username": self.username,
            "password": self.password,
            "authSource": self.auth_source,
            "authMechanism": self.auth_mechanism,
            "replicaSet": self.replica_set,
            "directConnection": self.direct_connection,
        }
        options: dict[str, Any] = {k: v for k, v in given.items() if v not in (None, "")}
        options["serverSelectionTimeoutMS"] = self.server_selection_timeout_ms
        options["connectTimeoutMS"] = self.connect_timeout_ms
        return options

    def client(self):
        from enrich_crawl.store.mongo import connect

        return connect(self.effective_uri(), **self.client_options())

    def display_uri(self) -> str:
        from enrich_crawl.store.mongo import redact_uri

        return redact_uri(self.effective_uri())

    def scrub(self, text: str) -> str:
        """`text` (e.g. an error message) without any credential of this resource."""
        from enrich_crawl.store.mongo import scrub

        uri = self.uri or config.mongodb_uri()
        secrets = (self.password, self.tls_certificate_key_file_password)
        return scrub(text, uri, secrets=secrets)

    def write_retry(self):
        from enrich_crawl.store.merge import WriteRetry

        return WriteRetry(
            attempts=max(0, self.retry_attempts),
            initial_delay=max(0.0, self.retry_initial_delay),
            max_delay=max(0.0, self.retry_max_delay),
        )


class QualityResource(dg.ConfigurableResource):
    """Thresholds of the asset checks (checks.py); run config overrides them per run."""

    min_resolution_rate: float | None = Field(
        default=None,
        description="Lowest acceptable share of the records missing a field that end with a value "
        "for it, per field (0..1); default ENRICH_MIN_RESOLUTION_RATE or 0.5.",
    )
    field_min_resolution_rate: dict[str, float] = Field(
        default_factory=dict, description="Per-field overrides of min_resolution_rate."
    )
    max_rejected_rate: float = Field(
        default=0.2, description="Highest acceptable share of input rows rejected by the seed."
    )

    min_learned_precision: float = Field(
        default=0.95,
        description="Lowest held-out precision of a learned rule (check learned_precision).",
    )
    min_mapping_agreement: float = Field(
        default=0.9,
        description="Lowest share of a mapping's values that equal the known ones, per field "
        "(check mapping_agreement).",
    )
    min_mapping_disagreements: int = Field(
        default=2,
        description="Wrong values a mapping must give on a field before mapping_agreement fails "
        "(one odd known value is not a broken mapping).",
    )
    agreement_sample: int = Field(
        default=5,
        description="Records per mapping and field fetched by the check mapping_agreement "
        "(0: off).",
    )
    agreement_max_records: int = Field(
        default=40, description="Records in all fetched by the check mapping_agreement."
    )
    agreement_time_budget_seconds: float = Field(
        default=600.0, description="Time budget of the check mapping_agreement's crawl."
    )

    def resolution_threshold(self, field: str) -> float:
        if field in self.field_min_resolution_rate:
            return float(self.field_min_resolution_rate[field])
        if self.min_resolution_rate is not None:
            return self.min_resolution_rate
        return config.min_resolution_rate()
