"""Dagster wiring of enrich_crawl (thin: the work lives in the plain modules)."""

import warnings

import dagster as dg

# BackfillPolicy on assets is marked beta by Dagster; it is what lets one run take every shard
warnings.filterwarnings("ignore", category=dg.BetaWarning)
# Dagster's own Pipes message reader calls a preview API of Dagster on every crawl step
warnings.filterwarnings(
    "ignore", message=r".*PipesMessageReader\.expected_writer_count", category=dg.PreviewWarning
)
