"""Connections to the proxy (and to hosts) are shared by all requests: a download stopped midway
must not leave its connection to the next request, or that request is lost and sent again, a
request the host did not need to see twice."""

from __future__ import annotations

import collections

from enrich_crawl.crawl.robots import MAX_ROBOTS_BYTES
from enrich_crawl.testing.synthweb import read_candidates, read_outcomes, run_workers, write_dataset
from enrich_crawl.virtualweb import running_web

MAPPING = {
    "name": "conn",
    "url_patterns": [{"type": "regex", "pattern": r"^https?://c-[a-z0-9-]+\.test/"}],
    "fields": [
        {
            "name": "value",
            "processors": [
                {"type": "xpath", "parameters": {"expression": "//span[@id='v']/text()"}},
                {"type": "trim", "parameters": {}},
            ],
        }
    ],
}
HOSTS = 24


def test_a_stopped_download_leaves_no_connection_behind(tmp_path, mongo_server):
    """Small images (stopped at their headers: the whole body came with them), pages over
    max_page_bytes (aborted at their headers) and robots.txt files cut at 500 KiB on many hosts,
    with pages in between: every request reaches the server exactly once."""
    root = tmp_path / "web"
    padding = "# " + "x" * 98 + "\n"
    huge_robots = "User-agent: *\nAllow: /\n" + padding * (MAX_ROBOTS_BYTES // len(padding) + 20)
    rows = []
    for i in range(HOSTS):
        host = f"c-{i:02d}.test"
        folder = root / host
        folder.mkdir(parents=True)
        robots = huge_robots if i % 4 == 0 else "User-agent: *\nAllow: /\n"
        (folder / "robots.txt").write_text(robots, encoding="utf-8")
        (folder / "photo").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8)
        (folder / "_web.json").write_text('{"content_type": {"/photo": "image/png"}}')
        (folder / "big.html").write_text(f"<html><body>{'<p>big</p>' * 600}</body></html>")
        rows.append({"id": f"{host}/big", "url": f"http://{host}/big.html"})
        for page in ("a", "b"):
            (folder / f"{page}.html").write_text(
                f"<html><body><span id='v'>{host} {page}</span></body></html>", encoding="utf-8"
            )
            rows.append({"id": f"{host}/{page}", "url": f"http://{host}/{page}.html"})
        rows.append({"id": f"{host}/photo", "url": f"http://{host}/photo"})
    crawl = {
        "default_delay": 0.05,
        "store_pages": False,
        "retries": 2,
        "retry_backoff": 0.1,
        "max_page_bytes": 4000,
    }
    dataset, mappings = write_dataset(
        tmp_path, rows, fields={"value": {}}, mappings={"conn": MAPPING}, crawl=crawl
    )
    with running_web(root, log_path=tmp_path / "requests.jsonl") as server:
        run = run_workers(
            dataset,
            mappings,
            tmp_path / "work",
            proxy=server.proxy_url,
            shards=1,
            mongo_uri=mongo_server.uri,
            mongo_db=f"connections_{tmp_path.name}",  # its own robots.txt cache
        )
        log = server.read_log()
    assert run.returncodes == {"s00": 0}, run.logs
    values = {rid: f["value"] for rid, f in read_candidates(tmp_path / "work").items()}
    outcomes = read_outcomes(tmp_path / "work")
    stopped = {"photo": "not_text", "big": "too_large"}
    for row in rows:
        kind = row["id"].rpartition("/")[2]
        if kind in stopped:
            reasons = {e["reason"] for e in outcomes[row["id"]]["errors"]}
            assert reasons == {stopped[kind]}, (row, reasons)
        else:
            host, _, page = row["id"].partition("/")
            assert values.get(row["id"]) == f"{host} {page}", row
    sent = collections.Counter((e["host"], e["path"]) for e in log)
    paths = ("/robots.txt", "/photo", "/a.html", "/b.html", "/big.html")
    expected = {(f"c-{i:02d}.test", path) for i in range(HOSTS) for path in paths}
    assert set(sent) == expected
    twice = {key: n for key, n in sent.items() if n > 1}
    assert not twice, (twice, run.stats["s00"].get("retries"))
    assert run.stats["s00"]["retries"] == 0
