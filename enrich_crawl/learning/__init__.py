"""Learning and evaluating mappings from the dataset's own known values (SPEC 3b): the fetching
side and the orchestration, in plain code (no Dagster, no Scrapy).

    sample_for_learning   a bounded sample of records with known values, per site template
    sample_for_mappings   a bounded sample of such records per mapping (evaluate, mapping_agreement)
    collect_pages         those records' pages, fetched by the ordinary crawl worker (its own
                          process, same politeness, crawled-URL store) in collecting mode
    learn_dataset         sample -> collect -> enrich_crawl.extract.learn.learn -> mapping files
    evaluate_dataset      sample -> collect -> enrich_crawl.extract.learn.evaluate

`enrich-crawl mapping learn|evaluate`, the `learned_mappings` asset and the `mapping_agreement`
check call these; the learner itself lives in enrich_crawl.extract.learn.
"""

from enrich_crawl.learning.fetch import (
    COLLECT_PARTITION,
    Collected,
    FetchContext,
    collect_pages,
    examples_of,
    fetch_summary,
    run_worker,
)
from enrich_crawl.learning.mappings import REPORT_FILE, clear_learned, has_mappings
from enrich_crawl.learning.run import (
    LearningError,
    LearnOutcome,
    evaluate_dataset,
    learn_dataset,
)
from enrich_crawl.learning.sample import (
    Sampled,
    fields_wanting_depth,
    known_values,
    read_seed_records,
    sample_for_learning,
    sample_for_mappings,
    split_probes,
    template_key,
    write_sample_shard,
)
from enrich_crawl.learning.summary import (
    agreement_problems,
    evaluation_rows,
    learned_fields,
    read_learned,
)

__all__ = [
    "COLLECT_PARTITION",
    "REPORT_FILE",
    "Collected",
    "FetchContext",
    "LearnOutcome",
    "LearningError",
    "Sampled",
    "agreement_problems",
    "clear_learned",
    "collect_pages",
    "evaluate_dataset",
    "evaluation_rows",
    "examples_of",
    "fetch_summary",
    "fields_wanting_depth",
    "has_mappings",
    "known_values",
    "learn_dataset",
    "learned_fields",
    "read_learned",
    "read_seed_records",
    "run_worker",
    "sample_for_learning",
    "sample_for_mappings",
    "split_probes",
    "template_key",
    "write_sample_shard",
]
