"""`dagster job execute -m enrich_crawl.definitions -j enrich_job` on the production instance
configuration (the repository's dagster.yaml: dagster-postgres) against a real PostgreSQL."""

from __future__ import annotations

import shutil
import subprocess
import sys

from enrich_crawl_tests.conftest import REPO, product_env


def test_enrich_job_runs_on_a_postgres_backed_instance(
    postgres_server, mongo_server, mongo_client, mongo_db_name, tmp_path
):
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    env = product_env(
        DAGSTER_HOME=str(home),
        MONGODB_URI=mongo_server.uri,
        MONGODB_DB=mongo_db_name,
        ENRICH_SHARDS="2",
        **postgres_server.env,
    )
    # ENRICH_DATASET unset: enrich_job runs the bundled demo dataset
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "dagster",
            "job",
            "execute",
            "-m",
            "enrich_crawl.definitions",
            "-j",
            "enrich_job",
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]

    with postgres_server.connect() as conn, conn.cursor() as cursor:
        cursor.execute("select pipeline_name, status from runs")
        rows = cursor.fetchall()
        cursor.execute(
            "select count(*) from event_logs where dagster_event_type = 'ASSET_MATERIALIZATION'"
        )
        materializations = cursor.fetchone()[0]
    assert ("enrich_job", "SUCCESS") in rows
    # seed_dataset once, and every partitioned asset once per shard
    assert materializations >= 1 + 3 * 2
    assert mongo_client[mongo_db_name]["demo_orgs"].count_documents({}) == 46
