"""A virtual web of pages built by JavaScript, with the dataset rows and mappings that read them.

Used by the rendering tests (enrich_crawl_tests/test_render.py) and the rendering benchmark
(bench/bench_render.py). Every value a mapping reads on a `js-*` or `auto-shell` page exists only
after scripts ran: the static HTML has an empty mount node.

Hosts (`build_js_web`):

- `js-inject.test`     the value written into the page by an inline script;
- `js-fetch.test`      (seeded over https) a shell whose script fetch()es the value from a JSON
                       endpoint; it also asks for a stylesheet, an image, a font and a video
                       (all aborted);
- `js-lazy.test`       an infinite-scroll list: 10 items, 10 more per scroll to the bottom (from
                       JSON pages); the value is item 25, behind the mapping's `wait_for`;
- `js-crash.test`      a script that allocates without end: the renderer runs out of heap and
                       crashes (its name is in the static HTML, for a static mapping);
- `js-hang.test`       a script that never returns: the page never finishes loading;
- `auto-shell.test`    an `auto` page: an empty `<div id="root">`, a <noscript> hint, the value
                       injected by a script;
- `auto-static.test`   an `auto` page whose value is in the static HTML (not rendered);
- `auto-article.test`  an `auto` page without the value: plenty of text, no script (not rendered);
- `www.polite-js.test` three `js` pages behind `Crawl-delay: 1`: each loads the site's script,
  fetches its value from `/data/`, a second value from `api.polite-js.test` (same site, another
  host: robots.txt first), a secret under a robots.txt-disallowed path and a third-party script
  from `cdn.elsewhere.test` (neither may be requested).

`build_bench_web` generates `hosts` x `pages_per_host` pages of the `js-fetch` kind for the
benchmark (a shared script, one JSON request per page).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FIELD_VALUE = "//span[@id='v']/text()"

MAPPINGS: dict[str, dict[str, Any]] = {
    "js_pages": {
        "name": "js_pages",
        "render": "js",
        "url_patterns": [
            {"type": "regex", "pattern": r"^https?://js-(?:inject|fetch|crash|hang)\.test/"}
        ],
        "fields": [
            {
                "name": "value",
                "processors": [
                    {"type": "xpath", "parameters": {"expression": FIELD_VALUE}},
                    {"type": "trim", "parameters": {}},
                ],
            }
        ],
    },
    "js_names": {
        "name": "js_names",
        "url_patterns": [{"type": "regex", "pattern": r"^https?://js-[a-z]+\.test/"}],
        "fields": [
            {
                "name": "name",
                "processors": [
                    {"type": "xpath", "parameters": {"expression": "//h1[@class='name']/text()"}},
                    {"type": "trim", "parameters": {}},
                ],
            }
        ],
    },
    "js_lazy": {
        "name": "js_lazy",
        "render": "js",
        "wait_for": "#item-25",
        "url_patterns": [{"type": "regex", "pattern": r"^https?://js-lazy\.test/"}],
        "fields": [
            {
                "name": "value",
                "processors": [
                    {
                        "type": "xpath",
                        "parameters": {"expression": "//li[@id='item-25']/span[@class='v']/text()"},
                    }
                ],
            }
        ],
    },
    "auto_pages": {
        "name": "auto_pages",
        "render": "auto",
        "url_patterns": [{"type": "regex", "pattern": r"^https?://auto-[a-z]+\.test/"}],
        "fields": [
            {
                "name": "value",
                "processors": [
                    {"type": "xpath", "parameters": {"expression": FIELD_VALUE}},
                    {"type": "trim", "parameters": {}},
                ],
            }
        ],
    },
    "polite_js": {
        "name": "polite_js",
        "render": "js",
        "url_patterns": [
            {"type": "regex", "pattern": r"^https?://www\.polite-js\.test/p\d+(?:#.*)?$"}
        ],
        "fields": [
            {
                "name": "value",
                "processors": [{"type": "xpath", "parameters": {"expression": FIELD_VALUE}}],
            },
            {
                "name": "region",
                "processors": [
                    {"type": "xpath", "parameters": {"expression": "//span[@id='r']/text()"}}
                ],
            },
            {
                "name": "secret",
                "processors": [
                    {"type": "xpath", "parameters": {"expression": "//span[@id='s']/text()"}}
                ],
            },
        ],
    },
}

FIELDS = {"value": {}, "name": {}, "region": {}, "secret": {}}

# record id -> (seed URL, the value a render finds)
ROWS = {
    "inject": ("http://js-inject.test/", "Lyon"),
    "fetch": ("https://js-fetch.test/", "Porto"),
    "lazy": ("http://js-lazy.test/", "Item twenty-five"),
    "crash": ("http://js-crash.test/", None),
    "hang": ("http://js-hang.test/", None),
    "auto_shell": ("http://auto-shell.test/", "Gdansk"),
    "auto_static": ("http://auto-static.test/", "Turku"),
    "auto_article": ("http://auto-article.test/", None),
    "polite1": ("http://www.polite-js.test/p1", "Value 1"),
    "polite2": ("http://www.polite-js.test/p2", "Value 2"),
    "polite3": ("http://www.polite-js.test/p3", "Value 3"),
}

ALLOW_ALL = "User-agent: *\nAllow: /\n"


def _write(root: Path, host: str, files: dict[str, str], config: dict | None = None) -> None:
    folder = root / host
    folder.mkdir(parents=True, exist_ok=True)
    files = {"robots.txt": ALLOW_ALL, **files}
    for name, text in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    if config is not None:
        (folder / "_web.json").write_text(json.dumps(config), encoding="utf-8")


def _shell(title: str, body: str) -> str:
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title></head>"
        f"<body>{body}</body></html>"
    )


FETCH_SCRIPT = """
fetch('/api/company.json')
  .then(function (r) { return r.json(); })
  .then(function (d) {
    document.getElementById('app').innerHTML =
      '<p>City: <span id="v">' + d.city + '</span></p>';
  });
"""

LAZY_SCRIPT = """
var page = 1, loading = false;
function add(items) {
  var list = document.getElementById('list');
  items.forEach(function (item) {
    var li = document.createElement('li');
    li.id = 'item-' + item.n;
    li.style.height = '150px';
    li.innerHTML = '<span class="v">' + item.text + '</span>';
    list.appendChild(li);
  });
}
function more() {
  if (loading || page >= 4) { return; }
  loading = true;
  page += 1;
  setTimeout(function () {
    fetch('/api/items-' + page + '.json')
      .then(function (r) { return r.json(); })
      .then(function (d) { add(d.items); loading = false; });
  }, 200);
}
window.addEventListener('scroll', function () {
  if (window.innerHeight + window.scrollY >= document.body.offsetHeight - 100) { more(); }
});
fetch('/api/items-1.json').then(function (r) { return r.json(); })
  .then(function (d) { add(d.items); });
"""

NUMBERS = {25: "Item twenty-five"}


def _items(page: int) -> str:
    items = [
        {"n": n, "text": NUMBERS.get(n, f"item {n}")} for n in range(page * 10 - 9, page * 10 + 1)
    ]
    return json.dumps({"items": items})


INJECT_SCRIPT = (
    "document.getElementById('root').innerHTML ="
    " '<p>City: <span id=\"v\">' + ['Ly', 'on'].join('') + '</span></p>';"
)

# allocates until V8's heap limit: the renderer process dies (Chromium's "Aw, snap")
CRASH_SCRIPT = "var hoard = []; while (true) { hoard.push(new Array(100000).fill(Math.random())); }"
HANG_SCRIPT = "while (true) {}"

ARTICLE = " ".join(
    "The cooperative was founded by the fishermen of the bay, who pooled their boats and nets "
    "so that every family could sell its catch at the same fair price."
    for _ in range(20)
)

POLITE_SCRIPT = """
var n = location.pathname.replace('/p', '');
function show(id, url) {
  return fetch(url).then(function (r) { return r.json(); }).then(function (d) {
    var s = document.createElement('span'); s.id = id; s.textContent = d.value;
    document.getElementById('app').appendChild(s);
  }).catch(function () {});
}
show('v', '/data/p' + n + '.json');
show('r', 'http://api.polite-js.test/v/p' + n + '.json');
show('s', '/private/secret.json');
"""


def build_js_web(root: Path) -> list[dict[str, str]]:
    """Write the virtual web under `root`; the dataset rows (`id`, `url`)."""
    root.mkdir(parents=True, exist_ok=True)
    _write(
        root,
        "js-inject.test",
        {
            "index.html": _shell(
                "Inject",
                "<h1 class='name'>Inject Co</h1><div id='root'></div>"
                f"<script>{INJECT_SCRIPT}</script>",
            )
        },
    )
    _write(
        root,
        "js-fetch.test",
        {
            "index.html": _shell(
                "Fetch",
                "<link rel='stylesheet' href='/static/site.css'>"
                "<h1 class='name'>Fetch Co</h1><img src='/img/logo.png'>"
                "<video src='/media/intro.webm' preload='auto' muted autoplay></video>"
                "<div id='app'></div><script src='/static/app.js'></script>"
                "<style>@font-face { font-family: x; src: url('/fonts/x.woff2'); }"
                " body { font-family: x; }</style>",
            ),
            "static/app.js": FETCH_SCRIPT,
            "static/site.css": "body { color: black; }",
            "img/logo.png": "not really a png",
            "fonts/x.woff2": "not really a font",
            "media/intro.webm": "not really a video",
            "api/company.json": json.dumps({"city": "Porto"}),
        },
    )
    lazy_files = {
        "index.html": _shell(
            "Lazy",
            f"<h1 class='name'>Lazy Co</h1><ul id='list'></ul><script>{LAZY_SCRIPT}</script>",
        )
    }
    for page in range(1, 5):
        lazy_files[f"api/items-{page}.json"] = _items(page)
    _write(root, "js-lazy.test", lazy_files)
    _write(
        root,
        "js-crash.test",
        {
            "index.html": _shell(
                "Crash",
                "<h1 class='name'>Crash Co</h1><div id='root'></div>"
                f"<script>{CRASH_SCRIPT}</script>",
            )
        },
    )
    _write(
        root,
        "js-hang.test",
        {
            "index.html": _shell(
                "Hang",
                f"<h1 class='name'>Hang Co</h1><div id='root'></div><script>{HANG_SCRIPT}</script>",
            )
        },
    )
    _write(
        root,
        "auto-shell.test",
        {
            "index.html": _shell(
                "Shell",
                "<div id='root'></div><noscript>You need to enable JavaScript to run this app."
                "</noscript><script src='/app.js'></script>",
            ),
            "app.js": "document.getElementById('root').innerHTML ="
            " '<main><span id=\"v\">Gdansk</span></main>';",
        },
    )
    _write(
        root,
        "auto-static.test",
        {
            "index.html": _shell(
                "Static",
                "<p>City: <span id='v'>Turku</span></p><script>window.analytics = true;</script>",
            )
        },
    )
    _write(
        root,
        "auto-article.test",
        {"index.html": _shell("Article", f"<article><p>{ARTICLE}</p></article>")},
    )
    polite = {
        "robots.txt": "User-agent: *\nCrawl-delay: 1\nDisallow: /private/\n",
        "app.js": POLITE_SCRIPT,
        "private/secret.json": json.dumps({"value": "do not fetch"}),
    }
    for n in (1, 2, 3):
        polite[f"p{n}"] = _shell(
            f"Page {n}",
            "<div id='app'></div><script src='/app.js'></script>"
            "<script src='http://cdn.elsewhere.test/lib.js'></script>",
        )
        polite[f"data/p{n}.json"] = json.dumps({"value": f"Value {n}"})
    _write(root, "www.polite-js.test", polite, {"content_type": {"/p*": "text/html"}})
    api = {f"v/p{n}.json": json.dumps({"value": f"Region {n}"}) for n in (1, 2, 3)}
    _write(
        root,
        "api.polite-js.test",
        api,
        {"headers": {"Access-Control-Allow-Origin": "*"}},
    )
    _write(root, "cdn.elsewhere.test", {"lib.js": "window.lib = 1;"})
    return [{"id": rid, "url": url} for rid, (url, _) in ROWS.items()]


def as_static(mappings: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The same mappings with rendering off (what a static crawl of the same pages finds)."""
    out = {}
    for name, mapping in mappings.items():
        mapping = {k: v for k, v in mapping.items() if k not in ("render", "wait_for")}
        out[name] = mapping
    return out


# -- the benchmark's web ---------------------------------------------------------------------------

BENCH_MAPPING = {
    "name": "bench_js",
    "render": "js",
    "url_patterns": [{"type": "regex", "pattern": r"^https?://render-\d+\.test/item/\d+$"}],
    "fields": [
        {
            "name": "value",
            "processors": [{"type": "xpath", "parameters": {"expression": FIELD_VALUE}}],
        }
    ],
}
BENCH_STATIC_MAPPING = {
    "name": "bench_static",
    "url_patterns": [{"type": "regex", "pattern": r"^https?://render-\d+\.test/static/\d+$"}],
    "fields": [
        {
            "name": "value",
            "processors": [{"type": "xpath", "parameters": {"expression": FIELD_VALUE}}],
        }
    ],
}

BENCH_SCRIPT = """
var n = location.pathname.split('/').pop();
fetch('/api/' + n + '.json').then(function (r) { return r.json(); }).then(function (d) {
  var p = document.createElement('p');
  p.innerHTML = 'Value: <span id="v">' + d.value + '</span>';
  document.getElementById('app').appendChild(p);
  for (var i = 0; i < 200; i++) {
    var li = document.createElement('li'); li.textContent = d.value + ' row ' + i;
    document.getElementById('rows').appendChild(li);
  }
});
"""


def build_bench_web(
    root: Path, *, hosts: int, pages_per_host: int, latency: float = 0.0
) -> list[dict[str, str]]:
    """`hosts` x `pages_per_host` pages: `/item/N` (a shell filled by the host's script from one
    JSON request; it also asks for a stylesheet and an image) and `/static/N` (the same content in
    static HTML); rows `id`, `host`, `n`, `url`, `static_url`, `value`."""
    rows = []
    config: dict[str, Any] = {"content_type": {"/item/*": "text/html", "/static/*": "text/html"}}
    if latency:
        config["latency"] = latency
    for h in range(hosts):
        host = f"render-{h:03d}.test"
        files = {"app.js": BENCH_SCRIPT}
        for n in range(pages_per_host):
            value = f"value {h}-{n}"
            files[f"item/{n}"] = _shell(
                f"Item {n}",
                "<link rel='stylesheet' href='/site.css'><img src='/logo.png'>"
                "<div id='app'></div><ul id='rows'></ul><script src='/app.js'></script>",
            )
            files[f"api/{n}.json"] = json.dumps({"value": value})
            files[f"static/{n}"] = _shell(
                f"Item {n}",
                f"<p>Value: <span id='v'>{value}</span></p><ul>"
                + "".join(f"<li>{value} row {i}</li>" for i in range(200))
                + "</ul>",
            )
            rows.append(
                {
                    "id": f"r{h:03d}-{n:03d}",
                    "host": h,
                    "n": n,
                    "url": f"http://{host}/item/{n}",
                    "static_url": f"http://{host}/static/{n}",
                    "value": value,
                }
            )
        _write(root, host, files, config)
    return rows
