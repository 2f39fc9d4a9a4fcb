"""The `synth` corpus for learned mappings: the end-to-end benchmark's generated web
(generate.py: org sites in 16 themes, shared hosting, directories with one section per record), at
its full scale by default, as a corpus of `enrich_crawl.testing.learn_corpora` (same files, same
reading). The truth is the generator's model, never the pages. Fields that robots.txt, dead hosts
or broken seed URLs make unreachable are listed in `unfindable.json` (they are not expected from
any mapping).

    corpus = build_corpus("synth", root)      # or any corpus of learn_corpora
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from bench.e2e import generate as gen
from enrich_crawl.testing import learn_corpora
from enrich_crawl.testing.corpus import Corpus, _split_cells, _write

CORPORA = (*learn_corpora.CORPORA, "synth")


def build_corpus(name: str, root: str | Path, **options: Any) -> Corpus:
    """`learn_corpora.build_corpus`, knowing `synth` too."""
    return learn_corpora.build_corpus(name, root, more={"synth": build_synth}, **options)


def build_synth(root: Path, known_fraction: float, seed: int, scale: float) -> Corpus:
    """The `synth` corpus in `root`, its web generated once per configuration (kept in
    `root/generated`, remade when the configuration changes)."""
    hosts = max(20, round(1000 * scale))
    n_records = max(200, round(20000 * scale))
    cfg = gen.GenConfig(seed=seed + 1, hosts=hosts, records=n_records, plugins=())
    out = root / "generated"
    marker = out / ".learn-corpus"
    if not (marker.exists() and marker.read_text() == cfg.key()):
        gen.generate(cfg, out, log=lambda _msg: None)
        marker.write_text(cfg.key())
    _hosts, records, _sites, _plugins, _notes = gen.build_model(cfg)
    rng = random.Random(f"synth:{seed}")
    field_types = dict(gen.FIELDS)
    truth: dict[str, dict[str, Any]] = {}
    urls: dict[str, list[str]] = {}
    unfindable: dict[str, dict[str, str]] = {}
    url_rng = random.Random(f"synth-urls:{seed}")
    for record in records:
        truth[record.id] = {f: record.org.values[f] for f in field_types}
        website, profile = gen._seed_cells(url_rng, record)
        urls[record.id] = [website, profile]
        record.missing = list(field_types)
        facts = gen.ground_truth(record)
        why = {
            f: facts["why"].get(f, "unfindable") for f, ok in facts["findable"].items() if not ok
        }
        if why:
            unfindable[record.id] = why

    def dirty(rng_: random.Random, value: Any, text: str) -> str:
        return gen._dirty(rng_, value)

    known, cells, hidden = _split_cells(truth, field_types, known_fraction, rng, dirty=dirty)
    corpus = Corpus(
        name="synth",
        root=root,
        spec_path=root / "synth.yaml",
        web_root=out / "web",
        field_types=field_types,
        id_column="org_id",
        url_columns=["website", "profile_url"],
        urls=urls,
        known=known,
        truth=truth,
        hidden=hidden,
        unfindable=unfindable,
        depth=gen.DEPTH,
        notes=[f"bench/e2e/generate.py {cfg}", "truth: the generator's model"],
    )
    _write(corpus, cells)
    return corpus
