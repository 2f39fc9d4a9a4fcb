"""The staging area: the files the stages hand to each other (docs/ARCHITECTURE.md).

Every write is atomic (write to a temporary name, then rename), so a killed process never leaves a
half-written file that a later stage would trust.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from enrich_crawl.contracts import CANDIDATES_FILE, CRAWL_STATS_FILE, RECORD_OUTCOMES_FILE

_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def json_default(value: Any) -> Any:
    """JSON encoder fallback for the values we stage (dates, numpy scalars, sets)."""
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    raise TypeError(f"cannot stage a value of type {type(value).__name__}")


def dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, default=json_default, separators=(",", ":"))


@contextmanager
def atomic_write(path: Path, mode: str = "w") -> Iterator[IO[Any]]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        encoding = None if "b" in mode else "utf-8"
        with os.fdopen(fd, mode, encoding=encoding) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_json(path: Path, obj: Any) -> None:
    with atomic_write(path) as handle:
        handle.write(json.dumps(obj, ensure_ascii=False, default=json_default, indent=2))


def read_json(path: Path) -> Any:
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def write_jsonl(path: Path, rows: Iterable[Any]) -> int:
    count = 0
    with atomic_write(path) as handle:
        for row in rows:
            handle.write(dumps(row))
            handle.write("\n")
            count += 1
    return count


def read_jsonl(path: Path) -> Iterator[Any]:
    """Yield the rows of a JSON-lines file; a truncated last line (killed writer) is skipped."""
    if not path.exists():
        return
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            line = line.strip()
            if not line:
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue


@dataclass(frozen=True)
class DatasetStage:
    """Paths of one dataset's staging area."""

    root: Path
    dataset: str

    def __post_init__(self) -> None:
        if not _SAFE_NAME.match(self.dataset):
            raise ValueError(
                f"dataset name {self.dataset!r} must be 1-128 characters of letters, digits, "
                "'_', '.', '-' (it names a MongoDB collection and a folder)"
            )

    @property
    def base(self) -> Path:
        return self.root / self.dataset

    # seed_dataset
    @property
    def seed_dir(self) -> Path:
        return self.base / "seed"

    @property
    def seed_manifest(self) -> Path:
        return self.seed_dir / "manifest.json"

    def seed_shard(self, shard: str) -> Path:
        return self.seed_dir / f"shard={shard}.parquet"

    @property
    def rejected(self) -> Path:
        return self.seed_dir / "rejected.jsonl"

    # learned_mappings (SPEC 3b): the learned mapping files and learn-report.json, and the
    # collecting crawls of learning and of the mapping_agreement check
    @property
    def learned_dir(self) -> Path:
        return self.base / "learned"

    @property
    def learn_work(self) -> Path:
        return self.base / "learn"

    @property
    def agreement_work(self) -> Path:
        return self.base / "agreement"

    # crawl_results
    def crawl_dir(self, shard: str) -> Path:
        return self.base / "crawl" / shard

    def candidates(self, shard: str) -> Path:
        return self.crawl_dir(shard) / CANDIDATES_FILE

    def record_outcomes(self, shard: str) -> Path:
        return self.crawl_dir(shard) / RECORD_OUTCOMES_FILE

    def crawl_stats(self, shard: str) -> Path:
        return self.crawl_dir(shard) / CRAWL_STATS_FILE

    # resolved_fields
    def resolved(self, shard: str) -> Path:
        return self.base / "resolved" / f"{shard}.jsonl"

    def resolved_summary(self, shard: str) -> Path:
        return self.base / "resolved" / f"{shard}.summary.json"


CLAIM_FILE = "claim.json"


class StaleAttempt(Exception):
    """A crawl attempt that must not touch its shard's files: its run has ended, or a newer
    attempt (or another live run) owns them."""


def claim_shard(
    crawl_dir: Path, run_id: str, attempt: int, is_live: Any, node: str = ""
) -> dict[str, Any]:
    """Make this (run, attempt) the owner of a shard's crawl files, or raise StaleAttempt.

    A task redelivered late (a Celery worker lost with its task unacknowledged, the task handed
    out again an hour later) would otherwise clear and rewrite the files of whichever run crawls
    that shard now. The owner is recorded in `claim.json` under a file lock; an attempt takes it
    only when its own run is live (`is_live(run_id)`) and the current owner is an older attempt of
    the same run or a run that is no longer live."""
    import fcntl

    crawl_dir.mkdir(parents=True, exist_ok=True)
    with open(crawl_dir / ".claim.lock", "a+", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not is_live(run_id):
            raise StaleAttempt(f"run {run_id} is no longer running: its attempt is stale")
        try:
            owner = read_json(crawl_dir / CLAIM_FILE)
        except (OSError, ValueError):
            owner = None
        if isinstance(owner, dict) and owner.get("run_id"):
            if owner["run_id"] == run_id and int(owner.get("attempt", -1)) >= attempt:
                raise StaleAttempt(
                    f"attempt {owner.get('attempt')} of run {run_id} (on {owner.get('node')}) "
                    f"already owns {crawl_dir}: attempt {attempt} is stale or a duplicate"
                )
            if owner["run_id"] != run_id and is_live(owner["run_id"]):
                raise StaleAttempt(
                    f"run {owner['run_id']} (live, on {owner.get('node')}) is crawling "
                    f"{crawl_dir}: two runs of one dataset cannot share its staging area"
                )
        claim = {"run_id": run_id, "attempt": attempt, "node": node, "at": time_now()}
        write_json(crawl_dir / CLAIM_FILE, claim)
        return claim


def shard_owner(crawl_dir: Path) -> dict[str, Any] | None:
    try:
        owner = read_json(crawl_dir / CLAIM_FILE)
    except (OSError, ValueError):
        return None
    return owner if isinstance(owner, dict) else None


def time_now() -> float:
    import time

    return time.time()
