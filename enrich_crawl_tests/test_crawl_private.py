"""Without a proxy the crawler resolves names itself: a name that points inward (here `localhost`)
is refused at connect time with `private_address`, unless ENRICH_ALLOW_PRIVATE=1."""

from __future__ import annotations

import time

from enrich_crawl.testing.synthweb import read_candidates, read_outcomes, run_workers, write_dataset
from enrich_crawl.virtualweb import running_web
from enrich_crawl_tests.test_crawl_edge_cases import MAPPING

LOCAL_MAPPING = {
    **MAPPING,
    "name": "local",
    "url_patterns": [{"type": "regex", "pattern": r"^http://localhost:\d+/"}],
}


def _crawl(base, port, *, allow_private: bool, mongo_uri: str, run_id: str):
    dataset, mappings = write_dataset(
        base / run_id,
        [{"id": "inward", "url": f"http://localhost:{port}/"}],
        fields={"value": {}},
        mappings={"local": LOCAL_MAPPING},
        crawl={"default_delay": 0.1, "retries": 0},
    )
    run = run_workers(
        dataset,
        mappings,
        base / run_id / "work",
        proxy="",  # no proxy: the crawler resolves and connects itself
        shards=1,
        mongo_uri=mongo_uri,
        mongo_db=f"private_{run_id}_{int(time.time() * 1000)}",
        allow_private=allow_private,
    )
    assert run.returncodes == {"s00": 0}, run.logs
    return read_outcomes(base / run_id / "work"), read_candidates(base / run_id / "work")


def test_names_resolving_to_internal_addresses_are_refused_unless_allowed(tmp_path, mongo_server):
    root = tmp_path / "web"
    (root / "localhost").mkdir(parents=True)
    (root / "localhost" / "index.html").write_text(
        "<html><body><span id='v'>internal</span></body></html>", encoding="utf-8"
    )
    with running_web(root, log_path=tmp_path / "requests.jsonl") as server:
        refused, values = _crawl(
            tmp_path, server.port, allow_private=False, mongo_uri=mongo_server.uri, run_id="deny"
        )
        assert server.read_log() == []  # not even robots.txt: no connection was opened
        assert refused["inward"]["outcome"] == "unresolved"
        assert {e["reason"] for e in refused["inward"]["errors"]} == {"private_address"}
        assert "inward" not in values

        allowed, values = _crawl(
            tmp_path, server.port, allow_private=True, mongo_uri=mongo_server.uri, run_id="allow"
        )
        paths = [e["path"] for e in server.read_log()]
    assert paths == ["/robots.txt", "/"]
    assert allowed["inward"]["outcome"] == "resolved"
    assert values["inward"]["value"] == "internal"
