"""The learner on its corpora, in process: accuracy and precision on the missing cells with no
hand-written mapping, CPU per example page, rule kinds; the Python docs against the bundled mappings.

    python -m bench.bench_learn [--corpus pydocs structured synth] [--scale 1.0]
        [--examples-per-template N] [--tail-examples 400] [--eval-records 2000]

For each corpus (`enrich_crawl.testing.learn_corpora`, and `synth` from bench/e2e/synth_corpus.py;
~30% of each field's cells known):

1. Examples: the records with a known value, sampled per template (host + first path segment)
   until each field has `--examples-per-template` examples; the long tail (templates with fewer
   than 4 example records) two per template, `--tail-examples` in all; their known cells as the
   table writes them (the learner reads them as the dataset loader does). Pages are read from the
   corpus's web folder as the crawler gets them (path rules, robots.txt, dead hosts). Where the
   crawl depth is >= 1, a probe of a few records per template reads every same-host link within the
   depth; the learner learns from those, and the other examples' deeper pages are then read
   through the probe's learned links only (as a fetcher that does not crawl whole sites would).
2. `learn()` on all examples; CPU seconds of that call (process time) per example page.
3. The learned mappings (written out, loaded back with `MappingSet.load` as `mapping check` does)
   fill the blank cells of the records with hidden cells (a sample of `--eval-records`) by a
   goal-directed offline crawl: seed pages, then the mappings' links, shallowest first.
   accuracy = correct / hidden cells a crawler can reach; precision = correct / cells filled.
4. pydocs only: the bundled `python_docs_*` mappings on the same records and cells, and the ratio.

Writes bench/results/learn.json with `checks` {name: {value, target, ok}}.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from bench.e2e.synth_corpus import build_corpus
from enrich_crawl.extract.learn import Example, learn, write_learned
from enrich_crawl.extract.mapping import MappingSet
from enrich_crawl.testing.learn_corpora import (
    PageSource,
    WebFolder,
    offline_fill,
    record_pages,
    score,
    template_of,
)
from enrich_crawl.testing.pydocs import cache_dir

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
TARGET_ACCURACY = 0.95
TARGET_PRECISION = 0.98
TARGET_CPU_MS = 50.0
TARGET_HAND_RATIO = 0.97
PROBES_PER_TEMPLATE = 2
PROBES_TAIL = 60


def sample_examples(
    corpus, per_template: int, tail_examples: int, rng: random.Random
) -> tuple[list[str], list[str]]:
    """(probe record ids, other example record ids)."""
    by_template: dict[str, list[str]] = defaultdict(list)
    for record_id, known in corpus.known.items():
        if known and corpus.urls.get(record_id):
            first = next((u for u in corpus.urls[record_id] if u), "")
            by_template[template_of(first.split(" ")[0])].append(record_id)
    probes, others = [], []
    tail: list[str] = []
    for _template, ids in sorted(by_template.items()):
        ids = sorted(ids)
        rng.shuffle(ids)
        if len(ids) >= 4:
            counts: Counter[str] = Counter()
            chosen = []
            for record_id in ids:  # up to per_template examples of each field
                fields = corpus.known[record_id]
                if any(counts[f] < per_template for f in fields):
                    chosen.append(record_id)
                    counts.update(list(fields))
            probes += chosen[:PROBES_PER_TEMPLATE]
            others += chosen[PROBES_PER_TEMPLATE:]
        else:
            tail += ids[:2]
    rng.shuffle(tail)
    probes += tail[:PROBES_TAIL]
    others += tail[PROBES_TAIL:tail_examples]
    return probes, others


def examples_for(corpus, source, ids, *, wide: bool, mappings=None) -> list[Example]:
    out = []
    for record_id in ids:
        pages = record_pages(
            source,
            corpus.urls[record_id],
            corpus.depth,
            wide=wide,
            mappings=mappings,
            record_id=record_id,
        )
        if pages:
            # the cells as the table writes them (" 1,200 ", "BERLIN"): the learner reads them
            # the way the dataset loader does
            out.append(Example(record_id, dict(corpus.cells[record_id]), pages))
    return out


def run_corpus(name: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    started = time.monotonic()
    folder = name if args.scale == 1 else f"{name}-scale{args.scale:g}"
    corpus = build_corpus(name, cache_dir() / "learn" / folder, seed=args.seed, scale=args.scale)
    built = time.monotonic() - started
    rng = random.Random(args.seed)
    source = PageSource(WebFolder(corpus.web_root))
    per_template = args.examples_per_template or (12 if name == "synth" else 100)
    probes, others = sample_examples(corpus, per_template, args.tail_examples, rng)
    examples = examples_for(corpus, source, probes, wide=corpus.depth > 0)
    probe_mappings = None
    if corpus.depth > 0 and others:
        first = learn(examples, corpus.field_types, seed=args.seed)
        probe_mappings = MappingSet([m for m in _compiled(first.mappings)])
    examples += examples_for(corpus, source, others, wide=False, mappings=probe_mappings)
    result = learn(examples, corpus.field_types, seed=args.seed)
    out = work / name
    write_learned(result, out)
    mappings = MappingSet.load(out)  # strict: what `enrich-crawl mapping check` does
    evaluated = sorted(r for r, fields in corpus.hidden.items() if fields)
    if args.eval_records and len(evaluated) > args.eval_records:
        evaluated = sorted(random.Random(args.seed + 1).sample(evaluated, args.eval_records))
    fill_started = time.process_time()
    filled = offline_fill(corpus, source, mappings, evaluated)
    fill_cpu = time.process_time() - fill_started
    scores = score(corpus, filled)
    kinds = Counter()
    for mapping in result.mappings:
        kinds.update((mapping.get("learned") or {}).get("rules", {}).values())
    report: dict[str, Any] = {
        "corpus": name,
        "notes": corpus.notes,
        "records": len(corpus.urls),
        "hidden_cells": corpus.hidden_cells(),
        "build_seconds": round(built, 1),
        "examples": len(examples),
        "probe_examples": len(probes),
        "example_pages": result.report["pages"],
        "learn_cpu_seconds": result.report["cpu_seconds"],
        "learn_cpu_ms_per_page": result.report["cpu_ms_per_page"],
        "mappings": [m["name"] for m in result.mappings],
        "rule_kinds": dict(kinds),
        "learned": {m["name"]: m.get("learned") for m in result.mappings},
        "why_nothing": {
            f: e["why_nothing"] for f, e in result.report["fields"].items() if e.get("why_nothing")
        },
        "evaluated_records": len(evaluated),
        "fill_cpu_seconds": round(fill_cpu, 2),
        "score": scores,
        "learned_mapping_example": result.mappings[0] if result.mappings else None,
    }
    if name == "pydocs":
        hand = MappingSet.load(REPO / "mappings")
        hand = MappingSet([m for m in hand if m.name.startswith("python_docs_")])
        hand_scores = score(corpus, offline_fill(corpus, source, hand, evaluated))
        report["hand_written"] = {k: v for k, v in hand_scores.items() if k != "mistakes"}
        report["hand_written_mistakes"] = hand_scores["mistakes"][:5]
        ratio = (
            (scores["accuracy"] or 0) / hand_scores["accuracy"] if hand_scores["accuracy"] else 0
        )
        report["accuracy_vs_hand_written"] = round(ratio, 4)
    return report


def _compiled(raws: list[dict[str, Any]]):
    from enrich_crawl.extract.mapping import compile_mapping

    return [compile_mapping(raw) for raw in raws]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", nargs="+", default=["pydocs", "structured", "synth"])
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--examples-per-template",
        type=int,
        help="default: 100 (pydocs, structured), 12 (synth: its 130 directory hosts are templates)",
    )
    parser.add_argument("--tail-examples", type=int, default=400)
    parser.add_argument("--eval-records", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=RESULTS / "learn.json")
    parser.add_argument("--keep", type=Path, help="write the learned mappings under KEEP/<corpus>/")
    parser.add_argument(
        "--merge", action="store_true", help="update the corpora run in an existing --out file"
    )
    args = parser.parse_args(argv)
    reports = {}
    checks: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-learn-") as tmp:
        for name in args.corpus:
            report = run_corpus(name, args, args.keep or Path(tmp))
            report["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            reports[name] = report
            s = report["score"]
            checks[f"{name}_accuracy"] = {
                "value": s["accuracy"],
                "target": TARGET_ACCURACY,
                "ok": (s["accuracy"] or 0) >= TARGET_ACCURACY,
            }
            checks[f"{name}_precision"] = {
                "value": s["precision"],
                "target": TARGET_PRECISION,
                "ok": (s["precision"] or 0) >= TARGET_PRECISION,
            }
            checks[f"{name}_cpu_ms_per_example_page"] = {
                "value": report["learn_cpu_ms_per_page"],
                "target": TARGET_CPU_MS,
                "ok": report["learn_cpu_ms_per_page"] <= TARGET_CPU_MS,
            }
            if "accuracy_vs_hand_written" in report:
                checks["pydocs_accuracy_vs_hand_written"] = {
                    "value": report["accuracy_vs_hand_written"],
                    "target": TARGET_HAND_RATIO,
                    "ok": report["accuracy_vs_hand_written"] >= TARGET_HAND_RATIO,
                }
            print(
                f"{name}: accuracy {s['accuracy']} precision {s['precision']} "
                f"({s['correct']}/{s['findable']} findable, {s['filled']} filled), "
                f"learn {report['learn_cpu_ms_per_page']} ms CPU/page on "
                f"{report['example_pages']} pages",
                flush=True,
            )
    if args.merge and args.out.exists():
        previous = json.loads(args.out.read_text(encoding="utf-8"))
        kept = {n: r for n, r in previous.get("corpora", {}).items() if n not in reports}
        reports = {**kept, **reports}
        checks = {
            **{k: v for k, v in previous.get("checks", {}).items() if k.split("_")[0] in kept},
            **checks,
        }
    result = {
        "benchmark": "learn",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"python": platform.python_version(), "cpus": _cpus()},
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "checks": checks,
        "corpora": reports,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, default=str) + "\n", encoding="utf-8")
    print(json.dumps(checks, indent=1))
    return 0


def _cpus() -> int:
    import os

    return os.cpu_count() or 1


if __name__ == "__main__":
    raise SystemExit(main())
