"""The stage contracts: a record's outcome has one definition, shared by the crawl's outcome line
and the merged document's status; the staging paths use the contract's file names."""

from __future__ import annotations

import pytest

from enrich_crawl.contracts import (
    CANDIDATES_FILE,
    CRAWL_RUN_FILES,
    CRAWL_STATS_FILE,
    RECORD_OUTCOMES_FILE,
    crawl_outcome,
    fill_outcome,
)
from enrich_crawl.staging import DatasetStage


@pytest.mark.parametrize(
    ("wanted", "needed", "fresh", "expected"),
    [
        (set(), set(), set(), "nothing_to_do"),
        ({"a", "b"}, set(), {"a", "b"}, "fresh"),
        ({"a", "b"}, set(), {"a"}, "resolved"),
        ({"a", "b"}, {"b"}, set(), "partial"),
        ({"a", "b"}, {"a", "b"}, set(), "unresolved"),
        ({"a"}, {"a"}, set(), "unresolved"),
    ],
)
def test_crawl_outcome(wanted, needed, fresh, expected):
    assert crawl_outcome(frozenset(wanted), needed, frozenset(fresh)) == expected


def test_fill_outcome_is_the_crawl_outcome_of_a_record_that_wanted_something():
    for still_missing in (False, True):
        for filled_any in (False, True):
            if not still_missing and not filled_any:
                continue  # nothing wanted: the crawl says nothing_to_do, the document resolved
            wanted = {"a", "b"}
            needed = ({"a"} if filled_any else wanted) if still_missing else set()
            assert crawl_outcome(wanted, needed, ()) == fill_outcome(still_missing, filled_any)


def test_staging_paths_use_the_contract_names(tmp_path):
    stage = DatasetStage(tmp_path, "ds")
    assert stage.candidates("s01").name == CANDIDATES_FILE
    assert stage.record_outcomes("s01").name == RECORD_OUTCOMES_FILE
    assert stage.crawl_stats("s01").name == CRAWL_STATS_FILE
    assert {CANDIDATES_FILE, RECORD_OUTCOMES_FILE, CRAWL_STATS_FILE} <= set(CRAWL_RUN_FILES)
