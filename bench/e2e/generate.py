"""The benchmark web and its dirty dataset, deterministic from a seed.

``generate(GenConfig(seed=1, hosts=1000, records=20000), out_dir)`` writes::

    out_dir/
      web/                 a virtual-web root (enrich_crawl/virtualweb/): ROOT/_web.json + one folder
                           per host (robots.txt, pages); noise pages are hard links into pool/
      pool/                per-theme boilerplate pages (blog, careers, legal...) linked into the sites
      dataset/records.csv  the dirty table; dataset/bench.yaml its spec; dataset/mappings/*.json
                           (the mapping files of bench/e2e/mappings/, plus the plugins')
      dataset/truth.jsonl  ground truth: one line per record (below)
      hosts.json           per host: kind, scheme, Crawl-delay, robots state, faults, records
      manifest.json        the config, counts and the generator version (the cache key)

The web (what a crawler sees):

- *org sites*: a homepage whose main navigation leads to about / contact / team pages, the team page to
  person pages, the about page to a registration page; around them ~35 noise pages (blog, news,
  careers, products, legal, sitemap...) with 60-300 links per page (mega menus, footers, tag clouds,
  query-string variants, social links to other sites, a few broken links) and 15-40 KB of boilerplate
  HTML (inline CSS and JS, cookie banner). Own-host sites (some with extra brand sites under
  ``/brands/<slug>/``) and shared hosting (``sites.<provider>.example/<slug>/``, many per host).
- *directories* (``bizdir-N.test``): listing pages with one ``<section id="org-ID">`` per record,
  addressed by the record URL's fragment, a detail page per record and a management page behind it.
- optional *plugin hosts*, e.g. the Python docs of Debian's python3.11-doc (see :func:`plugin_hosts`).

Fields and where they sit (depth = link hops from the record's seed URL):

    field        org site                      directory entry
    description  home (0)                      detail (1)
    founded      about (1)                     listing section (0)
    employees    about (1)                     detail (1)
    city         contact (1)                   listing section (0)
    phone        contact (1)                   listing section (0)
    ceo          team -> person page (2)       detail -> management (2)
    vat_id       about -> registration (2)     detail (1)

robots.txt: a mix of Crawl-delay (none, 0.5, 1, 2, 3 s), noise Disallow rules and rules that hide pages
with values (team pages, registration pages, directory management pages): those fields are
*unreachable by design* in the ground truth. Faults: unreachable hosts, hosts answering 503 to
everything (robots.txt included: disallow all), transient 503s on homepages (retries recover them),
404 seed URLs, invalid URLs, slow hosts (seconds of latency, trickled bodies), hanging noise pages.
Latency of every host: log-normal, median 150 ms, sigma 0.8, max 8 s (``ROOT/_web.json``).

Ground truth line (truth.jsonl)::

    {"id", "family": "site"|"shared"|"brand"|"directory"|<plugin>, "hosts": [...],
     "missing": [fields missing in the table], "truth": {field: value},
     "findable": {field: bool}, "depth": {field: int|null}, "why": {field: reason when not findable}}

A record is *resolvable* when at least one missing field is findable; it is *resolved* by a run when
every findable missing field has the right value.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import os
import random
import shutil
import string
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import protego

GENERATOR_VERSION = 6
REPO = Path(__file__).resolve().parents[2]
MAPPINGS_DIR = Path(__file__).resolve().parent / "mappings"  # the org-site and directory mappings
USER_AGENT_TOKEN = "enrich_crawl"  # robots rules are evaluated for this product token
DEPTH = 2

FIELDS: dict[str, str] = {
    "description": "string",
    "founded": "integer",
    "employees": "integer",
    "city": "string",
    "phone": "string",
    "ceo": "string",
    "vat_id": "string",
}
MISSING_MARKERS = ["", "N/A", "-", "unknown", "n/a"]
# placeholders for fields that do not apply to a record's family (present, so never crawled for)
NOT_APPLICABLE = {"string": "not applicable", "integer": "0", "number": "0", "boolean": "false"}

# the pages (site-relative) on the way to each field of an org site, from the homepage
SITE_ROUTES: dict[str, list[str]] = {
    "description": [],
    "founded": ["about.html"],
    "employees": ["about.html"],
    "city": ["contact.html"],
    "phone": ["contact.html"],
    "ceo": ["team.html", "<ceo>"],
    "vat_id": ["about.html", "company/registration.html"],
}
# the same for a directory entry, from its listing page (host-relative, {id} = record id)
DIRECTORY_ROUTES: dict[str, list[str]] = {
    "founded": [],
    "city": [],
    "phone": [],
    "description": ["/org/{id}.html"],
    "employees": ["/org/{id}.html"],
    "vat_id": ["/org/{id}.html"],
    "ceo": ["/org/{id}.html", "/org/{id}/management.html"],
}


@dataclass(frozen=True)
class GenConfig:
    seed: int = 1
    hosts: int = 1000
    records: int = 20000
    https_fraction: float = 0.2
    directory_fraction: float = 0.45  # of the records (besides plugin records)
    plugins: tuple[str, ...] = ("pydocs",)
    plugin_records: int = 300  # at most, per plugin

    def key(self) -> str:
        raw = json.dumps({**dataclasses.asdict(self), "v": GENERATOR_VERSION}, sort_keys=True)
        return hashlib.blake2b(raw.encode(), digest_size=6).hexdigest()


# --------------------------------------------------------------------------------------------------
# vocabulary

_WORDS = (  # noqa: SIM905 - a word list reads better as text
    "data cloud smart value service quality team growth market digital customer product network "
    "solution platform partner global local secure fast simple open green energy health care "
    "build design create deliver support manage plan research learn future people world trust "
    "innovation experience project process system software hardware logistics retail finance "
    "insurance travel food water city home office industry training media content mobile studio "
    "craft precision engineering consulting analytics automation robotics sensor material "
    "chemical medical legal"
).split()
_ADJ = (  # noqa: SIM905 - a word list reads better as text
    "northern blue red silver golden bright swift clear urban coastal alpine quiet bold prime "
    "noble rapid green iron cedar maple oak harbor summit river stone crystal lunar solar polar "
    "amber coral"
).split()
_NOUN = (  # noqa: SIM905 - a word list reads better as text
    "widgets labs robotics systems analytics works foods logistics media dynamics partners studio "
    "networks energy health capital designs solutions industries ventures tools materials devices "
    "foundry kitchen garden bakery clinic motors textiles optics"
).split()
_FIRST = (  # noqa: SIM905 - a word list reads better as text
    "Anna Ben Carla David Emma Felix Grace Hugo Ines Jonas Karin Liam Mara Noah Olga Paul Quinn "
    "Rosa Sven Tara Umar Vera Walt Xenia Yusuf Zoe Aiko Bruno Chloe Dmitri Elena Farid Greta Hana "
    "Ivan Julia Kofi Lena Mateo Nadia Omar Priya Rafael Sofia Tomas Ulla Viktor Wen Yara"
).split()
_LAST = (  # noqa: SIM905 - a word list reads better as text
    "Andersen Bauer Costa Dubois Eriksen Fischer Garcia Hansen Ito Jensen Kowalski Larsen Meyer "
    "Novak Olsen Petrov Quist Rossi Schmidt Tanaka Ueda Vidal Weber Xu Yilmaz Zimmermann Berg "
    "Carvalho Dahl Engel Fontaine Gruber Horvat Iqbal Juarez Keller Lindqvist Moreau Nakamura"
).split()
_CITIES = [
    ("Springfield", "1"),
    ("Lyon", "33"),
    ("Porto", "351"),
    ("Aarhus", "45"),
    ("Leipzig", "49"),
    ("Utrecht", "31"),
    ("Ghent", "32"),
    ("Graz", "43"),
    ("Turku", "358"),
    ("Bergen", "47"),
    ("Cork", "353"),
    ("Brno", "420"),
    ("Krakow", "48"),
    ("Valencia", "34"),
    ("Bologna", "39"),
    ("Basel", "41"),
    ("Tartu", "372"),
    ("Kaunas", "370"),
    ("Malmo", "46"),
    ("Nantes", "33"),
    ("Bristol", "44"),
    ("Halifax", "1"),
    ("Osaka", "81"),
    ("Pune", "91"),
    ("Curitiba", "55"),
    ("Rosario", "54"),
    ("Perth", "61"),
    ("Dunedin", "64"),
    ("Busan", "82"),
    ("Izmir", "90"),
]
_VAT_CC = ["DE", "FR", "NL", "BE", "AT", "DK", "SE", "FI", "IE", "PT", "ES", "IT", "PL", "CZ"]
_SOCIAL = ["facebook", "twitter", "linkedin", "instagram", "youtube", "github", "mastodon"]


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n))


def _sentence(rng: random.Random, lo: int = 8, hi: int = 18) -> str:
    text = _words(rng, rng.randint(lo, hi))
    return text[:1].upper() + text[1:] + "."


def _paragraphs(rng: random.Random, count: int) -> str:
    return "\n".join(
        f"<p>{' '.join(_sentence(rng) for _ in range(rng.randint(2, 5)))}</p>" for _ in range(count)
    )


def _slug(text: str) -> str:
    out = "".join(c if c.isalnum() else "-" for c in text.lower())
    while "--" in out:
        out = out.replace("--", "-")
    return out.strip("-")


def _esc(text: str) -> str:
    return (
        text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")
    )


# --------------------------------------------------------------------------------------------------
# themes: the boilerplate of a family of sites (menus, footers, CSS, JS)


@dataclass
class Theme:
    index: int
    css: str
    js: str
    nav: list[tuple[str, str, str]]  # (label, site-relative href, li class)
    footer: list[tuple[str, str]]  # (label, href): site-relative, or absolute http(s)
    aside: list[tuple[str, str]]
    cookie: str
    footer_text: str

    def rel(self, href: str, depth: int) -> str:
        if href.startswith(("http://", "https://", "/", "#", "mailto:", "tel:")):
            return href
        return "../" * depth + href


NOISE_PAGES = (
    ["blog/index.html"]
    + [f"blog/post-{i}.html" for i in range(1, 7)]
    + ["news.html", "careers.html"]
    + [f"careers/job-{i}.html" for i in range(1, 4)]
    + ["products.html"]
    + [f"products/item-{i}.html" for i in range(1, 5)]
    + ["services.html", "privacy.html", "terms.html", "cookies.html", "imprint.html", "faq.html"]
    + ["support.html", "sitemap.html", "partners.html", "events.html", "press.html"]
    + ["locations.html"]
    + [f"people/staff-{i}.html" for i in range(1, 9)]
)
_TAGS = ["news", "product", "release", "event", "team", "culture", "howto", "case-study", "api"]


def make_theme(index: int, seed: int) -> Theme:
    rng = random.Random(f"theme:{seed}:{index}")
    rules = []
    for _ in range(rng.randint(120, 220)):
        cls = "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(4, 10)))
        props = "; ".join(
            f"{rng.choice(['margin', 'padding', 'color', 'font-size', 'line-height', 'border'])}: "
            f"{rng.randint(0, 40)}px"
            for _ in range(rng.randint(2, 6))
        )
        rules.append(f".{cls} {{ {props} }}")
    css = "\n".join(rules)
    js_parts = [
        "window.dataLayer = window.dataLayer || [];",
        "function gtag(){dataLayer.push(arguments);}",
        f"gtag('config', 'UA-{rng.randint(10**6, 10**7)}-1');",
    ]
    for _ in range(rng.randint(25, 60)):
        name = "".join(rng.choice(string.ascii_lowercase) for _ in range(8))
        js_parts.append(
            f"function {name}(e){{var t=document.querySelectorAll('.{name}');"
            f"for(var i=0;i<t.length;i++){{t[i].classList.toggle('open', e > {rng.randint(1, 99)});}}}}"
        )
    js = "\n".join(js_parts)
    # the main navigation: the three pages that matter plus a mega menu of noise
    nav: list[tuple[str, str, str]] = [("Home", "index.html", "menu-item menu-item-home")]
    core = [
        ("About us", "about.html", "menu-item menu-item-about"),
        ("Team", "team.html", "menu-item menu-item-team"),
        ("Contact", "contact.html", "menu-item menu-item-contact"),
    ]
    noise: list[tuple[str, str, str]] = []
    for page in NOISE_PAGES:
        if page.startswith("people/"):
            continue
        label = page.split("/")[-1].replace(".html", "").replace("-", " ").title()
        noise.append((label, page, "menu-item sub-item"))
    for tag in rng.sample(_TAGS, rng.randint(3, len(_TAGS))):
        noise.append((f"#{tag}", f"blog/index.html?tag={tag}", "menu-item sub-item tag"))
    for sort in ("price", "name", "new")[: rng.randint(1, 3)]:
        noise.append((f"Sort by {sort}", f"products.html?sort={sort}", "menu-item sub-item"))
    mega = rng.randint(20, 85)
    while len(noise) < mega:
        noise.append(noise[rng.randrange(len(noise))])  # mega menus repeat entries
    rng.shuffle(noise)
    nav += core[:1] + noise[: len(noise) // 2] + core[1:] + noise[len(noise) // 2 :]
    footer: list[tuple[str, str]] = []
    for page in ["privacy.html", "terms.html", "cookies.html", "imprint.html", "sitemap.html"]:
        footer.append((page.replace(".html", "").title(), page))
    footer += [("Login", "login"), ("Search", "search?q="), ("Cart", "cart")]  # 404s
    for page in rng.sample(NOISE_PAGES[:24], rng.randint(8, 22)):
        footer.append((page.split("/")[-1].replace(".html", "").title(), page))
    footer.append(("Newsletter", "index.html?utm_source=footer&utm_medium=link"))
    for net in rng.sample(_SOCIAL, rng.randint(3, len(_SOCIAL))):
        footer.append((net.title(), f"https://www.{net}.invalid/{{slug}}"))
    for _ in range(rng.randint(2, 12)):
        footer.append(
            (_words(rng, 2).title(), f"https://{rng.choice(_ADJ)}-{rng.choice(_NOUN)}.invalid/")
        )
    aside = [(f"Post {i}", f"blog/post-{i}.html") for i in range(1, 7)]
    aside += [(f"#{t}", f"blog/index.html?tag={t}") for t in rng.sample(_TAGS, rng.randint(2, 9))]
    aside += [(f"Archive {y}", f"blog/index.html?year={y}") for y in range(2016, 2025)][
        : rng.randint(0, 9)
    ]
    cookie = " ".join(_sentence(rng, 12, 24) for _ in range(rng.randint(4, 9)))
    footer_text = " ".join(_sentence(rng) for _ in range(rng.randint(3, 8)))
    return Theme(index, css, js, nav, footer, aside, cookie, footer_text)


def render_page(
    theme: Theme,
    *,
    site_name: str,
    slug: str,
    title: str,
    kind: str,
    depth: int,
    main: str,
    description: str | None = None,
    host_links: list[tuple[str, str]] = (),
) -> str:
    """A full page: head boilerplate, navigation, main content, aside, footer, scripts."""
    rel = theme.rel
    desc = description if description is not None else f"{title} - {site_name}"
    nav = "\n".join(
        f'<li class="{cls}"><a href="{rel(href, depth)}">{label}</a></li>'
        for label, href, cls in theme.nav
    )
    aside = "\n".join(f'<li><a href="{rel(h, depth)}">{label}</a></li>' for label, h in theme.aside)
    footer = "\n".join(
        f'<li><a href="{rel(h.replace("{slug}", slug), depth)}">{label}</a></li>'
        for label, h in theme.footer
    )
    hosting = "".join(f'<a class="hosting" href="{h}">{label}</a> ' for label, h in host_links)
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{_esc(title)} | {_esc(site_name)}</title>
<meta name="description" content="{_esc(desc)}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="stylesheet" href="{rel("assets/site.css", depth)}?v={theme.index}">
<link rel="icon" href="{rel("favicon.ico", depth)}">
<style>
{theme.css}
</style>
<script type="application/ld+json">{{"@context": "https://schema.org", "@type": "WebSite", "name": "{_esc(site_name)}"}}</script>
</head>
<body data-page="{kind}" class="theme-{theme.index} page-{kind}">
<div class="topbar">{hosting}<a href="#main" class="skip">Skip to content</a></div>
<header class="site-header"><a class="brand" href="{rel("index.html", depth)}">{_esc(site_name)}</a>
<nav id="main-nav" class="site-nav"><ul>
{nav}
</ul></nav></header>
<main id="main">
{main}
</main>
<aside class="sidebar"><h3>Recent posts</h3><ul>
{aside}
</ul></aside>
<footer class="site-footer">
<p>{theme.footer_text}</p>
<address class="footer-address"><span class="tel">+00 000 000 0000</span>
<span class="locality">Headquarters</span></address>
<ul class="footer-links">
{footer}
</ul>
<div class="cookie-banner"><p>{theme.cookie}</p><button>Accept</button></div>
<p class="copyright">&copy; 2025 {_esc(site_name)}</p>
</footer>
<script>
{theme.js}
</script>
</body>
</html>
"""


# --------------------------------------------------------------------------------------------------
# the model: hosts, sites, records


@dataclass
class Org:
    name: str
    values: dict[str, Any]  # every field's true value
    ceo_slug: str


@dataclass
class Site:
    host: Host
    base: str  # "/" or "/slug/" or "/brands/slug/"
    theme: int
    org: Org
    slug: str


@dataclass
class Host:
    name: str
    kind: str  # site | shared | directory | plugin
    scheme: str = "http"
    crawl_delay: float | None = None
    robots: str = "ok"  # ok | missing | error (5xx) | unreachable
    disallow: list[str] = field(default_factory=list)
    allow: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)  # ROOT/_web.json "hosts" entry
    faults: list[str] = field(default_factory=list)
    records: int = 0
    _robots: Any = None

    @property
    def down(self) -> bool:
        return self.robots in ("error", "unreachable")

    def robots_txt(self) -> str | None:
        if self.robots in ("missing", "unreachable"):
            return None
        lines = ["User-agent: BadBot", "Disallow: /", "", "User-agent: *"]
        if self.crawl_delay is not None:
            lines.append(f"Crawl-delay: {self.crawl_delay:g}")
        lines += [f"Allow: {p}" for p in self.allow]
        lines += [f"Disallow: {p}" for p in self.disallow]
        return "\n".join(lines) + "\n"

    def allows(self, path: str) -> bool:
        """Whether the product token may fetch path (RFC 9309 errors: 5xx/unreachable = none)."""
        if self.down:
            return False
        text = self.robots_txt()
        if text is None:
            return True
        if self._robots is None:
            self._robots = protego.Protego.parse(text)
        return self._robots.can_fetch(f"{self.scheme}://{self.name}{path}", USER_AGENT_TOKEN)

    def url(self, path: str) -> str:
        return f"{self.scheme}://{self.name}{path}"


@dataclass
class Record:
    id: str
    org: Org
    family: str
    site: Site | None = None
    directory: tuple[Host, int] | None = None  # host, listing page number
    missing: list[str] = field(default_factory=list)
    seed_fault: str = ""  # "" | "404" | "invalid"
    plugin: dict[str, Any] | None = None  # a plugin record (its own truth and routes)


@dataclass
class PluginHost:
    """A host contributed by a plugin (e.g. the Python docs): its web folder, records, mappings.

    records: [{"id", "name", "seeds": [url], "values": {field: value}, "depth": {field: int},
    "findable": {field: bool}}]; fields: {field: type}; install(web_root) writes ROOT/<host>/.
    """

    name: str
    host: str
    fields: dict[str, str]
    records: list[dict[str, Any]]
    mappings: list[dict[str, Any]]
    install: Callable[[Path], None]
    crawl_delay: float | None = None
    scheme: str = "http"


def _pick(rng: random.Random, items: list, fraction: float, minimum: int = 0) -> list:
    count = min(len(items), max(minimum if items else 0, round(len(items) * fraction)))
    return rng.sample(items, count)


def _org(rng: random.Random, used: set[str]) -> Org:
    while True:
        name = f"{rng.choice(_ADJ).title()} {rng.choice(_NOUN).title()}"
        if rng.random() < 0.5:
            name += f" {rng.choice(['GmbH', 'Ltd', 'SA', 'BV', 'Inc', 'AB', 'Oy', 'Group'])}"
        if name not in used or len(used) > 5000:
            break
    used.add(name)
    city, cc = rng.choice(_CITIES)
    ceo = f"{rng.choice(_FIRST)} {rng.choice(_LAST)}"
    employees = int(10 ** rng.uniform(0.5, 4.7))
    phone = f"+{cc} {rng.randint(100, 999)} {rng.randint(100, 999)} {rng.randint(1000, 9999)}"
    values = {
        "description": f"{name} {_words(rng, rng.randint(6, 14))}.",
        "founded": rng.randint(1950, 2022),
        "employees": employees,
        "city": city,
        "phone": phone,
        "ceo": ceo,
        "vat_id": f"{rng.choice(_VAT_CC)}{rng.randint(10**8, 10**9 - 1)}",
    }
    return Org(name, values, _slug(ceo))


# --------------------------------------------------------------------------------------------------
# plugins


def plugin_hosts(cfg: GenConfig, rng: random.Random) -> tuple[list[PluginHost], list[str]]:
    """The plugin hosts available now, and notes on those that are not."""
    hosts, notes = [], []
    for name in cfg.plugins:
        if name == "pydocs":
            host, note = _pydocs_plugin(cfg, rng)
        else:
            host, note = None, f"unknown plugin {name!r}"
        if host is not None:
            hosts.append(host)
        if note:
            notes.append(note)
    return hosts, notes


def _pydocs_plugin(cfg: GenConfig, rng: random.Random) -> tuple[PluginHost | None, str]:
    """The real Python docs (Debian python3.11-doc) as one host, via enrich_crawl.testing.pydocs:
    a sample of its module records (id = module name, as the module-index mapping's ``$id`` needs),
    their ground truth (from the reStructuredText sources), the bundled ``python_docs_*`` mappings.
    Fields: title, synopsis, source_path, added_in on the module's page (depth 0), deprecated from
    the module index linked from it (depth 1); a field whose truth is null is unfindable."""
    try:
        from enrich_crawl.testing import pydocs
    except ImportError as exc:
        return None, f"pydocs host skipped: enrich_crawl.testing.pydocs not available ({exc})"
    try:
        html = pydocs.ensure_corpus()
        available = pydocs.module_records(html)
    except Exception as exc:  # no corpus on this machine and no way to fetch it
        return None, f"pydocs host skipped: {type(exc).__name__}: {exc}"
    limit = min(cfg.plugin_records, max(5, cfg.records // 60), len(available))
    chosen = sorted(rng.sample(available, limit), key=lambda r: r["module"])
    mappings = [
        json.loads(path.read_text("utf-8"))
        for path in sorted((REPO / "mappings").glob("python_docs_*.json"))
    ]
    records = [
        {
            "id": r["module"],
            "name": r["module"],
            "seeds": [r["doc_url"]],
            "values": r["truth"],
            "findable": {f: v is not None for f, v in r["truth"].items()},
            "depth": {f: (1 if f == "deprecated" else 0) for f in r["truth"]},
        }
        for r in chosen
    ]
    return (
        PluginHost(
            name="pydocs",
            host=pydocs.HOST,
            fields=dict(pydocs.FIELDS),
            records=records,
            mappings=mappings,
            install=lambda root: pydocs.build_web(root, html=html),
            scheme=pydocs.BASE_URL.split(":")[0],
        ),
        "",
    )


# --------------------------------------------------------------------------------------------------
# generation


def build_model(
    cfg: GenConfig,
) -> tuple[list[Host], list[Record], list[Site], list[PluginHost], list[str]]:
    rng = random.Random(f"model:{cfg.seed}")
    plugins, notes = plugin_hosts(cfg, rng)
    free_hosts = max(3, cfg.hosts - len(plugins))
    n_dir = max(1, round(free_hosts * 0.13))
    n_shared = max(1, round(free_hosts * 0.25))
    n_site = max(1, free_hosts - n_dir - n_shared)
    plugin_records = sum(min(len(p.records), cfg.plugin_records) for p in plugins)
    free_records = max(n_site, cfg.records - plugin_records)

    hosts: list[Host] = []
    used_names: set[str] = set()
    for i in range(n_site):
        name = f"{rng.choice(_ADJ)}-{rng.choice(_NOUN)}-{i}.example"
        hosts.append(Host(name, "site"))
    for i in range(n_shared):
        hosts.append(
            Host(f"sites.{rng.choice(['hostco', 'webnest', 'pagebox'])}-{i}.example", "shared")
        )
    for i in range(n_dir):
        hosts.append(Host(f"bizdir-{i}.test", "directory"))
    for host in hosts:
        if rng.random() < cfg.https_fraction:
            host.scheme = "https"

    # records: directory-only entries, and org sites (own host, brands, shared hosting)
    n_directory = round(free_records * cfg.directory_fraction)
    n_sites = free_records - n_directory
    site_hosts = [h for h in hosts if h.kind == "site"]
    shared_hosts = [h for h in hosts if h.kind == "shared"]
    dir_hosts = [h for h in hosts if h.kind == "directory"]
    sites: list[Site] = []
    records: list[Record] = []
    themes = 16

    def new_site(host: Host, base: str, slug: str, family: str) -> None:
        org = _org(rng, used_names)
        site = Site(host, base, rng.randrange(themes), org, slug or _slug(org.name))
        sites.append(site)
        records.append(Record("", org, family, site=site))

    for host in site_hosts:
        if len(sites) >= n_sites:
            break
        new_site(host, "/", _slug(host.name.split(".")[0]), "site")
    brand_budget = max(0, n_sites - len(sites)) // 6
    for host in rng.sample(site_hosts, min(len(site_hosts), brand_budget)):
        for _ in range(rng.randint(1, 2)):
            slug = f"{rng.choice(_ADJ)}-{rng.randrange(1000)}"
            new_site(host, f"/brands/{slug}/", slug, "brand")
    weights = [min(rng.paretovariate(2.5), 3.0) for _ in shared_hosts]  # capped long tail
    while len(sites) < n_sites:
        host = rng.choices(shared_hosts, weights)[0]
        slug = f"{rng.choice(_ADJ)}-{rng.choice(_NOUN)}-{len(sites)}"
        new_site(host, f"/{slug}/", slug, "shared")
    for _ in range(n_directory):
        records.append(Record("", _org(rng, used_names), "directory"))
    # directory listings: every directory-only record, plus some org-site records
    listed = [r for r in records if r.family == "directory"]
    listed += [r for r in records if r.site is not None and rng.random() < 0.1]
    rng.shuffle(listed)
    per_host: dict[str, int] = {}
    for n, record in enumerate(listed):
        host = dir_hosts[n % len(dir_hosts)]
        index = per_host.get(host.name, 0)
        per_host[host.name] = index + 1
        record.directory = (host, index // 25 + 1)

    # faults and robots
    _assign_hosts(rng, hosts)
    for record in records:
        if record.site is not None and record.site.host.kind != "directory":
            roll = rng.random()
            if roll < 0.02:
                record.seed_fault = "404"
            elif roll < 0.025:
                record.seed_fault = "invalid"

    # missing fields
    for record in records:
        fields = list(FIELDS)
        missing = [f for f in fields if rng.random() < 0.55]
        record.missing = missing or [rng.choice(fields)]
    for plugin in plugins:
        for raw in plugin.records[: cfg.plugin_records]:
            values = raw["values"]
            org = Org(raw.get("name", raw["id"]), values, "")
            rec = Record("", org, plugin.name, plugin={**raw, "host": plugin.host})
            # a field without a true value is missing from the table too (and unfindable)
            rec.missing = [f for f in values if values[f] is None or rng.random() < 0.6]
            rec.missing = rec.missing or [next(iter(values))]
            records.append(rec)
    rng.shuffle(records)
    for n, record in enumerate(records, 1):
        record.id = record.plugin["id"] if record.plugin else f"R{n:06d}"
    for record in records:
        for h in {h.name: h for h in _record_hosts(record)}.values():
            h.records += 1
    return hosts, records, sites, plugins, notes


def _record_hosts(record: Record) -> list[Host]:
    out = []
    if record.site is not None:
        out.append(record.site.host)
    if record.directory is not None:
        out.append(record.directory[0])
    return out


def _assign_hosts(rng: random.Random, hosts: list[Host]) -> None:
    delays = [None, None, None, None, 0.5, 0.5, 1.0, 1.0, 1.0, 2.0, 2.0]
    for host in hosts:
        host.crawl_delay = rng.choice(delays + ([3.0] if host.kind == "site" else []))
        host.disallow = ["/search", "/cart", "/wp-admin/", "/*?sort="]
        host.allow = ["/wp-admin/admin-ajax.php"]
        if rng.random() < 0.1:
            host.robots = "missing"
    site_hosts = [h for h in hosts if h.kind == "site"]
    for host in _pick(rng, site_hosts, 0.02, 1):
        host.robots, host.config["unreachable"] = "unreachable", True
        host.faults.append("unreachable")
    healthy = [h for h in site_hosts if not h.down]
    for host in _pick(rng, healthy, 0.01, 1):
        host.robots, host.config["status"] = "error", {".*": 503}
        host.faults.append("http_503_everywhere")
    healthy = [h for h in site_hosts if not h.down]
    for host in _pick(rng, healthy, 0.02, 1):
        host.config["fail_first"] = {"^/$": 2}
        host.faults.append("fail_first_home")
    for host in _pick(rng, healthy, 0.01, 1):
        host.config["latency"] = {"median": 2.5, "sigma": 0.4, "max": 8}
        host.faults.append("slow_latency")
    for host in _pick(rng, healthy, 0.005, 1):
        host.config["slow"] = {".*": 8000}
        host.faults.append("slow_trickle")
    for host in _pick(rng, healthy, 0.005, 1):
        host.config["hang"] = ["events\\.html"]
        host.faults.append("hang_events")
    # rules that hide pages with values (fields unreachable by design)
    for host in _pick(rng, [h for h in site_hosts if not h.down], 0.06, 1):
        host.disallow.append("/team.html")
        host.faults.append("robots_hides_team")
    for host in _pick(rng, [h for h in site_hosts if not h.down], 0.04, 1):
        host.disallow.append("/company/")
        host.faults.append("robots_hides_registration")
    for host in _pick(rng, [h for h in hosts if h.kind == "directory"], 0.15, 1):
        host.disallow.append("/*/management.html$")
        host.faults.append("robots_hides_management")


def _shared_hides(rng: random.Random, sites: list[Site]) -> None:
    """On shared hosts, robots.txt hides some sites' team pages (one line per site)."""
    for site in sites:
        if site.host.kind == "shared" and rng.random() < 0.05:
            site.host.disallow.append(f"{site.base}team.html")


def ground_truth(record: Record, depth: int = DEPTH) -> dict[str, Any]:
    """Per missing field: the value, whether a polite crawler can find it, and at what depth."""
    if record.plugin is not None:
        raw = record.plugin
        truth = {f: raw["values"][f] for f in record.missing}
        findable = {f: bool(raw.get("findable", {}).get(f, True)) for f in record.missing}
        depths = {f: (raw.get("depth", {}).get(f) if findable[f] else None) for f in record.missing}
        why = {f: "no_value" for f in record.missing if not findable[f]}
        return {
            "family": record.family,
            "hosts": [raw["host"]],
            "truth": truth,
            "findable": findable,
            "depth": depths,
            "why": why,
        }
    truth = {f: record.org.values[f] for f in record.missing}
    findable: dict[str, bool] = {}
    depths: dict[str, int | None] = {}
    why: dict[str, str] = {}
    for fname in record.missing:
        best: int | None = None
        reasons: list[str] = []
        routes: list[tuple[Host, list[str]]] = []
        if record.site is not None:
            site = record.site
            if record.seed_fault:
                reasons.append(f"seed_{record.seed_fault}")
            else:
                pages = [site.base] + [
                    site.base + (f"people/{record.org.ceo_slug}.html" if p == "<ceo>" else p)
                    for p in SITE_ROUTES[fname]
                ]
                routes.append((site.host, pages))
        if record.directory is not None:
            host, page = record.directory
            pages = [f"/listings/page-{page}.html"] + [
                p.format(id=record.id) for p in DIRECTORY_ROUTES[fname]
            ]
            routes.append((host, pages))
        for host, pages in routes:
            if host.down:
                reasons.append(f"host_{host.robots}")
                continue
            blocked = [p for p in pages if not host.allows(p)]
            if blocked:
                reasons.append(f"robots:{host.name}{blocked[0]}")
                continue
            if len(pages) - 1 > depth:
                reasons.append("too_deep")
                continue
            best = len(pages) - 1 if best is None else min(best, len(pages) - 1)
        findable[fname] = best is not None
        depths[fname] = best
        if best is None:
            why[fname] = "; ".join(reasons) or "no_seed"
    return {
        "family": record.family,
        "hosts": sorted({h.name for h in _record_hosts(record)}),
        "truth": truth,
        "findable": findable,
        "depth": depths,
        "why": why,
    }


# --------------------------------------------------------------------------------------------------
# writing the web


class _Writer:
    def __init__(self, out: Path, seed: int):
        self.out = out
        self.web = out / "web"
        self.pool = out / "pool"
        self.seed = seed
        self.themes = [make_theme(i, seed) for i in range(16)]
        self.files = 0
        self.links = 0
        self.bytes = 0

    def write(self, path: Path, text: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = text.encode("utf-8")
        path.write_bytes(data)
        self.files += 1
        self.bytes += len(data)

    def link(self, source: Path, target: Path) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(source, target)
        except OSError:
            shutil.copyfile(source, target)
        self.links += 1

    # -- theme pools -------------------------------------------------------------------------------

    def write_pools(self) -> None:
        for theme in self.themes:
            rng = random.Random(f"pool:{self.seed}:{theme.index}")
            for page in NOISE_PAGES:
                depth = page.count("/")
                title = page.split("/")[-1].replace(".html", "").replace("-", " ").title()
                kind = "staff" if page.startswith("people/") else "content"
                main = f"<h1>{title}</h1>\n" + _paragraphs(rng, rng.randint(3, 10))
                if page.startswith("people/"):
                    name = f"{rng.choice(_FIRST)} {rng.choice(_LAST)}"
                    main = (
                        f'<article class="person" data-role="staff"><h1>{name}</h1>'
                        f'<p class="role">{_words(rng, 2).title()}</p>'
                        f"{_paragraphs(rng, 2)}</article>"
                        f'<p><a href="../team.html">Back to the team</a></p>'
                    )
                    kind = "person"
                elif page.startswith("blog/"):
                    others = "".join(
                        f'<li><a href="post-{i}.html">{_words(rng, 4).title()}</a></li>'
                        for i in range(1, 7)
                    )
                    main += f'<ul class="related">{others}</ul>'
                elif page == "sitemap.html":
                    links = "".join(
                        f'<li><a href="{p}">{p}</a></li>'
                        for p in [*NOISE_PAGES, "about.html", "contact.html", "team.html"]
                    )
                    main += f'<ul class="sitemap">{links}</ul>'
                text = render_page(
                    theme,
                    site_name="Our company",
                    slug="company",
                    title=title,
                    kind=kind,
                    depth=depth,
                    main=main,
                )
                self.write(self.pool / f"theme-{theme.index}" / page, text)

    # -- org sites -----------------------------------------------------------------------------------

    def write_site(self, site: Site, host_links: list[tuple[str, str]]) -> None:
        theme = self.themes[site.theme]
        root = self.web / site.host.name / site.base.strip("/")
        org, values = site.org, site.org.values
        rng = random.Random(f"site:{self.seed}:{site.host.name}{site.base}")

        def page(rel: str, title: str, kind: str, main: str, description: str | None = None):
            text = render_page(
                theme,
                site_name=org.name,
                slug=site.slug,
                title=title,
                kind=kind,
                depth=rel.count("/"),
                main=main,
                description=description,
                host_links=host_links,
            )
            self.write(root / rel, text)

        teaser = "".join(
            f'<div class="teaser"><h3>{_words(rng, 3).title()}</h3><p>{_sentence(rng)}</p>'
            f'<a href="blog/post-{i}.html">Read more</a></div>'
            for i in rng.sample(range(1, 7), 3)
        )
        page(
            "index.html",
            "Home",
            "home",
            f"<h1>{_esc(org.name)}</h1><p class='lead'>{_sentence(rng)}</p>{teaser}"
            + _paragraphs(rng, rng.randint(2, 5)),
            description=values["description"],
        )
        page(
            "about.html",
            "About us",
            "about",
            f"<h1>About {_esc(org.name)}</h1>{_paragraphs(rng, rng.randint(2, 6))}"
            f'<dl class="facts"><dt>Founded</dt><dd class="founded">{values["founded"]}</dd>'
            f'<dt>Employees</dt><dd class="employees">{values["employees"]:,}</dd>'
            f"<dt>Offices</dt><dd>{rng.randint(1, 12)}</dd></dl>"
            f'<p><a class="registration-details" href="company/registration.html">'
            f"Registered company details</a></p>",
        )
        page(
            "contact.html",
            "Contact",
            "contact",
            f"<h1>Contact us</h1>{_paragraphs(rng, 2)}"
            f'<address class="contact-card"><span class="org">{_esc(org.name)}</span>'
            f'<span class="street">{rng.randint(1, 200)} {_words(rng, 1).title()} Street</span>'
            f'<span class="locality">{values["city"]}</span>'
            f'<span class="tel">{values["phone"]}</span></address>'
            f'<form class="contact-form" action="contact.html"><input name="email"></form>',
        )
        staff = rng.sample(range(1, 9), rng.randint(3, 7))
        ceo_slot = rng.randrange(len(staff) + 1)
        cards = []
        for i in range(len(staff) + 1):
            if i == ceo_slot:
                cards.append(
                    f'<div class="card role-ceo"><img src="img/ceo.jpg" alt="">'
                    f'<p class="title">Chief Executive Officer</p>'
                    f'<a class="profile-link" href="people/{org.ceo_slug}.html">View profile</a></div>'
                )
            else:
                n = staff[i - (i > ceo_slot)]
                cards.append(
                    f'<div class="card role-staff"><img src="img/staff-{n}.jpg" alt="">'
                    f'<p class="title">{_words(rng, 2).title()}</p>'
                    f'<a class="profile-link" href="people/staff-{n}.html">View profile</a></div>'
                )
        page(
            "team.html",
            "Team",
            "team",
            f"<h1>Our team</h1>{_paragraphs(rng, 1)}"
            f'<section class="team-grid">{"".join(cards)}</section>',
        )
        page(
            f"people/{org.ceo_slug}.html",
            values["ceo"],
            "person",
            f'<article class="person" data-role="ceo"><h1>{values["ceo"]}</h1>'
            f'<p class="role">Chief Executive Officer</p>{_paragraphs(rng, 2)}</article>'
            f'<p><a href="../team.html">Back to the team</a></p>',
        )
        page(
            "company/registration.html",
            "Registered details",
            "registration",
            f"<h1>Registered details</h1><table class='registry'>"
            f"<tr><th>Legal name</th><td>{_esc(org.name)}</td></tr>"
            f"<tr><th>VAT</th><td class='vat'>{values['vat_id']}</td></tr>"
            f"<tr><th>Register</th><td>HRB {rng.randint(10000, 99999)}</td></tr></table>",
        )
        pool = self.pool / f"theme-{theme.index}"
        for rel in NOISE_PAGES:
            self.link(pool / rel, root / rel)

    def write_shared_home(self, host: Host, sites: list[Site]) -> list[tuple[str, str]]:
        """The provider's own pages; returns the provider links shown on every hosted page."""
        rng = random.Random(f"shared:{self.seed}:{host.name}")
        theme = self.themes[rng.randrange(len(self.themes))]
        featured = rng.sample(sites, min(len(sites), 10))
        main = "<h1>Hosted sites</h1><ul>" + "".join(
            f'<li><a href="{s.base}">{_esc(s.org.name)}</a></li>' for s in featured
        )
        main += "</ul>" + _paragraphs(rng, 4)
        for rel, title in [
            ("index.html", "Home"),
            ("pricing.html", "Pricing"),
            ("help.html", "Help"),
        ]:
            text = render_page(
                theme,
                site_name=host.name,
                slug="hosting",
                title=title,
                kind="provider",
                depth=0,
                main=main,
            )
            self.write(self.web / host.name / rel, text)
        return [
            ("Hosted by " + host.name, "/"),
            ("Pricing", "/pricing.html"),
            ("Help", "/help.html"),
        ]

    # -- directories -----------------------------------------------------------------------------------

    def write_directory(self, host: Host, entries: list[Record]) -> None:
        rng = random.Random(f"dir:{self.seed}:{host.name}")
        theme = self.themes[rng.randrange(len(self.themes))]
        root = self.web / host.name
        pages = max(r.directory[1] for r in entries)
        listing_links = "".join(
            f'<a class="page" href="/listings/page-{k}.html">{k}</a> ' for k in range(1, pages + 1)
        )
        letters = "".join(
            f'<a class="letter" href="/listings/page-1.html?letter={c}">{c}</a> '
            for c in string.ascii_uppercase
        )
        cats = "".join(
            f'<a class="cat" href="/listings/page-1.html?category={w}">{w}</a> '
            for w in rng.sample(_WORDS, 12)
        )

        def page(rel: str, title: str, kind: str, main: str) -> None:
            text = render_page(
                theme,
                site_name=host.name,
                slug="dir",
                title=title,
                kind=kind,
                depth=rel.count("/"),
                main=main,
            )
            self.write(root / rel, text)

        page(
            "index.html",
            "Business directory",
            "directory-home",
            f"<h1>Business directory</h1><nav class='pages'>{listing_links}</nav>"
            f"<nav class='letters'>{letters}</nav><nav class='cats'>{cats}</nav>"
            + _paragraphs(rng, 3),
        )
        by_page: dict[int, list[Record]] = {}
        for record in entries:
            by_page.setdefault(record.directory[1], []).append(record)
        ids = [r.id for r in entries]
        for number, group in sorted(by_page.items()):
            sections = []
            for record in group:
                v = record.org.values
                website = ""
                if record.site is not None:
                    website = (
                        f'<a class="website" rel="nofollow" href="{record.site.host.url(record.site.base)}">'
                        "Website</a>"
                    )
                sections.append(
                    f'<section id="org-{record.id}" class="entry"><h2>{_esc(record.org.name)}</h2>'
                    f'<p><span class="city">{v["city"]}</span> &middot; '
                    f'<span class="phone">{v["phone"]}</span></p>'
                    f'<dl><dt>Founded</dt><dd class="founded">{v["founded"]}</dd></dl>'
                    f'<a class="details" href="/org/{record.id}.html">Details</a> {website}</section>'
                )
            page(
                f"listings/page-{number}.html",
                f"Listings, page {number}",
                "listing",
                f"<h1>Listings {number}</h1><nav class='pages'>{listing_links}</nav>"
                f"<nav class='letters'>{letters}</nav>" + "\n".join(sections),
            )
        for record in entries:
            v = record.org.values
            related = "".join(
                f'<li><a href="/org/{other}.html">{other}</a></li>'
                for other in rng.sample(ids, min(len(ids), 8))
            )
            page(
                f"org/{record.id}.html",
                record.org.name,
                "org-detail",
                f'<article class="entry-detail" data-entry="{record.id}">'
                f"<h1>{_esc(record.org.name)}</h1><p class='summary'>{_esc(v['description'])}</p>"
                f'<dl><dt>Employees</dt><dd class="employees">{v["employees"]:,}</dd>'
                f'<dt>VAT</dt><dd class="vat">{v["vat_id"]}</dd></dl>'
                f'<a class="management" href="/org/{record.id}/management.html">Management</a>'
                f'<a class="back" href="/listings/page-{record.directory[1]}.html#org-{record.id}">'
                f"Back</a></article><ul class='related'>{related}</ul>",
            )
            page(
                f"org/{record.id}/management.html",
                f"{record.org.name}: management",
                "org-management",
                f"<h1>Management</h1><ul class='people' data-entry='{record.id}'>"
                f'<li data-role="ceo"><span class="name">{v["ceo"]}</span>, CEO</li>'
                f'<li data-role="cfo"><span class="name">{rng.choice(_FIRST)} '
                f"{rng.choice(_LAST)}</span>, CFO</li></ul>",
            )


# --------------------------------------------------------------------------------------------------
# dataset


def _dirty(rng: random.Random, value: Any) -> str:
    text = str(value)
    roll = rng.random()
    if roll < 0.1:
        return f"  {text} "
    if roll < 0.15 and isinstance(value, str):
        return text.upper()
    if roll < 0.2 and isinstance(value, int) and value >= 1000:
        return f"{value:,}"
    return text


def _seed_cells(rng: random.Random, record: Record) -> tuple[str, str]:
    website = ""
    if record.site is not None:
        site = record.site
        if record.seed_fault == "invalid":
            website = "htp//" + site.host.name
        else:
            path = site.base + ("index-old.html" if record.seed_fault == "404" else "")
            url = site.host.url(path)
            roll = rng.random()
            if roll < 0.1 and site.host.scheme == "http":
                url = url.removeprefix("http://")  # no scheme: the loader adds http://
            elif roll < 0.15:
                url = url.replace(site.host.name, site.host.name.upper())
            website = url
    profile = ""
    if record.directory is not None:
        host, number = record.directory
        profile = host.url(f"/listings/page-{number}.html#org-{record.id}")
    if record.plugin is not None:
        website = " ; ".join(record.plugin["seeds"])
    return website, profile


def _mappings() -> list[dict[str, Any]]:
    """The benchmark's own mappings, ordinary mapping files in MAPPINGS_DIR (`enrich-crawl mapping
    check` validates them), as the dataset gets them: without `$schema`, whose relative path only
    holds beside them."""
    mappings = []
    for path in sorted(MAPPINGS_DIR.glob("*.json")):
        mapping = json.loads(path.read_text(encoding="utf-8"))
        mapping.pop("$schema", None)
        mappings.append(mapping)
    return mappings


SPEC_TEMPLATE = """\
# Generated by bench/e2e/generate.py (seed {seed}): the end-to-end benchmark dataset.
# No virtual_web key: the benchmark serves the web once, through http_proxy, for every run.
name: {name}
source: records.csv
id: org_id
urls: [website, profile_url]
fields:
{fields}
missing_values: {missing}
crawl:
{crawl}
"""


def write_spec(
    dataset_dir: Path,
    name: str,
    fields: dict[str, str],
    crawl: dict[str, Any],
    seed: int,
) -> Path:
    lines = "\n".join(
        f"  {f}: {{}}" if t == "string" else f"  {f}: {{type: {t}}}" for f, t in fields.items()
    )
    crawl_lines = "\n".join(f"  {k}: {json.dumps(v)}" for k, v in crawl.items())
    spec = dataset_dir / "bench.yaml"
    spec.write_text(
        SPEC_TEMPLATE.format(
            seed=seed,
            name=name,
            fields=lines,
            missing=json.dumps(MISSING_MARKERS),
            crawl=crawl_lines,
        ),
        encoding="utf-8",
    )
    return spec


# --------------------------------------------------------------------------------------------------
# entry points


@dataclass
class Generated:
    """A generated benchmark: paths and what the checks need."""

    root: Path
    manifest: dict[str, Any]

    @property
    def web(self) -> Path:
        return self.root / "web"

    @property
    def dataset_dir(self) -> Path:
        return self.root / "dataset"

    @property
    def spec(self) -> Path:
        return self.dataset_dir / "bench.yaml"

    @property
    def mappings(self) -> Path:
        return self.dataset_dir / "mappings"

    @property
    def truth_path(self) -> Path:
        return self.dataset_dir / "truth.jsonl"

    def truth(self) -> dict[str, dict[str, Any]]:
        return read_truth(self.truth_path)

    def hosts(self) -> dict[str, dict[str, Any]]:
        return json.loads((self.root / "hosts.json").read_text("utf-8"))

    def write_delays(self, path: Path, default_delay: float) -> Path:
        """The delays file of the paced floor (`bench.e2e.floor --delays`): each host's
        Crawl-delay as its robots.txt publishes it, `default_delay` (the spec's) for a host whose
        robots.txt gives none or cannot be read: the delay the product keeps and the politeness
        audit checks (a host without a robots.txt has no Crawl-delay, whatever the model drew)."""
        hosts = {
            host: default_delay
            if info.get("crawl_delay") is None or info.get("robots", "ok") != "ok"
            else info["crawl_delay"]
            for host, info in self.hosts().items()
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"default": default_delay, "hosts": hosts}), encoding="utf-8")
        return path


def read_truth(path: Path) -> dict[str, dict[str, Any]]:
    out = {}
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                row = json.loads(line)
                out[row["id"]] = row
    return out


def generate(cfg: GenConfig, out: Path, *, log: Callable[[str], None] = print) -> Generated:
    """Write the benchmark into ``out`` (replaced if it exists); returns its description."""
    started = time.monotonic()
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    hosts, records, sites, plugins, notes = build_model(cfg)
    _shared_hides(random.Random(f"hides:{cfg.seed}"), sites)
    writer = _Writer(out, cfg.seed)
    writer.write_pools()
    by_host: dict[str, list[Site]] = {}
    for site in sites:
        by_host.setdefault(site.host.name, []).append(site)
    for host in hosts:
        if host.robots == "unreachable":
            continue  # no folder: the "hosts" entry of ROOT/_web.json answers for it
        host_sites = by_host.get(host.name, [])
        provider_links: list[tuple[str, str]] = []
        if host.kind == "shared" and host_sites:
            provider_links = writer.write_shared_home(host, host_sites)
        for site in host_sites:
            writer.write_site(site, provider_links)
        if host.kind == "directory":
            entries = [r for r in records if r.directory is not None and r.directory[0] is host]
            if entries:
                writer.write_directory(host, entries)
        (writer.web / host.name).mkdir(parents=True, exist_ok=True)
        robots = host.robots_txt()
        if robots is not None:
            writer.write(writer.web / host.name / "robots.txt", robots)
        if host.robots == "error":
            host.config.setdefault("status", {".*": 503})
    for plugin in plugins:
        plugin.install(writer.web)
    web_config = {
        "seed": cfg.seed,
        "latency": {"median": 0.15, "sigma": 0.8, "max": 8},
        "hosts": {h.name: h.config for h in hosts if h.config},
    }
    (writer.web / "_web.json").write_text(json.dumps(web_config, indent=1), encoding="utf-8")

    # the dataset
    dataset_dir = out / "dataset"
    (dataset_dir / "mappings").mkdir(parents=True)
    fields = dict(FIELDS)
    for plugin in plugins:
        fields.update(plugin.fields)
    rng = random.Random(f"dataset:{cfg.seed}")
    columns = ["org_id", "name", "website", "profile_url", *fields]
    with open(dataset_dir / "records.csv", "w", newline="", encoding="utf-8") as fh:
        table = csv.writer(fh)
        table.writerow(columns)
        for record in records:
            website, profile = _seed_cells(rng, record)
            row = [record.id, _dirty(rng, record.org.name), website, profile]
            own = FIELDS if record.plugin is None else plugins_fields(plugins, record.family)
            for fname, ftype in fields.items():
                if fname not in own:
                    row.append(NOT_APPLICABLE.get(ftype, "not applicable"))
                elif fname in record.missing:
                    row.append(rng.choice(MISSING_MARKERS))
                else:
                    row.append(_dirty(rng, record.org.values[fname]))
            table.writerow(row)
    with open(dataset_dir / "truth.jsonl", "w", encoding="utf-8") as fh:
        for record in records:
            gt = ground_truth(record)
            fh.write(json.dumps({"id": record.id, "missing": record.missing, **gt}) + "\n")
    for mapping in _mappings() + [m for p in plugins for m in p.mappings]:
        path = dataset_dir / "mappings" / f"{mapping['name']}.json"
        path.write_text(json.dumps(mapping, indent=2) + "\n", encoding="utf-8")
    write_spec(dataset_dir, "bench_e2e", fields, {"depth": DEPTH}, cfg.seed)

    host_info = {
        h.name: {
            "kind": h.kind,
            "scheme": h.scheme,
            "crawl_delay": h.crawl_delay,
            "robots": h.robots,
            "faults": h.faults,
            "records": h.records,
        }
        for h in hosts
    }
    for plugin in plugins:
        host_info[plugin.host] = {
            "kind": "plugin",
            "scheme": plugin.scheme,
            "crawl_delay": plugin.crawl_delay,
            "robots": "ok",
            "faults": [],
            "records": sum(1 for r in records if r.family == plugin.name),
        }
    (out / "hosts.json").write_text(json.dumps(host_info, indent=1), encoding="utf-8")
    truth = read_truth(dataset_dir / "truth.jsonl")
    findable = sum(sum(r["findable"].values()) for r in truth.values())
    manifest = {
        "config": dataclasses.asdict(cfg),
        "key": cfg.key(),
        "version": GENERATOR_VERSION,
        "hosts": len(host_info),
        "hosts_by_kind": _count(h["kind"] for h in host_info.values()),
        "records": len(records),
        "records_by_family": _count(r.family for r in records),
        "missing_fields": sum(len(r.missing) for r in records),
        "findable_fields": findable,
        "resolvable_records": sum(1 for r in truth.values() if any(r["findable"].values())),
        "findable_by_depth": _count(
            d for r in truth.values() for f, d in r["depth"].items() if r["findable"][f]
        ),
        "unfindable_reasons": _count(
            w.split(":")[0] for r in truth.values() for w in r["why"].values()
        ),
        "files": writer.files,
        "hard_links": writer.links,
        "bytes_written": writer.bytes,
        "plugins": [p.name for p in plugins],
        "notes": notes,
        "seconds": round(time.monotonic() - started, 1),
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    log(
        f"generated {manifest['hosts']} hosts, {manifest['records']} records, "
        f"{writer.files} files ({writer.bytes / 1e6:.0f} MB) + {writer.links} links "
        f"in {manifest['seconds']} s -> {out}"
    )
    return Generated(out, manifest)


def plugins_fields(plugins: list[PluginHost], family: str) -> dict[str, str]:
    for plugin in plugins:
        if plugin.name == family:
            return plugin.fields
    return {}


def _count(items) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        out[str(item)] = out.get(str(item), 0) + 1
    return dict(sorted(out.items()))


def cached(cfg: GenConfig, cache_dir: Path, *, log: Callable[[str], None] = print) -> Generated:
    """The benchmark for cfg from the cache (``cache_dir/<key>``), generated when absent."""
    out = cache_dir / f"e2e-{cfg.key()}-s{cfg.seed}-h{cfg.hosts}-r{cfg.records}"
    manifest_path = out / "manifest.json"
    if manifest_path.exists():
        manifest = json.loads(manifest_path.read_text("utf-8"))
        if manifest.get("version") == GENERATOR_VERSION:
            log(f"benchmark data from cache: {out}")
            return Generated(out, manifest)
    return generate(cfg, out, log=log)


# --------------------------------------------------------------------------------------------------
# derived datasets and webs (subsets for the scaling series, a web without Crawl-delay)


def subset(
    gen: Generated,
    name: str,
    record_ids: list[str] | set[str],
    *,
    crawl: dict[str, Any] | None = None,
) -> Path:
    """A dataset folder ``<root>/subsets/<name>/`` with those records, the same mappings and truth,
    and the spec's crawl section replaced by ``{"depth": 2, **crawl}``; returns the spec path."""
    wanted = set(record_ids)
    target = gen.root / "subsets" / name
    if target.exists():
        shutil.rmtree(target)
    (target / "mappings").mkdir(parents=True)
    for path in gen.mappings.glob("*.json"):
        shutil.copyfile(path, target / "mappings" / path.name)
    with (
        open(gen.dataset_dir / "records.csv", newline="", encoding="utf-8") as src,
        open(target / "records.csv", "w", newline="", encoding="utf-8") as dst,
    ):
        reader, writer = csv.reader(src), csv.writer(dst)
        writer.writerow(next(reader))
        for row in reader:
            if row[0] in wanted:
                writer.writerow(row)
    with (
        open(gen.truth_path, encoding="utf-8") as src,
        open(target / "truth.jsonl", "w", encoding="utf-8") as dst,
    ):
        for line in src:
            if json.loads(line)["id"] in wanted:
                dst.write(line)
    fields = {}
    import yaml

    raw = yaml.safe_load(gen.spec.read_text("utf-8"))
    for fname, options in raw["fields"].items():
        fields[fname] = (options or {}).get("type", "string")
    return write_spec(
        target,
        f"bench_{name}",
        fields,
        {"depth": DEPTH, **(crawl or {})},
        gen.manifest["config"]["seed"],
    )


def web_without_delays(gen: Generated) -> Path:
    """``<root>/web-nodelay``: the same web with ``Crawl-delay: 0`` in every robots.txt (host folders
    are real folders whose entries are symlinks into web/, except robots.txt)."""
    target = gen.root / "web-nodelay"
    marker = target / ".complete"
    if marker.exists():
        return target
    if target.exists():
        shutil.rmtree(target)
    target.mkdir()
    for entry in os.scandir(gen.web):
        source = Path(entry.path).resolve()
        if not entry.is_dir():
            shutil.copyfile(source, target / entry.name)
            continue
        host_dir = target / entry.name
        host_dir.mkdir()
        for item in os.scandir(source):
            if item.name == "robots.txt":
                lines = Path(item.path).read_text("utf-8").splitlines()
                lines = [ln for ln in lines if not ln.lower().startswith("crawl-delay")]
                out = []
                for line in lines:
                    out.append(line)
                    if line.strip().lower() == "user-agent: *":
                        out.append("Crawl-delay: 0")
                (host_dir / "robots.txt").write_text("\n".join(out) + "\n", encoding="utf-8")
            else:
                os.symlink(Path(item.path).resolve(), host_dir / item.name)
    marker.write_text("ok")
    return target


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="Generate the end-to-end benchmark web + dataset.")
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--hosts", type=int, default=1000)
    parser.add_argument("--records", type=int, default=20000)
    parser.add_argument("--no-plugins", action="store_true")
    args = parser.parse_args(argv)
    cfg = GenConfig(
        seed=args.seed,
        hosts=args.hosts,
        records=args.records,
        plugins=() if args.no_plugins else GenConfig.plugins,
    )
    gen = generate(cfg, args.out)
    print(json.dumps(gen.manifest, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
