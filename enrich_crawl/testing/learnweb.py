"""A small web for learning tests: a few sites, each with its own layout of the same facts
(organisations: status, city, founded), a dataset pointing at their pages with part of each field
known, the truth of every cell, and a way to change a site's layout between two runs.

    built = build_learn_web(tmp_path / "corpus", hosts=3, records_per_host=12)
    built.spec_path, built.web_root, built.truth[record_id][field]
    change_layout(built, "org-b.test")   # the site now writes "active since 1999" as status
"""

from __future__ import annotations

import csv
import random
from dataclasses import dataclass, field
from pathlib import Path

FIELDS = ("status", "city", "founded")
STATUSES = ("active", "dissolved", "dormant", "merged", "liquidation")
CITIES = (
    "Lyon",
    "Porto",
    "Graz",
    "Turku",
    "Ghent",
    "Bergen",
    "Cork",
    "Brno",
    "Lund",
    "Basel",
    "Padua",
    "Split",
)
WORDS = ("Amber", "Birch", "Cobalt", "Delta", "Ember", "Fjord", "Granite", "Harbor", "Iris")


def _table(org: dict) -> str:
    return (
        '<table class="facts">'
        f"<tr><th>Status:</th><td>{org['status_text']}</td></tr>"
        f"<tr><th>City:</th><td>{org['city']}</td></tr>"
        f"<tr><th>Founded:</th><td>{org['founded']}</td></tr></table>"
    )


def _definitions(org: dict) -> str:
    return (
        '<dl class="profile">'
        f"<dt>Registered office</dt><dd>{org['city']}</dd>"
        f"<dt>Current status</dt><dd>{org['status_text']}</dd>"
        f"<dt>Year of foundation</dt><dd>{org['founded']}</dd></dl>"
    )


def _spans(org: dict) -> str:
    return (
        '<div class="card">'
        f'<p>Based in <span id="org-city">{org["city"]}</span>.</p>'
        f'<p class="meta"><span class="org-status">{org["status_text"]}</span> '
        f'<span class="org-founded">{org["founded"]}</span></p></div>'
    )


LAYOUTS = (_table, _definitions, _spans)


def _page(host: str, org: dict, layout) -> str:
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{org['name']} | {host}</title></head><body>"
        f"<nav><a href='/'>{host}</a> <a href='/about.html'>About</a></nav>"
        f"<h1>{org['name']}</h1>{layout(org)}"
        "<footer>Public register extract</footer></body></html>"
    )


@dataclass
class LearnWeb:
    root: Path
    spec_path: Path
    web_root: Path
    hosts: list[str]
    truth: dict[str, dict[str, str]] = field(default_factory=dict)
    known: dict[str, dict[str, str]] = field(default_factory=dict)  # cells given in the table
    orgs: dict[str, dict] = field(default_factory=dict)
    layout_of: dict[str, int] = field(default_factory=dict)

    def page_path(self, record_id: str) -> Path:
        org = self.orgs[record_id]
        return self.web_root / org["host"] / "org" / f"{record_id}.html"


def build_learn_web(
    root: Path,
    *,
    hosts: int = 3,
    records_per_host: int = 12,
    known_fraction: float = 0.4,
    crawl_delay: float = 0.2,
    recrawl_ttl_hours: float | None = None,
    learn: bool = False,
    seed: int = 0,
) -> LearnWeb:
    """Write the web, the table (`orgs.csv`) and its spec (`orgs.yaml`) under `root`."""
    rng = random.Random(seed)
    root = Path(root)
    web_root = root / "web"
    names = [f"org-{chr(ord('a') + i)}.test" for i in range(hosts)]
    built = LearnWeb(root, root / "orgs.yaml", web_root, names)
    rows = []
    for h, host in enumerate(names):
        site = web_root / host
        (site / "org").mkdir(parents=True, exist_ok=True)
        (site / "robots.txt").write_text(
            f"User-agent: *\nCrawl-delay: {crawl_delay}\nDisallow: /private/\n", encoding="utf-8"
        )
        (site / "index.html").write_text(f"<html><body><h1>{host}</h1></body></html>")
        built.layout_of[host] = h % len(LAYOUTS)
        for n in range(records_per_host):
            rid = f"{host.split('.')[0]}-{n:03d}"
            status = rng.choice(STATUSES)
            org = {
                "id": rid,
                "host": host,
                "name": f"{rng.choice(WORDS)} {rng.choice(WORDS)} {n}",
                "status": status,
                "status_text": status,
                "city": rng.choice(CITIES),
                "founded": str(rng.randint(1900, 2020)),
            }
            built.orgs[rid] = org
            built.truth[rid] = {f: org[f] for f in FIELDS}
            (site / "org" / f"{rid}.html").write_text(
                _page(host, org, LAYOUTS[built.layout_of[host]]), encoding="utf-8"
            )
            known = {f: org[f] for f in FIELDS if rng.random() < known_fraction}
            built.known[rid] = known
            rows.append(
                {"id": rid, "url": f"http://{host}/org/{rid}.html", **dict.fromkeys(FIELDS, "")}
                | known
            )
    with open(root / "orgs.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=["id", "url", *FIELDS])
        writer.writeheader()
        writer.writerows(rows)
    crawl = [
        "crawl:",
        "  depth: 0",
        "  default_delay: 0.2",
    ]
    if recrawl_ttl_hours is not None:
        crawl.append(f"  recrawl_ttl_hours: {recrawl_ttl_hours}")
    built.spec_path.write_text(
        "\n".join(
            [
                "name: orgs",
                "source: orgs.csv",
                "id: id",
                "urls: [url]",
                "fields:",
                "  status: {}",
                "  city: {}",
                "  founded: {}",
                "virtual_web: web",
                *(["learn: true"] if learn else []),
                *crawl,
                "",
            ]
        ),
        encoding="utf-8",
    )
    return built


def change_layout(built: LearnWeb, host: str) -> None:
    """The site `host` now writes its status with the date it took effect ("active since
    1999"): a rule that read the status there now reads a wrong value."""
    layout = LAYOUTS[built.layout_of[host]]
    for rid, org in built.orgs.items():
        if org["host"] != host:
            continue
        changed = dict(org, status_text=f"{org['status']} since {org['founded']}")
        built.page_path(rid).write_text(_page(host, changed, layout), encoding="utf-8")
