"""The Definitions load, every job resolves, and the asset chain is the documented one
(seed_dataset -> crawl_results -> resolved_fields -> enriched_records)."""

from __future__ import annotations

import subprocess
import sys

import dagster as dg

from enrich_crawl.definitions import defs


def test_every_job_resolves():
    repo = defs.get_repository_def()
    names = [job.name for job in repo.get_all_jobs()]
    assert "enrich_job" in names
    for name in names:
        assert defs.resolve_job_def(name).name == name


def test_asset_chain_in_dependency_order():
    graph = defs.resolve_asset_graph()
    keys = {key.to_user_string() for key in graph.get_all_asset_keys()}
    assert {"seed_dataset", "crawl_results", "resolved_fields", "enriched_records"} <= keys
    parents = {
        key.to_user_string(): {p.to_user_string() for p in graph.get(key).parent_keys}
        for key in graph.get_all_asset_keys()
    }
    assert "seed_dataset" in parents["crawl_results"]
    assert "crawl_results" in parents["resolved_fields"]
    assert "resolved_fields" in parents["enriched_records"]


def test_crawl_is_partitioned_by_shard_and_enrich_job_takes_every_shard():
    crawl = defs.resolve_assets_def("crawl_results")
    keys = crawl.partitions_def.get_partition_keys()
    assert keys and all(k.startswith("s") for k in keys)
    job = defs.resolve_job_def("enrich_job")
    assert job.tags["dagster/asset_partition_range_start"] == keys[0]
    assert job.tags["dagster/asset_partition_range_end"] == keys[-1]


def test_nightly_schedule_targets_enrich_job():
    schedule = defs.resolve_schedule_def("nightly_enrich")
    assert schedule.job_name == "enrich_job"
    assert schedule.cron_schedule


def test_definitions_module_does_not_import_twisted():
    # the reactor cannot restart: crawls run in their own processes, never in the code server
    code = (
        "import sys, enrich_crawl.definitions; "
        "bad = [m for m in sys.modules if m.startswith(('twisted', 'scrapy'))]; "
        "print(','.join(bad)); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, f"definitions import Twisted/Scrapy: {result.stdout}"


def test_resources_are_configurable_resources():
    for key, resource in defs.resources.items():
        assert isinstance(resource, dg.ConfigurableResource), key
