"""Loaded by every Python process started with this folder on PYTHONPATH (bench/memprobe): the
processes whose command line contains MEMPROBE_MATCH (default: a crawl worker) sample where their
resident memory is, every MEMPROBE_INTERVAL seconds, into MEMPROBE_DIR/<pid>.jsonl. See
bench/memprobe/__init__.py. Nothing happens without MEMPROBE_DIR."""

import os
import sys


def _start() -> None:
    out = os.environ.get("MEMPROBE_DIR")
    if not out or os.environ.get("MEMPROBE_MATCH", "enrich_crawl.crawl.worker") not in " ".join(
        getattr(sys, "orig_argv", sys.argv)
    ):
        return
    from bench.memprobe.sample import start

    start(out)


try:
    _start()
except Exception as exc:  # a probe never stops the process it watches
    print(f"memprobe: not sampling ({exc})", file=sys.stderr)
