"""Which records learning and evaluating look at: a bounded sample of the records that hold
values, per site template (learning) or per mapping (evaluate, `mapping_agreement`), written as a
seed shard for the collecting crawl; the probes that go deeper.

The records are taken in a seeded pseudo-random order spread over the whole table (`spread_rank`
of the record's id), not from its first rows: a table sorted by date, country or site would
otherwise teach and check only its first stretch. The same seed and table give the same sample.
"""

from __future__ import annotations

import hashlib
import heapq
import json
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit


def known_values(record: dict[str, Any], fields: Iterable[str]) -> dict[str, Any]:
    """The spec fields of a seed record that hold a value after the dataset's cleaning."""
    data = record.get("_data") or {}
    return {name: data[name] for name in fields if data.get(name) not in (None, "", [])}


def template_key(url: str) -> tuple[str, tuple[str, ...], int]:
    """A guess at a URL's site template before fetching: its host and the shape of its path
    (segments holding digits, and the last one, are wildcards): /3.11/library/os.html and
    /3.11/library/re.html share one."""
    parts = urlsplit(url)
    segments = [s for s in parts.path.split("/") if s]
    shape = tuple("*" if any(c.isdigit() for c in s) else s for s in segments[:-1])
    return (parts.hostname or "", shape, len(segments))


def _domain(url: str) -> str:
    from enrich_crawl.dataset.shard import registrable_domain

    return registrable_domain((urlsplit(url).hostname or "").lower())


def spread_rank(record_id: str, seed: int = 0) -> int:
    """A record's place in the seeded order the samples take records in (stable across runs,
    processes and Python versions: not `hash()`)."""
    digest = hashlib.blake2b(f"{seed}:{record_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


OVERSAMPLE = 20  # records looked at per record a sample may take (its quotas skip most)


class _Lowest:
    """The `size` items of lowest rank seen (a uniform sample of a stream, bounded memory)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.heap: list[tuple[int, int, Any]] = []  # (-rank, -position, item): a max-heap
        self.seen = 0

    def offer(self, rank: int, item: Any) -> None:
        self.seen += 1
        entry = (-rank, -self.seen, item)
        if len(self.heap) < self.size:
            heapq.heappush(self.heap, entry)
        elif rank < -self.heap[0][0]:
            heapq.heapreplace(self.heap, entry)

    def ranked(self) -> list[tuple[int, Any]]:
        return [(-rank, item) for rank, _pos, item in sorted(self.heap, reverse=True)]


@dataclass
class Sampled:
    """A sampled record: its id, seed URLs and known values."""

    id: str
    urls: list[str]
    known: dict[str, Any]
    record: dict[str, Any] = field(repr=False, default_factory=dict)


def sample_for_learning(
    records: Iterable[dict[str, Any]],
    fields: Iterable[str],
    *,
    per_template: int = 40,
    per_domain: int = 120,
    max_records: int = 2000,
    yes_no: Iterable[str] = (),
    seed: int = 0,
) -> list[Sampled]:
    """Records with known values, in the seeded order spread over the table (`spread_rank`),
    taken while one of their known fields has fewer than `per_template` examples in the
    record's site template (template_key of its first URL), at most `per_domain` records of one
    registrable domain and `max_records` in all. The `yes_no` (boolean) fields count each answer
    apart, up to half of `per_template` each: the rare answer (a deprecated module among
    hundreds) is what teaches where the answer shows, so a record bringing an answer still short
    of examples is taken beyond `per_domain` too (and looked for over the whole table)."""
    fields = list(fields)
    yes_no = set(yes_no)
    half = max(1, per_template // 2)
    spread = _Lowest(max_records * OVERSAMPLE)
    answers: dict[tuple[Any, ...], _Lowest] = {}
    for record in records:
        urls = list(record.get("_urls") or [])
        known = known_values(record, fields)
        if not urls or not known:
            continue
        rank = spread_rank(str(record["_id"]), seed)
        item = (record, urls, known)
        spread.offer(rank, item)
        for name in yes_no & set(known):
            key = (template_key(urls[0]), name, str(known[name]).lower())
            answers.setdefault(key, _Lowest(half)).offer(rank, item)
    chosen: dict[str, tuple[int, Any]] = {}
    for lowest in [spread, *answers.values()]:
        for rank, item in lowest.ranked():
            chosen.setdefault(str(item[0]["_id"]), (rank, item))
    per_field: Counter[tuple[Any, ...]] = Counter()
    per_site: Counter[str] = Counter()
    out: list[Sampled] = []
    for _rank, (record, urls, known) in sorted(chosen.values(), key=lambda c: c[0]):
        template = template_key(urls[0])
        domain = _domain(urls[0])
        keys = [
            (template, name, str(value).lower()) if name in yes_no else (template, name)
            for name, value in known.items()
        ]
        wanted = [k for k in keys if per_field[k] < (half if len(k) == 3 else per_template)]
        if not wanted:
            continue
        # a yes/no answer still short of examples passes the domain's cap: on a one-domain
        # dataset the rare answer (4 deprecated modules, late in the file) comes after it
        if per_site[domain] >= per_domain and not any(len(k) == 3 for k in wanted):
            continue
        per_field.update(keys)
        per_site[domain] += 1
        out.append(Sampled(str(record["_id"]), urls, known, record))
        if len(out) >= max_records:
            break
    return out


def sample_for_mappings(
    records: Iterable[dict[str, Any]],
    fields: Iterable[str],
    mappings: Any,
    *,
    per_mapping: int = 10,
    max_records: int = 500,
    seed: int = 0,
) -> list[Sampled]:
    """Records with known values whose seed URLs one of `mappings` matches, while that mapping
    has fewer than `per_mapping` records sampled for one of its fields that the record knows,
    in the seeded order spread over the table (`spread_rank`). Records that also miss a field
    come first: a run has just fetched their pages (the crawled-URL store serves them again),
    so checking them costs no request."""
    fields = list(fields)
    crawled = _Lowest(max_records * OVERSAMPLE)
    complete = _Lowest(max_records * OVERSAMPLE)
    for record in records:
        urls = list(record.get("_urls") or [])
        known = known_values(record, fields)
        if not urls or not known:
            continue
        (complete if len(known) == len(fields) else crawled).offer(
            spread_rank(str(record["_id"]), seed),
            Sampled(str(record["_id"]), urls, known, record),
        )
    taken: Counter[tuple[str, str]] = Counter()
    out: list[Sampled] = []
    ordered = [s for _rank, s in crawled.ranked()] + [s for _rank, s in complete.ranked()]
    for sampled in ordered:
        pairs = {
            (mapping.name, name)
            for url in sampled.urls
            for mapping in mappings.matching(url)
            for name in mapping.field_set & set(sampled.known)
        }
        if any(taken[pair] < per_mapping for pair in pairs):
            taken.update(pairs)
            out.append(sampled)
            if len(out) >= max_records:
                break
    return out


def read_seed_records(paths: Iterable[Path]) -> Iterator[dict[str, Any]]:
    from enrich_crawl.dataset.seedfile import read_seed_shard

    for path in paths:
        yield from read_seed_shard(Path(path))


def write_sample_shard(sample: list[Sampled], path: Path) -> None:
    """A seed shard of the sampled records in which the known fields are the ones to find: the
    crawl then fetches their pages as it would for records missing them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from enrich_crawl.dataset.load import SEED_SCHEMA

    rows = []
    for s in sample:
        r = s.record
        rows.append(
            {
                "_id": s.id,
                "_row": r.get("_row"),
                "_urls": s.urls,
                "_url_errors": json.dumps(r.get("_url_errors") or []),
                "_missing": sorted(s.known),
                "_data": json.dumps(r.get("_data") or {}, ensure_ascii=False, default=str),
                "_raw": json.dumps(r.get("_raw") or {}, ensure_ascii=False, default=str),
                "_line": r.get("_line"),
                "_cell_errors": json.dumps(r.get("_cell_errors") or []),
            }
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=SEED_SCHEMA), path)


PROBES_PER_TEMPLATE = 2  # records per template that follow same-host links (depth >= 1)
MAX_PROBES = 50
PROBE_LINKS = 10  # same-host links followed per page by a probe


# why_nothing of the learner when a deeper page might hold what the record's own page does not
_DEEPER_HINTS = ("not found", "no rule reached", "no candidate")
LOW_RECALL = 0.8


def fields_wanting_depth(report: dict[str, Any]) -> set[str]:
    """Fields that the records' own pages did not teach (values not found there, no rule good
    enough) or taught only for a few records (recall below LOW_RECALL): deeper pages may hold
    them. Fields covered by given mappings, without known values, or yes/no fields short of
    examples of one answer are not among them (a deeper page would not help)."""
    out = set()
    for name, entry in (report.get("fields") or {}).items():
        if not entry.get("examples"):
            continue
        kept = [
            (m.get("kept") or {}) for m in (entry.get("mappings") or {}).values() if m.get("kept")
        ]
        why = str(entry.get("why_nothing") or "")
        not_here = not kept and any(hint in why for hint in _DEEPER_HINTS)
        rarely = bool(kept) and max(float(k.get("recall") or 0.0) for k in kept) < LOW_RECALL
        if not_here or rarely:
            out.add(name)
    return out


def split_probes(sample: list[Sampled]) -> tuple[list[Sampled], list[Sampled]]:
    """(probes, others): the first PROBES_PER_TEMPLATE records of each template, at most
    MAX_PROBES, and the rest."""
    per_template: Counter[Any] = Counter()
    probes: list[Sampled] = []
    others: list[Sampled] = []
    for s in sample:
        key = template_key(s.urls[0])
        if per_template[key] < PROBES_PER_TEMPLATE and len(probes) < MAX_PROBES:
            per_template[key] += 1
            probes.append(s)
        else:
            others.append(s)
    return probes, others
