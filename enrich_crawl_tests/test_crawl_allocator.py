"""The crawl worker's allocator (enrich_crawl/crawl/allocator.py): a worker re-executes itself once
with jemalloc preloaded, the processes it starts get the environment they would have had, and a
setting of `system` or a missing library leaves glibc's malloc in place. Real processes: what is
checked is the libraries mapped into them."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest

from enrich_crawl.crawl import allocator

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="LD_PRELOAD: Linux")

# what a worker does first, then what it and a process it starts run with
PROBE = """
import json, os, subprocess, sys
from enrich_crawl.crawl import allocator
allocator.ensure(sys.argv[1])
child = subprocess.run(
    [sys.executable, "-c", "from enrich_crawl.crawl import allocator; print(allocator.in_use())"],
    capture_output=True, text=True, check=True,
)
decay = None
if allocator.in_use() == "jemalloc":  # what jemalloc itself runs with (its mallctl interface)
    import ctypes
    value, size = ctypes.c_ssize_t(0), ctypes.c_size_t(ctypes.sizeof(ctypes.c_ssize_t))
    assert ctypes.CDLL(None).mallctl(
        b"opt.dirty_decay_ms", ctypes.byref(value), ctypes.byref(size), None, 0
    ) == 0
    decay = value.value
print(json.dumps({
    "pid": os.getpid(),
    "allocator": allocator.in_use(),
    "ld_preload": os.environ.get("LD_PRELOAD"),
    "marker": os.environ.get(allocator.PRELOADED),
    "malloc_conf": os.environ.get("MALLOC_CONF"),
    "dirty_decay_ms": decay,
    "child": child.stdout.strip(),
}))
"""


def _probe(setting: str, **env: str) -> tuple[int, dict]:
    environ = {
        k: v
        for k, v in os.environ.items()
        if k not in ("LD_PRELOAD", "MALLOC_CONF", allocator.PRELOADED, allocator.CONF_GIVEN)
    }
    environ.update(env)
    proc = subprocess.Popen(
        [sys.executable, "-c", PROBE, setting],
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    lines = out.strip().splitlines()
    assert len(lines) == 1, out  # the re-executed process printed, the first one never did
    return proc.pid, json.loads(lines[0])


def test_the_machine_has_jemalloc():
    # scripts/setup.sh installs Debian's libjemalloc2; without it every worker runs on glibc's
    # malloc (4-8 % more CPU a page) and the tests below would prove nothing about jemalloc
    assert allocator.find_jemalloc() is not None, "libjemalloc.so.2 not found: run scripts/setup.sh"


def test_a_worker_reexecutes_itself_with_jemalloc_and_its_children_do_not_inherit_it():
    pid, seen = _probe("auto")
    assert seen["pid"] == pid  # the same process, executed again (Dagster Pipes keeps its pid)
    assert seen["allocator"] == "jemalloc"
    assert seen["ld_preload"] is None and seen["marker"] is None
    assert seen["child"] == "system"  # a browser the worker starts brings its own allocator
    # freed pages go back to the system after a second, not jemalloc's default 10 s; the
    # processes the worker starts do not see the setting
    assert seen["dirty_decay_ms"] == 1000 and seen["malloc_conf"] is None


def test_the_users_own_jemalloc_options_win():
    _pid, seen = _probe("auto", MALLOC_CONF="dirty_decay_ms:5000")
    assert seen["allocator"] == "jemalloc"
    assert seen["dirty_decay_ms"] == 5000
    assert seen["malloc_conf"] == "dirty_decay_ms:5000"  # as it was, for its children too


def test_a_preload_of_the_users_own_is_kept_beside_it():
    libm = next(
        path
        for path in ("/lib/x86_64-linux-gnu/libm.so.6", "/lib/aarch64-linux-gnu/libm.so.6")
        if os.path.exists(path)
    )
    _pid, seen = _probe("auto", LD_PRELOAD=libm)
    assert seen["allocator"] == "jemalloc"
    assert seen["ld_preload"] == libm  # as it was, for the processes the worker starts
    assert seen["child"] == "system"


def test_system_keeps_glibcs_malloc_and_runs_once():
    _pid, seen = _probe("system")
    assert seen["allocator"] == "system"
    assert seen["ld_preload"] is None


def test_a_library_path_that_does_not_exist_is_named_and_the_crawl_runs_on(caplog):
    with caplog.at_level(logging.WARNING, logger="enrich_crawl.crawl.allocator"):
        assert allocator.library_for("/nowhere/libjemalloc.so.2") is None
    assert "ENRICH_CRAWL_ALLOCATOR=/nowhere/libjemalloc.so.2: no such file" in caplog.text
    _pid, seen = _probe("/nowhere/libjemalloc.so.2")
    assert seen["allocator"] == "system"


def test_an_explicit_library_path_is_preloaded():
    path = allocator.find_jemalloc()
    assert path is not None
    _pid, seen = _probe(path)
    assert seen["allocator"] == "jemalloc"
