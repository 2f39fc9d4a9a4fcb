"""The memory of a process tree (Linux /proc): the crawl, the Playwright driver and every
Chromium process, summed and by part (the browser handler's statistics, the tests' process
watch)."""

from __future__ import annotations

import os


def _children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", encoding="ascii", errors="replace") as handle:
                stat = handle.read()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 2:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    return children


def process_tree(pid: int) -> list[int]:
    """`pid` and all its descendants (Linux /proc)."""
    children = _children()
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo.extend(children.get(current, ()))
    return tree


def tree_memory(pid: int | None = None) -> dict[str, float]:
    """RSS summed over the process tree of `pid` (this process by default: the crawl, the
    Playwright driver and every Chromium process), and PSS (shared pages counted once), in total
    and by part: `crawl` (the root process), `driver` (Playwright's node), `browser` (Chromium)."""
    root = pid or os.getpid()
    rss = 0
    pss = {"crawl": 0, "driver": 0, "browser": 0}
    pids = process_tree(root)
    page_size = os.sysconf("SC_PAGE_SIZE")
    for proc in pids:
        try:
            with open(f"/proc/{proc}/statm", encoding="ascii") as handle:
                rss += int(handle.read().split()[1]) * page_size
            with open(f"/proc/{proc}/comm", encoding="ascii", errors="replace") as handle:
                comm = handle.read().strip()
            part = "crawl" if proc == root else "driver" if comm.startswith("node") else "browser"
            with open(f"/proc/{proc}/smaps_rollup", encoding="ascii") as handle:
                for line in handle:
                    if line.startswith("Pss:"):
                        pss[part] += int(line.split()[1]) * 1024
                        break
        except (OSError, ValueError, IndexError):
            continue
    mb = 1024 * 1024
    out = {
        "rss_mb": round(rss / mb, 1),
        "pss_mb": round(sum(pss.values()) / mb, 1),
        "processes": len(pids),
    }
    out.update({f"{part}_pss_mb": round(value / mb, 1) for part, value in pss.items()})
    return out
