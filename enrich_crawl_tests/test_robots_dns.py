"""A host whose name does not resolve fails on its robots.txt fetch (the first request to any
host): the record's outcome says `dns`, over http (the proxy's `502` with `X-Proxy-Error: dns`)
and https (the proxy refusing the CONNECT tunnel), in the run that fetched robots.txt and in the
next one, which finds the verdict cached in the results database."""

from __future__ import annotations

import json
import time

import pytest

from enrich_crawl.testing.synthweb import read_outcomes, run_workers, write_dataset
from enrich_crawl.virtualweb import running_web

UA = "enrich_crawl/0.1 (+https://example.org/bot.html)"
MAPPING = {
    "name": "dns_sites",
    "url_patterns": [{"type": "regex", "pattern": r"^https?://d-[a-z0-9-]+\.test/"}],
    "fields": [
        {
            "name": "value",
            "processors": [
                {"type": "xpath", "parameters": {"expression": "//span[@id='v']/text()"}}
            ],
        }
    ],
}
ROWS = {
    "http_nohost": "http://d-nohost.test/a.html",
    "https_nohost": "https://d-nohost-tls.test/a.html",
    "ok": "http://d-ok.test/a.html",
}


@pytest.fixture(scope="module")
def dns_crawl(tmp_path_factory, mongo_server):
    base = tmp_path_factory.mktemp("robots_dns")
    site = base / "web" / "d-ok.test"
    site.mkdir(parents=True)
    (site / "a.html").write_text("<html><body><span id='v'>ok</span></body></html>", "utf-8")
    rows = [{"id": rid, "url": url} for rid, url in ROWS.items()]
    crawl = {"default_delay": 0.1, "retry_backoff": 0.2, "retries": 1}
    dataset, mappings = write_dataset(
        base, rows, fields={"value": {}}, mappings={"dns_sites": MAPPING}, crawl=crawl
    )
    db = f"robots_dns_{int(time.time() * 1000)}"
    runs = {}
    with running_web(base / "web", log_path=base / "requests.jsonl") as server:
        for run_id in ("first", "cached"):
            run = run_workers(
                dataset,
                mappings,
                base / run_id,
                proxy=server.proxy_url,
                shards=1,
                mongo_uri=mongo_server.uri,
                mongo_db=db,
                user_agent=UA,
                run_id=run_id,
            )
            assert run.returncodes == {"s00": 0}, run.logs
            runs[run_id] = (run, read_outcomes(base / run_id, run_id))
    return runs


@pytest.mark.parametrize("run_id", ["first", "cached"])
@pytest.mark.parametrize("rid", ["http_nohost", "https_nohost"])
def test_an_unresolvable_host_is_recorded_as_dns(dns_crawl, run_id, rid):
    run, outcomes = dns_crawl[run_id]
    reasons = sorted({e["reason"] for e in outcomes[rid]["errors"]})
    assert reasons == ["dns"], json.dumps(outcomes[rid])
    robots = run.stats["s00"].get("robots") or {}
    if run_id == "first":
        assert robots.get("unreachable", 0) >= 2, robots


def test_a_resolvable_host_beside_them_is_crawled(dns_crawl):
    _run, outcomes = dns_crawl["first"]
    assert not outcomes["ok"]["errors"], outcomes["ok"]
