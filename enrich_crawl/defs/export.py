"""`enriched_export`: the enriched dataset back to a file (Parquet by default, CSV/TSV/JSON lines),
lineage columns optional. Wiring only: the work is enrich_crawl.export."""

from pathlib import Path

import dagster as dg
from pydantic import Field

from enrich_crawl.defs.resources import DatasetResource, MongoResource, StagingResource


class ExportConfig(dg.Config):
    format: str = Field(default="parquet", description="parquet, csv, tsv or jsonl.")
    lineage: bool = Field(
        default=False, description="Add _status, _missing and <field>__<lineage key> columns."
    )
    path: str | None = Field(
        default=None,
        description="Output file; default <staging>/<dataset>/export/<dataset>.<format>.",
    )


@dg.asset(
    group_name="enrich",
    kinds={"mongodb", "parquet"},
    deps=["enriched_records"],
    description="The enriched dataset exported from MongoDB to a file, lineage columns optional.",
)
def enriched_export(
    context: dg.AssetExecutionContext,
    config: ExportConfig,
    dataset: DatasetResource,
    staging: StagingResource,
    mongo: MongoResource,
) -> dg.MaterializeResult:
    """The enriched dataset exported from MongoDB to a file, lineage columns optional."""
    from pymongo.errors import PyMongoError

    from enrich_crawl.export import ExportError, export_dataset

    spec = dataset.load()
    out = (
        Path(config.path)
        if config.path
        else staging.stage(spec.name).base / "export" / f"{spec.name}.{config.format}"
    )
    client = mongo.client()
    try:
        result = export_dataset(
            client[mongo.database_name()][spec.name],
            out,
            field_types=spec.field_types(),
            fmt=config.format,
            lineage=config.lineage,
        )
    except PyMongoError as exc:
        raise dg.Failure(
            description=f"exporting {spec.name} failed: MongoDB at {mongo.display_uri()}: "
            f"{mongo.scrub(str(exc).split(', Timeout:')[0])}"
        ) from None
    except ExportError as exc:
        raise dg.Failure(description=str(exc), allow_retries=False) from None
    finally:
        client.close()
    context.log.info(f"wrote {result.rows} records to {result.path}")
    return dg.MaterializeResult(
        metadata={
            "path": dg.MetadataValue.path(str(result.path)),
            "format": result.format,
            "rows": result.rows,
            "columns": len(result.columns),
            "lineage_columns": config.lineage,
            "status": dg.MetadataValue.json(result.status),
        }
    )
