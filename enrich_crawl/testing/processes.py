"""Find the crawl worker processes of this machine, and which shards each one crawls.

A crawl worker (`python -m enrich_crawl.crawl.worker`) launched through Dagster Pipes carries its
parameters in the Pipes context (the DAGSTER_PIPES_CONTEXT variable names a file holding them), so
tests and benchmarks can tell the crawl of shard s01 from the others, watch its process tree and
kill it to simulate a crash. A process crawling several shards (CrawlerResource.crawl_processes)
names them all in `partitions`; `partition` is its first.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psutil

WORKER_MODULE = "enrich_crawl.crawl.worker"


@dataclass
class CrawlWorker:
    process: psutil.Process
    partition: str | None
    run_id: str | None
    dataset: str | None
    partitions: tuple[str, ...] = ()

    def tree(self) -> list[psutil.Process]:
        try:
            return [self.process, *self.process.children(recursive=True)]
        except psutil.Error:
            return []


def _pipes_params(process: psutil.Process) -> list[dict[str, Any]]:
    from dagster_pipes import decode_param

    try:
        raw = process.environ().get("DAGSTER_PIPES_CONTEXT")
        if not raw:
            return []
        source = decode_param(raw)
        if "path" in source:
            with open(source["path"], encoding="utf-8") as handle:
                context = json.load(handle)
        else:
            context = source.get("data") or {}
        extras = context.get("extras") or {}
        return list(extras.get("shards") or [extras.get("params") or {}])
    except (psutil.Error, OSError, ValueError, KeyError, TypeError):
        return []


def crawl_workers() -> Iterator[CrawlWorker]:
    """The running crawl workers (zombies excluded)."""
    for process in psutil.process_iter(["cmdline", "status"]):
        try:
            cmdline = process.info["cmdline"] or []
            if WORKER_MODULE not in cmdline or process.info["status"] == psutil.STATUS_ZOMBIE:
                continue
        except psutil.Error:
            continue
        shards = _pipes_params(process)
        params = shards[0] if shards else {}
        yield CrawlWorker(
            process,
            params.get("partition"),
            params.get("run_id"),
            params.get("dataset"),
            tuple(p["partition"] for p in shards if p.get("partition")),
        )


def alive(processes: list[psutil.Process]) -> list[psutil.Process]:
    """Those of `processes` still running (a zombie has ended: only its exit status is left)."""
    living = []
    for process in processes:
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                living.append(process)
        except psutil.Error:
            continue
    return living
