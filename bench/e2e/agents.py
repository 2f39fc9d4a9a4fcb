"""The benchmark crawlers' User-Agents: the request log tells the crawlers apart by them, even when
they overlap in time. A module of its own so that the CPU floor imports nothing of the product."""

_UA_URL = "(+https://github.com/enrich-crawl/enrich_crawl/tree/main/bench)"
SEED_UA = f"enrich_crawl-bench-seed/0.1 {_UA_URL}"
BFS_UA = f"enrich_crawl-bench-bfs/0.1 {_UA_URL}"
FLOOR_UA = f"enrich_crawl-bench-floor/0.1 {_UA_URL}"
