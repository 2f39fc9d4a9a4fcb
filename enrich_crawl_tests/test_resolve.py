"""resolved_fields: conflicting candidates resolved by mapping priority, then depth, then recency;
the losers counted; the staged line carries what the merge needs (then merged for real)."""

from __future__ import annotations

import itertools

from enrich_crawl.dataset.load import prepare_dataset
from enrich_crawl.dataset.spec import load_spec
from enrich_crawl.resolve import choose, rank_candidates, resolve_shard
from enrich_crawl.staging import DatasetStage, read_jsonl, write_jsonl
from enrich_crawl.store.merge import Merger


def cand(value, *, priority=0, depth=1, at="2025-05-01T10:00:00+00:00", url=None, mapping="m"):
    return {
        "record": "R1",
        "field": "city",
        "value": value,
        "url": url or f"https://{mapping}.example/{depth}",
        "mapping": mapping,
        "priority": priority,
        "depth": depth,
        "fetched_at": at,
        "http_status": 200,
        "content_hash": "h",
        "rendered": False,
    }


def test_priority_then_depth_then_recency():
    by_priority = cand("Priority", priority=5, depth=2, at="2025-01-01T00:00:00+00:00")
    shallow = cand("Shallow", depth=0, at="2025-01-02T00:00:00+00:00")
    recent = cand("Recent", depth=1, at="2025-06-01T00:00:00+00:00")
    older = cand("Older", depth=1, at="2025-02-01T00:00:00+00:00")
    assert choose([shallow, recent, older, by_priority])[0] is by_priority
    assert choose([recent, older, shallow])[0] is shallow
    assert choose([older, recent])[0] is recent
    # naive times are UTC, and an unknown time is the oldest
    assert choose([cand("Naive", at="2025-06-01T00:00:00"), cand("Unknown", at=None)])[0][
        "value"
    ] == ("Naive")


def test_losers_that_disagree_are_counted_and_sampled():
    winner = cand("Springfield", priority=2)
    same_but_spaced = cand(" springfield ", priority=1)
    other = cand("Shelbyville", priority=1, mapping="dir")
    another = cand("Ogdenville", priority=0, mapping="wiki")
    best, losers = rank_candidates([another, same_but_spaced, other, winner])
    assert best is winner
    assert [c["value"] for c in losers] == ["Shelbyville", "Ogdenville"]
    assert choose([another, same_but_spaced, other, winner])[1] == 2


def test_full_tie_is_decided_the_same_whatever_the_crawl_order():
    tied = [
        cand("B", url="https://b.example/"),
        cand("A", url="https://a.example/"),
        cand("B", url="https://c.example/"),
    ]
    winners = {choose(list(order))[0]["url"] for order in itertools.permutations(tied)}
    # the value more candidates agree on wins, then the smaller URL
    assert winners == {"https://b.example/"}


SPEC = """\
name: resolve_orgs
source: orgs.csv
id: org_id
urls: [website]
fields:
  city: {}
  founded: {type: integer}
  last_release: {type: date, refresh: true}
missing_values: ["N/A"]
"""


def test_resolve_shard_stages_winner_lineage_and_conflicts_then_merges(
    tmp_path, mongo_client, mongo_db_name
):
    (tmp_path / "orgs.yaml").write_text(SPEC, encoding="utf-8")
    (tmp_path / "orgs.csv").write_text(
        "org_id,website,city,founded,last_release\n"
        "R1,https://acme.example/,N/A,1998,2024-01-01\n"
        "R2,https://bolt.example/,,,\n",
        encoding="utf-8",
    )
    spec = load_spec(tmp_path / "orgs.yaml")
    stage = DatasetStage(tmp_path / "work", spec.name)
    prepare_dataset(spec, stage, ["s00"])
    write_jsonl(
        stage.candidates("s00"),
        [
            cand("Springfield", priority=1, depth=1, url="https://acme.example/about"),
            cand("Shelbyville", priority=0, depth=0, url="https://acme.example/", mapping="dir"),
            {**cand(2001), "field": "founded"},  # present in the dataset: not resolved
            {**cand("2025-03-03"), "field": "last_release"},  # refresh: resolved
        ],
    )
    write_jsonl(
        stage.record_outcomes("s00"),
        [
            {"record": "R1", "errors": [], "pages": 2},
            {"record": "R2", "errors": [{"url": "https://bolt.example/", "reason": "dns"}]},
        ],
    )
    summary = resolve_shard(stage, "s00")
    assert summary["fields_resolved"] == 2 and summary["conflicts"] == 1
    assert summary["conflicts_per_field"] == {"city": 1}

    lines = {ln["record"]: ln for ln in read_jsonl(stage.resolved("s00"))}
    city = lines["R1"]["fields"]["city"]
    assert (city["value"], city["mapping"], city["source_url"]) == (
        "Springfield",
        "m",
        "https://acme.example/about",
    )
    assert (city["candidates"], city["conflicts"]) == (2, 1)
    assert city["alternatives"] == [
        {
            "value": "Shelbyville",
            "source_url": "https://acme.example/",
            "mapping": "dir",
            "depth": 0,
        }
    ]
    assert "founded" not in lines["R1"]["fields"]
    assert lines["R1"]["fields"]["last_release"]["value"] == "2025-03-03"
    assert lines["R2"]["fields"] == {} and lines["R2"]["errors"][0]["reason"] == "dns"

    collection = mongo_client[mongo_db_name]["resolve_orgs"]
    fields = {n: {"type": f.type, "refresh": f.refresh} for n, f in spec.fields.items()}
    stats = Merger(collection, fields=fields, run_id="run-1").merge(
        read_jsonl(stage.resolved("s00")), partition="s00"
    )
    assert stats.conflicts == 1 and stats.status == {"resolved": 1, "unresolved": 1}
    doc = collection.find_one({"_id": "R1"})
    assert doc["data"]["founded"] == 1998 and "founded" not in doc["lineage"]
    assert doc["lineage"]["city"]["conflicts"] == 1
    assert doc["original"]["city"] == "N/A"
    assert doc["lineage"]["last_release"]["previous"] == "2024-01-01"
    r2 = collection.find_one({"_id": "R2"})
    assert r2["status"] == "unresolved" and r2["errors"][0]["reason"] == "dns"
    mongo_client.drop_database(mongo_db_name)
