"""`python -m bench.memprobe DIR`: each sampled process's samples (MB) and its census at its peak."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def load(path: Path) -> list[dict[str, Any]]:
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            rows.append(json.loads(line))
        except ValueError:  # the last line of a process killed while writing
            print(f"{path}:{number}: not JSON, skipped")
    return rows


def _collector(gc: dict[str, Any]) -> str:
    runs = "/".join(str(runs) for runs, _ in gc["stats"])
    found = "/".join(str(found) for _, found in gc["stats"])
    return f"; gc young {gc['count'][0]}, runs {runs}, found {found}"


def report(path: Path, top: int = 20) -> list[str]:
    rows = load(path)
    lines = [f"{path.name}  (t s: RSS = anon + file; jemalloc resident/allocated; pymalloc "
             "arenas/bytes in blocks; objects; fds; collector: young count, runs of each "
             "generation)"]  # fmt: skip
    for row in rows:
        st, je, py = row["status"], row.get("jemalloc", {}), row.get("pymalloc", {})
        census = row.get("census", {})
        lines.append(
            f"  {row['t']:>7} s: {st.get('VmRSS')} = {st.get('RssAnon')} + {st.get('RssFile')}"
            f" (peak {st.get('VmHWM')})"
            f"; je {je.get('resident', '-')}/{je.get('allocated', '-')}"
            + (f"; py {py.get('arenas')}/{py.get('bytes_in_blocks')}" if py else "")
            + (f"; {census['objects']} objects; {census['fds']} fds" if census else "")
            + (_collector(row["gc"]) if "gc" in row else "")
        )
    with_census = [row for row in rows if "census" in row]
    if with_census:
        peak = max(with_census, key=lambda row: row["status"].get("VmRSS", 0))
        lines.append(f"  census at {peak['t']} s (type, count, shallow MB):")
        lines += [f"    {name} {count} {mb}" for name, count, mb in peak["census"]["top"][:top]]
        if "shapes" in peak:
            lines.append("  shapes at the same time (count, shape):")
            lines += [f"    {count} {name}" for name, count in peak["shapes"][:top]]
    for row in rows:
        if "collected" in row:
            got = row["collected"]
            lines.append(
                f"  collected at {row['t']} s: {got['found']} objects unreachable in {got['ms']} "
                f"ms; {got['objects_after']} objects and RSS {got['status_after'].get('VmRSS')} "
                "after"
            )
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.memprobe", description=__doc__)
    parser.add_argument("dir", type=Path, help="MEMPROBE_DIR of the sampled run")
    parser.add_argument("--top", type=int, default=20, help="types shown from the peak census")
    args = parser.parse_args(argv)
    files = sorted(args.dir.glob("*.jsonl"))
    if not files:
        raise SystemExit(f"memprobe: no samples in {args.dir} (was MEMPROBE_DIR set?)")
    for path in files:
        print("\n".join(report(path, args.top)))


if __name__ == "__main__":
    main()
