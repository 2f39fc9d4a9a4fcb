"""The fetching side of learning (SPEC 3b): a collecting crawl of sampled records goes through the
ordinary crawl worker (robots.txt first, Crawl-delay, one request at a time per host), hands every
page to the learner, and keeps the bodies in the crawled-URL store so that the next crawl of the
same pages fetches none of them again. Real worker processes, virtual web, MongoDB-wire server."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

from enrich_crawl.crawl.params import WorkerParams
from enrich_crawl.dataset.load import prepare_dataset
from enrich_crawl.dataset.spec import load_spec
from enrich_crawl.extract.mapping import MappingSet
from enrich_crawl.learning import (
    FetchContext,
    collect_pages,
    run_worker,
    sample_for_learning,
    sample_for_mappings,
    template_key,
)
from enrich_crawl.quality import audit_request_log
from enrich_crawl.staging import DatasetStage, read_jsonl
from enrich_crawl.testing.learnweb import build_learn_web
from enrich_crawl.virtualweb import running_web

UA = "enrich_crawl/0.1 (+https://example.org/bot)"

TABLE_MAPPING = {
    "name": "org_a_table",
    "url_patterns": [{"type": "regex", "pattern": r"^http://org-a\.test/org/[\w-]+\.html$"}],
    "fields": [
        {
            "name": "city",
            "processors": [
                {"type": "xpath", "parameters": {"expression": "//th[.='City:']/../td/text()"}}
            ],
        },
        {
            "name": "status",
            "processors": [
                {"type": "xpath", "parameters": {"expression": "//th[.='Status:']/../td/text()"}}
            ],
        },
    ],
}


def _politeness(entries: list[dict], delay: float) -> list[str]:
    """Requests of one host that overlapped or came closer than the delay after an answer."""
    problems = []
    by_host: dict[str, list[dict]] = {}
    for e in entries:
        if e.get("method") != "CONNECT":
            by_host.setdefault(e["host"], []).append(e)
    for host, reqs in by_host.items():
        reqs.sort(key=lambda e: e["t"])
        for prev, req in itertools.pairwise(reqs):
            gap = req["t"] - (prev["t"] + prev.get("dur", 0.0))
            if gap < delay - 0.05:
                problems.append(f"{host}{req['path']}: {gap:.3f}s after the previous answer")
    return problems


def _seed(built, tmp_path: Path):
    spec = load_spec(built.spec_path)
    stage = DatasetStage(tmp_path / "stage", spec.name)
    prepare_dataset(spec, stage, ["all"])
    return spec, [stage.seed_shard("all")]


def test_sampling_is_bounded_per_template_and_prefers_crawled_records():
    records = [
        {
            "_id": f"r{n}",
            "_urls": [f"http://a.test/item/{n}.html"],
            "_data": {"x": "1" if n % 2 else None, "y": "2"},
        }
        for n in range(50)
    ]
    sample = sample_for_learning(records, ["x", "y"], per_template=5, max_records=100)
    assert len({template_key(s.urls[0]) for s in sample}) == 1
    # sampled while one of its known fields has fewer than 5 examples in the template
    assert 5 <= len(sample) <= 10
    assert sum("x" in s.known for s in sample) == 5
    assert all(s.known for s in sample)
    mappings = MappingSet([])
    assert sample_for_mappings(records, ["x", "y"], mappings) == []


def test_given_mappings_take_precedence_over_learned(tmp_path):
    given_dir, learned_dir = tmp_path / "given", tmp_path / "learned"
    given_dir.mkdir()
    learned_dir.mkdir()
    (given_dir / "a.json").write_text(json.dumps(TABLE_MAPPING))
    clash = dict(TABLE_MAPPING, priority=50)
    other = dict(TABLE_MAPPING, name="learned_generic", priority=5)
    (learned_dir / "clash.json").write_text(json.dumps(clash))
    (learned_dir / "other.json").write_text(json.dumps(other))
    combined = MappingSet.load(given_dir).with_learned(MappingSet.load(learned_dir))
    assert [m.name for m in combined] == ["org_a_table", "learned_generic"]
    assert combined.by_name["learned_generic"].priority < combined.by_name["org_a_table"].priority


def test_collecting_crawl_is_polite_and_the_next_crawl_fetches_none_of_its_pages(
    mongo_server, mongo_db_name, tmp_path
):
    built = build_learn_web(tmp_path / "corpus", hosts=2, records_per_host=8, crawl_delay=0.2)
    spec, seeds = _seed(built, tmp_path)
    from enrich_crawl.learning import read_seed_records

    sample = sample_for_learning(read_seed_records(seeds), spec.fields, per_template=4)
    assert sample and all(s.known for s in sample)
    ctx = FetchContext(
        work_dir=tmp_path / "collect",
        mongo_uri=mongo_server.uri,
        mongo_db=mongo_db_name,
        user_agent=UA,
        run_id="learn-1",
    )
    collected = collect_pages(spec, sample, None, ctx)

    # every sampled record got its own page, body as served
    for s in sample:
        (row,) = collected.pages[s.id]
        assert row["url"] == s.urls[0]
        assert row["depth"] == 0
        assert row["body"] == built.page_path(s.id).read_bytes()
    # politeness: robots.txt first, Crawl-delay between answers, nothing disallowed
    log = list(read_jsonl(collected.request_log))
    assert audit_request_log(log, built.web_root, UA) == []
    assert _politeness(log, 0.2) == []
    pages = [e for e in log if e["path"] != "/robots.txt" and e.get("method") != "CONNECT"]
    assert len(pages) <= 1.2 * len(sample)
    assert collected.stats["collected"]["pages"] == len(sample)
    learned_paths = {e["host"] + e["path"] for e in pages}

    # an ordinary crawl of every record afterwards: the sampled pages come from the store
    mappings = tmp_path / "mappings"
    mappings.mkdir()
    (mappings / "a.json").write_text(json.dumps(TABLE_MAPPING))
    out = tmp_path / "run"
    out.mkdir()
    with running_web(built.web_root, log_path=out / "web.jsonl") as web:
        params = WorkerParams(
            dataset=spec.name,
            partition="all",
            seed_path=str(seeds[0]),
            out_dir=str(out / "crawl"),
            mappings_dir=str(mappings),
            field_types=spec.field_types(),
            crawl=spec.crawl.to_dict(),
            run_id="run-2",
            user_agent=UA,
            proxy=web.proxy_url,
            mongo_uri=mongo_server.uri,
            mongo_db=mongo_db_name,
        )
        stats = run_worker(params, out)
    run_log = [e for e in read_jsonl(out / "web.jsonl") if e.get("method") != "CONNECT"]
    run_paths = {e["host"] + e["path"] for e in run_log if e["path"] != "/robots.txt"}
    assert stats["pages_from_store"] > 0
    assert not (run_paths & learned_paths), sorted(run_paths & learned_paths)
    candidates = list(read_jsonl(out / "crawl" / "candidates.jsonl"))
    assert {c["mapping"] for c in candidates} == {"org_a_table"}


def test_agreement_problems_need_repeated_disagreements_or_silence():
    from enrich_crawl.learning import agreement_problems

    def entry(examples, yielded, agreed):
        return {
            "examples": examples,
            "yielded": yielded,
            "agreed": agreed,
            "precision": agreed / yielded if yielded else None,
            "recall": agreed / examples if examples else None,
            "disagreements": [{"url": "http://a.test/x", "expected": "a", "got": "b"}]
            * (yielded - agreed),
        }

    result = {
        "mappings": {
            "site_a": {"status": entry(5, 5, 1), "city": entry(5, 5, 5)},
            "site_b": {"status": entry(5, 5, 4)},  # one odd known value: not a broken mapping
            "site_c": {"city": entry(4, 0, 0)},  # yields nothing any more
        }
    }
    disagreeing, silent = agreement_problems(result, min_agreement=0.9)
    assert [(r["mapping"], r["field"]) for r in disagreeing] == [("site_a", "status")]
    assert [(r["mapping"], r["field"]) for r in silent] == [("site_c", "city")]


def test_sampling_takes_the_rare_answer_of_a_yes_no_field():
    records = [
        {
            "_id": f"r{n}",
            "_urls": [f"http://a.test/item/{n}.html"],
            "_data": {"deprecated": n % 25 == 7},  # 4 of 100 records say yes
        }
        for n in range(100)
    ]
    plain = sample_for_learning(records, ["deprecated"], per_template=10)
    assert len(plain) == 10  # whatever the answers: the rare one may be missing
    balanced = sample_for_learning(records, ["deprecated"], per_template=10, yes_no=["deprecated"])
    assert sum(s.known["deprecated"] for s in balanced) == 4
    assert len(balanced) == 9  # 5 of each answer at most: the 4 yes and 5 no


def test_only_fields_the_own_pages_do_not_teach_send_learning_deeper():
    from enrich_crawl.learning import fields_wanting_depth

    report = {
        "fields": {
            "title": {"examples": 9, "mappings": {"m": {"kept": {"recall": 1.0}}}},
            "city": {  # on the about page: not on the records' own pages
                "examples": 9,
                "mappings": {"m": {"kept": None}},
                "why_nothing": "the known values were not found on the training examples' pages",
            },
            "phone": {"examples": 9, "mappings": {"m": {"kept": {"recall": 0.3}}}},
            "deprecated": {  # a deeper page would not help
                "examples": 9,
                "mappings": {"m": {"kept": None}},
                "why_nothing": "a yes/no field needs two training examples of each answer",
            },
            "email": {"examples": 0, "why_nothing": "no example record has a known value"},
        }
    }
    assert fields_wanting_depth(report) == {"city", "phone"}


def test_spec_key_learn_and_the_run_override(tmp_path):
    from enrich_crawl.defs.resources import DatasetResource

    built = build_learn_web(tmp_path / "on", hosts=1, records_per_host=2, learn=True)
    assert load_spec(built.spec_path).learn is True
    assert load_spec(built.spec_path).to_dict()["learn"] is True
    plain = build_learn_web(tmp_path / "off", hosts=1, records_per_host=2)
    assert load_spec(plain.spec_path).learn is False
    # `enrich-crawl run --learn` sets the resource's `learn` for one run
    assert DatasetResource(spec=str(plain.spec_path), learn=True).load().learn is True
    assert DatasetResource(spec=str(built.spec_path), learn=False).load().learn is False
    assert DatasetResource(spec=str(built.spec_path)).load().learn is True


def test_sampling_takes_a_rare_yes_no_answer_beyond_the_domains_cap():
    # one domain, 4 "yes" records among 100: the domain's cap (per_domain) may be reached
    # before all of them come, and without them no yes/no rule can be learned
    records = [
        {
            "_id": f"r{n}",
            "_urls": [f"http://docs.test/lib/{n}.html"],
            "_data": {"title": f"T{n}", "deprecated": n >= 96},
        }
        for n in range(100)
    ]
    sample = sample_for_learning(
        records, ["title", "deprecated"], per_template=40, per_domain=40, yes_no=["deprecated"]
    )
    assert sum(s.known["deprecated"] for s in sample) == 4
    # the cap still holds for everything else
    assert sum(not s.known["deprecated"] for s in sample) <= 40 <= len(sample)


def test_probe_links_go_first_to_the_pages_naming_sought_fields_then_about_the_entity(
    tmp_path: Path,
):
    from enrich_crawl.crawl.collect import CollectConfig, PageCollector, field_words
    from enrich_crawl.extract.page import Page

    nav = "".join(f'<a href="blog/post-{n}.html">Post {n}</a>' for n in range(8))
    html = (
        "<html><body>"
        f'<a href="blog/index.html?tag=news">#news</a>{nav}'
        '<a href="products.html">Products</a><a href="team.html">Team</a>'
        '<a href="https://other.test/about.html">About them</a>'
        '<a href="legal.html">Registered company details</a>'
        '<a href="vat.html">VAT number</a><a href="team.html">Our people</a>'
        "</body></html>"
    )
    page = Page("http://org.test/", html, content_type="text/html")
    assert field_words(["vat_id", "ceo"]) == ("vat", "ceo")
    collector = PageCollector(tmp_path, CollectConfig(links_per_page=4, field_words=("vat", "ceo")))
    try:
        links = collector.links(page, lambda url: "post-0" not in url)  # the URL policy
    finally:
        collector.close()
    assert links == [
        "http://org.test/vat.html",  # names a sought field
        "http://org.test/team.html",  # about the entity, in document order
        "http://org.test/legal.html",
        "http://org.test/blog/post-1.html",  # then the others allowed, without a query
    ]
