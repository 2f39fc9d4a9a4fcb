"""A hostile dataset and the virtual web it points at: every kind of bad input at once.

Used by `enrich_crawl_tests/test_bad_input.py` (one `enrich-crawl run` over all of it) and
`bench/soak.py`. The table is dirty (ragged rows, NUL bytes, a line in cp1252 inside a UTF-8 file,
duplicate and missing ids, malformed / non-http / private URLs) and the web is hostile (redirect
loops, a huge page, a gzip bomb, a slowloris server, a server that never answers, robots.txt files
that are huge, binary junk or an HTML page, pages in unexpected encodings, a host that resets every
connection, a name no DNS knows, a 500). `built.expected` says how every row must end:

    built = build_hostile_dataset(tmp_path / "hostile")
    built.spec, built.mappings          # for `enrich-crawl run --dataset ... --mappings ...`
    built.expected["loop"]              # Expect(status="unresolved", reason="redirect_loop")
    built.rejected                      # {row number: reason prefix} of the rows the seed rejects
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from enrich_crawl.crawl.robots import MAX_ROBOTS_BYTES

MAPPING = {
    "name": "hostile",
    "url_patterns": [{"type": "regex", "pattern": r"^https?://h-[a-z0-9-]+\.test/"}],
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

# small limits, so that every fault costs seconds, not minutes
CRAWL = {
    "depth": 0,
    "default_delay": 0.1,
    "download_timeout": 2.0,
    "max_page_bytes": 1024 * 1024,
    "retries": 1,
    "retry_backoff": 0.2,
    "retry_backoff_max": 1.0,
}


@dataclass(frozen=True)
class Expect:
    """How a usable record must end: its status, and its value or the reason of its failure."""

    status: str  # resolved | unresolved
    value: str | None = None
    reason: str | None = None


@dataclass
class HostileDataset:
    root: Path
    spec: Path
    mappings: Path
    name: str
    expected: dict[str, Expect] = field(default_factory=dict)
    rejected: dict[int, str] = field(default_factory=dict)  # row -> reason (prefix)
    web: Path | None = None


def _page(value: str, head: str = "") -> str:
    return (
        f"<html><head>{head}<title>t</title></head><body><p>record page</p>"
        f"<span id='v'>{value}</span></body></html>"
    )


def _host(
    web: Path,
    host: str,
    files: dict[str, str | bytes],
    config: dict | None = None,
    robots: str | bytes | None = "User-agent: *\nAllow: /\n",
) -> None:
    folder = web / host
    folder.mkdir(parents=True, exist_ok=True)
    if robots is not None:
        data = robots.encode("utf-8") if isinstance(robots, str) else robots
        (folder / "robots.txt").write_bytes(data)
    for name, body in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body.encode("utf-8") if isinstance(body, str) else body)
    if config:
        (folder / "_web.json").write_text(json.dumps(config), encoding="utf-8")


def build_hostile_web(web: Path) -> None:
    prose = (
        "<p>Die Rösterei in Zürich röstet täglich frische Bohnen für unsere Gäste. Ein kleines "
        "Café, seit 1952 familiengeführt. Öffnungszeiten: Montag bis Freitag. Über uns: Qualität, "
        "Geschmack und Nachhaltigkeit, für Groß und Klein.</p>"
    )
    html = {"content_type": {"*": "text/html"}}
    _host(
        web,
        "h-ok.test",
        {
            "index.html": _page("ok"),
            "nul.html": _page("nul ok"),
            "cafe.html": _page("café ok"),
            "dup.html": _page("the duplicate must not win"),
        },
    )
    _host(web, "h-loop.test", {}, {"redirects": {"^/start$": "/welcome", "^/welcome$": "/start"}})
    _host(web, "h-huge.test", {}, {"huge": {"^/$": 20_000_000}})
    _host(web, "h-bomb.test", {}, {"bomb": {"^/$": 1_000_000_000}})
    # a slowloris server: the page trickles at 50 bytes/s, far beyond the download timeout
    _host(web, "h-slowloris.test", {"index.html": _page("slow" + " " * 4000)}, {"slow": {"": 50}})
    _host(web, "h-hang.test", {"index.html": _page("never")}, {"hang": ["^/$"]})
    _host(web, "h-500.test", {"index.html": _page("never")}, {"status": {"^/$": 500}})
    # robots.txt: huge (only the first 500 KiB count), binary junk, an HTML page (no rules)
    padding = "# " + "x" * 98 + "\n"
    _host(
        web,
        "h-rbig.test",
        {"early/a.html": _page("early"), "late/a.html": _page("late ok")},
        robots="User-agent: *\nDisallow: /early/\n"
        + padding * (MAX_ROBOTS_BYTES // len(padding) + 50)
        + "Disallow: /late/\n",
    )
    _host(
        web,
        "h-rjunk.test",
        {"a.html": _page("junk robots ok")},
        robots=b"\x00\x01\xff\xfe binary \x89PNG junk\nDisallow: /\n\x00" * 50,
    )
    _host(
        web,
        "h-rhtml.test",
        {"a.html": _page("html robots ok")},
        robots="<!doctype html><html><body><h1>Not found</h1>Disallow: /</body></html>",
    )
    # pages in unexpected encodings
    _host(
        web,
        "h-cp1252.test",
        {"index.html": (_page("Zürich café – “quoted”")[:-14] + prose + "</body></html>").encode(
            "cp1252"
        )},
        html,
    )
    _host(
        web,
        "h-sjis.test",
        {"index.html": _page("東京の会社", head='<meta charset="shift_jis">').encode("shift_jis")},
        html,
    )
    _host(
        web,
        "h-utf16.test",
        {"index.html": _page("Köln").encode("utf-16")},
        {"content_type": {"*": "text/html; charset=iso-8859-1"}},
    )
    (web / "_web.json").write_text(
        json.dumps({"hosts": {"h-down.test": {"unreachable": True}}}), encoding="utf-8"
    )


# the table, line by line (bytes: some lines are deliberately not UTF-8 or hold NUL bytes);
# (line, expectation): an Expect for a usable record, a str for a rejected row's reason
def _rows() -> list[tuple[bytes, Expect | str | None]]:
    ok = Expect("resolved", value="ok")
    bad = Expect("unresolved", reason="invalid_url")
    private = Expect("unresolved", reason="private_address")
    return [
        (b"ok,http://h-ok.test/,", ok),
        (b"ragged,http://h-ok.test/,,surplus,cells", "malformed row"),
        (b"nul\x00id,http://h-ok.test/nul.html,\x00", Expect("resolved", value="nul ok")),
        ("café-1,http://h-ok.test/cafe.html,".encode("cp1252"), Expect("resolved", "café ok")),
        (b"ok,http://h-ok.test/dup.html,", "duplicate id"),
        (b",http://h-ok.test/,", "missing id"),
        (b"badport,http://h-ok.test:99999/,", bad),
        (b"ftp,ftp://h-ok.test/file.txt,", bad),
        (b"js,javascript:alert(1),", bad),
        # a space inside a URL splits it: `http://exa` is refused (a single-label host, no DNS
        # look-up), `mple.test/page` is tried and not found
        (b"spaced,http://exa mple.test/page,", bad),
        (b"nourl,,", Expect("unresolved", reason="no_url")),  # a blank URL cell: the reason
        (b"private,http://10.1.2.3/admin,", private),
        (b"loopback,http://127.0.0.1:8080/,", private),
        (b"hexip,http://0x7f000001/,", private),
        (b"metadata,http://169.254.169.254/latest/meta-data/,", private),
        (b"loop,http://h-loop.test/start,", Expect("unresolved", reason="redirect_loop")),
        (b"huge,http://h-huge.test/,", Expect("unresolved", reason="too_large")),
        (b"bomb,http://h-bomb.test/,", Expect("unresolved", reason="too_large")),
        (b"slowloris,http://h-slowloris.test/,", Expect("unresolved", reason="timeout")),
        (b"hang,http://h-hang.test/,", Expect("unresolved", reason="timeout")),
        (b"s500,http://h-500.test/,", Expect("unresolved", reason="http_500")),
        (b"down,http://h-down.test/,", Expect("unresolved", reason="connection")),
        (b"nodns,http://h-nohost.test/,", Expect("unresolved", reason="dns")),
        (b"robots_big_early,http://h-rbig.test/early/a.html,", Expect("unresolved", reason="robots")),
        (b"robots_big_late,http://h-rbig.test/late/a.html,", Expect("resolved", "late ok")),
        (b"robots_junk,http://h-rjunk.test/a.html,", Expect("resolved", "junk robots ok")),
        (b"robots_html,http://h-rhtml.test/a.html,", Expect("resolved", "html robots ok")),
        (b"cp1252,http://h-cp1252.test/,", Expect("resolved", "Zürich café – “quoted”")),
        (b"sjis,http://h-sjis.test/,", Expect("resolved", "東京の会社")),
        (b"utf16,http://h-utf16.test/,", Expect("resolved", "Köln")),
    ]


def build_hostile_dataset(root: Path, *, name: str = "hostile") -> HostileDataset:
    root = Path(root)
    web = root / "web"
    mappings = root / "mappings"
    web.mkdir(parents=True, exist_ok=True)
    mappings.mkdir(parents=True, exist_ok=True)
    (mappings / "hostile.json").write_text(json.dumps(MAPPING, indent=2), encoding="utf-8")
    build_hostile_web(web)
    built = HostileDataset(
        root=root, spec=root / f"{name}.yaml", mappings=mappings, name=name, web=web
    )
    lines = [b"id,url,value"]
    for row, (line, expect) in enumerate(_rows(), start=1):
        lines.append(line)
        if isinstance(expect, Expect):
            record = line.split(b",", 1)[0]
            rid = record.replace(b"\x00", b"").decode("utf-8", errors="replace")
            if rid.startswith("caf"):
                rid = "café-1"
            built.expected[rid] = expect
        elif isinstance(expect, str):
            built.rejected[row] = expect
    (root / f"{name}.csv").write_bytes(b"\n".join(lines) + b"\n")
    crawl = "\n".join(f"  {key}: {value}" for key, value in CRAWL.items())
    built.spec.write_text(
        f"name: {name}\nsource: {name}.csv\nid: id\nurls: [url]\nfields:\n  value: {{}}\n"
        f"crawl:\n{crawl}\nvirtual_web: web\n",
        encoding="utf-8",
    )
    return built
