"""Reading a seed shard (`seed/shard=<key>.parquet`, docs/ARCHITECTURE.md), apart from the loader:
the crawl worker reads its shard with pyarrow alone, without the loader's pandas and cleaning
machinery (a third of a second of imports per crawl process)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

RECORDS_PER_BATCH = 256  # records decoded at a time

# columns stored as JSON text, and their value when empty
JSON_COLUMNS = ("_url_errors", "_data", "_raw", "_cell_errors")
JSON_DEFAULTS = {"_url_errors": "[]", "_data": "{}", "_raw": "{}", "_cell_errors": "[]"}


def read_seed_shard(path: Path, columns: Sequence[str] | None = None) -> Iterator[dict[str, Any]]:
    """Yield the records of one seed shard (decoded), one Parquet batch at a time; only `columns`
    when given (those the shard has). A missing shard has no records.

    Parquet is read a row group at a time: the columns read of a whole row group (up to
    enrich_crawl.dataset.load.SHARD_ROW_GROUP records) stay in memory while its records are
    yielded, so a reader that needs a few columns names them (the crawl feed: a 4-crawler process
    held ~15 MB for four shards of 2,700 records with every column, ~4 MB with the feed's)."""
    import pyarrow.parquet as pq

    if not path.exists():
        return
    parquet = pq.ParquetFile(path)
    if columns is not None:
        present = set(parquet.schema_arrow.names)
        columns = [column for column in columns if column in present]
    # small batches: a crawl holds one batch of decoded records while it starts them (a few
    # hundred at a time); no threads for reads this small
    for batch in parquet.iter_batches(
        batch_size=RECORDS_PER_BATCH,
        columns=list(columns) if columns is not None else None,
        use_threads=False,
    ):
        for row in batch.to_pylist():
            for column in JSON_COLUMNS:
                if column in row:
                    row[column] = json.loads(row[column] or JSON_DEFAULTS[column])
            yield row
