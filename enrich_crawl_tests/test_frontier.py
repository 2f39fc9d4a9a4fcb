"""The goal-directed frontier and the run's page cache (plain Python), and the crawl they drive:
a page fetched once per run however many records need it, even after it left memory; records
stop as soon as their fields are found; a plain breadth-first crawl fetches far more."""

from __future__ import annotations

import json
import time

import pytest

from enrich_crawl.crawl.frontier import Frontier
from enrich_crawl.crawl.pagecache import PageCache
from enrich_crawl.extract.page import Page
from enrich_crawl.testing.synthweb import (
    build_synth_web,
    read_candidates,
    read_outcomes,
    run_workers,
    write_dataset,
)
from enrich_crawl.virtualweb import requests_by_host, running_web


def make_frontier(**kwargs):
    done = []
    frontier = Frontier(max_depth=kwargs.pop("max_depth", 1), on_record_done=done.append, **kwargs)
    return frontier, done


def test_a_page_wanted_by_many_records_is_ordered_once():
    frontier, _done = make_frontier()
    first = frontier.add_record("a", ["http://h.test/dir.html#a"], ["x"])
    second = frontier.add_record("b", ["http://h.test/dir.html#b"], ["x"])
    third = frontier.add_record("c", ["http://h.test/dir.html?utm_source=mail#c"], ["x"])
    assert [o.key for o in first] == ["http://h.test/dir.html"]
    assert second == [] and third == []  # same page (fragment and tracking parameter aside)
    waiters = frontier.take("http://h.test/dir.html")
    assert sorted((w.record, w.fragment) for w in waiters) == [("a", "a"), ("b", "b"), ("c", "c")]


def test_goal_reached_finishes_the_record_and_drops_its_pending_pages():
    frontier, done = make_frontier()
    frontier.add_record("r", ["http://h.test/", "http://other.test/"], ["x", "y"])
    home = frontier.take("http://h.test/")[0]
    orders = frontier.want("r", "http://h.test/about", depth=1, seed=home.seed, priority=10)
    assert [o.key for o in orders] == ["http://h.test/about"]
    frontier.record_found(home, ["x", "y"])
    frontier.release(home)
    assert [s.id for s in done] == ["r"] and not done[0].needed
    # nobody needs the pages still pending: the scheduler and the downloader drop them
    assert not frontier.is_wanted("http://h.test/about")
    assert not frontier.is_wanted("http://other.test/")
    frontier.drop("http://h.test/about")
    assert "http://h.test/about" not in frontier.tasks


def test_depth_limit_and_page_budget():
    frontier, _done = make_frontier(max_depth=1, max_pages_per_record=3)
    frontier.add_record("r", ["http://h.test/"], ["x"])
    assert frontier.want("r", "http://h.test/deep", depth=2, seed="s", priority=0) == []
    assert len(frontier.want("r", "http://h.test/a", depth=1, seed="s", priority=0)) == 1
    assert len(frontier.want("r", "http://h.test/b", depth=1, seed="s", priority=0)) == 1
    assert frontier.want("r", "http://h.test/c", depth=1, seed="s", priority=0) == []
    assert frontier.records["r"].over_budget == 1


def test_breadth_first_mode_does_not_stop_at_the_goal():
    frontier, done = make_frontier(stop_at_goal=False)
    frontier.add_record("r", ["http://h.test/"], ["x"])
    home = frontier.take("http://h.test/")[0]
    frontier.want("r", "http://h.test/a", depth=1, seed=home.seed, priority=0)
    frontier.record_found(home, ["x"])
    frontier.release(home)
    assert done == [] and frontier.is_wanted("http://h.test/a")
    frontier.release(frontier.take("http://h.test/a")[0])
    assert [s.id for s in done] == ["r"]


def test_fresh_fields_are_not_crawled():
    frontier, done = make_frontier()
    assert frontier.add_record("r", ["http://h.test/"], ["x"], known={"x"}) == []
    assert done[0].fresh == frozenset({"x"}) and not done[0].needed
    orders = frontier.add_record("s", ["http://h.test/"], ["x", "y"], known={"x"})
    assert len(orders) == 1 and frontier.records["s"].needed == {"y"}


def test_a_seed_whose_values_were_already_found_is_not_reported_empty():
    frontier, done = make_frontier()
    frontier.add_record("r", ["http://a.test/", "http://b.test/"], ["x", "y"])
    a = frontier.take("http://a.test/")[0]
    frontier.record_found(a, ["x"])
    frontier.release(a)
    b = frontier.take("http://b.test/")[0]
    frontier.record_found(b, [], also_on_page=["x"])  # b has x too, found first through a
    frontier.release(b)
    state = done[0]
    assert state.seed_yield == {"http://a.test/": 1, "http://b.test/": 1}


def test_page_cache_spills_to_disk_and_reloads(tmp_path):
    cache = PageCache(max_bytes=3000, spill_dir=str(tmp_path), max_parsed=1)
    pages = {}
    for i in range(5):
        page = Page(f"http://h.test/{i}", f"<html><body><p>{i}</p>{'x' * 1000}</body></html>")
        page.fetched_at, page.content_hash = "2026-01-01T00:00:00+00:00", f"h{i}"
        pages[i] = page
        cache.put(f"k{i}", page)
        assert page.tree is not None
    assert cache.spilled >= 3 and len(cache.pages) <= 2
    again = cache.get("k0")
    assert again is not None and again.text == pages[0].text and again.content_hash == "h0"
    assert again.tree.xpath("//p/text()") == ["0"]
    assert cache.reloaded == 1
    # only the most recently used page keeps its parsed tree
    assert sum("tree" in p.__dict__ for p in cache.pages.values()) <= 1
    cache.put_failure("bad", "http_404")
    assert cache.failure("bad") == "http_404" and cache.get("bad") is None
    cache.put_robots({"_id": "http://h.test", "status": "ok"})
    assert cache.get_robots("http://h.test")["status"] == "ok"
    cache.close()
    assert not list(tmp_path.iterdir())


# -- against the virtual web -------------------------------------------------------------------

DIRECTORY = {
    "name": "directory",
    "url_patterns": [{"type": "regex", "pattern": r"^http://d-(?:dir|fill)\.test/"}],
    "fields": [
        {
            "name": "value",
            "processors": [
                {
                    "type": "xpath",
                    "parameters": {
                        "expression": "//section[@id=$fragment]//span[@class='v']/text() | "
                        "//span[@id='filler']/text()"
                    },
                }
            ],
        }
    ],
}


@pytest.mark.parametrize("store_pages", [False, True], ids=["scratch-file", "crawled-url-store"])
def test_a_shared_page_is_fetched_once_even_after_leaving_memory(
    tmp_path, mongo_server, store_pages
):
    """A page that left memory is served again from the run's scratch file, or (when the
    crawled-URL store keeps its body) from the store, without a second fetch."""
    root = tmp_path / "web"
    (root / "d-dir.test").mkdir(parents=True)
    (root / "d-fill.test").mkdir()
    sections = "".join(
        f"<section id='org-{i}'><span class='v'>org {i}</span></section>" for i in range(12)
    )
    (root / "d-dir.test" / "orgs.html").write_text(
        f"<html><body>{sections}{'<p>pad</p>' * 500}</body></html>", encoding="utf-8"
    )
    rows = []
    for i in range(12):
        rows.append({"id": f"dir{i}", "url": f"http://d-dir.test/orgs.html#org-{i}"})
        (root / "d-fill.test" / f"p{i}.html").write_text(
            f"<html><body><span id='filler'>fill {i}</span>{'<p>pad</p>' * 2000}</body></html>",
            encoding="utf-8",
        )
        rows.append({"id": f"fill{i}", "url": f"http://d-fill.test/p{i}.html"})
    crawl = {"default_delay": 0.05, "page_cache_mb": 0.01, "store_pages": store_pages}
    dataset, mappings = write_dataset(
        tmp_path, rows, fields={"value": {}}, mappings={"directory": DIRECTORY}, crawl=crawl
    )
    with running_web(root, log_path=tmp_path / "requests.jsonl") as server:
        run = run_workers(
            dataset,
            mappings,
            tmp_path / "work",
            proxy=server.proxy_url,
            shards=1,
            mongo_uri=mongo_server.uri,
            mongo_db=f"dir_{int(time.time() * 1000)}",
            max_active_records=1,  # records one after the other: the page leaves memory between
        )
        log = server.read_log()
    assert run.returncodes == {"s00": 0}, run.logs
    values = read_candidates(tmp_path / "work")
    assert {rid: v["value"] for rid, v in values.items() if rid.startswith("dir")} == {
        f"dir{i}": f"org {i}" for i in range(12)
    }
    paths = [e["path"] for e in requests_by_host(log)["d-dir.test"]]
    assert paths == ["/robots.txt", "/orgs.html"]
    stats = run.stats["s00"]
    assert stats["pages_reused"] == 11 and stats["pages_from_store"] == 0
    if store_pages:  # the stored pages left memory without a copy in the scratch file
        assert stats["pages_left_to_store"] > 0 and stats["pages_spilled"] == 0
    else:
        assert stats["pages_spilled"] > 0 and stats["pages_left_to_store"] == 0


@pytest.fixture(scope="module")
def goal_vs_bfs(tmp_path_factory, mongo_server):
    base = tmp_path_factory.mktemp("bfs")
    # every record its own site, as organisations in a real dataset
    web = build_synth_web(base, hosts=16, records_per_host=1, crawl_delay=None, default_delay=0.02)
    results = {}
    with running_web(web.root, log_path=base / "requests.jsonl") as server:
        for strategy in ("goal", "bfs"):
            run = run_workers(
                web.dataset,
                web.mappings,
                base / "work",
                proxy=server.proxy_url,
                shards=2,
                mongo_uri=mongo_server.uri,
                mongo_db=f"bfs_{strategy}_{int(time.time() * 1000)}",
                run_id=strategy,
                crawl_overrides={"strategy": strategy, "store_pages": False},
            )
            assert set(run.returncodes.values()) == {0}, run.logs
            results[strategy] = (run, read_outcomes(base / "work", strategy))
    return web, results


def test_goal_directed_crawl_fetches_at_most_half_of_breadth_first(goal_vs_bfs):
    web, results = goal_vs_bfs
    pages = {}
    for strategy, (run, outcomes) in results.items():
        assert len(outcomes) == web.records
        assert all(o["outcome"] == "resolved" for o in outcomes.values()), strategy
        fetched = sum(s["pages"] for s in run.stats.values())
        pages[strategy] = fetched / web.records
    # goal-directed: home, about, contact and the API record, nothing else
    assert pages["goal"] == 4
    assert pages["goal"] <= 0.5 * pages["bfs"], pages


def test_stats_report_pages_per_resolved_record(goal_vs_bfs):
    _web, results = goal_vs_bfs
    run, _outcomes = results["goal"]
    for stats in run.stats.values():
        assert stats["pages_per_resolved_record"] == 4.0
        assert json.dumps(stats)  # stats.json is plain JSON
