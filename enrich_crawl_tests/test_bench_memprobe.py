"""The memory probe of bench/memprobe (a diagnostic of the RSS check): a real Python process with
its sitecustomize on the path samples itself, on glibc's malloc and on jemalloc, and the report
reads what it wrote. Not a benchmark: no figure is asserted but that the parts are there."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.memprobe.__main__ import load, report
from enrich_crawl.crawl import allocator

REPO = Path(__file__).resolve().parents[1]
# a process that holds ~20 MB of small and large objects long enough to be sampled a few times
WORKLOAD = """# memprobe-test-marker
import time
small = [str(i) * 3 for i in range(200_000)]
large = [bytes(100_000) for _ in range(100)]
time.sleep(1.6)
"""


# cyclic garbage the collector has not reached yet (its thresholds pushed out of the way)
GARBAGE = """# memprobe-test-marker
import gc, time
gc.set_threshold(10**9)
class Node:
    pass
for i in range(5_000):
    node = Node()
    node.me = [node, "x"]
del node
time.sleep(1.6)
"""


def _run(tmp_path: Path, workload: str = WORKLOAD, **env: str) -> list[dict]:
    out = tmp_path / "probe"
    environ = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "MALLOC_CONF")}
    environ.update(
        PYTHONPATH=os.pathsep.join([str(REPO / "bench" / "memprobe" / "site"), str(REPO)]),
        MEMPROBE_DIR=str(out),
        MEMPROBE_MATCH="memprobe-test-marker",
        MEMPROBE_INTERVAL="0.3",
        MEMPROBE_CENSUS="2",
        **env,
    )
    proc = subprocess.run(
        [sys.executable, "-c", workload], env=environ, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert "memprobe: not sampling" not in proc.stderr
    files = list(out.glob("*.jsonl"))
    assert len(files) == 1 and not list(out.glob("*.err"))
    rows = load(files[0])
    assert len(rows) >= 3
    text = "\n".join(report(files[0]))
    assert "census at" in text and "builtins.str" not in text  # str is not tracked by gc
    assert "(peak " in text
    return rows


def test_a_process_samples_where_its_memory_is(tmp_path):
    rows = _run(tmp_path)
    last = rows[-1]
    assert last["status"]["VmRSS"] >= last["status"]["RssAnon"] > 20  # the workload's ~30 MB
    assert last["jemalloc"] == {}  # glibc's malloc: nothing to ask
    censused = [row for row in rows if "census" in row]
    assert censused and censused[0]["pymalloc"]["arenas"] > 0
    assert censused[0]["pymalloc"]["bytes_in_blocks"] > 5  # the 200,000 small strings
    names = {name for name, _count, _mb in censused[0]["census"]["top"]}
    assert "builtins.list" in names and censused[0]["census"]["fds"] >= 3


@pytest.mark.skipif(allocator.find_jemalloc() is None, reason="libjemalloc2 (scripts/setup.sh)")
def test_on_jemalloc_its_own_statistics_are_sampled(tmp_path):
    rows = _run(tmp_path, LD_PRELOAD=allocator.find_jemalloc())
    je = rows[-1]["jemalloc"]
    assert je["allocated"] >= 10  # the 100 blocks of 100 kB at least
    assert je["resident"] >= je["allocated"] * 0.9


def test_other_processes_are_not_sampled(tmp_path):
    out = tmp_path / "probe"
    environ = dict(os.environ)
    environ.update(
        PYTHONPATH=os.pathsep.join([str(REPO / "bench" / "memprobe" / "site"), str(REPO)]),
        MEMPROBE_DIR=str(out),
        MEMPROBE_INTERVAL="0.1",
    )  # the default match is a crawl worker's command line
    subprocess.run([sys.executable, "-c", "import time; time.sleep(0.5)"], env=environ, check=True)
    assert not out.exists()


def test_shapes_and_a_collection_show_the_garbage_waiting(tmp_path):
    rows = _run(tmp_path, GARBAGE, MEMPROBE_SHAPES="1", MEMPROBE_COLLECT="1")
    first = next(row for row in rows if "collected" in row)
    shapes = dict(first["shapes"])
    assert shapes["list[2](Node,str)"] >= 5_000  # the cycles, by the shape of their lists
    assert first["collected"]["found"] >= 10_000  # each Node and its list were garbage
    assert first["collected"]["objects_after"] <= first["census"]["objects"] - 10_000
    young, _middle, _old = first["gc"]["count"]
    assert young >= 10_000 and first["gc"]["threshold"][0] == 10**9
    later = [row for row in rows if "collected" in row][1:]
    assert all(row["collected"]["found"] < 1_000 for row in later)  # nothing new meanwhile
