"""Learned mappings: the dataset's known values teach where the missing ones sit on the web.

    result = learn(examples, field_types, existing=mapping_set, min_precision=0.95)
    write_learned(result, Path("learned/"))     # mapping files + learn-report.json
    evaluate(MappingSet.load("learned/"), examples, field_types)

Plain code (no crawling): the caller fetches the pages (`ExamplePage`) that each example record's
URLs lead to. Pages at depth >= 1 teach `url_parsers` (the links to follow) as well as fields;
a fetcher that cannot fetch every linked page may probe a few records widely, learn, and fetch the
others' deeper pages through the learned mappings' links.
"""

from enrich_crawl.extract.learn.apply import REPORT_NAME, evaluate, write_learned
from enrich_crawl.extract.learn.compare import known_value, same_value
from enrich_crawl.extract.learn.induce import learn
from enrich_crawl.extract.learn.model import Example, ExamplePage, LearnResult

__all__ = [
    "REPORT_NAME",
    "Example",
    "ExamplePage",
    "LearnResult",
    "evaluate",
    "known_value",
    "learn",
    "same_value",
    "write_learned",
]
