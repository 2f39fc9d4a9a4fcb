"""The crawl worker's memory allocator: jemalloc where the machine has it, glibc's malloc otherwise.

A crawl worker parses every page into an lxml tree (thousands of small C allocations) and frees it
soon after, between page bodies, decoded texts and compressed copies of tens of kilobytes each.
With glibc's malloc that pattern ends in its slow paths: a system-wide sampling profile (`perf
record -a`) of eight polite workers and of the paced floor on the same requests put 9 % of the
workers' CPU in malloc, free, `malloc_consolidate` and `unlink_chunk`, against 4 % of the floor's.
jemalloc keeps freed memory in per-size runs that the next tree reuses. Measured with eight polite
workers at once on 4,000 records, half of them with jemalloc and half without in the same fleet (so
both halves share the machine's load; `python -m bench.e2e.split_ab`), then the halves swapped:
4.3-7.8 % less CPU per page with it in five fleets, ~10 MB more peak RSS per worker
(docs/performance.md). glibc's own knob (`glibc.malloc.tcache_count=65535`) measured no
difference in the same set-up.

The allocator of a process is chosen when it starts, so the worker re-executes itself, once, with
jemalloc in `LD_PRELOAD` (`ensure`, the first thing `python -m enrich_crawl.crawl.worker` does,
whoever launched it: Dagster Pipes, a benchmark, a user). The re-executed worker puts `LD_PRELOAD`
back as it was, so the processes it starts (the browser of a rendering crawl, its driver) run with
their own allocators. `ENRICH_CRAWL_ALLOCATOR` (enrich_crawl.config) chooses: `auto` (default:
jemalloc when found at the usual library paths), `system` (glibc's malloc), or the path of a
malloc library to preload. Not Linux, no library found, or a re-exec that fails: the worker runs on
as it started, and `stats.json` says which allocator it used (`allocator`).

jemalloc keeps the pages it freed for 10 s by default before it gives them back to the system; a
crawl frees a parsed page every few milliseconds, so at its peak a worker held ~30 MB of such
pages beyond what it used. Unless `MALLOC_CONF` is set (then it is the user's), the re-executed
worker gets `dirty_decay_ms:1000,muzzy_decay_ms:0`: pages unused for a second go back
(docs/performance.md, "The crawl workers' allocator"). Like `LD_PRELOAD`, `MALLOC_CONF` is put
back as it was for the processes the worker starts.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

logger = logging.getLogger(__name__)

# where Debian/Ubuntu (libjemalloc2), Fedora/RHEL (jemalloc) and Alpine put the library
JEMALLOC_PATHS = (
    "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
    "/usr/lib/aarch64-linux-gnu/libjemalloc.so.2",
    "/usr/lib64/libjemalloc.so.2",
    "/usr/lib/libjemalloc.so.2",
    "/usr/local/lib/libjemalloc.so.2",
)
# set on the re-executed worker: LD_PRELOAD as it was before (restored at once)
PRELOADED = "ENRICH_CRAWL_PRELOADED"
# set on the re-executed worker when it was given JEMALLOC_CONF (MALLOC_CONF removed at once)
CONF_GIVEN = "ENRICH_CRAWL_MALLOC_CONF_GIVEN"
SYSTEM = "system"
# jemalloc's options for a crawl worker: freed pages go back to the system after 1 s (not 10)
JEMALLOC_CONF = "dirty_decay_ms:1000,muzzy_decay_ms:0"


def find_jemalloc() -> str | None:
    for path in JEMALLOC_PATHS:
        if os.path.isfile(path):
            return path
    return None


def library_for(setting: str) -> str | None:
    """The library to preload for an `ENRICH_CRAWL_ALLOCATOR` value; None: glibc's malloc."""
    setting = (setting or "auto").strip()
    if setting.lower() == SYSTEM or not sys.platform.startswith("linux"):
        return None
    if setting.lower() == "auto":
        return find_jemalloc()
    if not os.path.isfile(setting):
        logger.warning(
            "ENRICH_CRAWL_ALLOCATOR=%s: no such file; the crawl runs with the system allocator",
            setting,
        )
        return None
    return setting


def ensure(setting: str) -> None:
    """Re-execute this process with the allocator `setting` asks for, unless it already runs with
    it (then restore `LD_PRELOAD` for the processes it starts). Returns only when there is nothing
    to do or the re-exec failed."""
    if PRELOADED in os.environ:
        before = os.environ.pop(PRELOADED)
        if before:
            os.environ["LD_PRELOAD"] = before
        else:
            os.environ.pop("LD_PRELOAD", None)
        if os.environ.pop(CONF_GIVEN, None) is not None:
            os.environ.pop("MALLOC_CONF", None)
        return
    library = library_for(setting)
    if library is None or os.path.realpath(library) in in_use_libraries():
        return
    env = dict(os.environ)
    before = env.get("LD_PRELOAD", "")
    env[PRELOADED] = before
    env["LD_PRELOAD"] = f"{library} {before}".strip()
    if "jemalloc" in os.path.basename(library) and not env.get("MALLOC_CONF"):
        env["MALLOC_CONF"] = JEMALLOC_CONF
        env[CONF_GIVEN] = "1"
    argv = [sys.executable, *sys.orig_argv[1:]]
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, argv, env)
    except OSError as exc:  # pragma: no cover - exec of our own interpreter
        logger.warning("could not restart the crawl with %s (%s): system allocator", library, exc)


def in_use_libraries() -> set[str]:
    """Paths of the shared libraries mapped into this process (Linux; empty elsewhere)."""
    try:
        maps = Path("/proc/self/maps").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return set()
    paths = set()
    for line in maps.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].startswith("/"):
            paths.add(parts[5].strip())
    return paths


def in_use() -> str:
    """The allocator this process runs with: "jemalloc", "tcmalloc", "mimalloc" or "system"."""
    for path in in_use_libraries():
        name = os.path.basename(path)
        for allocator in ("jemalloc", "tcmalloc", "mimalloc"):
            if name.startswith(f"lib{allocator}"):
                return allocator
    return SYSTEM
