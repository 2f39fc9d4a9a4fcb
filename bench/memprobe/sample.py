"""The sampler thread of bench/memprobe (started by its sitecustomize)."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import os
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

MB = 2**20
JEMALLOC_STATS = ("allocated", "active", "resident", "mapped", "retained", "metadata")
STATUS = ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem")
PYMALLOC = {
    "# arenas allocated current": "arenas",
    "# bytes in allocated blocks": "bytes_in_blocks",
    "# bytes in available blocks": "bytes_free_in_blocks",
}


def status() -> dict[str, float]:
    """The kernel's view (MB): resident, its peak, anonymous and file-backed pages."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in STATUS:
            out[key] = round(int(value.split()[0]) / 1024, 1)
    return out


def _mallctl():
    try:
        return ctypes.CDLL(None).mallctl  # jemalloc preloaded (enrich_crawl.crawl.allocator)
    except (AttributeError, OSError):
        return None


def jemalloc(mallctl=None) -> dict[str, float]:
    """jemalloc's own statistics (MB), refreshed first; {} when the process does not run on it."""
    mallctl = mallctl or _mallctl()
    if mallctl is None:
        return {}
    epoch, size = ctypes.c_uint64(1), ctypes.c_size_t(8)
    if mallctl(b"epoch", ctypes.byref(epoch), ctypes.byref(size), ctypes.byref(epoch), size):
        return {}
    out = {}
    for name in JEMALLOC_STATS:
        value, size = ctypes.c_size_t(0), ctypes.c_size_t(ctypes.sizeof(ctypes.c_size_t))
        if mallctl(f"stats.{name}".encode(), ctypes.byref(value), ctypes.byref(size), None, 0) == 0:
            out[name] = round(value.value / MB, 1)
    return out


def pymalloc() -> dict[str, float]:
    """pymalloc's arenas (count, 1 MiB each on 3.10+) and the MB in their blocks, from
    `sys._debugmallocstats` (which writes to the C stderr: caught in a temporary file)."""
    saved = os.dup(2)
    try:
        with tempfile.TemporaryFile() as fh:
            os.dup2(fh.fileno(), 2)
            try:
                sys._debugmallocstats()
            finally:
                os.dup2(saved, 2)
            fh.seek(0)
            text = fh.read().decode("utf-8", "replace")
    finally:
        os.close(saved)
    out: dict[str, float] = {}
    for line in text.splitlines():
        for prefix, key in PYMALLOC.items():
            if line.startswith(prefix):
                number = int(line.rsplit("=", 1)[-1].replace(",", "").strip())
                out[key] = number if key == "arenas" else round(number / MB, 1)
    return out


def census(top: int = 40) -> dict[str, Any]:
    """The objects the cyclic collector tracks, by type: count and shallow MB (the largest)."""
    count: Counter[str] = Counter()
    size: Counter[str] = Counter()
    objects = gc.get_objects()
    for obj in objects:
        name = f"{type(obj).__module__}.{type(obj).__qualname__}"
        count[name] += 1
        with contextlib.suppress(Exception):  # a type whose size cannot be taken
            size[name] += sys.getsizeof(obj)
    total = len(objects)
    del objects
    return {
        "objects": total,
        "fds": len(os.listdir("/proc/self/fd")),
        "top": [
            [name, count[name], round(size[name] / MB, 2)] for name, _ in size.most_common(top)
        ],
    }


def collector() -> dict[str, Any]:
    """The cyclic collector's state: the counts that trigger each generation, and per generation
    how often it ran and how many objects it found unreachable (garbage waits until it runs)."""
    return {
        "count": list(gc.get_count()),
        "threshold": list(gc.get_threshold()),
        "frozen": gc.get_freeze_count(),
        "stats": [[g["collections"], g["collected"]] for g in gc.get_stats()],
    }


def _shape(obj: Any) -> str | None:
    """What kind of small object `obj` is, for `shapes` (None: not counted)."""
    kind = type(obj)
    if kind in (tuple, list, set, frozenset):
        items = list(obj)[:3] if kind in (tuple, list) else []
        inner = ",".join(type(item).__name__ for item in items)
        return f"{kind.__name__}[{min(len(obj), 9)}]({inner})"
    if kind is dict:
        return "dict{" + ",".join(str(key)[:20] for key in list(obj)[:4]) + "}"
    if kind.__name__ == "Failure":  # Twisted's (an exception itself since Twisted 24)
        return f"failure of {type(getattr(obj, 'value', None)).__name__}"
    if isinstance(obj, BaseException):
        return f"exception {kind.__name__}"
    if kind.__name__ == "traceback":
        code = obj.tb_frame.f_code
        return f"traceback at {code.co_name} ({Path(code.co_filename).name})"
    return None


def shapes(top: int = 40) -> list[list[Any]]:
    """The commonest shapes of what the collector tracks: containers by type, length and the
    types of their first items (a dict by its first keys), exceptions and Twisted failures by
    type, tracebacks by the function they stopped in. Which structure holds the many small
    objects, and which garbage waits for the collector."""
    count: Counter[str] = Counter()
    for obj in gc.get_objects():
        shape = _shape(obj)
        if shape is not None:
            count[shape] += 1
    return [[name, number] for name, number in count.most_common(top)]


def sample(n: int, every_census: int, mallctl=None) -> dict[str, Any]:
    row: dict[str, Any] = {"status": status(), "jemalloc": jemalloc(mallctl), "gc": collector()}
    if every_census and n % every_census == 0:
        row["pymalloc"] = pymalloc()
        row["census"] = census()
        if os.environ.get("MEMPROBE_SHAPES") == "1":
            row["shapes"] = shapes()
        if os.environ.get("MEMPROBE_COLLECT") == "1":  # how much of it was garbage waiting
            started = time.perf_counter()
            found = gc.collect()
            row["collected"] = {
                "found": found,
                "ms": round((time.perf_counter() - started) * 1000, 1),
                "objects_after": len(gc.get_objects()),
                "status_after": status(),
                "jemalloc_after": jemalloc(mallctl),
            }
    return row


def start(out_dir: str) -> threading.Thread:
    interval = float(os.environ.get("MEMPROBE_INTERVAL", "10"))
    every_census = int(os.environ.get("MEMPROBE_CENSUS", "3"))
    path = Path(out_dir) / f"{os.getpid()}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    argv = " ".join(getattr(sys, "orig_argv", sys.argv))
    mallctl = _mallctl()

    def run() -> None:
        started = time.monotonic()
        n = 0
        while True:
            time.sleep(interval)
            try:
                row = {
                    "t": round(time.monotonic() - started, 1),
                    **sample(n, every_census, mallctl),
                }
                if n == 0:
                    row["argv"] = argv[-300:]
                with open(path, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps(row) + "\n")
            except Exception as exc:  # a probe never stops the process
                with open(path.with_suffix(".err"), "a", encoding="utf-8") as fh:
                    fh.write(f"{exc!r}\n")
            n += 1

    thread = threading.Thread(target=run, daemon=True, name="memprobe")
    thread.start()
    return thread
