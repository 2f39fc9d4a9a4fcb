"""Partitions: shards of one dataset (static), and the registered datasets (dynamic).

Shards: records sharded by a hash of their registrable domain (ENRICH_SHARDS shards, keys s00..).
A host's records all land in one shard, so its requests come from one crawl process
(enrich_crawl.dataset.shard); a crawl process crawls one shard, or a group of them
(CrawlerResource.crawl_processes). The shard key is the Dagster partition key that
lineage records (`lineage.<field>.partition`).

Datasets: when several datasets are configured (spec files in a watched folder, see sensors.py),
each is a key of the dynamic partitions `datasets`, registered by the sensor. The dataset dimension
is deliberately not crossed with the shards (no MultiPartitionsDefinition): every enrich_job run
enriches one dataset named in its run config, so `enrich_job`, `enrich-crawl run` and lineage's
`partition` (the shard key) stay as they are for one dataset, and several datasets are several runs.
"""

from __future__ import annotations

from collections.abc import Mapping

import dagster as dg

from enrich_crawl.config import shard_count
from enrich_crawl.dataset.shard import shard_keys

SHARD_KEYS = shard_keys(shard_count())
shards = dg.StaticPartitionsDefinition(SHARD_KEYS)

# one run materialises every shard (enrich_job): the partitioned assets take a range in one run
ALL_SHARDS_TAGS = {
    "dagster/asset_partition_range_start": SHARD_KEYS[0],
    "dagster/asset_partition_range_end": SHARD_KEYS[-1],
}

datasets = dg.DynamicPartitionsDefinition(name="datasets")

# run tags set by the sensor, the schedule and `enrich-crawl run`
DATASET_TAG = "enrich_crawl/dataset"
TRIGGER_TAG = "enrich_crawl/trigger"
FINGERPRINT_TAG = "enrich_crawl/fingerprint"


def shards_of_run(tags: Mapping[str, str]) -> list[str]:
    """The shard keys a run targets, from its partition tags (every shard when it has none)."""
    key = tags.get("dagster/partition")
    if key:
        return [key] if key in SHARD_KEYS else []
    start = tags.get("dagster/asset_partition_range_start")
    end = tags.get("dagster/asset_partition_range_end")
    if start in SHARD_KEYS and end in SHARD_KEYS:
        return SHARD_KEYS[SHARD_KEYS.index(start) : SHARD_KEYS.index(end) + 1]
    return list(SHARD_KEYS)
