"""The asset checks pass on sound data and fail on bad data: a request against robots.txt, a shard
without results, MongoDB documents missing or extra, a value without lineage, a low resolution
rate, a seed that rejects too much. The data is real (the seed of a generated dataset, documents in
a MongoDB-wire server); only the crawl's outcome is written by hand, to be exactly as bad as
needed."""

from __future__ import annotations

import datetime as dt
import json

import dagster as dg
import pytest

from enrich_crawl.defs.assets import ASSETS
from enrich_crawl.defs.checks import ALL_CHECK_SPECS, CHECKS
from enrich_crawl.defs.pipes import CrawlProcessClient
from enrich_crawl.defs.resources import (
    CrawlerResource,
    DatasetResource,
    MongoResource,
    QualityResource,
    StagingResource,
    VirtualWebResource,
)
from enrich_crawl.quality import (
    audit_fetched_pages,
    audit_request_log,
    document_coverage,
    lineage_problems,
    resolution_rates,
)
from enrich_crawl.staging import DatasetStage
from enrich_crawl.testing.politeweb import build_polite_dataset

UA = "enrich_crawl/0.1 (+https://example.org/bot)"

# -- the measures --------------------------------------------------------------------------------


def _web(tmp_path):
    root = tmp_path / "web"
    (root / "a.test").mkdir(parents=True)
    (root / "a.test" / "robots.txt").write_text("User-agent: *\nDisallow: /private/\n")
    (root / "b.test").mkdir()
    return root


def test_request_log_audit_finds_disallowed_and_premature_requests(tmp_path):
    root = _web(tmp_path)
    clean = [
        {"t": 1.0, "dur": 0.1, "host": "a.test", "path": "/robots.txt", "status": 200},
        {"t": 2.0, "host": "a.test", "path": "/page.html", "status": 200},
        {"t": 2.5, "host": "b.test", "path": "/robots.txt", "status": 404},
        {"t": 3.0, "host": "b.test", "path": "/private/ok-here", "status": 200},
        {"t": 3.5, "host": "unknown.test", "path": "/anything", "status": 502},
        {"t": 4.0, "method": "CONNECT", "host": "a.test", "path": "a.test:443"},
    ]
    assert audit_request_log(clean, root, UA) == []
    bad = [
        *clean,
        {"t": 5.0, "host": "a.test", "path": "/private/x?y=1", "status": 200},
        {"t": 0.5, "host": "b.test", "path": "/early", "status": 200},
    ]
    found = {(v["url"], v["reason"]) for v in audit_request_log(bad, root, UA)}
    assert found == {
        ("http://a.test/private/x?y=1", "disallowed"),
        ("http://b.test/early", "before_robots"),
    }
    # robots.txt unreachable (status 0) or 5xx: everything else is disallowed for now
    down = [
        {"t": 1.0, "host": "a.test", "path": "/robots.txt", "status": 503},
        {"t": 2.0, "host": "a.test", "path": "/page.html", "status": 200},
    ]
    assert [v["reason"] for v in audit_request_log(down, root, UA)] == ["disallowed"]


def test_crawled_pages_audit_uses_the_stored_robots_verdicts():
    robots = [
        {
            "_id": "http://a.test",
            "status": "ok",
            "text": "User-agent: *\nDisallow: /private/\n",
            "http_status": 200,
            "fetched_at": 10.0,
        }
    ]
    pages = [
        {"_id": "http://a.test/ok", "url": "http://a.test/ok", "status": 200, "fetched_at": 100},
        {"url": "http://a.test/private/1", "status": 200, "fetched_at": 101.0},
        {"url": "http://a.test/private/old", "status": 200, "fetched_at": 5.0},
        {"url": "http://a.test/private/refused", "status": None, "fetched_at": 102.0},
        {
            "url": "http://a.test/private/iso",
            "status": 200,
            "fetched_at": dt.datetime.fromtimestamp(103, dt.timezone.utc).isoformat(),
        },
    ]
    found = [v["url"] for v in audit_fetched_pages(pages, robots, UA, since=50.0)]
    assert found == ["http://a.test/private/1", "http://a.test/private/iso"]


def test_resolution_rates_lineage_and_coverage_measures():
    docs = [
        {"_id": "r1", "data": {"city": "Lyon"}, "original": {"city": None}, "lineage": {}},
        {"_id": "r2", "data": {"city": None}, "lineage": {}},
        {
            "_id": "r3",
            "data": {"city": "Porto"},
            "lineage": {
                "city": {
                    "value": "Porto",
                    "source_url": "http://x.test/",
                    "mapping": "m",
                    "run_id": "r",
                    "partition": "s00",
                }
            },
        },
        {"_id": "r4", "data": {"city": "Cork"}, "lineage": {"city": {"value": "Cork"}}},
        {"_id": "r5", "data": {"city": "Given"}, "original": {"city": " Given "}, "lineage": {}},
    ]
    rates = resolution_rates(docs, ["city"])["city"]
    assert rates["needed"] == 3 and rates["resolved"] == 2
    problems = {(p["record"], p["problem"]) for p in lineage_problems(docs, ["city"])}
    assert problems == {("r1", "no_lineage"), ("r4", "incomplete_lineage")}
    # with the seed's inputs: r5's value was in the table (no lineage needed), r1's was not
    inputs = {"r1": {"city": None}, "r5": {"city": "Given"}}
    problems = {(p["record"], p["problem"]) for p in lineage_problems(docs, ["city"], inputs)}
    assert problems == {("r1", "no_lineage"), ("r4", "incomplete_lineage")}
    coverage = document_coverage({"a", "b"}, {"a", "z"}, {"a", "b", "c"})
    assert coverage["missing"] == ["b"] and coverage["extra"] == ["z"]


# -- the checks, run by Dagster on a seeded dataset ---------------------------------------------


@pytest.fixture
def seeded(tmp_path, mongo_server, mongo_db_name):
    """A generated dataset seeded for real; resources pointing at it."""
    built = build_polite_dataset(tmp_path / "polite", shards=2, records_per_host=3, name="chk")
    resources = {
        "dataset": DatasetResource(spec=str(built.spec), mappings=str(built.mappings)),
        "staging": StagingResource(root=str(tmp_path / "work")),
        "mongo": MongoResource(uri=mongo_server.uri, database=mongo_db_name),
        "crawler": CrawlerResource(user_agent=UA),
        "quality": QualityResource(min_resolution_rate=0.5, max_rejected_rate=0.2),
        "crawl_process": CrawlProcessClient(),
        "virtual_web": VirtualWebResource(),
    }
    with dg.instance_for_test() as instance:
        seeded = dg.materialize(
            ASSETS[:1], instance=instance, resources=resources, selection=["seed_dataset"]
        )
        assert seeded.success
        stage = DatasetStage(tmp_path / "work", "chk")
        manifest = json.loads(stage.seed_manifest.read_text())
        yield built, resources, instance, stage, manifest


def _good_state(built, stage, manifest, mongo_client, db):
    """What a sound crawl and merge leave: stats per shard, a clean request log, one document per
    record with its value and lineage."""
    for key in manifest["shards"]:
        crawl = stage.crawl_dir(key)
        crawl.mkdir(parents=True, exist_ok=True)
        (crawl / "stats.json").write_text(json.dumps({"partition": key, "pages": 3}))
        host = next(iter(built.hosts_by_shard.values()))[0]
        log = [
            {"t": 1.0, "dur": 0.1, "host": host, "path": "/robots.txt", "status": 200},
            {"t": 2.0, "host": host, "path": "/rec-0.html", "status": 200},
        ]
        (crawl / "web-requests.jsonl").write_text("\n".join(json.dumps(r) for r in log) + "\n")
    docs = []
    for rid, city in built.expected.items():
        lineage = {
            "value": city,
            "previous": None,
            "source_url": f"http://x.test/{rid}",
            "mapping": "polite_city",
            "run_id": "r",
            "partition": "s00",
        }
        docs.append(
            {
                "_id": rid,
                "data": {"id": rid, "city": city},
                "original": {"city": None},
                "lineage": {"city": lineage},
                "status": "resolved",
                "missing": [],
                "errors": [],
            }
        )
    collection = mongo_client[db]["chk"]
    collection.delete_many({})
    collection.insert_many(docs)
    return collection


# the checks of the stages this module feeds (the learning checks have their own tests)
LEARNING_CHECKS = {"learned_precision", "mapping_agreement"}


def _run_checks(resources, instance):
    keys = [spec.key for spec in ALL_CHECK_SPECS if spec.name not in LEARNING_CHECKS]
    result = dg.materialize(
        [*ASSETS, *CHECKS],
        selection=dg.AssetSelection.checks(*keys),
        resources=resources,
        instance=instance,
        raise_on_error=False,
    )
    evaluations = {
        e.event_specific_data.check_name: e.event_specific_data
        for e in result.all_events
        if e.event_type_value == "ASSET_CHECK_EVALUATION"
    }
    return result, evaluations


def test_checks_pass_on_sound_data(seeded, mongo_client, mongo_db_name):
    built, resources, instance, stage, manifest = seeded
    _good_state(built, stage, manifest, mongo_client, mongo_db_name)
    result, evaluations = _run_checks(resources, instance)
    assert {name: e.passed for name, e in evaluations.items()} == {
        "seed_profile": True,
        "seed_data_quality": True,
        "every_shard_crawled": True,
        "no_robots_violations": True,
        "resolution_rate": True,
        "documents_match_records": True,
        "values_have_lineage": True,
    }
    assert result.success


def test_checks_fail_on_bad_data(seeded, mongo_client, mongo_db_name):
    built, resources, instance, stage, manifest = seeded
    collection = _good_state(built, stage, manifest, mongo_client, mongo_db_name)
    keys = sorted(manifest["shards"])
    # a request against robots.txt in the server's log
    log = stage.crawl_dir(keys[0]) / "web-requests.jsonl"
    host = next(iter(built.hosts_by_shard.values()))[0]
    with open(log, "a", encoding="utf-8") as handle:
        handle.write(json.dumps({"t": 3.0, "host": host, "path": "/private/a", "status": 404}))
        handle.write("\n")
    # a shard without results
    (stage.crawl_dir(keys[-1]) / "stats.json").unlink()
    # a record missing, a document that is no record, a value without lineage, and most cities
    # unresolved
    ids = sorted(built.expected)
    collection.delete_one({"_id": ids[0]})
    collection.insert_one({"_id": "not-a-record", "data": {}, "lineage": {}})
    collection.update_one({"_id": ids[1]}, {"$set": {"lineage": {}}})
    for rid in ids[2:]:
        collection.update_one({"_id": rid}, {"$set": {"data.city": None, "lineage": {}}})

    result, evaluations = _run_checks(resources, instance)
    failed = {name for name, e in evaluations.items() if not e.passed}
    assert failed == {
        "every_shard_crawled",
        "no_robots_violations",
        "resolution_rate",
        "documents_match_records",
        "values_have_lineage",
    }
    robots = evaluations["no_robots_violations"].metadata
    assert robots["violations"].value == 1
    coverage = evaluations["documents_match_records"].metadata
    assert coverage["missing"].value == 1 and coverage["extra"].value == 1
    lineage = evaluations["values_have_lineage"].metadata
    assert lineage["problems/no_lineage"].value == 1
    assert evaluations["resolution_rate"].severity == dg.AssetCheckSeverity.WARN
    # a shard without results fails the run, not only the check: every_shard_crawled is blocking
    assert evaluations["every_shard_crawled"].blocking
    assert evaluations["every_shard_crawled"].severity == dg.AssetCheckSeverity.ERROR
    assert "s0" in evaluations["every_shard_crawled"].description
    assert not result.success
    failure = next(e for e in result.all_events if e.is_step_failure)
    assert failure.step_failure_data.error.cls_name == "DagsterAssetCheckFailedError"


def test_seed_profile_fails_when_the_seed_rejects_too_much(tmp_path, mongo_server, mongo_db_name):
    built = build_polite_dataset(tmp_path / "polite", shards=2, records_per_host=2, name="rej")
    with open(built.root / "rej.csv", "a", encoding="utf-8") as table:
        for _ in range(6):  # rows without an id are rejected
            table.write(",http://site-0000.test/rec-0.html,\n")
    resources = {
        "dataset": DatasetResource(spec=str(built.spec), mappings=str(built.mappings)),
        "staging": StagingResource(root=str(tmp_path / "work")),
        "mongo": MongoResource(uri=mongo_server.uri, database=mongo_db_name),
        "crawler": CrawlerResource(user_agent=UA),
        "quality": QualityResource(max_rejected_rate=0.2),
        "crawl_process": CrawlProcessClient(),
        "virtual_web": VirtualWebResource(),
    }
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [*ASSETS, *CHECKS],
            selection=dg.AssetSelection.assets("seed_dataset"),  # its checks come with it
            resources=resources,
            instance=instance,
        )
        (evaluation,) = [
            e.event_specific_data
            for e in result.all_events
            if e.event_type_value == "ASSET_CHECK_EVALUATION"
            and e.event_specific_data.check_name == "seed_profile"
        ]
        assert not evaluation.passed
        assert evaluation.metadata["rejected_rows"].value == 6


def test_robots_check_fails_when_it_audited_nothing(seeded):
    """No request log (no virtual web) and a page store that cannot be read: the check cannot say
    "no violation", it says it saw nothing."""
    import socket

    _built, resources, instance, stage, manifest = seeded
    for key in manifest["shards"]:
        crawl = stage.crawl_dir(key)
        crawl.mkdir(parents=True, exist_ok=True)
        (crawl / "stats.json").write_text(json.dumps({"partition": key, "pages": 3}))
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    unreachable = MongoResource(
        uri=f"mongodb://127.0.0.1:{port}/", database="x", server_selection_timeout_ms=300
    )
    # one check of its stage's group, run alone (the groups can be subset)
    robots_check = dg.AssetCheckKey(dg.AssetKey("crawl_results"), "no_robots_violations")
    result = dg.materialize(
        [*ASSETS, *CHECKS],
        selection=dg.AssetSelection.checks(robots_check),
        resources={**resources, "mongo": unreachable},
        instance=instance,
        raise_on_error=False,
    )
    evaluations = [
        e.event_specific_data
        for e in result.all_events
        if e.event_type_value == "ASSET_CHECK_EVALUATION"
    ]
    assert len(evaluations) == 1 and not evaluations[0].passed
    metadata = evaluations[0].metadata
    assert metadata["request_logs_audited"].value == 0
    assert metadata["crawled_pages_audited"].value == 0
    assert metadata["page_store_audited"].value.startswith("no (")
    assert "nothing audited" in evaluations[0].description
