"""MongoDB commands a process sends, counted with pymongo's command monitoring.

    python -m bench.e2e.mongo_commands OUT_DIR MODULE [ARGS ...]

runs `python -m MODULE ARGS ...` with a command listener registered before any client is made
(`pymongo.monitoring.register`: every client of the process reports to it) and writes the counts
by command name to `OUT_DIR/<pid>.json` (every 2 s while it runs, so that a killed process leaves
what it counted up to then, and at exit). `read(OUT_DIR)` sums the files of every process.
The listener only counts (a dict increment per command): the process's CPU is not changed by it
in any way a benchmark could see.
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import sys
import time
from collections import Counter
from pathlib import Path

from pymongo import monitoring

DUMP_INTERVAL = 2.0


class CommandCounter(monitoring.CommandListener):
    def __init__(self, out_dir: Path):
        self.out_dir = out_dir
        self.counts: Counter[str] = Counter()
        self._dumped_at = 0.0

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        # "update _crawl_hosts": the command and the collection it names, if any
        target = event.command.get(event.command_name)
        name = event.command_name
        self.counts[f"{name} {target}" if isinstance(target, str) else name] += 1
        now = time.monotonic()
        if now - self._dumped_at > DUMP_INTERVAL:
            self._dumped_at = now
            self.dump()

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass

    def dump(self) -> None:
        path = self.out_dir / f"{os.getpid()}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"argv": sys.argv, "commands": dict(self.counts)}), "utf-8")
        os.replace(tmp, path)


def install(out_dir: Path) -> CommandCounter:
    out_dir.mkdir(parents=True, exist_ok=True)
    counter = CommandCounter(out_dir)
    monitoring.register(counter)
    atexit.register(counter.dump)
    return counter


def read(out_dir: Path) -> Counter[str]:
    """Commands by name and collection ("find _crawl_robots"), summed over the processes that
    wrote into `out_dir`."""
    total: Counter[str] = Counter()
    for path in sorted(Path(out_dir).glob("*.json")):
        total.update(json.loads(path.read_text("utf-8"))["commands"])
    return total


# commands a pymongo client sends by itself, whatever the application does (server monitoring)
HANDSHAKE = frozenset({"hello", "ismaster", "isMaster", "endSessions", "ping"})


def application_commands(counts: Counter[str]) -> int:
    """The commands the application asked for (not the client's own monitoring)."""
    return sum(n for name, n in counts.items() if name.split(" ")[0] not in HANDSHAKE)


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        raise SystemExit("usage: python -m bench.e2e.mongo_commands OUT_DIR MODULE [ARGS ...]")
    install(Path(argv[0]))
    sys.argv = [argv[1], *argv[2:]]
    runpy.run_module(argv[1], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
