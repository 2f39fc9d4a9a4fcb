"""Several datasets: `dataset_spec`, one dynamic partition per dataset of the watched folder.

The sensor `dataset_specs` (sensors.py) registers a dataset (adds its partition and materialises
its `dataset_spec`) when a new spec file appears in the watched folder (ENRICH_DATASETS_DIR) and
launches an `enrich_job` run for it; `nightly_enrich` (schedules.py) runs `enrich_job` once per
dataset that is due. Every enrich_job run names its dataset in its run config (`enrich_run_config`),
so the shard partitions, lineage's `partition` and the single-dataset commands are unchanged.
"""

from typing import Any

import dagster as dg

from enrich_crawl.defs.partitions import datasets
from enrich_crawl.defs.resources import DatasetResource

DATASETS_GROUP = "datasets"


def enrich_run_config(spec_path: str, mappings: str | None = None) -> dict[str, Any]:
    """Run config of an enrich_job run for the dataset of `spec_path`."""
    config: dict[str, Any] = {"spec": spec_path}
    if mappings:
        config["mappings"] = mappings
    return {"resources": {"dataset": {"config": config}}}


@dg.asset(
    group_name=DATASETS_GROUP,
    kinds={"yaml"},
    partitions_def=datasets,
    description="A dataset of the watched folder: its spec, validated (one partition per dataset).",
)
def dataset_spec(
    context: dg.AssetExecutionContext, dataset: DatasetResource
) -> dg.MaterializeResult:
    """A dataset of the watched folder: its spec, validated (one partition per dataset)."""
    from enrich_crawl.catalog import find_spec

    folder = dataset.watched_dir()
    if folder is None:
        raise dg.Failure("no watched folder of dataset specs: set ENRICH_DATASETS_DIR")
    found = find_spec(folder, context.partition_key)
    if found is None:
        raise dg.Failure(
            f"dataset {context.partition_key!r}: no valid spec of that name in {folder} "
            "(removed, renamed or invalid: see the sensor dataset_specs' log)"
        )
    spec = found.spec
    rows = [[name, f.type, "yes" if f.refresh else ""] for name, f in spec.fields.items()]
    table = "\n".join(
        ["| field | type | refresh |", "|---|---|---|"]
        + ["| " + " | ".join(row) + " |" for row in rows]
    )
    try:
        table_bytes = spec.source.stat().st_size
    except OSError:
        table_bytes = 0
    return dg.MaterializeResult(
        metadata={
            "dataset": spec.name,
            "spec": dg.MetadataValue.path(str(spec.path)),
            "source": dg.MetadataValue.path(str(spec.source)),
            "source_bytes": table_bytes,
            "id_column": spec.id,
            "url_columns": ", ".join(spec.urls),
            "fields": len(spec.fields),
            "fields_table": dg.MetadataValue.md(table),
            "crawl_depth": spec.crawl.depth,
            "recrawl_ttl_hours": spec.crawl.recrawl_ttl_hours,
            "fingerprint": found.fingerprint,
        }
    )
