"""Counts the turns of a process's asyncio event loop and what starts each one (an instrument).

Put this folder first on PYTHONPATH and set LOOPTURNS_OUT to a path prefix: every Python process
started so writes `<prefix>.<pid>.json` at exit with

- `iterations`: turns of the loop (`BaseEventLoop._run_once`), and `kinds`: how many of them
  found sockets ready (`io`) or ran only timers and callbacks (`timer/ready`);
- `first`: per (kind, callback), the turns that callback started (what woke the process up);
- `all`: per callback, the turns it ran in.

A callback is named by its function (`module:qualname`), a task's step by the innermost coroutine
its task waits in (`task:qualname`). Turns are counted on asyncio's own loop, in Python: a crawl
worker, which runs on uvloop where it is installed, is switched to asyncio's loop to be counted
(its CPU under the instrument is not the plain worker's).

    LOOPTURNS_OUT=/tmp/turns/run PYTHONPATH=bench/e2e/loopturns:. \\
        python -m enrich_crawl.crawl.worker --params params.json

The counts need no CPU clock and do not depend on the machine's load: what one change takes off a
crawl's turns per page shows in one run (divide by the pages of the crawl's stats.json).
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.machinery
import json
import os
import sys
from collections import Counter

_OUT = os.environ.get("LOOPTURNS_OUT")


def _install(out: str) -> None:
    import asyncio
    import asyncio.base_events as base_events
    import asyncio.events as events

    turns = {"iterations": 0, "io": 0}
    first: Counter[tuple[str, str]] = Counter()
    every: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    ran: list[str] = []

    def name(handle: events.Handle) -> str:
        callback = handle._callback
        owner = getattr(callback, "__self__", None)
        if isinstance(owner, asyncio.Task):
            coro = owner.get_coro()
            while hasattr(getattr(coro, "cr_await", None), "cr_code"):
                coro = coro.cr_await
            return f"task:{getattr(coro, '__qualname__', type(coro).__name__)}"
        qualname = getattr(callback, "__qualname__", None) or type(callback).__name__
        return f"{getattr(callback, '__module__', '') or ''}:{qualname}"

    handle_run = events.Handle._run

    def run(self: events.Handle) -> None:
        ran.append(name(self))
        handle_run(self)

    run_once = base_events.BaseEventLoop._run_once

    def run_once_counted(self: base_events.BaseEventLoop) -> None:
        selector = self._selector
        if not getattr(selector, "_turns_counted", False):
            select = selector.select

            def select_counted(timeout: float | None = None) -> list:
                ready = select(timeout)
                turns["io"] = len(ready)
                return ready

            selector.select = select_counted
            selector._turns_counted = True
        ran.clear()
        turns["io"] = 0
        run_once(self)
        turns["iterations"] += 1
        kind = "io" if turns["io"] else "timer/ready"
        kinds[kind] += 1
        first[(kind, ran[0] if ran else "(nothing)")] += 1
        every.update(set(ran))

    events.Handle._run = run
    base_events.BaseEventLoop._run_once = run_once_counted

    class _NoUvloop(importlib.abc.MetaPathFinder):
        """The crawl worker's settings without uvloop (see the module's docstring)."""

        def find_spec(self, fullname: str, path: object, target: object = None) -> object:
            if fullname != "enrich_crawl.crawl.settings":
                return None
            sys.meta_path.remove(self)
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
            if spec is None or spec.loader is None:
                return spec
            exec_module = spec.loader.exec_module

            def exec_without_uvloop(module: object) -> None:
                exec_module(module)
                module._has_uvloop = lambda: False

            spec.loader.exec_module = exec_without_uvloop
            return spec

    sys.meta_path.insert(0, _NoUvloop())

    def write() -> None:
        with open(f"{out}.{os.getpid()}.json", "w", encoding="utf-8") as stream:
            json.dump(
                {
                    "argv": sys.argv,
                    "iterations": turns["iterations"],
                    "kinds": kinds,
                    "first": [[kind, label, n] for (kind, label), n in first.most_common()],
                    "all": every.most_common(),
                },
                stream,
                indent=0,
            )

    atexit.register(write)


if _OUT:
    _install(_OUT)
