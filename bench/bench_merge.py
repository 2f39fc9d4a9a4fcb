"""Merge throughput: resolved records with lineage into MongoDB, against a bare insert_many.

    python -m bench.bench_merge [--records 100000] [--partitions 10] [--batch-size 2000]
                                [--data-dir D] [--no-reads-variant]

Everything runs against one nx-27017 server started for the benchmark (in memory unless --data-dir),
in one process. The records are staged as the pipeline stages them: one `resolved/<key>.jsonl` file
per partition. Two collections fill side by side, partition by partition, the order of the pair
alternating, so a change of load on a shared machine hits both alike:

- ceiling: `insert_many(ordered=False)` of the very documents the merge writes (built beforehand)
  into a collection that was empty, without secondary indexes;
- merge: one `Merger` (as the `enriched_records` step uses it) merging each partition's staged file
  (read and parsed here) into a collection that was empty; then `ensure_indexes`, timed apart.

Then, standalone: the re-run (the merge again over the merged collection: nothing changes, nothing
is written) and, unless --no-reads-variant, the merge with the read of existing documents forced
(what a collection that was not empty costs for new ids). A breakdown of the Python side (parse,
build, BSON encoding, without the server) says what dominates. Results: bench/results/bench_merge.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import platform
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import bson
import pymongo

from enrich_crawl.staging import read_jsonl, write_jsonl
from enrich_crawl.store.merge import Merger, MergeStats, build_document
from enrich_crawl.store.mongo import ensure_indexes
from enrich_crawl.testing.services import ephemeral_mongo

RESULTS = Path(__file__).resolve().parent / "results"

FIELDS: dict[str, dict[str, Any]] = {
    "description": {"type": "string"},
    "city": {"type": "string"},
    "country": {"type": "string"},
    "founded": {"type": "integer"},
    "employees": {"type": "integer"},
    "email": {"type": "string"},
    "phone": {"type": "string"},
    "tags": {"type": "list"},
    "open_source": {"type": "boolean"},
    "last_release": {"type": "date", "refresh": True},
}
CITIES = ["Springfield", "Bristol", "Aarhus", "Leeds", "Zürich", "Lyon", "Porto", "Gdańsk"]
COUNTRIES = ["United States", "United Kingdom", "Denmark", "Switzerland", "France", "Portugal"]


def _value(name: str, rng: random.Random, i: int) -> Any:
    if name == "description":
        return f"Organisation {i} builds things for customers in {rng.choice(CITIES)}. " * 2
    if name == "city":
        return rng.choice(CITIES)
    if name == "country":
        return rng.choice(COUNTRIES)
    if name == "founded":
        return rng.randint(1900, 2024)
    if name == "employees":
        return rng.randint(1, 50000)
    if name == "email":
        return f"info@org{i}.example"
    if name == "phone":
        return f"+44 117 496 {i % 10000:04d}"
    if name == "tags":
        return rng.sample(["widgets", "robots", "coffee", "sensors", "open hardware", "IoT"], 3)
    if name == "open_source":
        return rng.random() < 0.5
    return f"2025-0{rng.randint(1, 9)}-1{rng.randint(0, 9)}"


def resolved_lines(count: int, seed: int = 7) -> list[dict[str, Any]]:
    """`count` resolved lines shaped like resolve.py's: most fields missing and found, some
    conflicts, errors and normalised raw values."""
    rng = random.Random(seed)
    base = dt.datetime(2025, 6, 1, tzinfo=dt.timezone.utc)
    lines = []
    for i in range(count):
        rid = f"ORG-{i:07d}"
        host = f"org{i}.example"
        data: dict[str, Any] = {
            "org_id": rid,
            "name": f"Organisation {i}",
            "website": f"https://{host}/",
            "profile_url": f"https://directory.example/orgs/{i}",
        }
        raw: dict[str, Any] = {}
        winners: dict[str, Any] = {}
        for name in FIELDS:
            if rng.random() < 0.25:
                data[name] = _value(name, rng, i)  # present in the dataset
                continue
            data[name] = None
            if rng.random() < 0.3:
                raw[name] = "N/A"
            if rng.random() < 0.85:
                depth = rng.randint(0, 1)
                page = f"https://{host}/{'about' if depth else ''}"
                fetched = base + dt.timedelta(seconds=i, microseconds=rng.randint(0, 999999))
                winner = {
                    "value": _value(name, rng, i),
                    "source_url": page,
                    "mapping": "orgsite",
                    "depth": depth,
                    "fetched_at": fetched.isoformat(),
                    "http_status": 200,
                    "content_hash": hashlib.sha1(page.encode()).hexdigest(),
                    "rendered": False,
                    "candidates": 1,
                    "conflicts": 0,
                }
                if rng.random() < 0.1:
                    winner["candidates"] = 2
                    winner["conflicts"] = 1
                    winner["alternatives"] = [
                        {
                            "value": _value(name, rng, i + 1),
                            "source_url": "https://directory.example/orgs",
                            "mapping": "directory",
                            "depth": 1,
                        }
                    ]
                winners[name] = winner
        errors = []
        if rng.random() < 0.1:
            errors.append({"url": f"https://{host}/missing", "reason": "http_404"})
        lines.append(
            {
                "record": rid,
                "row": i + 2,
                "data": data,
                "raw": raw,
                "missing_before": [n for n in FIELDS if data[n] is None],
                "urls": [data["website"], data["profile_url"]],
                "fields": winners,
                "errors": errors,
                "pages": rng.randint(1, 4),
                "crawled": True,
            }
        )
    return lines


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)

    def pick(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 4)

    return {"p50": pick(0.5), "p95": pick(0.95), "max": round(ordered[-1], 4)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=2000)
    parser.add_argument("--data-dir", help="nx-27017 data folder (default: in memory)")
    parser.add_argument("--no-reads-variant", action="store_true")
    parser.add_argument("--out", default=str(RESULTS / "bench_merge.json"))
    args = parser.parse_args(argv)

    n = args.records
    now = dt.datetime.now(dt.timezone.utc)
    keys = [f"s{i:02d}" for i in range(args.partitions)]
    with tempfile.TemporaryDirectory(prefix="bench-merge-") as tmp:
        lines = resolved_lines(n)
        paths = {key: Path(tmp) / "resolved" / f"{key}.jsonl" for key in keys}
        for i, key in enumerate(keys):
            write_jsonl(paths[key], lines[i :: len(keys)])
        size_mb = sum(path.stat().st_size for path in paths.values()) / 1e6
        del lines

        # the Python side alone, without the server
        start = time.perf_counter()
        staged = {key: list(read_jsonl(paths[key])) for key in keys}
        parse_s = time.perf_counter() - start
        start = time.perf_counter()
        docs = {
            key: [
                build_document(ln, None, fields=FIELDS, run_id="bench", partition=key, now=now)[0]
                for ln in staged[key]
            ]
            for key in keys
        }
        build_s = time.perf_counter() - start
        del staged
        start = time.perf_counter()
        encoded = sum(len(bson.encode(doc)) for chunk in docs.values() for doc in chunk)
        encode_s = time.perf_counter() - start
        print(
            f"{n} records in {len(keys)} partitions, staged {size_mb:.1f} MB, average document "
            f"{encoded / n:.0f} B BSON; Python side alone: parse {n / parse_s:,.0f}/s, build "
            f"{n / build_s:,.0f}/s, BSON encode {n / encode_s:,.0f}/s",
            flush=True,
        )

        with ephemeral_mongo(data_dir=args.data_dir) as server:
            client = pymongo.MongoClient(server.uri, tz_aware=True)
            db = client["bench_merge"]
            ceiling_coll, merged_coll = db["ceiling"], db["merged"]
            batch_times: list[float] = []
            last = [0.0]

            def progress(_partition: str, _stats: MergeStats) -> None:
                t = time.perf_counter()
                batch_times.append(t - last[0])
                last[0] = t

            merger = Merger(
                merged_coll,
                fields=FIELDS,
                run_id="bench",
                now=now,
                batch_size=args.batch_size,
                progress=progress,
            )
            assert merger.fresh
            pairs = []
            for i, key in enumerate(keys):
                pair: dict[str, Any] = {"partition": key, "records": len(docs[key])}

                def ceiling(key=key, pair=pair) -> None:
                    start = time.perf_counter()
                    ceiling_coll.insert_many(docs[key], ordered=False)
                    pair["insert_many_s"] = time.perf_counter() - start

                def merge(key=key, pair=pair) -> None:
                    start = last[0] = time.perf_counter()
                    stats = merger.merge(read_jsonl(paths[key]), partition=key)
                    pair["merge_s"] = time.perf_counter() - start
                    assert stats.inserted == len(docs[key]), stats

                for step in (ceiling, merge) if i % 2 == 0 else (merge, ceiling):
                    step()
                pair["ratio"] = pair["insert_many_s"] / pair["merge_s"]
                pairs.append(pair)
                print(
                    f"  {key}: insert_many {pair['records'] / pair['insert_many_s']:,.0f}/s, "
                    f"merge {pair['records'] / pair['merge_s']:,.0f}/s, ratio {pair['ratio']:.2f}",
                    flush=True,
                )
            start = time.perf_counter()
            ensure_indexes(merged_coll)
            index_s = time.perf_counter() - start
            assert merged_coll.count_documents({}) == ceiling_coll.count_documents({}) == n
            insert_many_s = sum(p["insert_many_s"] for p in pairs)
            merge_s = sum(p["merge_s"] for p in pairs)

            # re-run: nothing changes, nothing is written
            rerun = Merger(merged_coll, fields=FIELDS, run_id="bench-2", batch_size=args.batch_size)
            start = time.perf_counter()
            for key in keys:
                stats = rerun.merge(read_jsonl(paths[key]), partition=key)
                assert stats.written == 0 and stats.unchanged == len(docs[key]), stats
            rerun_s = time.perf_counter() - start

            reads_s = None
            if not args.no_reads_variant:
                forced = Merger(
                    db["merged_reads"],
                    fields=FIELDS,
                    run_id="bench",
                    batch_size=args.batch_size,
                    fresh=False,
                )
                start = time.perf_counter()
                for key in keys:
                    forced.merge(read_jsonl(paths[key]), partition=key)
                reads_s = time.perf_counter() - start
            client.close()

    ratios = [p["ratio"] for p in pairs]
    summary = {
        "benchmark": "merge",
        "when": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "load_average": os.getloadavg(),
        },
        "server": "nx-27017 " + ("on disk" if args.data_dir else "in memory"),
        "records": n,
        "partitions": len(keys),
        "batch_size": args.batch_size,
        "staged_mb": round(size_mb, 1),
        "avg_document_bson_bytes": round(encoded / n),
        "python_side_records_per_s": {
            "parse": round(n / parse_s),
            "build": round(n / build_s),
            "bson_encode": round(n / encode_s),
        },
        "records_per_s": {
            "insert_many_ceiling": round(n / insert_many_s),
            "merge": round(n / merge_s),
            "merge_with_index_build": round(n / (merge_s + index_s)),
            "rerun_unchanged": round(n / rerun_s),
            **({"merge_with_reads": round(n / reads_s)} if reads_s else {}),
        },
        "ratio_to_insert_many": {
            "merge": round(insert_many_s / merge_s, 3),
            "merge_with_index_build": round(insert_many_s / (merge_s + index_s), 3),
            "per_partition": _percentiles(ratios) | {"min": round(min(ratios), 3)},
        },
        "merge_batch_seconds": _percentiles(batch_times),
        "pairs": pairs,
        "target": ">= 0.5 of insert_many",
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2), encoding="utf-8")
    print(json.dumps({k: summary[k] for k in ("records_per_s", "ratio_to_insert_many")}, indent=2))
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
