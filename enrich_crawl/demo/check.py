"""Compare a demo run's MongoDB documents with the demo's ground truth (expected.json).

Used by the tests and available to users: `python -m enrich_crawl.demo.check MONGODB_URI [DB]`.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from enrich_crawl.demo import DEMO_DIR

EXPECTED = DEMO_DIR / "expected.json"


def expected() -> dict[str, Any]:
    return json.loads(EXPECTED.read_text(encoding="utf-8"))


def compare(documents: dict[str, dict[str, Any]]) -> list[str]:
    """Every difference between the documents (by _id) and expected.json, as readable lines."""
    truth = expected()["records"]
    problems = []
    for rid in sorted(set(documents) - set(truth)):
        problems.append(f"{rid}: unexpected document")
    for rid, want in truth.items():
        doc = documents.get(rid)
        if doc is None:
            problems.append(f"{rid}: missing document")
            continue
        if doc.get("status") != want["status"]:
            problems.append(f"{rid}: status {doc.get('status')!r}, expected {want['status']!r}")
        for name, value in want["fields"].items():
            got = (doc.get("data") or {}).get(name)
            if got != value:
                problems.append(f"{rid}: {name} = {got!r}, expected {value!r}")
        reasons = sorted({e.get("reason") for e in doc.get("errors") or []})
        if reasons != sorted(set(want.get("error_reasons", []))):
            problems.append(
                f"{rid}: error reasons {reasons}, expected "
                f"{sorted(set(want.get('error_reasons', [])))}"
            )
    return problems


def main(argv: list[str] | None = None) -> int:
    import pymongo

    args = argv if argv is not None else sys.argv[1:]
    if not args:
        sys.stderr.write("usage: python -m enrich_crawl.demo.check MONGODB_URI [DB]\n")
        return 2
    client = pymongo.MongoClient(args[0], serverSelectionTimeoutMS=5000)
    docs = {
        d["_id"]: d for d in client[args[1] if len(args) > 1 else "enrich_crawl"].demo_orgs.find()
    }
    problems = compare(docs)
    for line in problems:
        print(line)
    print(f"{len(docs)} documents, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
