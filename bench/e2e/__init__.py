"""The end-to-end benchmark of issue #9: a generated web and dirty dataset, the product against the
seed-style baseline and a plain Scrapy breadth-first crawl, a CPU floor, a scaling series.

Entry point: ``python -m bench e2e`` (see ``bench/__main__.py``); the pieces:

- ``generate``: the benchmark web (a virtual-web folder) + dataset + mappings + ground truth;
- ``baseline_seed``: sequential ``requests`` + lxml per process, naive depth-limited BFS;
- ``baseline_bfs``: plain Scrapy breadth-first crawl with the same extraction;
- ``floor``: the CPU floor, a Scrapy spider fetching given URLs and parsing each once with lxml;
- ``measure``: process-tree measurements, request-log politeness checks, accuracy;
- ``suite``: the whole invocation (runs, report, plot).
"""
