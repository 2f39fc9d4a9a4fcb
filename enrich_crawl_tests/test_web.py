"""The virtual web server (enrich_crawl.virtualweb): files, proxy forms, TLS, behaviours, the log."""

from __future__ import annotations

import asyncio
import gzip
import http.client
import json
import os
import random
import signal
import socket
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest
import requests
import urllib3

from enrich_crawl.virtualweb import (
    HostConfig,
    VirtualWeb,
    read_log,
    requests_by_host,
    running_web,
)

BOMB_SIZE = 20_000_000
HUGE_SIZE = 20_000_000

SITE_CONFIG = {
    "gzip": True,
    "headers": {"X-Site": "site"},
    "content_type": {"/legacy*": "text/html; charset=cp1252"},
    "status": {"^/teapot$": 418, "^/weird$": 999, "^/forbidden\\.html$": 403},
    "redirects": {
        "^/old/(.*)$": "/docs/\\1",
        "^/moved$": {"code": 301, "to": "http://other.example/"},
        "^/loop-a$": "/loop-b",
        "^/loop-b$": "/loop-a",
    },
    "bomb": {"^/bomb$": BOMB_SIZE},
    "huge": {"^/huge$": HUGE_SIZE},
    "slow": {"^/slow\\.txt$": 2000},
    "hang": ["^/hang$"],
    "close": ["^/close$"],
    "fail_first": {"^/flaky": 2},
    "no_such_option": 1,
}


def _write(path: Path, content: str | bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")


def build_root(root: Path) -> Path:
    """A small virtual web: a rich site, a bare site, a slow site, an IP host, a dead host."""
    _write(
        root / "_web.json",
        json.dumps({"seed": 1, "hosts": {"down.example": {"unreachable": True}}}),
    )
    site = root / "site.example"
    _write(site / "_web.json", json.dumps(SITE_CONFIG))
    _write(site / "index.html", "<html><title>home</title></html>")
    _write(site / "page.html", "<html><title>page</title><p>hello</p></html>")
    _write(site / "about.html", "<html><title>about</title></html>")
    _write(site / "docs" / "index.html", "<p>docs index</p>")
    _write(site / "docs" / "intro.html", "<p>intro</p>")
    _write(site / "search", "<p>search: generic</p>")
    _write(site / "search?q=python", "<p>search: python</p>")
    _write(site / "data.json", '{"a": 1}')
    _write(site / "notes.txt", "plain notes\n" * 50)
    _write(site / "slow.txt", "s" * 600)
    _write(site / "legacy.html", "<p>caf\u00e9</p>".encode("cp1252"))
    _write(site / "forbidden.html", "<p>no entry</p>")
    _write(site / "flaky.html", "<p>finally</p>")
    _write(site / "robots.txt", "User-agent: *\nDisallow: /private/\n")
    _write(site / "404.html", "<p>custom not found</p>")
    _write(site / "_secret.txt", "never served")
    _write(root / "bare.example" / "index.html", "<p>bare</p>")
    _write(root / "slow.example" / "index.html", "<p>slow</p>")
    _write(root / "slow.example" / "_web.json", json.dumps({"latency": 0.5}))
    _write(root / "127.0.0.5" / "index.html", "<p>by ip</p>")
    return root


@pytest.fixture(scope="module")
def web(tmp_path_factory):
    root = build_root(tmp_path_factory.mktemp("vweb"))
    with running_web(root) as handle:
        yield handle


@pytest.fixture(autouse=True)
def _quiet_insecure_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", urllib3.exceptions.InsecureRequestWarning)
        yield


def direct(web, method, path, host, headers=None):
    """Origin-form request (``GET /path`` + ``Host:``) on a fresh connection."""
    conn = http.client.HTTPConnection("127.0.0.1", web.port, timeout=5)
    try:
        conn.request(method, path, headers={"Host": host, **(headers or {})})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def proxied(web, url, headers=None, method="GET"):
    """Absolute-form request (``GET http://host/path``), raw: no decoding, no redirects."""
    conn = http.client.HTTPConnection("127.0.0.1", web.port, timeout=5)
    try:
        conn.request(method, url, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def get(web, url, **kwargs):
    kwargs.setdefault("timeout", 5)
    return requests.get(url, proxies=web.proxies, verify=False, **kwargs)


def wait_log(web, predicate, timeout=3.0):
    deadline = time.monotonic() + timeout
    while True:
        hits = [e for e in web.read_log() if predicate(e)]
        if hits or time.monotonic() > deadline:
            return hits
        time.sleep(0.02)


# -- request forms ---------------------------------------------------------------------------------


def test_proxy_form_and_origin_form(web):
    status, headers, body = proxied(web, "http://site.example/page.html")
    assert status == 200 and b"<p>hello</p>" in body
    assert headers["Content-Length"] == str(len(body))
    status, _, body2 = direct(web, "GET", "/page.html", "SITE.Example:80")
    assert status == 200 and body2 == body
    status, _, body = direct(web, "GET", "/", "127.0.0.5")
    assert status == 200 and body == b"<p>by ip</p>"
    entries = wait_log(web, lambda e: e["path"] == "/page.html" and e["host"] == "site.example")
    assert sorted(e["proxy"] for e in entries) == [False, True]


def test_connect_tls(web):
    r = get(web, "https://site.example/page.html")
    assert r.status_code == 200 and "<p>hello</p>" in r.text
    # The per-host certificate is valid for the host and signed by the server's CA.
    r = requests.get(
        "https://site.example/docs/", proxies=web.proxies, verify=str(web.ca_path), timeout=5
    )
    assert r.status_code == 200 and r.text == "<p>docs index</p>"
    tls = wait_log(web, lambda e: e["tls"] and e["path"] == "/page.html")
    assert tls and tls[0]["proxy"] is True and tls[0]["host"] == "site.example"
    connects = wait_log(web, lambda e: e["method"] == "CONNECT")
    assert connects and connects[0]["path"] == "site.example:443"


def test_unknown_host(web):
    status, headers, body = proxied(web, "http://nowhere.example/")
    assert status == 502 and headers["X-Proxy-Error"] == "dns" and body
    status, headers, _ = direct(web, "GET", "/", "nowhere.example")
    assert status == 502 and headers["X-Proxy-Error"] == "dns"
    with pytest.raises(requests.exceptions.ProxyError):
        get(web, "https://nowhere.example/")


def test_robots_absent_is_404(web):
    r = get(web, "http://bare.example/robots.txt")
    assert r.status_code == 404 and r.headers["Content-Type"].startswith("text/plain")
    r = get(web, "http://site.example/robots.txt")
    assert r.status_code == 200 and r.text.startswith("User-agent: *")
    assert r.headers["Content-Type"] == "text/plain"


# -- paths -----------------------------------------------------------------------------------------


def test_index_directory_and_fallbacks(web):
    assert proxied(web, "http://site.example/")[2] == b"<html><title>home</title></html>"
    status, headers, _ = proxied(web, "http://site.example/docs?x=1")
    assert status == 301 and headers["Location"] == "/docs/?x=1"
    assert proxied(web, "http://site.example/docs/")[2] == b"<p>docs index</p>"
    assert proxied(web, "http://site.example/about")[2] == b"<html><title>about</title></html>"
    status, _, body = proxied(web, "http://site.example/missing")
    assert status == 404 and body == b"<p>custom not found</p>"  # the host's 404.html
    for hidden in ("/_secret.txt", "/_web.json", "/../../_web.json", "/%2e%2e/%2e%2e/etc/passwd"):
        status, _, body = proxied(web, f"http://site.example{hidden}")
        assert status == 404 and b"never" not in body and b"gzip" not in body, hidden
    status, _, body = proxied(web, "http://bare.example/nothing")
    assert status == 404 and body.startswith(b"404")


def test_query_files(web):
    assert proxied(web, "http://site.example/search?q=python")[2] == b"<p>search: python</p>"
    assert proxied(web, "http://site.example/search?q=java")[2] == b"<p>search: generic</p>"
    assert proxied(web, "http://site.example/search")[2] == b"<p>search: generic</p>"
    assert proxied(web, "http://site.example/page.html?utm=1")[0] == 200


def test_content_types(web):
    def ctype(path):
        return proxied(web, f"http://site.example{path}")[1]["Content-Type"]

    assert ctype("/page.html") == "text/html"  # no charset unless configured
    assert ctype("/search?q=python") == "text/html"  # sniffed: no extension
    assert ctype("/data.json") == "application/json"
    assert ctype("/notes.txt") == "text/plain"
    assert ctype("/legacy.html") == "text/html; charset=cp1252"
    r = get(web, "http://site.example/legacy.html")
    assert r.text == "<p>caf\u00e9</p>"
    assert r.headers["X-Site"] == "site"


def test_etag_and_304(web):
    status, headers, body = proxied(web, "http://site.example/page.html")
    etag, modified = headers["ETag"], headers["Last-Modified"]
    assert status == 200 and etag.startswith('"')
    status, headers, body = proxied(web, "http://site.example/page.html", {"If-None-Match": etag})
    assert status == 304 and body == b"" and headers["ETag"] == etag
    status, _, _ = proxied(web, "http://site.example/page.html", {"If-None-Match": '"other"'})
    assert status == 200
    status, _, body = proxied(web, "http://site.example/page.html", {"If-Modified-Since": modified})
    assert status == 304 and body == b""
    old = "Mon, 01 Jan 2001 00:00:00 GMT"
    assert proxied(web, "http://site.example/page.html", {"If-Modified-Since": old})[0] == 200
    assert any(e["status"] == 304 for e in wait_log(web, lambda e: e["path"] == "/page.html"))


def test_gzip(web):
    plain = (b"plain notes\n") * 50
    _, headers, body = proxied(web, "http://site.example/notes.txt", {"Accept-Encoding": "gzip"})
    assert headers["Content-Encoding"] == "gzip" and headers["Vary"] == "Accept-Encoding"
    assert int(headers["Content-Length"]) == len(body) < len(plain)
    assert gzip.decompress(body) == plain
    _, headers, body = proxied(web, "http://site.example/notes.txt")
    assert "Content-Encoding" not in headers and body == plain
    # A gzip variant's ETag still validates.
    _, headers, _ = proxied(web, "http://site.example/notes.txt", {"Accept-Encoding": "gzip"})
    h = {"Accept-Encoding": "gzip", "If-None-Match": headers["ETag"]}
    assert proxied(web, "http://site.example/notes.txt", h)[0] == 304
    assert get(web, "http://site.example/notes.txt").content == plain


def test_bomb(web):
    status, headers, body = proxied(web, "http://site.example/bomb")  # even without Accept-Encoding
    assert status == 200 and headers["Content-Encoding"] == "gzip"
    assert len(body) < BOMB_SIZE / 500
    inflated = gzip.decompress(body)
    assert len(inflated) == BOMB_SIZE and inflated.count(0) == BOMB_SIZE


def test_huge_streamed(web):
    with get(web, "http://site.example/huge", stream=True) as r:
        assert r.status_code == 200 and int(r.headers["Content-Length"]) == HUGE_SIZE
        total = sum(len(chunk) for chunk in r.iter_content(1 << 20))
    assert total == HUGE_SIZE
    status, headers, body = proxied(web, "http://site.example/huge", method="HEAD")
    assert status == 200 and headers["Content-Length"] == str(HUGE_SIZE) and body == b""
    entries = wait_log(web, lambda e: e["path"] == "/huge" and e["method"] == "GET")
    assert entries[0]["bytes"] == HUGE_SIZE


# -- behaviours ------------------------------------------------------------------------------------


def test_status_overrides(web):
    assert get(web, "http://site.example/teapot").status_code == 418
    r = get(web, "http://site.example/weird")
    assert r.status_code == 999 and r.headers["Content-Length"] == str(len(r.content))
    r = get(web, "http://site.example/forbidden.html")
    assert r.status_code == 403 and r.text == "<p>no entry</p>"


def test_redirects(web):
    r = get(web, "http://site.example/old/intro.html", allow_redirects=False)
    assert r.status_code == 302 and r.headers["Location"] == "/docs/intro.html"
    r = get(web, "http://site.example/old/intro.html")
    assert r.status_code == 200 and r.text == "<p>intro</p>" and len(r.history) == 1
    r = get(web, "http://site.example/moved", allow_redirects=False)
    assert r.status_code == 301 and r.headers["Location"] == "http://other.example/"
    with pytest.raises(requests.TooManyRedirects):
        get(web, "http://site.example/loop-a")


def test_fail_first(web):
    codes = [get(web, "http://site.example/flaky").status_code for _ in range(4)]
    assert codes == [503, 503, 200, 200]
    assert get(web, "http://site.example/flaky?other=1").status_code == 503  # counted per path


def test_latency(web):
    start = time.monotonic()
    assert get(web, "http://slow.example/").status_code == 200
    assert 0.49 <= time.monotonic() - start < 3.0
    start = time.monotonic()
    get(web, "http://bare.example/")
    assert time.monotonic() - start < 0.4


def test_lognormal_latency_is_seeded():
    cfg = HostConfig.parse({"latency": {"median": 0.15, "sigma": 0.6, "max": 5}}, "test")
    draws = [cfg.draw_latency(random.Random("1/a.example")) for _ in range(3)]
    assert draws[0] == draws[1] == draws[2]
    rng = random.Random(7)
    values = sorted(cfg.draw_latency(rng) for _ in range(2001))
    assert 0.12 < values[1000] < 0.18 and max(values) <= 5 and len(set(values)) > 1000


def test_slow_body(web):
    start = time.monotonic()
    r = get(web, "http://site.example/slow.txt", headers={"Accept-Encoding": "identity"})
    assert r.text == "s" * 600 and time.monotonic() - start >= 0.25


def test_hang_close_unreachable(web):
    with pytest.raises(requests.exceptions.ReadTimeout):
        get(web, "http://site.example/hang", timeout=0.5)
    with pytest.raises(requests.exceptions.ConnectionError):
        get(web, "http://site.example/close")
    for url in ("http://down.example/robots.txt", "https://down.example/"):
        with pytest.raises(requests.exceptions.ConnectionError):
            get(web, url)
    notes = {e.get("note") for e in wait_log(web, lambda e: "note" in e)}
    assert {"hang", "close", "unreachable"} <= notes
    assert get(web, "http://site.example/").status_code == 200  # still serving


# -- protocol --------------------------------------------------------------------------------------


def test_keep_alive(web):
    conn = http.client.HTTPConnection("127.0.0.1", web.port, timeout=5)
    conn.request("GET", "http://site.example/page.html", headers={"User-Agent": "ka-test"})
    first = conn.getresponse()
    first.read()
    sock = conn.sock
    conn.request("GET", "http://site.example/about", headers={"User-Agent": "ka-test"})
    second = conn.getresponse()
    assert second.read() == b"<html><title>about</title></html>"
    assert conn.sock is sock and first.status == second.status == 200
    conn.close()
    entries = wait_log(web, lambda e: e["ua"] == "ka-test")
    assert len(entries) == 2 and entries[0]["conn"] == entries[1]["conn"]


def test_head_and_other_methods(web):
    status, headers, body = proxied(web, "http://site.example/page.html", method="HEAD")
    assert status == 200 and body == b"" and int(headers["Content-Length"]) > 0
    status, headers, _ = proxied(web, "http://site.example/page.html", method="POST")
    assert status == 405 and headers["Allow"] == "GET, HEAD"


def _raw(web, data: bytes, read: bool = True) -> bytes:
    with socket.create_connection(("127.0.0.1", web.port), timeout=5) as s:
        s.sendall(data)
        if not read:
            return b""
        chunks = []
        while True:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)


def test_malformed_requests_do_not_crash(web):
    assert _raw(web, b"garbage\r\n\r\n").startswith(b"HTTP/1.1 400")
    assert _raw(web, b"GET / HTTP/2.0\r\nHost: site.example\r\n\r\n").startswith(b"HTTP/1.1 505")
    assert _raw(web, b"GET / HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 400")  # no Host
    assert _raw(web, b"GET / HTTP/1.1\r\nHost: a/../b\r\n\r\n").startswith(b"HTTP/1.1 400")
    huge = b"GET / HTTP/1.1\r\nHost: site.example\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n"
    assert _raw(web, huge).startswith(b"HTTP/1.1 431")
    many = b"GET / HTTP/1.1\r\nHost: site.example\r\n" + b"X-A: b\r\n" * 5000 + b"\r\n"
    assert _raw(web, many).startswith(b"HTTP/1.1 431")
    _raw(web, b"GET http://site.example/huge HTTP/1.1\r\n\r\n", read=False)  # client vanishes
    _raw(web, b"GET /page.ht", read=False)
    _raw(web, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", read=False)  # TLS without CONNECT
    pipelined = b"".join(
        b"GET /%s HTTP/1.1\r\nHost: site.example\r\n%s\r\n" % (p, c)
        for p, c in ((b"page.html", b""), (b"about", b"Connection: close\r\n"))
    )
    answer = _raw(web, pipelined)
    assert answer.count(b"HTTP/1.1 200 OK") == 2 and answer.endswith(b"</title></html>")
    one_zero = _raw(web, b"GET /about HTTP/1.0\r\nHost: site.example\r\n\r\n")  # then closed
    assert one_zero.startswith(b"HTTP/1.1 200") and b"Connection: close" in one_zero
    with_body = (
        b"GET /page.html HTTP/1.1\r\nHost: site.example\r\nContent-Length: 5\r\n\r\nhello"
        b"GET /about HTTP/1.1\r\nHost: site.example\r\nConnection: close\r\n\r\n"
    )
    answer = _raw(web, with_body)
    assert answer.count(b"HTTP/1.1 200 OK") == 2 and answer.endswith(b"</title></html>")
    assert get(web, "http://site.example/").status_code == 200
    assert web.process.poll() is None


def test_request_log_fields(web):
    plain_headers = {"User-Agent": "LogBot/1.0", "Accept-Encoding": "identity"}
    get(web, "http://site.example/data.json?x=1", headers=plain_headers)
    get(web, "https://site.example/data.json?tls=1", headers={"User-Agent": "LogBot/1.0"})
    entries = wait_log(web, lambda e: e["ua"] == "LogBot/1.0")
    assert len(entries) == 2
    plain, tls = sorted(entries, key=lambda e: e["tls"])
    assert set(plain) >= {
        "t",
        "host",
        "path",
        "method",
        "ua",
        "status",
        "bytes",
        "proxy",
        "conn",
        "tls",
    }
    assert plain["host"] == "site.example" and plain["path"] == "/data.json?x=1"
    assert plain["method"] == "GET" and plain["status"] == 200 and plain["bytes"] == 8
    assert plain["proxy"] is True and plain["tls"] is False and isinstance(plain["conn"], int)
    assert abs(plain["t"] - time.time()) < 30
    assert tls["tls"] is True and tls["path"] == "/data.json?tls=1"
    grouped = requests_by_host(web.read_log())
    assert "site.example" in grouped and all(
        e["method"] != "CONNECT" for e in grouped["site.example"]
    )
    times = [e["t"] for e in grouped["site.example"]]
    assert times == sorted(times)
    assert "CONNECT" in {
        e["method"] for e in requests_by_host(web.log_path, include_connect=True)["site.example"]
    }
    assert "unknown key 'no_such_option'" in web.server_log()


SCRAPY_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import scrapy
    from scrapy.crawler import CrawlerProcess

    class Probe(scrapy.Spider):
        name = "probe"

        async def start(self):
            for url in sys.argv[1:]:
                yield scrapy.Request(url, dont_filter=True)

        def parse(self, response):
            print(json.dumps({"url": response.url, "status": response.status,
                              "text": response.text}), flush=True)

    process = CrawlerProcess({
        "LOG_LEVEL": "ERROR", "TELNETCONSOLE_ENABLED": False, "ROBOTSTXT_OBEY": False,
        "USER_AGENT": "ScrapyProbe (+https://example.invalid/bot)",
    })
    process.crawl(Probe)
    process.start()
    """
)


def test_scrapy_reaches_it_through_http_proxy(web, tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(SCRAPY_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k.lower() not in ("no_proxy", "all_proxy")}
    env.update(web.proxy_env())
    urls = ["http://site.example/page.html", "https://site.example/docs/intro.html"]
    out = subprocess.run(
        [sys.executable, str(script), *urls], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    got = {d["url"]: d for d in map(json.loads, out.stdout.splitlines())}
    assert got[urls[0]]["status"] == 200 and "<p>hello</p>" in got[urls[0]]["text"]
    assert got[urls[1]]["status"] == 200 and got[urls[1]]["text"] == "<p>intro</p>"
    seen = wait_log(web, lambda e: e["ua"].startswith("ScrapyProbe") and e["method"] == "GET")
    assert {(e["path"], e["tls"], e["proxy"]) for e in seen} == {
        ("/page.html", False, True),
        ("/docs/intro.html", True, True),
    }


# -- API -------------------------------------------------------------------------------------------


def test_in_process_server(tmp_path):
    root = build_root(tmp_path / "root")
    log_path = tmp_path / "requests.jsonl"

    async def scenario():
        async with VirtualWeb(root, log_path=log_path, seed=3) as vweb:
            assert vweb.proxy_url == f"http://127.0.0.1:{vweb.port}"
            reader, writer = await asyncio.open_connection("127.0.0.1", vweb.port)
            writer.write(b"HEAD http://site.example/page.html HTTP/1.1\r\nUser-Agent: t\r\n\r\n")
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            writer.close()
            return head

    head = asyncio.run(scenario())
    assert head.startswith(b"HTTP/1.1 200 OK") and b"Content-Length: " in head
    (entry,) = read_log(log_path)
    assert entry["method"] == "HEAD" and entry["bytes"] == 0 and entry["ua"] == "t"


def test_running_web_always_stops(tmp_path):
    root = build_root(tmp_path / "root")
    log_path = tmp_path / "log.jsonl"
    with pytest.raises(RuntimeError, match="boom"), running_web(root, log_path=log_path) as handle:
        proc = handle.process
        assert os.getpgid(proc.pid) == proc.pid  # its own process group / session
        assert get(handle, "http://bare.example/").text == "<p>bare</p>"
        raise RuntimeError("boom")
    assert proc.poll() is not None and proc.returncode in (0, -signal.SIGTERM)
    assert [e["path"] for e in read_log(log_path)] == ["/"]


def test_idle_keep_alive_connections_are_closed_after_idle_timeout(tmp_path):
    """`--idle-timeout` (running_web's `idle_timeout`): as real servers do (Apache closes after
    5 s), an idle keep-alive connection is closed; a busy one is not."""
    root = build_root(tmp_path / "root")
    with (
        running_web(root, idle_timeout=0.5) as handle,
        socket.create_connection(("127.0.0.1", handle.port), timeout=5) as s,
    ):
        request = b"GET http://bare.example/ HTTP/1.1\r\nHost: bare.example\r\n\r\n"
        s.sendall(request)
        assert s.recv(65536).startswith(b"HTTP/1.1 200")
        time.sleep(0.2)  # idle, but not long enough
        s.sendall(request)
        assert s.recv(65536).startswith(b"HTTP/1.1 200")
        # closed by the server once idle for 0.5 s (the default, 120 s, would outlast the
        # socket's 5 s timeout)
        assert s.recv(65536) == b""
