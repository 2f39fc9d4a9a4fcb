"""The `djangodocs` learning corpus: the Django 3.2 documentation of Debian's python-django-doc, a
real site of another kind than the Python docs (Django's own theme, many kinds of page), with a
few odd pages mixed in, as the web at large has them.

Records (truth from Sphinx's inventory `objects.inv`, never from the HTML):

- every documentation page (`std:doc`): `page_title` (the inventory's title of the page);
- every setting, template tag, template filter and django-admin command (`std:setting`,
  `std:templatetag`, `std:templatefilter`, `std:django-admin`), on the page that documents it
  with many others (`#fragment` URLs): `name` (the inventory's name) and `page_title`;
- odd records whose URL leads to an image, a script, an empty page, a 6 MB page, binary bytes
  served as HTML and a missing page, each with a `page_title` known in the table: the learner
  must not stop on them (they are `unfindable`: no mapping is expected to fill them).

The package (3.5 MB) is downloaded once with `apt-get download` into
`$ENRICH_CACHE/djangodocs` (or `~/.cache/enrich_crawl/djangodocs`); never committed.
"""

from __future__ import annotations

import random
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

DEB_PACKAGE = "python-django-doc"
HTML_IN_DEB = "usr/share/doc/python-django-doc/html"
HOST = "docs.djangoproject.com"
BASE_URL = f"https://{HOST}/en/3.2/"
OBJECT_ROLES = ("std:setting", "std:templatetag", "std:templatefilter", "std:django-admin")
FIELDS = {"name": "string", "page_title": "string"}


def ensure_html() -> Path:
    """The `html/` folder of the extracted package, fetched on first use."""
    from enrich_crawl.testing.pydocs import CorpusUnavailable, cache_dir

    root = cache_dir() / "djangodocs"
    html = root / "html"
    if (root / ".complete").exists() and (html / "objects.inv").exists():
        return html
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        try:
            subprocess.run(
                ["apt-get", "download", DEB_PACKAGE],
                cwd=tmp,
                check=True,
                capture_output=True,
                timeout=600,
            )
            deb = next(Path(tmp).glob("*.deb"))
            subprocess.run(
                ["dpkg-deb", "-x", str(deb), str(Path(tmp) / "x")],
                check=True,
                capture_output=True,
                timeout=600,
            )
        except (OSError, subprocess.SubprocessError, StopIteration) as exc:
            raise CorpusUnavailable(f"apt-get download {DEB_PACKAGE}: {exc}") from exc
        staged = Path(tmp) / "x" / HTML_IN_DEB
        if not (staged / "objects.inv").exists():
            raise CorpusUnavailable(f"{DEB_PACKAGE}: no {HTML_IN_DEB}/objects.inv")
        if html.exists():
            shutil.rmtree(html)
        shutil.move(str(staged), html)
    (root / ".complete").write_text(DEB_PACKAGE + "\n", encoding="utf-8")
    return html


def _odd_pages(site: Path, html: Path, rng: random.Random) -> dict[str, str]:
    """Path under the site -> the page title a table would claim for it."""
    odd = site / "odd"
    odd.mkdir(parents=True, exist_ok=True)
    (odd / "empty.html").write_bytes(b"")
    (odd / "binary.html").write_bytes(bytes(rng.randrange(256) for _ in range(4096)))
    releases = sorted((html / "releases").glob("*.html"))
    bodies = b"".join(p.read_bytes() for p in releases)
    huge = bodies
    while len(huge) < 6_000_000 and bodies:
        huge += bodies
    (odd / "huge.html").write_bytes(huge)
    image = next(iter(sorted((site / "_images").glob("*.png"))), None)
    out = {
        "odd/empty.html": "An empty page",
        "odd/binary.html": "Binary bytes",
        "odd/huge.html": "Release notes, all of them",
        "odd/missing.html": "A page that is not there",
        "searchindex.js": "The search index",
    }
    if image is not None:
        out[f"_images/{image.name}"] = "A diagram"
    return out


def build(root: Path, *, known_fraction: float, seed: int, scale: float):
    from enrich_crawl.testing.corpus import Corpus, _split_cells, _write
    from enrich_crawl.testing.pydocs import read_inventory

    html = ensure_html()
    web_root = root / "web"
    site = web_root / HOST / "en" / "3.2"
    if web_root.exists():
        shutil.rmtree(web_root)
    shutil.copytree(html, site, ignore_dangling_symlinks=True)  # Debian links its JS elsewhere
    (web_root / HOST / "robots.txt").write_text("User-agent: *\nAllow: /\n", encoding="utf-8")
    entries = read_inventory(html / "objects.inv")
    titles = {e.uri: e.display for e in entries if e.role == "std:doc" and e.display != "-"}
    rng = random.Random(f"djangodocs:{seed}")
    truth: dict[str, dict[str, Any]] = {}
    urls: dict[str, list[str]] = {}
    for entry in entries:
        page = entry.uri.split("#", 1)[0]
        if not (site / page).is_file():
            continue
        if entry.role == "std:doc" and page in titles:
            record = f"doc:{entry.name}"
            truth[record] = {"name": None, "page_title": titles[page]}
        elif entry.role in OBJECT_ROLES and "#" in entry.uri:
            record = f"{entry.role.split(':')[1]}:{entry.name}"
            truth[record] = {"name": entry.name, "page_title": titles.get(page)}
        else:
            continue
        urls[record] = [BASE_URL + entry.uri]
    if scale < 1:
        kept = sorted(rng.sample(sorted(truth), max(40, round(len(truth) * scale))))
        truth = {r: truth[r] for r in kept}
        urls = {r: urls[r] for r in kept}
    known, cells, hidden = _split_cells(truth, dict(FIELDS), known_fraction, rng)
    unfindable: dict[str, dict[str, str]] = {}
    for n, (path, title) in enumerate(sorted(_odd_pages(site, html, rng).items())):
        record = f"odd:{n}"
        truth[record] = {"name": None, "page_title": None}  # nothing on the page to fill
        urls[record] = [BASE_URL + path]
        known[record] = {"page_title": title}
        cells[record] = {"page_title": title}
        hidden[record] = []
        unfindable[record] = {"page_title": "an odd page: no title to find"}
    corpus = Corpus(
        name="djangodocs",
        root=root,
        spec_path=root / "djangodocs.yaml",
        web_root=web_root,
        field_types=dict(FIELDS),
        id_column="ref",
        url_columns=["url"],
        urls=urls,
        known=known,
        truth=truth,
        hidden=hidden,
        unfindable=unfindable,
        depth=0,
        notes=[
            f"{len(truth)} records: the pages, settings, template tags and filters and "
            "django-admin commands of Debian's python-django-doc (Django 3.2), and "
            f"{len(unfindable)} odd pages (an image, a script, empty, 6 MB, binary, missing)",
            "truth: Sphinx's objects.inv",
        ],
    )
    _write(corpus, cells)
    return corpus
