"""`enrich-crawl run`'s progress: records and partitions done, pages/s, and who holds the crawl
pool slots the run waits for. Read from the files the stages write (seed manifest, each crawl's
progress/stats file), so it works whichever executor runs the steps."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from enrich_crawl.staging import DatasetStage


def read_json_or_none(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text("utf-8"))
    except (OSError, ValueError):
        return None


POOL_CHECK_SECONDS = 5.0


class Progress:
    """Records and partitions done, pages/s: a bar on a terminal, a log line every 10 s otherwise.

    Read from the files the stages write (seed manifest, each crawl's progress/stats file), so it
    works whichever executor runs the steps."""

    def __init__(
        self, stage: DatasetStage, stream: TextIO, pool_wait: Callable[[], str] | None = None
    ):
        self.stage = stage
        self.stream = stream
        # who holds the pool slots the run waits for ("" when it waits for none)
        self.pool_wait = pool_wait
        self._pool_checked = -POOL_CHECK_SECONDS
        self._pool_note = ""
        self.tty = stream.isatty()
        self.started = time.monotonic()
        self.started_wall = time.time()
        self.last_line = 0.0

    def _fresh(self, data: dict[str, Any] | None) -> bool:
        return bool(data) and float(data.get("started_at", 0)) >= self.started_wall - 1

    def read(self) -> dict[str, Any]:
        manifest = read_json_or_none(self.stage.seed_manifest)
        if manifest is None or not self._fresh({"started_at": _iso_ts(manifest.get("created_at"))}):
            return {"total": 0, "shards": 0, "partitions_done": 0, "records_done": 0, "pages": 0}
        state = {
            "total": manifest["profile"]["usable"],
            "shards": len(manifest["shards"]),
            "partitions_done": 0,
            "records_done": 0,
            "pages": 0,
        }
        for shard in manifest["shards"]:
            final = read_json_or_none(self.stage.crawl_stats(shard))
            current = (
                final
                if self._fresh(final)
                else read_json_or_none(self.stage.crawl_dir(shard) / "progress.json")
            )
            if not self._fresh(current):
                continue
            state["records_done"] += current.get("records_done", 0)
            state["pages"] += current.get("pages", 0)
            if current is final:
                state["partitions_done"] += 1
        if state["partitions_done"] < state["shards"]:
            state["waiting"] = self._pool_wait()
        return state

    def _pool_wait(self) -> str:
        """'waiting for the crawl pool: ...' while steps of this run wait for pool slots (asked
        at most every POOL_CHECK_SECONDS)."""
        if self.pool_wait is None:
            return ""
        if time.monotonic() - self._pool_checked >= POOL_CHECK_SECONDS:
            self._pool_checked = time.monotonic()
            try:
                self._pool_note = self.pool_wait()
            except Exception:  # the progress line must never stop the run
                self._pool_note = ""
        return self._pool_note

    def show(self, final: bool = False) -> None:
        if not (self.tty or final) and time.monotonic() - self.last_line < 10:
            return  # no line due: nothing to read
        state = self.read()
        elapsed = max(time.monotonic() - self.started, 1e-6)
        rate = state["pages"] / elapsed
        if self.tty:
            width = 30
            frac = min(state["records_done"] / state["total"], 1.0) if state["total"] else 0.0
            filled = int(frac * width)
            self.stream.write(
                f"\r[{'#' * filled}{'-' * (width - filled)}] records {state['records_done']}/"
                f"{state['total']}  partitions {state['partitions_done']}/{state['shards']}  "
                f"{rate:.1f} pages/s  {elapsed:.0f}s "
                + (f" {state['waiting']} " if state.get("waiting") else "")
            )
            if final:
                self.stream.write("\n")
            self.stream.flush()
        else:
            self.last_line = time.monotonic()
            self.stream.write(
                f"progress: records {state['records_done']}/{state['total']}, partitions "
                f"{state['partitions_done']}/{state['shards']}, {state['pages']} pages "
                f"({rate:.1f}/s), {elapsed:.0f}s"
                + (f"; {state['waiting']}" if state.get("waiting") else "")
                + "\n"
            )
            self.stream.flush()


def _iso_ts(value: Any) -> float:
    import datetime as dt

    try:
        return dt.datetime.fromisoformat(str(value)).timestamp()
    except (TypeError, ValueError):
        return 0.0
