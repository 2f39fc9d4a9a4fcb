"""The parameters of one crawl worker (one partition), passed from Dagster to the crawl process."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from enrich_crawl.config import CrawlConfig, chromium_path


@dataclass
class WorkerParams:
    dataset: str
    partition: str
    seed_path: str  # seed shard Parquet file
    out_dir: str  # crawl output folder of the partition
    mappings_dir: str
    field_types: dict[str, str]
    crawl: dict[str, Any] = field(default_factory=dict)  # CrawlConfig.to_dict()
    run_id: str = ""
    user_agent: str = ""
    proxy: str | None = None
    allow_private: bool = False
    # browser for `js`/`auto` mappings: ENRICH_CHROMIUM of the process that builds the params
    chromium: str = field(default_factory=chromium_path)
    # overrides of enrich_crawl.crawl.render.RenderConfig (browser concurrency, contexts, ...);
    # they win over the ENRICH_RENDER_* variables of the worker's environment
    render: dict[str, Any] = field(default_factory=dict)
    mongo_uri: str | None = None  # crawl state (robots cache, crawled URLs); None: no persistence
    mongo_db: str = "enrich_crawl"
    max_active_records: int = 2000
    progress_interval: float = 5.0
    log_level: str = "INFO"
    # learned mappings (SPEC 3b) used beside `mappings_dir`, whose mappings take precedence
    learned_mappings_dir: str | None = None
    # a collecting crawl (enrich_crawl.crawl.collect.CollectConfig): keeps every page a record
    # reaches, for learning and evaluating mappings; empty for an ordinary crawl
    collect: dict[str, Any] = field(default_factory=dict)

    @cached_property
    def crawl_config(self) -> CrawlConfig:
        """`crawl` parsed (once: the spider, the settings and the worker all ask for it)."""
        return CrawlConfig.from_mapping(self.crawl)

    def share_of_process(self, crawls: int) -> WorkerParams:
        """These parameters for one of `crawls` crawls that share a process: the records in
        flight (`max_active_records`), the downloads in flight (`concurrent_requests`, rounded
        up) and the in-memory page cache (`page_cache_mb`) are the process's, shared out among
        its crawls, so that a process's memory and connections do not grow with the shards it
        is given."""
        if crawls <= 1:
            return self
        config = self.crawl_config
        crawl = {
            **self.crawl,
            "concurrent_requests": -(-config.concurrent_requests // crawls),
            "page_cache_mb": config.page_cache_mb / crawls,
        }
        return dataclasses.replace(
            self, crawl=crawl, max_active_records=-(-self.max_active_records // crawls)
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WorkerParams:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})
