"""Nothing is lost when MongoDB goes away during the merge: a real nx-27017 server is stopped in the
middle of a merge and started again (same port, same data). A short outage is ridden out by the
retries; a long one fails the merge step clearly, and re-running just the merge from the staged
results completes it, every record present once."""

from __future__ import annotations

import subprocess
import sys
import threading

import dagster as dg
import pymongo
import pytest

from enrich_crawl.defs.assets import merge_records
from enrich_crawl.defs.partitions import shards
from enrich_crawl.defs.resources import DatasetResource, MongoResource, StagingResource
from enrich_crawl.staging import DatasetStage, read_jsonl, write_jsonl
from enrich_crawl.store.merge import MergeError, Merger, MergeStats, WriteRetry
from enrich_crawl.testing.services import MissingServiceBinary, ephemeral_mongo
from enrich_crawl_tests.conftest import REPO, product_env
from enrich_crawl_tests.test_merge import FIELDS, line, winner

# five batches: the outage comes after the first, so the merge is cut short with most to write
RECORDS = 1000
BATCH = 200


def resolved(count: int, prefix: str = "R") -> list[dict]:
    return [
        line(f"{prefix}{i:05d}", row=i, found={"city": winner(f"City {i}")}) for i in range(count)
    ]


@pytest.fixture
def outage_mongo(tmp_path):
    """A server of its own, on disk, that the test may stop and start."""
    try:
        with ephemeral_mongo(data_dir=tmp_path / "mongo") as server:
            yield server
    except MissingServiceBinary as exc:
        pytest.skip(str(exc))


def _client(server) -> pymongo.MongoClient:
    return pymongo.MongoClient(
        server.uri, serverSelectionTimeoutMS=500, connectTimeoutMS=500, tz_aware=True
    )


def _stop_after_first_batch(server, then=None):
    def progress(_partition: str, stats: MergeStats) -> None:
        if stats.batches == 1:
            server.stop()
            if then is not None:
                then()

    return progress


def test_outage_during_merge_fails_then_rerun_completes_every_record_once(outage_mongo):
    lines = resolved(RECORDS)
    client = _client(outage_mongo)
    merger = Merger(
        client.db.orgs,
        fields=FIELDS,
        run_id="run-1",
        batch_size=BATCH,
        retry=WriteRetry(attempts=2, initial_delay=0.05, max_delay=0.1),
        progress=_stop_after_first_batch(outage_mongo),
    )
    with pytest.raises(MergeError) as failure:
        merger.merge(lines, partition="s00")
    client.close()
    assert failure.value.kind == "unavailable" and failure.value.partition == "s00"
    assert "unavailable" in str(failure.value) and "written before the failure" in str(
        failure.value
    )

    outage_mongo.start()
    client = _client(outage_mongo)
    collection = client.db.orgs
    written = collection.count_documents({})
    assert BATCH <= written < RECORDS  # the outage really cut the merge short

    stats = Merger(collection, fields=FIELDS, run_id="run-2", batch_size=BATCH).merge(
        lines, partition="s00"
    )
    assert stats.records == RECORDS
    assert stats.inserted == RECORDS - written and stats.unchanged == written
    ids = [doc["_id"] for doc in collection.find({}, {"_id": 1})]
    assert len(ids) == len(set(ids)) == RECORDS
    assert set(ids) == {ln["record"] for ln in lines}
    for doc in collection.find():
        assert doc["data"]["city"] == doc["lineage"]["city"]["value"]
        assert len(doc["history"]["city"]) == 1
    client.close()


def test_short_outage_is_ridden_out_by_the_retries(outage_mongo):
    lines = resolved(RECORDS)
    client = _client(outage_mongo)
    restart = threading.Thread(target=outage_mongo.start)
    stats = Merger(
        client.db.orgs,
        fields=FIELDS,
        run_id="run-1",
        batch_size=BATCH,
        # generous: the server restarts at once, the budget only bounds a broken machine
        retry=WriteRetry(attempts=200, initial_delay=0.05, max_delay=0.5),
        progress=_stop_after_first_batch(outage_mongo, then=restart.start),
    ).merge(lines, partition="s00")
    restart.join()
    assert stats.retries >= 1
    assert stats.written == RECORDS
    collection = client.db.orgs
    assert collection.count_documents({}) == RECORDS
    assert len({doc["_id"] for doc in collection.find({}, {"_id": 1})}) == RECORDS
    client.close()


# -- through Dagster: a clear Failure, then `dagster asset materialize ... --partition` -----------

SPEC = """\
name: outage_orgs
source: orgs.csv
id: org_id
urls: [website]
fields:
  city: {}
  founded: {type: integer}
  last_release: {type: date, refresh: true}
"""
SECRET = "S3cretPw-never-shown"


# the merge's own body, without its op's RetryPolicy (15 s waits) so the failure shows at once
@dg.asset(
    name="enriched_records",
    partitions_def=shards,
    backfill_policy=dg.BackfillPolicy.single_run(),
)
def enriched_records_once(
    context,
    dataset: DatasetResource,
    staging: StagingResource,
    mongo: MongoResource,
) -> dg.MaterializeResult:
    return merge_records(context, dataset, staging, mongo)


def test_merge_step_fails_clearly_and_the_printed_rerun_command_completes_it(
    outage_mongo, tmp_path, dagster_home
):
    spec = tmp_path / "outage.yaml"
    spec.write_text(SPEC, encoding="utf-8")
    (tmp_path / "orgs.csv").write_text("org_id,website,city,founded,last_release\n")
    work = tmp_path / "work"
    stage = DatasetStage(work, "outage_orgs")
    first, second = shards.get_partition_keys()[:2]
    write_jsonl(stage.resolved(first), resolved(400, prefix="A"))
    write_jsonl(stage.resolved(second), resolved(300, prefix="B"))
    staged = stage.resolved(second).read_bytes()

    def resources(uri: str) -> dict:
        return {
            "dataset": DatasetResource(spec=str(spec)),
            "staging": StagingResource(root=str(work)),
            "mongo": MongoResource(
                uri=uri,
                database="outage",
                server_selection_timeout_ms=300,
                connect_timeout_ms=300,
                retry_attempts=1,
                retry_initial_delay=0.05,
            ),
        }

    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [enriched_records_once],
            partition_key=first,
            resources=resources(outage_mongo.uri),
            instance=instance,
        )
        assert result.success

        # MongoDB goes away; credentials in the URI must not leak into the failure or the logs
        outage_mongo.stop()
        uri_with_secret = outage_mongo.uri.replace("mongodb://", f"mongodb://enrich:{SECRET}@")
        result = dg.materialize(
            [enriched_records_once],
            partition_key=second,
            resources=resources(uri_with_secret),
            instance=instance,
            raise_on_error=False,
        )
        assert not result.success
        (failure,) = result.get_step_failure_events()
        user = failure.step_failure_data.user_failure_data
        assert user is not None, failure.step_failure_data.error
        description = user.description
        assert "MongoDB unavailable" in description
        assert "Nothing is lost" in description
        command = f"--select enriched_records --partition {second}"
        assert command in description and user.metadata["rerun"].value.endswith(command)
        logs = "\n".join(str(entry) for entry in instance.all_logs(result.run_id))
        assert SECRET not in logs and SECRET not in description
        assert "mongodb://***@127.0.0.1" in description

    # the staged results are untouched; MongoDB comes back; the command the failure printed
    # re-runs just the merge of that partition, without re-crawling
    assert stage.resolved(second).read_bytes() == staged
    outage_mongo.start()
    rerun = user.metadata["rerun"].value.split()
    assert rerun[:3] == ["dagster", "asset", "materialize"]
    env = product_env(
        MONGODB_URI=outage_mongo.uri,
        MONGODB_DB="outage",
        DAGSTER_HOME=str(dagster_home),
        ENRICH_DATASET=str(spec),
        ENRICH_WORK_DIR=str(work),
    )
    done = subprocess.run(
        [sys.executable, "-m", "dagster", *rerun[1:]],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    client = _client(outage_mongo)
    collection = client.outage.outage_orgs
    ids = [doc["_id"] for doc in collection.find({}, {"_id": 1})]
    expected = {ln["record"] for p in (first, second) for ln in read_jsonl(stage.resolved(p))}
    assert len(ids) == len(set(ids)) == 700 and set(ids) == expected
    client.close()


def test_merge_step_refuses_a_partition_with_nothing_staged(tmp_path, mongo_server):
    spec = tmp_path / "outage.yaml"
    spec.write_text(SPEC, encoding="utf-8")
    (tmp_path / "orgs.csv").write_text("org_id,website,city,founded,last_release\n")
    result = dg.materialize(
        [enriched_records_once],
        partition_key=shards.get_partition_keys()[0],
        resources={
            "dataset": DatasetResource(spec=str(spec)),
            "staging": StagingResource(root=str(tmp_path / "work")),
            "mongo": MongoResource(uri=mongo_server.uri, database="nothing_staged"),
        },
        raise_on_error=False,
    )
    assert not result.success
    (failure,) = result.get_step_failure_events()
    assert (
        "materialise resolved_fields first"
        in failure.step_failure_data.user_failure_data.description
    )
