"""Measurements: a process tree's time, CPU and memory; politeness and pages from the virtual web's
request log; accuracy against the generated ground truth.

- :func:`run_measured` runs a command to the end: wall time, CPU seconds of the whole tree (user+sys
  of every descendant, sampled with psutil every 0.1 s, also by role; ``getrusage(RUSAGE_CHILDREN)``
  is kept as a floor but misses what Dagster's forkserver runs, since nobody waits for it), peak RSS
  per process and of the tree's total (same samples, plus the kernel's ``ru_maxrss``).
- :func:`request_stats` reads the request log of one crawler (by User-Agent and time window): pages,
  statuses, and politeness violations across all its processes: requests to paths robots.txt
  disallows, requests to a host before its robots.txt, two requests to one host closer than its
  Crawl-delay (or the default), two requests to one host at the same time.
- :func:`accuracy` scores per-record values against ``truth.jsonl``.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from bench.e2e.common import RobotsRules
from enrich_crawl.values import clean_text

# --------------------------------------------------------------------------------------------------
# process trees


@dataclass
class ProcInfo:
    pid: int
    role: str
    cmd: str
    peak_rss: int = 0
    user: float = 0.0  # CPU seen at the last sample
    system: float = 0.0
    looks: int = 0  # times its command line was read again

    @property
    def cpu(self) -> float:
        return self.user + self.system


@dataclass
class RunMetrics:
    label: str
    cmd: list[str]
    returncode: int | None = None
    timed_out: bool = False
    wall_s: float = 0.0
    started_at: float = 0.0  # epoch seconds (to cut the request log)
    ended_at: float = 0.0
    cpu_user_s: float = 0.0  # whole tree: psutil samples (or rusage when it saw more)
    cpu_sys_s: float = 0.0
    cpu_rusage_s: float = 0.0  # getrusage(RUSAGE_CHILDREN): only descendants reaped by waiters
    cpu_sampled_s: float = 0.0  # psutil, whole tree (misses the last 0.1 s of each process)
    cpu_by_role_s: dict[str, float] = field(default_factory=dict)
    peak_rss_total_mb: float = 0.0
    peak_rss_max_mb: float = 0.0  # largest single process
    ru_maxrss_mb: float = 0.0
    peak_rss_by_role_mb: dict[str, float] = field(default_factory=dict)
    processes: list[dict[str, Any]] = field(default_factory=list)
    stdout_path: str = ""
    stderr_path: str = ""

    @property
    def cpu_s(self) -> float:
        return self.cpu_user_s + self.cpu_sys_s

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["cpu_s"] = round(self.cpu_s, 3)
        return out


ROLE_LOOKS = 30  # samples (0.1 s) during which a new process's command line is read again
ROLES = (
    ("crawl_worker", "enrich_crawl.crawl.worker"),
    ("seed_baseline", "bench.e2e.baseline_seed"),
    ("bfs_baseline", "bench.e2e.baseline_bfs"),
    ("floor", "bench.e2e.floor"),
    ("dagster", "dagster"),
    ("enrich_crawl", "enrich-crawl"),
)


def _role(cmdline: list[str]) -> str:
    text = " ".join(cmdline)
    for role, needle in ROLES:
        if needle in text:
            return role
    return "other"


class TreeSampler(threading.Thread):
    """Samples RSS and CPU of a process and all its descendants until stopped."""

    def __init__(self, pid: int, interval: float = 0.1):
        super().__init__(daemon=True)
        self.pid = pid
        self.interval = interval
        self.procs: dict[tuple[int, float], ProcInfo] = {}
        self.peak_total = 0
        self._halt = threading.Event()

    def run(self) -> None:
        try:
            root = psutil.Process(self.pid)
        except psutil.Error:
            return
        while not self._halt.is_set():
            try:
                tree = [root, *root.children(recursive=True)]
            except psutil.Error:
                tree = []
            total = 0
            for proc in tree:
                try:
                    with proc.oneshot():
                        key = (proc.pid, proc.create_time())
                        rss = proc.memory_info().rss
                        times = proc.cpu_times()
                        info = self.procs.get(key)
                        if info is None:
                            cmdline = proc.cmdline()
                            info = ProcInfo(proc.pid, _role(cmdline), " ".join(cmdline)[:300])
                            self.procs[key] = info
                        elif info.looks < ROLE_LOOKS:
                            # a child seen between its fork and its exec still shows the parent's
                            # command line (a crawl worker forked by Dagster's forkserver): look
                            # again during its first seconds
                            info.looks += 1
                            cmdline = proc.cmdline()
                            info.role, info.cmd = _role(cmdline), " ".join(cmdline)[:300]
                    info.peak_rss = max(info.peak_rss, rss)
                    info.user, info.system = times.user, times.system
                    total += rss
                except psutil.Error:
                    continue
            self.peak_total = max(self.peak_total, total)
            self._halt.wait(self.interval)

    def stop(self) -> None:
        self._halt.set()
        self.join(5)


def run_measured(
    label: str,
    cmd: list[str],
    *,
    env: dict[str, str] | None = None,
    cwd: str | Path | None = None,
    log_dir: Path,
    timeout: float | None = None,
) -> RunMetrics:
    """Run cmd (its own session) to the end, measuring its whole process tree."""
    log_dir.mkdir(parents=True, exist_ok=True)
    metrics = RunMetrics(label, [str(c) for c in cmd])
    out_path, err_path = log_dir / f"{label}.stdout", log_dir / f"{label}.stderr"
    metrics.stdout_path, metrics.stderr_path = str(out_path), str(err_path)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    metrics.started_at = time.time()
    started = time.monotonic()
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(
            metrics.cmd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )
        sampler = TreeSampler(proc.pid)
        sampler.start()
        try:
            metrics.returncode = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            metrics.timed_out = True
            _kill_tree(proc)
            metrics.returncode = proc.wait()
        except BaseException:
            _kill_tree(proc)
            proc.wait()
            raise
        finally:
            sampler.stop()
    metrics.wall_s = round(time.monotonic() - started, 3)
    metrics.ended_at = time.time()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # Dagster's forkserver is never waited for, so rusage misses the step processes: the psutil
    # samples are the measure, rusage a floor (it wins only for very short-lived trees)
    rusage_user = after.ru_utime - before.ru_utime
    rusage_sys = after.ru_stime - before.ru_stime
    metrics.cpu_rusage_s = round(rusage_user + rusage_sys, 3)
    metrics.ru_maxrss_mb = round(after.ru_maxrss / 1024, 1)  # KiB on Linux; max over all children
    procs = list(sampler.procs.values())
    sampled_user, sampled_sys = sum(p.user for p in procs), sum(p.system for p in procs)
    metrics.cpu_sampled_s = round(sampled_user + sampled_sys, 3)
    if metrics.cpu_rusage_s > metrics.cpu_sampled_s:
        metrics.cpu_user_s, metrics.cpu_sys_s = round(rusage_user, 3), round(rusage_sys, 3)
    else:
        metrics.cpu_user_s, metrics.cpu_sys_s = round(sampled_user, 3), round(sampled_sys, 3)
    by_role: Counter[str] = Counter()
    peak_role: dict[str, float] = {}
    for p in procs:
        by_role[p.role] += p.cpu
        peak_role[p.role] = max(peak_role.get(p.role, 0.0), p.peak_rss / 2**20)
    metrics.cpu_by_role_s = {k: round(v, 3) for k, v in by_role.items()}
    metrics.peak_rss_by_role_mb = {k: round(v, 1) for k, v in peak_role.items()}
    metrics.peak_rss_total_mb = round(sampler.peak_total / 2**20, 1)
    metrics.peak_rss_max_mb = round(max((p.peak_rss for p in procs), default=0) / 2**20, 1)
    metrics.processes = [
        {"pid": p.pid, "role": p.role, "peak_rss_mb": round(p.peak_rss / 2**20, 1), "cpu_s": p.cpu}
        for p in sorted(procs, key=lambda p: -p.peak_rss)[:40]
    ]
    return metrics


def _kill_tree(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)


def run_parallel(
    jobs: list[tuple[str, list[str]]],
    *,
    env: dict[str, str] | None = None,
    log_dir: Path,
    timeout: float | None = None,
) -> RunMetrics:
    """Several commands at once, measured as one tree (a tiny shell parent waits for them all)."""
    script = " & ".join(
        f"{' '.join(_quote(c) for c in cmd)} > {_quote(str(log_dir / f'{name}.stdout'))} "
        f"2> {_quote(str(log_dir / f'{name}.stderr'))}"
        for name, cmd in jobs
    )
    label = jobs[0][0].rsplit("-", 1)[0] if jobs else "parallel"
    return run_measured(
        label, ["bash", "-c", f"{script} & wait"], env=env, log_dir=log_dir, timeout=timeout
    )


def _quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


# --------------------------------------------------------------------------------------------------
# the request log


class HostRules:
    """robots.txt of each host of the benchmark web, as a polite crawler must read it."""

    def __init__(self, web_root: Path, hosts: dict[str, dict[str, Any]]):
        self.web_root = Path(web_root)
        self.hosts = hosts
        self._rules: dict[str, RobotsRules] = {}

    def rules(self, host: str) -> RobotsRules | None:
        if host in self._rules:
            return self._rules[host]
        info = self.hosts.get(host)
        if info is None:
            return None
        state = info.get("robots", "ok")
        if state in ("error", "unreachable"):
            rules = RobotsRules.from_response(None, b"")
        else:
            path = self.web_root / host / "robots.txt"
            if path.exists():
                rules = RobotsRules.from_response(200, path.read_bytes())
            else:
                rules = RobotsRules.from_response(404, b"")
        self._rules[host] = rules
        return rules


def select_requests(
    entries: list[dict[str, Any]], *, ua_prefix: str, t0: float, t1: float
) -> list[dict[str, Any]]:
    return [
        e
        for e in entries
        if t0 <= e.get("t", 0) <= t1
        and e.get("method") != "CONNECT"
        and str(e.get("ua", "")).startswith(ua_prefix)
    ]


# seconds the server's log of an answer may lag its last byte (its event loop, on a loaded machine);
# on a host with a delay, a real overlap is also far below the delay
OVERLAP_SLACK = 0.05


def request_stats(
    entries: list[dict[str, Any]],
    rules: HostRules,
    *,
    default_delay: float,
    tolerance: float = 0.05,
) -> dict[str, Any]:
    """Pages and politeness of one crawler's requests (already selected by agent and window)."""
    by_host: dict[str, list[dict[str, Any]]] = {}
    for entry in entries:
        by_host.setdefault(entry.get("host", ""), []).append(entry)
    statuses: Counter[str] = Counter()
    pages = robots = 0
    disallowed, before_robots, too_close, too_close_after_robots, overlapping = [], [], [], [], []
    unknown_hosts = 0
    bound = 0.0
    min_gap_ratio = None
    min_arrival_gap = float("inf")
    for host, reqs in by_host.items():
        reqs.sort(key=lambda e: e["t"])
        host_rules = rules.rules(host)
        if host_rules is None:
            unknown_hosts += len(reqs)
        ua = str(reqs[0].get("ua", ""))
        delay = host_rules.delay(ua, default_delay) if host_rules is not None else default_delay
        bound = max(bound, (len(reqs) - 1) * delay)
        seen_robots = False
        for i, req in enumerate(reqs):
            path = req.get("path", "")
            is_robots = path == "/robots.txt"
            if is_robots:
                robots += 1
                seen_robots = True
            else:
                pages += 1
                statuses[str(req.get("status"))] += 1
                if not seen_robots:
                    before_robots.append(f"{host}{path}")
                scheme = "https" if req.get("tls") else "http"
                if host_rules is not None and not host_rules.allowed(
                    f"{scheme}://{host}{path}", str(req.get("ua", ""))
                ):
                    disallowed.append(f"{host}{path}")
            if i == 0:
                continue
            # the rule: the next request of a host leaves >= delay after the previous answer. The
            # server finished sending that answer at t + dur, before the crawler had it, and sees
            # the next request after the crawler sent it: a crawler keeping the rule always shows
            # arrival - previous end >= delay here (server-side lag aside: `tolerance`)
            prev = reqs[i - 1]
            prev_end = prev["t"] + prev.get("dur", 0.0)
            gap = req["t"] - prev_end
            min_arrival_gap = min(min_arrival_gap, req["t"] - prev["t"])
            if gap < -OVERLAP_SLACK:
                overlapping.append(f"{host}{path}")
                continue
            if delay > 0:
                ratio = gap / delay
                min_gap_ratio = ratio if min_gap_ratio is None else min(min_gap_ratio, ratio)
                if gap < delay - tolerance:
                    where = f"{host}: {gap:.3f}s after the answer < {delay:g}s before {path}"
                    if prev.get("path") == "/robots.txt":
                        too_close_after_robots.append(where)
                    else:
                        too_close.append(where)
    times = [e["t"] for e in entries]
    window = (max(times) - min(times)) if times else 0.0
    violations = (
        len(disallowed)
        + len(before_robots)
        + len(too_close)
        + len(too_close_after_robots)
        + len(overlapping)
    )
    return {
        "requests": len(entries),
        "pages": pages,
        "robots_requests": robots,
        "hosts": len(by_host),
        "statuses": dict(sorted(statuses.items())),
        "unknown_host_requests": unknown_hosts,
        "crawl_window_s": round(window, 3),
        "politeness_bound_s": round(bound, 3),
        # meaningless without delays (the CPU-bound case): None
        "politeness_efficiency": round(bound / window, 3) if window > 0 and bound > 0 else None,
        # (next arrival - previous answer's end) / delay, smallest over all hosts with a delay
        "min_gap_over_delay": round(min_gap_ratio, 3) if min_gap_ratio is not None else None,
        "min_arrival_gap_s": round(min_arrival_gap, 3) if min_arrival_gap != float("inf") else None,
        "tolerance_s": tolerance,
        "violations": violations,
        "violations_by_kind": {
            "disallowed": len(disallowed),
            "before_robots": len(before_robots),
            "too_close": len(too_close),
            "too_close_after_robots": len(too_close_after_robots),
            "overlapping": len(overlapping),
        },
        "violation_examples": {
            "disallowed": disallowed[:5],
            "before_robots": before_robots[:5],
            "too_close": too_close[:5],
            "too_close_after_robots": too_close_after_robots[:5],
            "overlapping": overlapping[:5],
        },
    }


# --------------------------------------------------------------------------------------------------
# accuracy


_TYPOGRAPHIC = str.maketrans({"\u201c": '"', "\u201d": '"', "\u2018": "'", "\u2019": "'"})


def _text(value: Any) -> str:
    """Whitespace collapsed, typographic quotes as ASCII (Sphinx curls the sources' quotes)."""
    return clean_text(str(value).translate(_TYPOGRAPHIC))


def same_value(truth: Any, got: Any, ftype: str) -> bool:
    if got is None:
        return False
    try:
        if ftype in ("integer", "number"):
            return float(got) == float(truth)
        if ftype == "boolean":
            return str(got).lower() == str(truth).lower()
        if ftype == "list":
            items = got if isinstance(got, list) else [got]
            want = truth if isinstance(truth, list) else [truth]
            return sorted(_text(x) for x in items) == sorted(_text(x) for x in want)
    except (TypeError, ValueError):
        return False
    return _text(got) == _text(truth)


def accuracy(
    truth: dict[str, dict[str, Any]],
    values: dict[str, dict[str, Any]],
    field_types: dict[str, str],
    *,
    attempted: set[str] | None = None,
) -> dict[str, Any]:
    """Score the values a run found per record ({record: {field: value}}) against the truth.

    Only the records in ``attempted`` (default: all) count; a *findable* field scores correct, wrong
    (another value) or missed (none); a value for a field that is unreachable by design is
    ``unexpected``. A record is resolvable when one of its missing fields is findable, resolved when
    every findable missing field is correct.
    """
    ids = set(truth) if attempted is None else (set(attempted) & set(truth))
    per_field: dict[str, Counter[str]] = {}
    resolvable = resolved = 0
    wrong_examples: list[dict[str, Any]] = []
    for rid in ids:
        row = truth[rid]
        got = values.get(rid, {})
        findable_any = False
        all_ok = True
        for fname in row["missing"]:
            counts = per_field.setdefault(fname, Counter())
            value = got.get(fname)
            if row["findable"].get(fname):
                findable_any = True
                counts["findable"] += 1
                if value is None:
                    counts["missed"] += 1
                    all_ok = False
                elif same_value(row["truth"][fname], value, field_types.get(fname, "string")):
                    counts["correct"] += 1
                else:
                    counts["wrong"] += 1
                    all_ok = False
                    if len(wrong_examples) < 10:
                        wrong_examples.append(
                            {
                                "record": rid,
                                "field": fname,
                                "truth": row["truth"][fname],
                                "got": value,
                            }
                        )
            else:
                counts["unfindable"] += 1
                if value is not None:
                    counts["unexpected"] += 1
        if findable_any:
            resolvable += 1
            if all_ok:
                resolved += 1
    total: Counter[str] = Counter()
    for counts in per_field.values():
        total.update(counts)
    scored = total["correct"] + total["wrong"] + total["missed"]
    produced = total["correct"] + total["wrong"] + total["unexpected"]
    return {
        "records": len(ids),
        "resolvable_records": resolvable,
        "resolved_records": resolved,
        "accuracy": round(total["correct"] / scored, 4) if scored else None,
        "precision": round(total["correct"] / produced, 4) if produced else None,
        "fields": dict(total),
        "per_field": {
            name: {
                **dict(counts),
                "accuracy": round(counts["correct"] / counts["findable"], 4)
                if counts["findable"]
                else None,
            }
            for name, counts in sorted(per_field.items())
        },
        "wrong_examples": wrong_examples,
    }


def product_values(mongo_uri: str, database: str, collection: str) -> dict[str, dict[str, Any]]:
    """Every record's ``data`` as the product left it in MongoDB (docs/results.md)."""
    import pymongo

    client = pymongo.MongoClient(mongo_uri, serverSelectionTimeoutMS=10000)
    try:
        return {
            str(doc["_id"]): doc.get("data") or {}
            for doc in client[database][collection].find({}, {"data": 1})
        }
    finally:
        client.close()
