"""A politeness-bound dataset and virtual web: crawls that last as long as their Crawl-delay says.

Used by the orchestration tests (terminating a running crawl, time budgets, a failing shard) and
by the orchestration benchmark (bench/bench_orchestration.py). Every shard gets the same number of
hosts (host names are chosen by the real shard hash), every host serves `records_per_host` record
pages behind a robots.txt Crawl-delay, and every record needs one page (depth 0). A shard's crawl
therefore takes about `records_per_host * crawl_delay` seconds, whatever the machine's speed: the
hosts of a shard are crawled in parallel, the pages of one host one at a time.

    built = build_polite_dataset(tmp_path / "polite", shards=4, hosts_per_shard=2,
                                 records_per_host=10, crawl_delay=1.0)
    built.spec        # dataset spec YAML (with `virtual_web:`, so each crawl serves it itself)
    built.mappings    # mappings folder with the one mapping the pages need
    built.expected    # record id -> the city its page gives
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path

from enrich_crawl.dataset.shard import registrable_domain, shard_index, shard_keys

MAPPING = {
    "name": "polite_city",
    "url_patterns": [
        {"type": "regex", "pattern": r"^https?://[a-z0-9-]+\.test/rec-[0-9]+\.html(?:#.*)?$"}
    ],
    "url_parsers": [],
    "fields": [
        {
            "name": "city",
            "processors": [
                {"type": "xpath", "parameters": {"expression": "//p[@class='city']/text()"}},
                {"type": "trim", "parameters": {}},
            ],
        }
    ],
}
CITIES = ("Lyon", "Porto", "Gdansk", "Turku", "Brno", "Cork", "Ghent", "Bergen", "Split", "Graz")


@dataclass
class PoliteDataset:
    root: Path
    spec: Path
    mappings: Path
    name: str
    hosts_by_shard: dict[str, list[str]] = field(default_factory=dict)
    expected: dict[str, str] = field(default_factory=dict)

    @property
    def records(self) -> int:
        return len(self.expected)


def hosts_for_shards(shards: int, hosts_per_shard: int, prefix: str = "site") -> dict[str, list]:
    """`hosts_per_shard` host names per shard key, found by the real shard hash."""
    keys = shard_keys(shards)
    chosen: dict[str, list[str]] = {key: [] for key in keys}
    i = 0
    while any(len(v) < hosts_per_shard for v in chosen.values()):
        host = f"{prefix}-{i:04d}.test"
        key = keys[shard_index(registrable_domain(host), shards)]
        if len(chosen[key]) < hosts_per_shard:
            chosen[key].append(host)
        i += 1
        if i > 100000:  # pragma: no cover - the hash spreads names; this never happens
            raise RuntimeError("could not spread host names over the shards")
    return chosen


def build_polite_dataset(
    root: Path,
    *,
    shards: int,
    hosts_per_shard: int = 1,
    records_per_host: int = 10,
    crawl_delay: float = 1.0,
    name: str = "polite",
    latency: float = 0.05,
    disallow: str | None = "/private/",
    records_by_shard: dict[str, int] | None = None,
) -> PoliteDataset:
    """Write the dataset; `records_by_shard` overrides `records_per_host` for some shards (a slow
    shard beside quick ones)."""
    root = Path(root)
    web = root / "web"
    mappings = root / "mappings"
    web.mkdir(parents=True, exist_ok=True)
    mappings.mkdir(parents=True, exist_ok=True)
    (mappings / "polite_city.json").write_text(json.dumps(MAPPING, indent=2), encoding="utf-8")
    (web / "_web.json").write_text(json.dumps({"latency": latency}), encoding="utf-8")
    built = PoliteDataset(root=root, spec=root / f"{name}.yaml", mappings=mappings, name=name)
    rows = []
    for key, hosts in hosts_for_shards(shards, hosts_per_shard).items():
        built.hosts_by_shard[key] = hosts
        count = (records_by_shard or {}).get(key, records_per_host)
        for host in hosts:
            site = web / host
            site.mkdir(exist_ok=True)
            robots = ["User-agent: *", f"Crawl-delay: {crawl_delay:g}"]
            if disallow:
                robots.insert(1, f"Disallow: {disallow}")
            (site / "robots.txt").write_text("\n".join(robots) + "\n", encoding="utf-8")
            (site / "index.html").write_text("<html><body>home</body></html>", encoding="utf-8")
            for n in range(count):
                rid = f"{host.split('.')[0]}-{n:03d}"
                city = CITIES[(n + len(rows)) % len(CITIES)]
                (site / f"rec-{n}.html").write_text(
                    f"<html><body><h1>{rid}</h1><p class='city'> {city} </p></body></html>",
                    encoding="utf-8",
                )
                built.expected[rid] = city
                rows.append({"id": rid, "url": f"http://{host}/rec-{n}.html", "city": ""})
    with open(root / f"{name}.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=["id", "url", "city"])
        writer.writeheader()
        writer.writerows(rows)
    built.spec.write_text(
        "\n".join(
            [
                f"name: {name}",
                f"source: {name}.csv",
                "id: id",
                "urls: [url]",
                "fields:",
                "  city: {}",
                "crawl:",
                "  depth: 0",
                f"  default_delay: {crawl_delay:g}",
                "virtual_web: web",
                "",
            ]
        ),
        encoding="utf-8",
    )
    return built
