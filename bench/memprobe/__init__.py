"""Where a process's resident memory is, sampled while it runs: a diagnostic for the RSS check.

RSS alone cannot say what grows. Each sample splits it into what the kernel counts (anonymous and
file-backed pages, /proc/<pid>/status), what jemalloc counts when the process runs on it
(allocated by the program, resident in its pages, retained; `mallctl` "stats.*"), what Python's
small-object allocator holds (pymalloc arenas and the bytes in their blocks,
`sys._debugmallocstats`), and every few samples a census of the objects the cyclic collector
tracks (count and shallow size by type) and the open file descriptors. Memory outside both
allocators (libxml2 through jemalloc shows as jemalloc's; thread stacks, mmaps) is what is left of
the anonymous pages. tracemalloc is not used: it traces every allocation, which costs the process
its own memory and time (a 4-crawler worker traced at 550 MB peaked at ~300 MB untraced).

    PYTHONPATH=$PWD/bench/memprobe/site MEMPROBE_DIR=/tmp/probe \\
        python -m bench.e2e.layouts --records 20000 --series fleet:8/2
    python -m bench.memprobe /tmp/probe            # each process: its samples and peak census

Every sample also records the cyclic collector's state (the young generation's count, how often
each generation ran and what it found). Environment: MEMPROBE_DIR (required), MEMPROBE_MATCH (a
substring of the command lines to sample; default `enrich_crawl.crawl.worker`), MEMPROBE_INTERVAL
(seconds, default 10), MEMPROBE_CENSUS (every how many samples the census runs, default 3; 0:
never), MEMPROBE_SHAPES=1 (with each census, the commonest shapes of the small objects: which
structure holds them, which exceptions and tracebacks wait for the collector), MEMPROBE_COLLECT=1
(after each census, a full collection: what it found, what it took, RSS after; it changes the
process it measures, so it is for finding garbage, not for peaks).
"""
