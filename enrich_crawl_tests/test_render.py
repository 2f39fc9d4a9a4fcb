"""JavaScript rendering against the virtual web and real Chromium (enrich_crawl.testing.jsweb).

One crawl with the render mappings and one with the same mappings made static (what a crawl without
a browser finds), plus a crawl whose browser is killed in the middle of a page. Every crawl is a
real crawl worker process; the browser is Debian's Chromium through scrapy-playwright.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import psutil
import pytest

from enrich_crawl.extract.page import Page
from enrich_crawl.testing.jsweb import FIELDS, MAPPINGS, ROWS, as_static, build_js_web
from enrich_crawl.testing.synthweb import read_outcomes, run_workers, seed_shards, write_dataset
from enrich_crawl.virtualweb import requests_by_host, running_web

pytestmark = pytest.mark.browser

CHROMIUM = os.environ.get("ENRICH_CHROMIUM", "/usr/bin/chromium")
UA = "enrich_crawl/0.1 (+https://example.org/render-test-bot.html)"
CRAWL = {
    "depth": 0,
    "default_delay": 0.1,
    "download_timeout": 5,
    "retries": 0,
    # generous: the machine is shared; the page that never loads costs this much once
    "render_timeout": 10,
}
JS_RECORDS = ("inject", "fetch", "lazy", "polite1", "polite2", "polite3")
OUR_HOSTS = {
    "js-inject.test",
    "js-fetch.test",
    "js-lazy.test",
    "js-crash.test",
    "js-hang.test",
    "auto-shell.test",
    "auto-static.test",
    "auto-article.test",
    "www.polite-js.test",
    "api.polite-js.test",
    "cdn.elsewhere.test",
}


@pytest.fixture(scope="module", autouse=True)
def _chromium():
    if not Path(CHROMIUM).exists():
        if os.environ.get("ENRICH_REQUIRE_SERVICES") == "1":
            pytest.fail(f"Chromium missing at {CHROMIUM}")
        pytest.skip(f"Chromium missing at {CHROMIUM}")


# -- helpers -------------------------------------------------------------------------------------


def _workers() -> list[psutil.Process]:
    """This test's crawl workers (children of this process: not those of other test runs or
    benchmarks on the machine)."""
    found = []
    with suppress(psutil.Error):
        for proc in psutil.Process(os.getpid()).children(recursive=True):
            with suppress(psutil.Error):
                if "enrich_crawl.crawl.worker" in proc.cmdline():
                    found.append(proc)
    return found


# The browser's processes: Playwright's driver (node) and Chromium's browser, renderers and helpers.
# Not every child of a worker is one: Scrapy logs the platform at start-up, and Python's
# platform.platform() runs `uname -p` for it.
BROWSER_PROCESS_NAMES = frozenset(
    {"chromium", "chrome", "headless_shell", "chrome_crashpad_handler", "node"}
)


class Watch:
    """What the crawl workers started: process names, and the processes themselves."""

    def __init__(self) -> None:
        self.names: set[str] = set()
        self.processes: dict[int, psutil.Process] = {}
        self._names: dict[int, str] = {}  # pid -> name when first seen (it may be gone since)

    def name_of(self, proc: psutil.Process) -> str:
        return self._names.get(proc.pid, "")

    def left_behind(self, grace: float = 3.0) -> list[str]:
        """The processes the workers started that still run once the workers exited (same pid
        and start time; a moment allowed for the last ones to go)."""
        deadline = time.monotonic() + grace
        while True:
            alive = []
            for proc in self.processes.values():
                with suppress(psutil.Error):
                    if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                        alive.append(f"{proc.pid} {proc.name()} {' '.join(proc.cmdline())[:80]}")
            if not alive or time.monotonic() >= deadline:
                return alive
            time.sleep(0.1)


@contextmanager
def watching_workers(on_poll=None) -> Iterator[Watch]:
    """While the block runs: the processes started by crawl workers (their descendants)."""
    seen = Watch()
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            for worker in _workers():
                try:
                    children = worker.children(recursive=True)
                except psutil.Error:
                    continue
                for child in children:
                    with suppress(psutil.Error):
                        name = child.name()
                        seen.names.add(name)
                        seen.processes.setdefault(child.pid, child)
                        seen._names.setdefault(child.pid, name)
                if on_poll is not None:
                    on_poll(children)
            time.sleep(0.05)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join(5)


def _candidates(work: Path) -> dict[str, dict[str, dict[str, Any]]]:
    """{record: {field: candidate line}} (first line wins)."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for path in (work / "run").glob("*/candidates.jsonl"):
        for line in path.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            out.setdefault(row["record"], {}).setdefault(row["field"], row)
    return out


def _crawl(base: Path, web: Path, mappings: dict, records=ROWS, render_env=None):
    rows = [{"id": rid, "url": ROWS[rid][0]} for rid in records]
    dataset, folder = write_dataset(base, rows, fields=FIELDS, mappings=mappings, crawl=CRAWL)
    prepared = seed_shards(dataset, base / "work", 1)
    with (
        pytest.MonkeyPatch.context() as env,
        running_web(web, log_path=base / "requests.jsonl") as server,
        watching_workers() as seen,
    ):
        # a smaller V8 heap: the runaway page crashes its renderer sooner and cheaper
        env.setenv("ENRICH_RENDER_JS_HEAP_MB", "128")
        for name, value in (render_env or {}).items():
            env.setenv(f"ENRICH_RENDER_{name.upper()}", str(value))
        run = run_workers(
            dataset,
            folder,
            base / "work",
            proxy=server.proxy_url,
            shards=1,
            prepared=prepared,
            user_agent=UA,
        )
        log = server.read_log()
    assert run.returncodes == {"s00": 0}, run.logs["s00"][-3000:]
    return {
        "run": run,
        "stats": run.stats["s00"],
        "outcomes": read_outcomes(base / "work"),
        "candidates": _candidates(base / "work"),
        "log": log,
        "by_host": requests_by_host(log),
        "processes": set(seen.names),
        "left_behind": seen.left_behind(),
        "browser_processes": sum(
            1 for proc in seen.processes.values() if seen.name_of(proc) in BROWSER_PROCESS_NAMES
        ),
        "base": base,
        "prepared": prepared,
    }


@pytest.fixture(scope="module")
def js_web(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("jsweb") / "web"
    build_js_web(root)
    return root


@pytest.fixture(scope="module")
def js_crawl(tmp_path_factory, js_web):
    return _crawl(tmp_path_factory.mktemp("js"), js_web, MAPPINGS)


@pytest.fixture(scope="module")
def static_crawl(tmp_path_factory, js_web):
    return _crawl(tmp_path_factory.mktemp("static"), js_web, as_static(MAPPINGS))


def _value(crawl, rid: str, field: str = "value"):
    row = crawl["candidates"].get(rid, {}).get(field)
    return row["value"] if row else None


def _found(crawl, rid: str, field: str = "value") -> dict[str, Any]:
    """The candidate of `rid`; when there is none, the failure says what the browser saw."""
    row = crawl["candidates"].get(rid, {}).get(field)
    browser = crawl["stats"]["render"]["browser"]
    assert row is not None, (
        f"no {field} for {rid}: outcome {crawl['outcomes'].get(rid)}, "
        f"subresources {browser['subresources']}, failed {browser['failed']}, "
        f"page wait {browser.get('page_wait_max_seconds')} s"
    )
    return row


# -- what rendering finds ------------------------------------------------------------------------


@pytest.mark.parametrize("rid", JS_RECORDS)
def test_js_mappings_resolve_fields_a_static_crawl_cannot(js_crawl, static_crawl, rid):
    expected = ROWS[rid][1]
    assert _value(static_crawl, rid) is None  # the static HTML has an empty mount node
    row = _found(js_crawl, rid)
    assert row["value"] == expected
    assert row["rendered"] is True
    assert row["http_status"] == 200


def test_auto_resolves_a_script_built_page_a_static_crawl_cannot(js_crawl, static_crawl):
    assert _value(static_crawl, "auto_shell") is None
    row = _found(js_crawl, "auto_shell")
    assert (row["value"], row["rendered"], row["mapping"]) == ("Gdansk", True, "auto_pages")


def test_auto_renders_only_the_pages_that_need_it(js_crawl):
    stats = js_crawl["stats"]
    render = stats["render"]
    # rendered: the six js pages that came through, and the one auto shell
    assert render["rendered_js"] == 6
    assert render["rendered_auto"] == 1
    assert stats["pages_rendered"] == 7
    # not rendered: the value was in the static page; the page is text without script
    assert render["skipped"] == {"fields_found": 1, "not_script_built": 1}
    assert stats["render_skipped"] == 2
    static_row = js_crawl["candidates"]["auto_static"]["value"]
    assert (static_row["value"], static_row["rendered"]) == ("Turku", False)
    assert js_crawl["outcomes"]["auto_article"]["errors"] == [
        {"url": "http://auto-article.test/", "reason": "not_on_page"}
    ]
    by_host = js_crawl["by_host"]
    # an auto render starts from the static answer: each document fetched exactly once
    for host in ("auto-shell.test", "auto-static.test", "auto-article.test"):
        assert [e["path"] for e in by_host[host]].count("/") == 1
    assert [e["path"] for e in by_host["auto-shell.test"]] == ["/robots.txt", "/", "/app.js"]


def test_lazy_content_behind_wait_for_is_scrolled_into_the_page(js_crawl):
    paths = [e["path"] for e in js_crawl["by_host"]["js-lazy.test"]]
    # item 25 is on the third JSON page: two scrolls to the bottom were needed
    assert "/api/items-3.json" in paths
    assert js_crawl["stats"]["render"]["browser"]["scrolls"] >= 2


def test_rendered_values_carry_rendered_into_lineage(js_crawl):
    from enrich_crawl.resolve import resolve_shard
    from enrich_crawl.staging import read_jsonl
    from enrich_crawl.store.merge import build_document

    spec, stage, _ = js_crawl["prepared"]
    crawl_dir = stage.crawl_dir("s00")
    crawl_dir.mkdir(parents=True, exist_ok=True)
    for name in ("candidates.jsonl", "records.jsonl"):
        shutil.copy(js_crawl["base"] / "work" / "run" / "s00" / name, crawl_dir / name)
    resolve_shard(stage, "s00")
    lines = {line["record"]: line for line in read_jsonl(stage.resolved("s00"))}
    now = dt.datetime.now(dt.timezone.utc)
    fields = {name: {"type": t} for name, t in spec.field_types().items()}
    doc, _, _ = build_document(
        lines["fetch"], None, fields=fields, run_id="run", partition="s00", now=now
    )
    assert doc["data"]["value"] == "Porto"
    assert doc["lineage"]["value"]["rendered"] is True
    assert doc["lineage"]["name"]["rendered"] is True  # the rendered page served both fields
    doc, _, _ = build_document(
        lines["auto_static"], None, fields=fields, run_id="run", partition="s00", now=now
    )
    assert doc["lineage"]["value"]["rendered"] is False


# -- failures -------------------------------------------------------------------------------------


def test_a_renderer_crash_loses_neither_the_record_nor_the_run(js_crawl):
    outcome = js_crawl["outcomes"]["crash"]
    # retried once, then reported; the static page still gave what it has
    assert {"url": "http://js-crash.test/", "reason": "render_crash"}.items() <= (
        outcome["errors"][0].items()
    )
    assert _value(js_crawl, "crash", "name") == "Crash Co"
    assert js_crawl["candidates"]["crash"]["name"]["rendered"] is False
    browser = js_crawl["stats"]["render"]["browser"]
    assert browser["crashes"] == 2 and browser["retries"] == 1
    assert js_crawl["stats"]["errors_by_kind"]["render_crash"] == 1
    assert js_crawl["stats"]["finish_reason"] == "finished"
    # every record has its outcome line
    assert set(js_crawl["outcomes"]) == set(ROWS)


def test_a_page_that_never_finishes_times_out_and_the_run_goes_on(js_crawl):
    outcome = js_crawl["outcomes"]["hang"]
    assert [e["reason"] for e in outcome["errors"]] == ["render_timeout"]
    assert _value(js_crawl, "hang", "name") == "Hang Co"
    assert js_crawl["stats"]["render"]["failed"] == {"render_crash": 1, "render_timeout": 1}


def _with_latency(web: Path, dest: Path, latency: dict[str, float]) -> Path:
    """A copy of `web` whose hosts answer `latency[host]` seconds late (every request)."""
    shutil.copytree(web, dest)
    for host, seconds in latency.items():
        path = dest / host / "_web.json"
        config = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
        path.write_text(json.dumps({**config, "latency": seconds}), encoding="utf-8")
    return dest


def test_a_page_waiting_for_a_browser_context_keeps_its_whole_render_time(tmp_path, js_web):
    """One context at a time, a new one per page: each page waits for the context of the page
    before it to close, the first behind the page that never finishes (a whole render timeout).
    A page's render time counts from its navigation, not from that wait: the page that waited
    longest still gets its scripts and its value (it used to lose them as "late")."""
    # the hanging page renders first; the page with scripts to fetch is the last in line
    web = _with_latency(
        js_web,
        tmp_path / "web",
        {
            "js-inject.test": 0.3,
            "auto-shell.test": 0.3,
            "www.polite-js.test": 0.3,
            "js-fetch.test": 0.6,
        },
    )
    crawl = _crawl(
        tmp_path / "run",
        web,
        MAPPINGS,
        records=("hang", "inject", "auto_shell", "polite1", "fetch"),
        render_env={"max_contexts": 1, "recycle_after": 1},
    )
    browser = crawl["stats"]["render"]["browser"]
    # the scenario happened: some page waited for its context longer than the old code allowed
    # before refusing the page's requests as late
    assert browser["page_wait_max_seconds"] > CRAWL["render_timeout"] - 0.5, browser
    assert browser["failed"] == {"render_timeout": 1}
    assert [e["reason"] for e in crawl["outcomes"]["hang"]["errors"]] == ["render_timeout"]
    for rid in ("inject", "auto_shell", "polite1", "fetch"):
        assert _found(crawl, rid)["value"] == ROWS[rid][1], rid
    assert "aborted/late" not in browser["subresources"], browser["subresources"]
    assert [e["path"] for e in crawl["by_host"]["js-fetch.test"]][-2:] == [
        "/static/app.js",
        "/api/company.json",
    ]


# -- hygiene and politeness -------------------------------------------------------------------------


def test_browser_hygiene(js_crawl):
    browser = js_crawl["stats"]["render"]["browser"]
    paths = [e["path"] for e in js_crawl["by_host"]["js-fetch.test"]]
    # the stylesheet, the image, the font and the video were never requested
    assert paths == ["/robots.txt", "/", "/static/app.js", "/api/company.json"]
    sub = browser["subresources"]
    assert sub["aborted/stylesheet"] == 1 and sub["aborted/image"] == 1
    assert sub["aborted/font"] == 1 and sub["aborted/media"] == 1
    # every page opened was closed; pages and contexts stayed within their bounds
    assert browser["pages_opened"] == browser["pages_closed"] == 10  # 9 renders + 1 retry
    assert browser["max_concurrent_pages"] <= browser["config"]["concurrency"]
    assert browser["browser_launched"] == 1
    # the site's script was fetched once for its three pages
    assert [e["path"] for e in js_crawl["by_host"]["www.polite-js.test"]].count("/app.js") == 1
    assert sub["cached"] >= 2


def test_rendered_fetches_are_as_polite_as_static_ones(js_crawl):
    by_host = js_crawl["by_host"]
    # nothing but the crawler's requests to the sites: Chromium's own traffic (component
    # updates, sign-in checks) never reached the proxy
    assert set(by_host) <= OUR_HOSTS, sorted(set(by_host) - OUR_HOSTS)
    for host in by_host:
        entries = by_host[host]
        assert entries[0]["path"] == "/robots.txt", host  # robots.txt before anything else
        # one request at a time per host, the page's subresources included
        for a, b in itertools.pairwise(entries):
            assert b["t"] >= a["t"] + a["dur"] - 0.01, (host, a, b)
        # every request is the crawler's own (the browser never fetched anything itself)
        assert {e["ua"] for e in entries} == {UA}, host
    polite = by_host["www.polite-js.test"]
    paths = [e["path"] for e in polite]
    # robots.txt disallows /private/: the page's script asked for it, the crawler never sent it
    assert not any(p.startswith("/private/") for p in paths)
    assert js_crawl["stats"]["render"]["browser"]["subresources"]["refused/robots"] == 3
    # third-party scripts are not fetched
    assert "cdn.elsewhere.test" not in by_host
    # same site, other host: its own robots.txt first, then the three values
    assert [e["path"] for e in by_host["api.polite-js.test"]] == [
        "/robots.txt",
        "/v/p1.json",
        "/v/p2.json",
        "/v/p3.json",
    ]
    assert _value(js_crawl, "polite2", "region") == "Region 2"
    # Crawl-delay 1: each page visit (document + subresources) starts a second after the last
    # answer of the previous visit
    starts = [i for i, e in enumerate(polite) if e["path"] in ("/p1", "/p2", "/p3")]
    for i in starts[1:]:
        previous = polite[i - 1]
        assert polite[i]["t"] - (previous["t"] + previous["dur"]) >= 1.0 - 0.05, polite


def test_no_browser_process_outlives_the_crawl(js_crawl):
    # the driver and every Chromium process (browser, renderers, utilities) the worker started
    assert js_crawl["browser_processes"] >= 3
    assert js_crawl["left_behind"] == []


# -- the static path ----------------------------------------------------------------------------


def test_a_static_crawl_starts_no_browser(js_crawl, static_crawl):
    assert static_crawl["stats"]["render"] == {
        "enabled": False,
        "rendered_js": 0,
        "rendered_auto": 0,
        "skipped": {"fields_found": 0, "not_script_built": 0},
        "signals": {},
        "failed": {},
        "fallbacks": 0,
        "pending": 0,
    }
    assert static_crawl["stats"]["pages_rendered"] == 0
    # the process watch sees the browser when there is one, and none in the static crawl
    assert "chromium" in js_crawl["processes"]
    assert not {"chromium", "node"} & static_crawl["processes"]
    assert static_crawl["browser_processes"] == 0
    # the static crawl got what static HTML has
    assert _value(static_crawl, "auto_static") == "Turku"
    assert _value(static_crawl, "crash", "name") == "Crash Co"


def test_static_settings_do_not_load_playwright(tmp_path):
    code = (
        "import sys\n"
        "from enrich_crawl.crawl.params import WorkerParams\n"
        "from enrich_crawl.crawl.settings import build_settings\n"
        "import enrich_crawl.crawl.spider\n"
        "p = WorkerParams('d', 's00', 'x', 'y', 'm', {})\n"
        "s = build_settings(p)\n"
        "r = build_settings(p, render=True)\n"
        "print('DOWNLOAD_HANDLERS' in s, 'scrapy_playwright' in sys.modules,"
        " r['DOWNLOAD_HANDLERS']['https'])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == [
        "False",
        "False",
        "enrich_crawl.crawl.render_handler.RenderDownloadHandler",
    ]


# -- a browser that dies in the middle of a page ---------------------------------------------------


def test_a_browser_killed_mid_page_is_replaced_and_the_page_retried_once(tmp_path):
    web = tmp_path / "web"
    host = web / "js-slow.test"
    host.mkdir(parents=True)
    (host / "robots.txt").write_text("User-agent: *\nAllow: /\n", encoding="utf-8")
    (host / "index.html").write_text(
        "<html><body><div id='root'></div><script src='/slow.js'></script></body></html>",
        encoding="utf-8",
    )
    script = "document.getElementById('root').innerHTML = '<span id=\"v\">Cork</span>';"
    (host / "slow.js").write_text(script + " " * (600 - len(script)), encoding="utf-8")
    # the script trickles in for ~3 s: time enough to kill the browser while it waits for it
    (host / "_web.json").write_text(json.dumps({"slow": {"^/slow.js$": 200}}), encoding="utf-8")
    mapping = dict(MAPPINGS["js_pages"], url_patterns=[r"^https?://js-slow\.test/"])
    rows = [{"id": "slow", "url": "http://js-slow.test/"}]
    crawl = dict(CRAWL, render_timeout=20, download_timeout=20)
    dataset, folder = write_dataset(
        tmp_path, rows, fields={"value": {}}, mappings={"js_pages": mapping}, crawl=crawl
    )
    killed: list[int] = []
    log_path = tmp_path / "requests.jsonl"

    def kill_browser(children: list[psutil.Process]) -> None:
        if killed or not log_path.exists() or "/slow.js" not in log_path.read_text():
            return
        for child in children:
            try:
                cmdline = child.cmdline()
            except psutil.Error:
                continue
            if any("remote-debugging-pipe" in a for a in cmdline) and not any(
                a.startswith("--type=") for a in cmdline
            ):
                os.kill(child.pid, signal.SIGKILL)
                killed.append(child.pid)

    with running_web(web, log_path=log_path) as server, watching_workers(kill_browser) as seen:
        run = run_workers(
            dataset, folder, tmp_path / "work", proxy=server.proxy_url, shards=1, user_agent=UA
        )
    assert run.returncodes == {"s00": 0}, run.logs["s00"][-3000:]
    assert seen.left_behind() == []  # neither the killed browser's renderers nor the new one
    assert killed, "the browser was never seen"
    stats = run.stats["s00"]
    browser = stats["render"]["browser"]
    assert browser["browser_launched"] == 2  # replaced
    assert browser["browser_disconnected"] == 1
    assert browser["retries"] == 1 and browser["crashes"] == 1
    row = _candidates(tmp_path / "work")["slow"]["value"]
    assert (row["value"], row["rendered"]) == ("Cork", True)
    assert read_outcomes(tmp_path / "work")["slow"]["outcome"] == "resolved"


# -- the heuristics, on their own ----------------------------------------------------------------


@pytest.mark.parametrize(
    "html, built, signal",
    [
        ("<div id='root'></div><script src='/a.js'></script>", True, "spa_root"),
        (
            "<div id='app'><p>loading</p></div><noscript>Please enable JavaScript.</noscript>"
            "<script src='/a.js'></script>",
            True,
            "noscript_hint",
        ),
        ("<main></main><script>render()</script>", True, "little_text"),
        ("<p>" + "word " * 400 + "</p><script src='/a.js'></script>", False, None),
        ("<p>short page, no script at all</p>", False, "little_text"),
        (
            "<div id='root'><p>" + "server rendered " * 20 + "</p></div><script>x()</script>",
            False,
            None,
        ),
    ],
)
def test_looks_script_built(html, built, signal):
    from enrich_crawl.crawl.render import looks_script_built

    verdict = looks_script_built(
        Page("http://x.test/", f"<html><body>{html}</body></html>", content_type="text/html")
    )
    assert bool(verdict) is built, verdict
    if signal:
        assert signal in verdict.signals


# -- no browser at all ---------------------------------------------------------------------------


def test_a_missing_browser_fails_renders_not_the_run(tmp_path, monkeypatch):
    # ENRICH_CHROMIUM names nothing: the js pages keep their static version, with the reason
    monkeypatch.setenv("ENRICH_CHROMIUM", str(tmp_path / "no-such-chromium"))
    web = tmp_path / "web"
    build_js_web(web)
    rows = [{"id": rid, "url": ROWS[rid][0]} for rid in ("inject", "fetch", "auto_static")]
    dataset, folder = write_dataset(tmp_path, rows, fields=FIELDS, mappings=MAPPINGS, crawl=CRAWL)
    with running_web(web) as server, watching_workers() as seen:
        run = run_workers(
            dataset, folder, tmp_path / "work", proxy=server.proxy_url, shards=1, user_agent=UA
        )
    assert run.returncodes == {"s00": 0}, run.logs["s00"][-3000:]
    outcomes = read_outcomes(tmp_path / "work")
    for rid in ("inject", "fetch"):
        (error,) = outcomes[rid]["errors"]
        assert error["reason"] == "render_error", error
        assert "did not start" in error["detail"], error
    found = _candidates(tmp_path / "work")
    assert found["inject"]["name"]["value"] == "Inject Co"  # the static page still served
    assert "value" not in found["inject"]
    assert found["auto_static"]["value"]["value"] == "Turku"  # auto: nothing to render
    browser = run.stats["s00"]["render"]["browser"]
    assert browser["failed"] == {"browser_start": 1}  # tried once, not once per page
    assert browser["browser_launched"] == 0
    assert "no-such-chromium" in run.logs["s00"]
    assert seen.left_behind() == []


# -- options and settings --------------------------------------------------------------------------


def test_wait_for_is_refused_on_a_static_mapping():
    from enrich_crawl.extract.mapping import MappingError, compile_mapping

    raw = dict(MAPPINGS["js_lazy"])
    assert compile_mapping(raw).wait_for == "#item-25"
    assert compile_mapping(dict(raw, render="auto")).render == "auto"
    raw.pop("render")
    with pytest.raises(MappingError) as caught:
        compile_mapping(raw)
    assert caught.value.problems[0][0] == "$.wait_for"
    with pytest.raises(MappingError) as caught:
        compile_mapping(dict(raw, render="sometimes", wait_for="#x"))
    assert caught.value.problems[0][0] == "$.render"


def test_browser_knobs_from_the_environment_and_the_params(monkeypatch):
    from enrich_crawl.crawl.params import WorkerParams
    from enrich_crawl.crawl.settings import build_settings

    monkeypatch.setenv("ENRICH_CHROMIUM", "/opt/chromium/chrome")
    monkeypatch.setenv("ENRICH_RENDER_CONCURRENCY", "2")
    monkeypatch.setenv("ENRICH_RENDER_MAX_CONTEXTS", "3")
    monkeypatch.setenv("ENRICH_RENDER_RECYCLE_AFTER", "20")
    monkeypatch.setenv("ENRICH_RENDER_THIRD_PARTY", "no")
    params = WorkerParams("d", "s00", "x", "y", "m", {}, crawl={"render_timeout": 12})
    settings = build_settings(params, render=True)
    assert settings["PLAYWRIGHT_LAUNCH_OPTIONS"]["executable_path"] == "/opt/chromium/chrome"
    args = settings["PLAYWRIGHT_LAUNCH_OPTIONS"]["args"]
    for flag in (
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--no-proxy-server",
        "--host-resolver-rules=MAP * ~NOTFOUND",
    ):
        assert flag in args
    assert "proxy" not in settings["PLAYWRIGHT_LAUNCH_OPTIONS"]
    assert settings["PLAYWRIGHT_MAX_PAGES_PER_CONTEXT"] == 2
    assert settings["PLAYWRIGHT_MAX_CONTEXTS"] == 3
    render = settings["ENRICH_RENDER"]
    assert (render["recycle_after"], render["third_party"], render["timeout"]) == (20, False, 12.0)
    # the params' own overrides win over the environment
    params.render = {"concurrency": 1}
    assert build_settings(params, render=True)["PLAYWRIGHT_MAX_PAGES_PER_CONTEXT"] == 1
    monkeypatch.setenv("ENRICH_RENDER_CONCURRENCY", "two")
    params.render = {}
    with pytest.raises(ValueError, match="concurrency"):
        build_settings(params, render=True)


def test_the_render_bound_counts_from_navigation_and_the_wait_for_a_page_apart():
    """RenderDownloadHandler._in_time on its own: a render whose page never comes back is cut
    at navigation + timeout + 5 s, however long the wait for a page allowed (here 60 s); a
    render that never gets a page is cut at the page-wait bound. Either way the download is
    cancelled."""
    import asyncio
    from types import SimpleNamespace

    from enrich_crawl.crawl.render import RenderConfig
    from enrich_crawl.crawl.render_handler import RenderDownloadHandler

    def gate() -> SimpleNamespace:
        return SimpleNamespace(created=time.monotonic(), navigated=None, navigation=asyncio.Event())

    async def stuck(g: SimpleNamespace, navigate_after: float | None, state: dict) -> None:
        try:
            if navigate_after is not None:
                await asyncio.sleep(navigate_after)
                g.navigated = time.monotonic()
                g.navigation.set()
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            state["cancelled"] = True
            raise

    async def cut(page_wait: float, navigate_after: float | None) -> tuple[float, bool]:
        # render timeout 0.1 s: the bound after navigation is 5.1 s
        handler = SimpleNamespace(render_config=RenderConfig(timeout=0.1), _page_wait=page_wait)
        g, state = gate(), {}
        started = time.monotonic()
        with pytest.raises(asyncio.TimeoutError):
            await RenderDownloadHandler._in_time(handler, stuck(g, navigate_after, state), g)
        return time.monotonic() - started, state.get("cancelled", False)

    elapsed, cancelled = asyncio.run(cut(page_wait=60.0, navigate_after=0.2))
    assert cancelled and 5.2 <= elapsed < 30.0  # navigation + 5.1 s, not the 60 s of page wait
    elapsed, cancelled = asyncio.run(cut(page_wait=0.5, navigate_after=None))
    assert cancelled and 0.5 <= elapsed < 5.0  # no page: the page-wait bound
