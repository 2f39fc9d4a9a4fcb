"""`enrich-crawl mapping check|learn|evaluate|test`: the mapping subcommands (docs/mappings.md,
docs/learning.md); enrich_crawl.cli wires them into the console script."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def say_error(message: str) -> None:
    """A one-line error of the console script on stderr."""
    sys.stderr.write(f"enrich-crawl: {message}\n")


def cmd_mapping_check(args: argparse.Namespace) -> int:
    """Validate a folder (or one file) of mappings: every problem as FILE: $.path: reason."""
    from enrich_crawl import config
    from enrich_crawl.extract.mapping import MappingLoadError, MappingSet

    target = Path(args.dir) if args.dir else config.mappings_dir()
    try:
        mappings = MappingSet.load(target, strict=False)
    except MappingLoadError as exc:  # the folder itself is missing
        for error in exc.errors:
            sys.stderr.write(f"error: {error}\n")
        return 2
    if args.json:
        report = {
            "path": str(target),
            "valid": [
                {
                    "name": m.name,
                    "file": str(m.path),
                    "fields": m.field_names,
                    "url_parsers": len(m.url_parsers),
                    "render": m.render,
                    "priority": m.priority,
                }
                for m in mappings
            ],
            "errors": mappings.errors,
        }
        sys.stdout.write(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    else:
        for mapping in mappings:
            sys.stdout.write(
                f"ok  {mapping.name:<28} {mapping.path.name if mapping.path else ''}  "
                f"fields: {', '.join(mapping.field_names) or '-'}; url_parsers: "
                f"{len(mapping.url_parsers)}; render: {mapping.render}; "
                f"priority: {mapping.priority}\n"
            )
        for error in mappings.errors:
            sys.stderr.write(f"error: {error}\n")
    bad_files = len({error.split(": $", 1)[0] for error in mappings.errors})
    if mappings.errors:
        sys.stderr.write(
            f"{bad_files} invalid mapping file(s) ({len(mappings.errors)} problem(s)), "
            f"{len(mappings)} valid, in {target}\n"
        )
        return 1
    if not len(mappings):
        sys.stderr.write(f"no mappings (*.json) in {target}\n")
        return 1
    if not args.json:
        sys.stdout.write(f"{len(mappings)} valid mapping(s) in {target}\n")
    return 0


def _learning_setup(spec_path: str) -> tuple[object, object, list[Path]]:
    """The spec, a FetchContext and the seed shards of `mapping learn|evaluate`: the table is
    loaded and cleaned as `run` does (into a staging folder of its own), and the pages are
    fetched with `run`'s identity, limiter and crawled-URL store. Raises ValueError (bad input)."""
    from enrich_crawl import config
    from enrich_crawl.dataset.load import DatasetError, prepare_dataset
    from enrich_crawl.dataset.spec import SpecError, load_spec
    from enrich_crawl.home import ensure_dagster_home
    from enrich_crawl.learning import FetchContext
    from enrich_crawl.staging import DatasetStage
    from enrich_crawl.store.mongo import resolve_uri

    try:
        spec = load_spec(spec_path)
    except SpecError as exc:
        raise ValueError(str(exc)) from None
    # the same home as `run` (its staging area and embedded MongoDB): the pages fetched here
    # are the ones the next run finds in the crawled-URL store
    ensure_dagster_home(initialise=False)
    stage = DatasetStage(config.work_dir() / "_learn", spec.name)
    try:
        manifest = prepare_dataset(spec, stage, ["all"])
    except (DatasetError, SpecError) as exc:
        raise ValueError(str(exc)) from None
    sys.stderr.write(
        f"{spec.name}: {manifest['profile']['usable']} usable records in {spec.source}\n"
    )
    uri = resolve_uri(config.mongodb_uri(), config.work_dir() / "mongo")
    ctx = FetchContext.from_environment(
        stage.base / "collect",
        uri,
        config.mongodb_db(),
        log=lambda line: sys.stderr.write(line + "\n"),
    )
    return spec, ctx, [stage.seed_shard("all")]


def _mappings_or_error(path: Path) -> object:
    from enrich_crawl.extract.mapping import MappingLoadError, MappingSet

    try:
        return MappingSet.load(path)
    except MappingLoadError as exc:
        raise ValueError(f"{exc}\n(check them with: enrich-crawl mapping check {path})") from None


def cmd_mapping_learn(args: argparse.Namespace) -> int:
    """Learn mappings from the dataset's known values (SPEC 3b); exit 0 even when nothing could
    be learned (the report says why), 2 on bad input."""
    from enrich_crawl.learning import LearningError, learn_dataset

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        say_error(f"--out {out}: exists and is not a folder")
        return 2
    if not 0 < args.min_precision <= 1:
        say_error(f"--min-precision {args.min_precision}: must be a share in (0, 1], e.g. 0.95")
        return 2
    if args.per_template < 1:
        say_error(f"--per-template {args.per_template}: must be at least 1")
        return 2
    given = Path(args.mappings) if args.mappings else None
    try:
        if given is not None:
            _mappings_or_error(given)
        spec, ctx, seeds = _learning_setup(args.dataset)
        outcome = learn_dataset(
            spec,
            seeds,
            out,
            ctx,
            given_dir=given,
            min_precision=args.min_precision,
            per_template=args.per_template,
        )
    except (LearningError, ValueError) as exc:
        say_error(str(exc))
        return 2
    except RuntimeError as exc:
        say_error(str(exc))
        return 1
    fetch = outcome.fetch
    sys.stdout.write(
        f"sampled {fetch['records_sampled']} records with known values "
        f"({fetch['templates']} URL templates); pages fetched {fetch['pages_fetched']}, from "
        f"the store {fetch['pages_from_store']}, robots.txt {fetch['robots_fetched']}\n"
    )
    for name, entry in (outcome.report.get("fields") or {}).items():
        sys.stdout.write(f"  {name}: {_field_line(entry)}\n")
    written = [p for p in outcome.files if p.name != "learn-report.json"]
    sys.stdout.write(
        f"{len(written)} learned mapping file(s) and learn-report.json in {out}\n"
        + (
            f"use them with: enrich-crawl run --dataset {args.dataset} --mappings {out}\n"
            if written
            else ""
        )
    )
    return 0


def _field_line(entry: object) -> str:
    """One line of the learn report's entry of a field."""
    if not isinstance(entry, dict):
        return str(entry)
    parts = [f"examples {entry.get('examples', 0)}"]
    for mapping, outcome in sorted((entry.get("mappings") or {}).items()):
        kept = (outcome or {}).get("kept")
        if kept:
            parts.append(
                f"{mapping}: precision {kept.get('precision')}, recall {kept.get('recall')}"
            )
    if entry.get("why_nothing"):
        parts.append(f"nothing learned: {entry['why_nothing']}")
    return ", ".join(parts)


def cmd_mapping_evaluate(args: argparse.Namespace) -> int:
    """Agreement of mappings with the dataset's known values, as JSON (SPEC 3b)."""
    from enrich_crawl import config
    from enrich_crawl.learning import LearningError, evaluate_dataset

    if args.sample < 1:
        say_error(f"--sample {args.sample}: must be at least 1 (records per mapping)")
        return 2
    mappings_dir = Path(args.mappings) if args.mappings else config.mappings_dir()
    try:
        mappings = _mappings_or_error(mappings_dir)
        if not len(mappings):
            raise ValueError(f"{mappings_dir}: no mappings (*.json) to evaluate")
        spec, ctx, seeds = _learning_setup(args.dataset)
        result = evaluate_dataset(spec, seeds, mappings, mappings_dir, ctx, per_mapping=args.sample)
    except (LearningError, ValueError) as exc:
        say_error(str(exc))
        return 2
    except RuntimeError as exc:
        say_error(str(exc))
        return 1
    sys.stdout.write(json.dumps(result, ensure_ascii=False, indent=2, default=str) + "\n")
    return 0


MAX_FETCH_BYTES = 20 * 1024 * 1024


def _fetch(url: str) -> tuple[str, bytes, str | None, int]:
    """GET url as the crawler would (its TLS policy: certificates not verified; its proxy:
    http_proxy for http and https, enrich_crawl.crawl.transport), following redirects; returns
    (final url, body, content type, status). HTTP error pages are returned too: their status
    says what happened."""
    import urllib.error
    import urllib.request

    from enrich_crawl import config
    from enrich_crawl.crawl.transport import crawler_opener

    request = urllib.request.Request(
        url,
        headers={
            "User-Agent": config.user_agent(),
            "Accept": "text/html,application/xhtml+xml,application/json;q=0.9,*/*;q=0.8",
        },
    )
    try:
        with crawler_opener().open(request, timeout=30) as response:
            body = response.read(MAX_FETCH_BYTES)
            return response.geturl(), body, response.headers.get("Content-Type"), response.status
    except urllib.error.HTTPError as exc:
        return (
            exc.geturl() or url,
            exc.read(MAX_FETCH_BYTES),
            exc.headers.get("Content-Type"),
            exc.code,
        )


def _guess_content_type(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix in (".json", ".jsonld"):
        return "application/json"
    if suffix in (".xml", ".rss", ".atom"):
        return "application/xml"
    if suffix in (".txt",):
        return "text/plain"
    return "text/html"


def _not_on_page_hints(page, fragment: str, record_id: str) -> list[str]:
    """Why a page may have given no field: the fragment names no element of the page (the usual
    cause when mappings select `//*[@id=$fragment]`), or the record id is nowhere in its text."""
    import difflib

    hints = []
    tree = page.tree
    if fragment and tree is not None and page.kind == "html":
        ids = [str(v) for v in tree.xpath("//@id | //a/@name")]
        if fragment not in ids:
            near = difflib.get_close_matches(fragment, ids, n=5, cutoff=0.6)
            if not near:
                lowered = fragment.lower()
                near = [i for i in ids if lowered in i.lower() or i.lower() in lowered][:5]
            if near:
                listed = f"ids nearby: {', '.join(near)}"
            elif ids:
                listed = f"{len(ids)} ids on the page, e.g. {', '.join(ids[:5])}"
            else:
                listed = "the page has no id at all"
            hints.append(f"no element of the page has the id {fragment!r} ($fragment); {listed}")
    if record_id and record_id not in page.text:
        hints.append(f"the record id {record_id!r} ($id) does not occur in the page's text")
    return hints


def cmd_mapping_test(args: argparse.Namespace) -> int:
    """Run mappings on one page and print {"mappings", "fields", "links"}."""
    from enrich_crawl.extract.mapping import MappingLoadError, MappingSet, try_mappings
    from enrich_crawl.extract.page import Page
    from enrich_crawl.urls import fragment_of, without_fragment

    target = Path(args.mapping)
    try:
        candidates = list(MappingSet.load(target))
    except MappingLoadError as exc:
        say_error(str(exc))
        return 2
    if args.url:
        url = args.url
        if "://" not in url:
            say_error(f"{url}: not an absolute URL (e.g. https://example.org/page.html)")
            return 2
        try:
            final, body, ctype, status = _fetch(without_fragment(url))
        except (OSError, ValueError) as exc:
            say_error(f"{url}: cannot fetch: {getattr(exc, 'reason', None) or exc}")
            return 2
        if final != without_fragment(url):
            sys.stderr.write(f"note: redirected to {final}\n")
        if status >= 400:
            sys.stderr.write(f"note: {final} answered HTTP {status}\n")
    else:
        if not args.base_url:
            say_error("--file needs --base-url (the URL the page was fetched from)")
            return 2
        path = Path(args.file)
        try:
            body = path.read_bytes()
        except OSError as exc:
            say_error(f"{path}: cannot read: {exc.strerror or exc}")
            return 2
        url = args.base_url
        final, status = without_fragment(url), 200
        ctype = args.content_type or _guess_content_type(path)
    fragment = args.fragment if args.fragment is not None else fragment_of(url)
    field_types: dict[str, str] = {}
    if args.dataset:
        from enrich_crawl.dataset.spec import SpecError, load_spec

        try:
            field_types = load_spec(args.dataset).field_types()
        except SpecError as exc:
            say_error(str(exc))
            return 2
    page = Page(final, body, content_type=ctype, status=status)
    output, errors = try_mappings(
        candidates,
        page,
        fragment=fragment,
        record_id=args.id or "",
        field_types=field_types,
        force=args.force,
    )
    for error in errors:
        sys.stderr.write(f"error: {error}\n")
    if output["mappings"] and not output["fields"]:
        for hint in _not_on_page_hints(page, fragment, args.id or ""):
            sys.stderr.write(f"note: {hint}\n")
    if not output["mappings"]:
        match_url = final + (f"#{fragment}" if fragment else "")
        sys.stderr.write(
            f"note: no mapping's url_patterns match {match_url} (--force runs them anyway)\n"
        )
    sys.stdout.write(json.dumps(output, ensure_ascii=False, indent=2, default=str) + "\n")
    return 0


def add_mapping_parser(sub: argparse._SubParsersAction) -> None:
    """The `mapping` command and its subcommands, on the console script's subparsers."""
    mapping = sub.add_parser("mapping", help="check or try mappings")
    msub = mapping.add_subparsers(dest="mapping_command", required=True)
    check = msub.add_parser("check", help="validate mappings; non-zero exit if any is invalid")
    check.add_argument(
        "dir", nargs="?", help="mappings folder or one mapping file (default: mappings/)"
    )
    check.add_argument("--json", action="store_true", help="print the report as JSON")
    check.set_defaults(func=cmd_mapping_check)
    learn = msub.add_parser(
        "learn", help="learn mappings from the values the dataset already holds (SPEC 3b)"
    )
    learn.add_argument("--dataset", required=True, help="dataset spec YAML")
    learn.add_argument("--out", required=True, help="folder for the learned mappings and report")
    learn.add_argument(
        "--mappings", help="hand-written mappings: kept as they are, and they take precedence"
    )
    learn.add_argument(
        "--min-precision",
        type=float,
        default=0.95,
        help="held-out precision a rule needs to be kept (default 0.95)",
    )
    learn.add_argument(
        "--per-template",
        type=int,
        default=40,
        help="example records fetched per site template and field (default 40)",
    )
    learn.set_defaults(func=cmd_mapping_learn)
    evaluate = msub.add_parser(
        "evaluate", help="how well mappings agree with the dataset's known values, as JSON"
    )
    evaluate.add_argument("--dataset", required=True, help="dataset spec YAML")
    evaluate.add_argument(
        "--mappings", help="mappings folder (default: ENRICH_MAPPINGS or mappings/)"
    )
    evaluate.add_argument(
        "--sample", type=int, default=10, help="records fetched per mapping (default 10)"
    )
    evaluate.set_defaults(func=cmd_mapping_evaluate)
    test = msub.add_parser("test", help="print the fields and links a mapping extracts, as JSON")
    test.add_argument("mapping", help="mapping JSON file (or a folder: every mapping that matches)")
    source = test.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--url",
        help="fetch this URL as the crawl does (http_proxy, certificates not verified; follows "
        "redirects)",
    )
    source.add_argument("--file", help="a saved page")
    test.add_argument("--base-url", help="the URL the --file page was fetched from")
    test.add_argument("--fragment", help="value of $fragment (default: the URL's fragment)")
    test.add_argument("--id", help="value of $id")
    test.add_argument("--content-type", help="Content-Type of the --file page")
    test.add_argument("--dataset", help="dataset spec, to type the fields like a crawl does")
    test.add_argument("--force", action="store_true", help="run even if url_patterns do not match")
    test.set_defaults(func=cmd_mapping_test)
