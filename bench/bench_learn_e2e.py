"""Learning end to end: `enrich-crawl mapping learn` then `enrich-crawl run`, with NO hand-written
mapping, on the corpora of enrich_crawl.testing.learn_corpora (pydocs, structured) and synth
(bench/e2e/synth_corpus.py), each served by the virtual web; writes bench/results/learn-e2e.json
with a `checks` object.

    python -m bench.bench_learn_e2e [--corpora pydocs,structured,synth] [--known 0.3]
        [--out bench/results/learn-e2e.json] [--work DIR] [--shards 4]

Measured per corpus, from MongoDB and the virtual web's request log (one log; learning and the
run are told apart by their time windows):
- accuracy on the cells missing from the table (right values / missing cells) and precision
  (right values / values filled), against the corpus's truth;
- pages learning fetched per sampled example record (robots.txt requests left out), politeness
  violations of learning and of the run (bench.e2e.measure.request_stats: robots.txt first,
  nothing disallowed, no overlap, delay kept), and pages the run fetched again among those
  learning fetched;
- for pydocs, the bundled hand-written mappings' accuracy on the same records (a second run of
  the same table under another collection name, its pages from the crawled-URL store).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TARGETS = {
    "accuracy": 0.95,
    "precision": 0.98,
    "pages_per_example": 1.2,
    "politeness_violations": 0,
    "refetched": 0,
    "vs_handwritten": 0.97,
}


def say(message: str) -> None:
    sys.stderr.write(f"[learn-e2e {time.strftime('%H:%M:%S')}] {message}\n")
    sys.stderr.flush()


def _cli(args: list[str], env: dict[str, str], cwd: Path, log: Path, timeout: float) -> dict:
    started = time.time()
    with open(log, "w", encoding="utf-8") as out:
        proc = subprocess.run(
            [sys.executable, "-m", "enrich_crawl.cli", *args],
            env=env,
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=timeout,
            check=False,
        )
    return {"rc": proc.returncode, "t0": started, "t1": time.time(), "log": str(log)}


def _bench_spec(spec_path: Path, name: str | None = None) -> Path:
    """A copy of the corpus spec beside it without its own `virtual_web` (the benchmark serves
    the web itself, with one request log for learning and the run), under another name when
    asked (a second collection of the same table)."""
    import yaml

    raw = yaml.safe_load(spec_path.read_text("utf-8"))
    raw.pop("virtual_web", None)
    raw.pop("learn", None)
    if name:
        raw["name"] = name
    out = spec_path.with_name(f"bench-{name or raw['name']}.yaml")
    out.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    return out


def _cells(
    docs: dict[str, dict],
    truth: dict[str, dict],
    types: dict[str, str],
    unfindable: dict[str, dict[str, str]],
) -> dict:
    """Accuracy and precision on the cells the table was missing (the lineage's and the still
    missing fields of each document) whose truth is a value a crawler can reach (the corpus's
    `unfindable` cells, behind robots.txt or dead hosts, are counted apart)."""
    from bench.e2e.measure import same_value

    missing = filled = right = unreachable = 0
    per_field: dict[str, dict[str, int]] = {}
    for rid, doc in docs.items():
        expected = truth.get(rid)
        if expected is None:
            continue
        cells = set(doc.get("lineage") or {}) | set(doc.get("missing") or [])
        for name in cells:
            if name not in types or expected.get(name) in (None, "", []):
                continue
            if name in (unfindable.get(rid) or {}):
                unreachable += 1
                continue
            entry = per_field.setdefault(name, {"missing": 0, "filled": 0, "right": 0})
            missing += 1
            entry["missing"] += 1
            got = (doc.get("lineage") or {}).get(name, {}).get("value")
            if name not in (doc.get("lineage") or {}):
                continue
            filled += 1
            entry["filled"] += 1
            if same_value(expected[name], got, types[name]):
                right += 1
                entry["right"] += 1
    return {
        "missing_cells": missing,
        "unreachable_cells": unreachable,
        "filled": filled,
        "right": right,
        "accuracy": round(right / missing, 4) if missing else None,
        "precision": round(right / filled, 4) if filled else None,
        "per_field": per_field,
    }


def _documents(uri: str, db: str, collection: str) -> dict[str, dict]:
    import pymongo

    client = pymongo.MongoClient(uri, serverSelectionTimeoutMS=10000)
    try:
        return {d["_id"]: d for d in client[db][collection].find()}
    finally:
        client.close()


def _window(entries: list[dict], run: dict) -> list[dict]:
    from bench.e2e.measure import select_requests

    return select_requests(entries, ua_prefix="enrich_crawl", t0=run["t0"], t1=run["t1"] + 1)


def _politeness(entries: list[dict], web_root: Path, delay: float) -> dict[str, Any]:
    """bench.e2e.measure.request_stats with each host's robots.txt as the crawler got it: a
    host whose robots.txt only ever answered 5xx (or nothing) gave no rules and no
    Crawl-delay (the default delay applies), whatever file its folder holds."""
    from bench.e2e.measure import HostRules, request_stats

    answers: dict[str, list[int]] = {}
    for e in entries:
        if e.get("path") == "/robots.txt":
            answers.setdefault(e.get("host", ""), []).append(int(e.get("status") or 0))
    hosts = {p.name: {"robots": "ok"} for p in web_root.iterdir() if p.is_dir()}
    for host, statuses in answers.items():
        if all(status == 0 or status >= 500 for status in statuses):
            hosts[host] = {"robots": "error"}
    return request_stats(entries, HostRules(web_root, hosts), default_delay=delay)


def bench_corpus(name: str, args: argparse.Namespace, mongo: Any, work: Path) -> dict[str, Any]:
    import yaml

    from bench.e2e.synth_corpus import build_corpus
    from enrich_crawl.staging import read_jsonl
    from enrich_crawl.virtualweb import running_web

    root = work / name
    say(f"{name}: building the corpus ...")
    corpus = build_corpus(
        name, root / "corpus", known_fraction=args.known, seed=args.seed, scale=args.scale
    )
    spec = _bench_spec(Path(corpus.spec_path))
    raw = yaml.safe_load(spec.read_text("utf-8"))
    types = {f: (o or {}).get("type", "string") for f, o in raw["fields"].items()}
    delay = float((raw.get("crawl") or {}).get("default_delay", 1.0))
    truth = {str(k): v for k, v in dict(corpus.truth).items()}
    home = root / "dagster_home"
    home.mkdir(parents=True, exist_ok=True)
    out = root / "learned"
    log_path = root / "requests.jsonl"
    result: dict[str, Any] = {"corpus": name, "records": len(truth), "depth": corpus.depth}
    with running_web(corpus.web_root, log_path=log_path) as web:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("ENRICH_", "DAGSTER_", "MONGODB_")) and k.lower() != "no_proxy"
        }
        env.update(web.proxy_env())
        env.update(
            DAGSTER_HOME=str(home),
            ENRICH_WORK_DIR=str(root / "work"),
            MONGODB_URI=mongo.uri,
            MONGODB_DB=f"learn_{name}",
            ENRICH_SHARDS=str(args.shards),
            ENRICH_MAX_PARALLEL=str(args.shards),
            PYTHONWARNINGS="ignore",
        )
        say(f"{name}: mapping learn ...")
        learn = _cli(
            [
                "mapping",
                "learn",
                "--dataset",
                str(spec),
                "--out",
                str(out),
                "--per-template",
                str(args.per_template),
            ],
            env,
            root,
            root / "learn.log",
            args.timeout,
        )
        result["learn"] = {
            "rc": learn["rc"],
            "seconds": round(learn["t1"] - learn["t0"], 1),
            "window": [learn["t0"], learn["t1"]],
        }
        if learn["rc"] != 0:
            result["error"] = f"mapping learn exited {learn['rc']} (see {learn['log']})"
            return result
        report = json.loads((out / "learn-report.json").read_text("utf-8"))
        result["learn"].update(
            fetch=report.get("fetch"),
            mappings=report.get("mappings"),
            cpu_ms_per_page=report.get("cpu_ms_per_page"),
            fields={
                f: {k: e.get(k) for k in ("examples", "pages", "why_nothing")}
                for f, e in (report.get("fields") or {}).items()
            },
        )
        say(f"{name}: run with the learned mappings only ...")
        run = _cli(
            ["run", "--dataset", str(spec), "--mappings", str(out)],
            env,
            root,
            root / "run.log",
            args.timeout,
        )
        result["run"] = {
            "rc": run["rc"],
            "seconds": round(run["t1"] - run["t0"], 1),
            "window": [run["t0"], run["t1"]],
        }
        hand = None
        if name == "pydocs":
            say(f"{name}: run with the bundled hand-written mappings ...")
            hand_spec = _bench_spec(Path(corpus.spec_path), name=f"{raw['name']}_handwritten")
            hand = _cli(
                ["run", "--dataset", str(hand_spec), "--mappings", str(REPO / "mappings")],
                env,
                root,
                root / "run-handwritten.log",
                args.timeout,
            )
    entries = list(read_jsonl(log_path))
    learn_requests = _window(entries, learn)
    run_requests = _window(entries, run)

    def pages(requests: list[dict]) -> set[str]:
        return {e["host"] + e["path"] for e in requests if e.get("path") != "/robots.txt"}

    sampled = int((report.get("fetch") or {}).get("records_sampled") or 0)
    learn_pages = [e for e in learn_requests if e.get("path") != "/robots.txt"]
    # one timeline: the run uses the robots.txt verdicts learning fetched (robots cache), so
    # "robots.txt first" holds over both together, not within the run's window alone
    result["politeness"] = _politeness(learn_requests + run_requests, corpus.web_root, delay)
    result["pages_per_example"] = round(len(learn_pages) / sampled, 3) if sampled else None
    result["refetched"] = len(pages(learn_requests) & pages(run_requests))
    result["refetched_sample"] = sorted(pages(learn_requests) & pages(run_requests))[:10]
    docs = _documents(mongo.uri, f"learn_{name}", raw["name"])
    unfindable = {str(k): v for k, v in dict(corpus.unfindable or {}).items()}
    result["learned"] = _cells(docs, truth, types, unfindable)
    if hand is not None:
        hand_docs = _documents(mongo.uri, f"learn_{name}", f"{raw['name']}_handwritten")
        result["handwritten"] = _cells(hand_docs, truth, types, unfindable)
        result["handwritten"]["rc"] = hand["rc"]
    return result


def checks(results: dict[str, dict]) -> dict[str, dict]:
    out: dict[str, dict] = {}

    def check(key: str, value: Any, target: Any, ok: bool) -> None:
        out[key] = {"value": value, "target": target, "ok": bool(ok)}

    for name, r in results.items():
        learned = r.get("learned") or {}
        acc, prec = learned.get("accuracy"), learned.get("precision")
        check(
            f"{name}/accuracy", acc, f">= {TARGETS['accuracy']}", (acc or 0) >= TARGETS["accuracy"]
        )
        check(
            f"{name}/precision",
            prec,
            f">= {TARGETS['precision']}",
            (prec or 0) >= TARGETS["precision"],
        )
        ppe = r.get("pages_per_example")
        if (r.get("depth") or 0) <= 1:
            check(
                f"{name}/pages_per_example",
                ppe,
                f"<= {TARGETS['pages_per_example']}",
                ppe is not None and ppe <= TARGETS["pages_per_example"],
            )
        else:
            # issue #19's bound is for records whose values sit on their own pages: a record whose
            # values lie deeper is learned from the pages its links lead to (the probes)
            out[f"{name}/pages_per_example"] = {
                "value": ppe,
                "target": f"(information: depth {r['depth']}; the bound is for depth 0-1)",
                "ok": None,
            }
        violations = (r.get("politeness") or {}).get("violations")
        check(f"{name}/politeness_violations", violations, 0, violations == 0)
        check(f"{name}/refetched", r.get("refetched"), 0, r.get("refetched") == 0)
        if "handwritten" in r:
            hand = r["handwritten"].get("accuracy") or 0
            ratio = round((acc or 0) / hand, 4) if hand else None
            check(
                f"{name}/learned_vs_handwritten",
                ratio,
                f">= {TARGETS['vs_handwritten']}",
                ratio is not None and ratio >= TARGETS["vs_handwritten"],
            )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpora", default="pydocs,structured,synth")
    parser.add_argument(
        "--known", type=float, default=0.3, help="share of each field's cells known"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--scale", type=float, default=1.0, help="< 1: smaller corpora (smoke)")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--per-template", type=int, default=40, help="mapping learn's sample")
    parser.add_argument("--timeout", type=float, default=3600.0, help="per command, seconds")
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "learn-e2e.json"))
    parser.add_argument("--work", help="work folder (default: a new temporary folder)")
    args = parser.parse_args(argv)

    import tempfile

    from enrich_crawl.testing.services import ephemeral_mongo

    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="learn-e2e-"))
    work.mkdir(parents=True, exist_ok=True)
    say(f"work folder {work}")
    started = time.monotonic()
    results: dict[str, dict] = {}
    with ephemeral_mongo() as mongo:
        for name in [c.strip() for c in args.corpora.split(",") if c.strip()]:
            try:
                results[name] = bench_corpus(name, args, mongo, work)
            except Exception as exc:  # one corpus failing keeps the others' figures
                import traceback

                say(f"{name} failed: {exc!r}")
                results[name] = {"corpus": name, "error": traceback.format_exc()[-3000:]}
            say(
                f"{name}: {json.dumps({k: v for k, v in results[name].items() if k != 'learn'})[:600]}"
            )
    report = {
        "benchmark": "learn-e2e",
        "date": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "known_fraction": args.known,
        "scale": args.scale,
        "corpora": results,
        "checks": checks(results),
        "seconds": round(time.monotonic() - started, 1),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
    say(f"wrote {args.out}")
    failed = [k for k, v in report["checks"].items() if not v["ok"]]
    say("all checks ok" if not failed else f"checks missed: {', '.join(failed)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
