"""The `enrich-crawl` console script (README.md, docs/mappings.md, docs/results.md).

enrich-crawl demo                                   the main job on the bundled demo
enrich-crawl run --dataset SPEC.yaml [--mappings DIR]
enrich-crawl run --dataset SPEC.yaml [--mappings DIR] --learn
enrich-crawl mapping check [DIR]
enrich-crawl mapping learn --dataset SPEC.yaml --out DIR [--mappings DIR] [--min-precision P]
enrich-crawl mapping evaluate --dataset SPEC.yaml [--mappings DIR] [--sample N]
enrich-crawl mapping test MAPPING --url URL | --file PAGE --base-url URL [--fragment F]
enrich-crawl ui [--port P]                          the Dagster UI on the home's instance
enrich-crawl mongo status|stop                      the embedded MongoDB of this instance
enrich-crawl export --dataset SPEC.yaml [--out FILE] [--format F] [--lineage] [--status S ...]
enrich-crawl worker -y celery.yaml [-n NAME] [-- CELERY ARGS]   a Celery worker (exec'd)
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
from pathlib import Path

from enrich_crawl.cli_mapping import add_mapping_parser, say_error

# -- run / demo ------------------------------------------------------------------------------------


def _run(
    spec_path: Path,
    mappings: Path | None,
    *,
    demo: bool = False,
    verbose: bool = False,
    learn: bool = False,
) -> int:
    # no garbage collection while the command loads (Dagster, the definitions, the preflight's
    # libraries: hundreds of thousands of objects, traversed again at every collection); the run
    # collects once, freezes what is loaded and turns it back on (runner.run_enrich_job)
    gc.disable()
    try:
        return _run_loaded(spec_path, mappings, demo=demo, verbose=verbose, learn=learn)
    finally:
        gc.enable()


def _run_loaded(
    spec_path: Path, mappings: Path | None, *, demo: bool, verbose: bool, learn: bool
) -> int:
    from enrich_crawl import config
    from enrich_crawl.home import enrich_crawl_hint, ensure_dagster_home
    from enrich_crawl.preflight import PreflightError, preflight
    from enrich_crawl.runner import run_enrich_job
    from enrich_crawl.summary import print_summary

    try:
        checked = preflight(spec_path, mappings or config.mappings_dir(), learn=learn)
    except PreflightError as exc:
        say_error(str(exc))
        return 2
    for warning in checked.warnings:
        sys.stderr.write(f"warning: {warning}\n")
    spec, mappings_dir = checked.spec, checked.mappings_dir
    home = ensure_dagster_home()
    sys.stderr.write(
        f"enrich_job: dataset {spec.name} ({spec.path}), mappings {mappings_dir}, instance {home}\n"
    )
    outcome = run_enrich_job(
        spec.path,
        mappings_dir,
        stream=sys.stderr,
        verbose=verbose,
        mongo_uri=checked.mongo_uri,
        mongo_database=checked.mongo_database,
        learn=learn or None,
    )

    counts, results = _run_counts(spec, checked.mongo_uri, enrich_crawl_hint("mongo stop"))
    print_summary(outcome, sys.stdout, counts=counts, results=results)
    if demo and outcome.success:
        from enrich_crawl.console import command
        from enrich_crawl.demo import DEMO_DIR

        # absolute paths: the hint works as printed from any folder
        sys.stdout.write(
            f"  try               {command('enrich-crawl')} mapping test "
            f"{mappings_dir / 'demo_directory.json'} "
            f"--file {DEMO_DIR / 'web' / 'directory.example' / 'orgs.html'} "
            "--base-url http://directory.example/orgs.html#org-ORG-012\n"
        )
    if not outcome.success:
        return 1
    # a failed check of severity ERROR fails the command even though the run completed
    return 3 if outcome.error_checks else 0


def _run_counts(spec, uri: str, stop_hint: str) -> tuple[dict | None, str]:
    """The run's counts (enrich_crawl.counts, the same as the UI's) and where the results are."""
    from enrich_crawl import config
    from enrich_crawl.counts import PROJECTION, run_counts
    from enrich_crawl.preflight import first_line
    from enrich_crawl.staging import DatasetStage, read_json
    from enrich_crawl.store.mongo import connect, redact_uri

    database = config.mongodb_db()
    stage = DatasetStage(config.work_dir(), spec.name)
    where = f"{redact_uri(uri)}  database {database}, collection {spec.name}"
    if not config.mongodb_uri():
        where += f"  (embedded server; stop it with: {stop_hint})"
    client = connect(uri, serverSelectionTimeoutMS=5000, connectTimeoutMS=5000)
    try:
        manifest = read_json(stage.seed_manifest) if stage.seed_manifest.exists() else {}
        stats = [stage.crawl_stats(key) for key in sorted(manifest.get("shards") or {})]
        counts = run_counts(
            client[database][spec.name].find({}, PROJECTION), list(spec.fields), stats
        )
        return counts, where
    except Exception as exc:  # the summary still prints what it can
        reason = first_line(str(exc).split(", Timeout:")[0])
        return None, f"MongoDB not reachable ({where}): {reason}"
    finally:
        client.close()


def cmd_demo(args: argparse.Namespace) -> int:
    from enrich_crawl.demo import DEMO_SPEC

    return _run(
        DEMO_SPEC, Path(args.mappings) if args.mappings else None, demo=True, verbose=args.verbose
    )


def cmd_run(args: argparse.Namespace) -> int:
    return _run(
        Path(args.dataset),
        Path(args.mappings) if args.mappings else None,
        verbose=args.verbose,
        learn=args.learn,
    )


# -- the Dagster UI --------------------------------------------------------------------------------


def cmd_ui(args: argparse.Namespace) -> int:
    """`dagster dev` on the home's instance with the project's definitions, from any folder."""
    from enrich_crawl.home import ensure_dagster_home

    home = ensure_dagster_home()
    command = [
        sys.executable,
        "-m",
        "dagster",
        "dev",
        "-m",
        "enrich_crawl.definitions",
        "--host",
        args.host,
        "--port",
        str(args.port),
    ]
    sys.stderr.write(
        f"Dagster UI on http://{args.host}:{args.port}  (instance {home}; Ctrl-C stops it)\n"
    )
    sys.stderr.flush()
    # run in the home: a dagster.yaml or .env of the current folder is not this instance's
    os.chdir(home)
    os.execv(sys.executable, command)
    return 0  # not reached


# -- embedded mongo --------------------------------------------------------------------------------


def cmd_mongo(args: argparse.Namespace) -> int:
    from enrich_crawl import config
    from enrich_crawl.home import ensure_dagster_home
    from enrich_crawl.store.embedded import embedded_mongo_status, stop_embedded_mongo

    ensure_dagster_home()
    data_dir = config.work_dir() / "mongo"
    if args.action == "stop":
        stopped = stop_embedded_mongo(data_dir)
        sys.stdout.write(("stopped" if stopped else "not running") + f" ({data_dir})\n")
        return 0
    status = embedded_mongo_status(data_dir)
    sys.stdout.write(
        json.dumps(status or {"running": False, "data_dir": str(data_dir)}, indent=2, default=str)
        + "\n"
    )
    return 0


# -- export --------------------------------------------------------------------------------------


def cmd_export(args: argparse.Namespace) -> int:
    """The enriched dataset from MongoDB back to CSV/TSV/Parquet/JSON lines."""
    from pymongo.errors import PyMongoError

    from enrich_crawl.dataset.spec import SpecError, load_spec
    from enrich_crawl.defs.resources import MongoResource
    from enrich_crawl.export import ExportError, export_dataset, export_format
    from enrich_crawl.home import ensure_dagster_home

    try:
        spec = load_spec(args.dataset)
    except SpecError as exc:
        say_error(str(exc))
        return 2
    out = Path(args.out) if args.out else Path(f"{spec.name}.enriched.{args.format or 'csv'}")
    try:
        fmt = export_format(out, args.format)
    except ExportError as exc:
        say_error(str(exc))
        return 2
    ensure_dagster_home()  # the embedded server (MONGODB_URI unset) lives in the instance's home
    mongo = MongoResource(database=args.db) if args.db else MongoResource()
    where = f"{mongo.display_uri()} database {mongo.database_name()} collection {spec.name}"
    client = mongo.client()
    try:
        collection = client[mongo.database_name()][spec.name]
        if collection.find_one({}, {"_id": 1}) is None:
            say_error(f"no results in {where}: run the job first (enrich-crawl run --dataset ...)")
            return 1
        result = export_dataset(
            collection,
            out,
            field_types=spec.field_types(),
            fmt=fmt,
            lineage=args.lineage,
            statuses=args.status or None,
        )
    except PyMongoError as exc:
        reason = str(exc).split(", Timeout:")[0].split("\n")[0]
        say_error(f"MongoDB not reachable ({where}): {mongo.scrub(reason)}")
        return 1
    except (ExportError, OSError) as exc:
        say_error(str(exc))
        return 1
    finally:
        client.close()
    counts = ", ".join(f"{n} {status}" for status, n in sorted(result.status.items()))
    sys.stdout.write(
        f"wrote {result.rows} records ({counts}), {len(result.columns)} columns, "
        f"{result.format}, to {result.path}\n"
    )
    return 0


def build_parser() -> argparse.ArgumentParser:

    parser = argparse.ArgumentParser(
        prog="enrich-crawl",
        description="Fill the gaps of a dirty dataset from the web, politely, with lineage.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="run the main job on the bundled demo dataset and demo web")
    demo.add_argument("--mappings", help="mappings folder (default: ENRICH_MAPPINGS or mappings/)")
    demo.add_argument("-v", "--verbose", action="store_true", help="show Dagster and crawl logs")
    demo.set_defaults(func=cmd_demo)

    run = sub.add_parser("run", help="run the whole job for one dataset, via Dagster")
    run.add_argument("--dataset", required=True, help="dataset spec YAML")
    run.add_argument("--mappings", help="mappings folder (default: ENRICH_MAPPINGS or mappings/)")
    run.add_argument("-v", "--verbose", action="store_true", help="show Dagster and crawl logs")
    run.add_argument(
        "--learn",
        action="store_true",
        help="learn mappings from the dataset's known values before crawling (as `learn: true`)",
    )
    run.set_defaults(func=cmd_run)

    add_mapping_parser(sub)

    ui = sub.add_parser(
        "ui", help="open the Dagster UI on the runs of this home (every folder's runs)"
    )
    ui.add_argument("--host", default="127.0.0.1", help="address to serve on (default 127.0.0.1)")
    ui.add_argument("--port", type=int, default=3000, help="port (default 3000)")
    ui.set_defaults(func=cmd_ui)

    mongo = sub.add_parser(
        "mongo", help="the embedded MongoDB server (used when MONGODB_URI is unset)"
    )
    mongo.add_argument("action", choices=["status", "stop"])
    mongo.set_defaults(func=cmd_mongo)

    export = sub.add_parser(
        "export", help="the enriched dataset from MongoDB back to CSV/TSV/Parquet/JSON lines"
    )
    export.add_argument("--dataset", required=True, help="dataset spec YAML (names the collection)")
    export.add_argument(
        "--out", help="output file (default: <name>.enriched.<format> in the current folder)"
    )
    export.add_argument(
        "--format", choices=["csv", "tsv", "parquet", "jsonl"], help="default: from --out, or csv"
    )
    export.add_argument(
        "--lineage",
        action="store_true",
        help="add _status, _missing, _updated_at and <field>__<lineage key> columns",
    )
    export.add_argument(
        "--status",
        action="append",
        choices=["resolved", "partial", "unresolved"],
        help="only records with this status (repeatable)",
    )
    export.add_argument("--db", help="database (default: MONGODB_DB or enrich_crawl)")
    export.set_defaults(func=cmd_export)

    worker = sub.add_parser(
        "worker",
        help="become a Celery worker for enrich_job's steps (ENRICH_EXECUTOR=celery); SIGTERM to "
        "it is a warm shutdown",
    )
    worker.add_argument("-y", "--config-yaml", help="YAML with the executor's execution.config")
    worker.add_argument("-n", "--name", help="worker name (default: enrich-<host>-<pid>)")
    worker.add_argument("-q", "--queue", action="append", default=[], help="queue (repeatable)")
    worker.add_argument("-l", "--loglevel", default="INFO")
    worker.add_argument("celery_args", nargs="*", help="after --: passed to `celery worker`")
    worker.set_defaults(func=cmd_worker)
    return parser


def cmd_worker(args: argparse.Namespace) -> int:
    from enrich_crawl.celery_worker import WorkerConfigError, exec_worker

    try:
        exec_worker(
            Path(args.config_yaml) if args.config_yaml else None,
            args.name,
            args.queue,
            args.loglevel,
            args.celery_args,
        )
    except WorkerConfigError as exc:
        say_error(str(exc))
        return 2
    return 0  # not reached: the process is the worker now


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        say_error("interrupted")
        return 130
    except Exception as exc:  # a few lines here; the whole traceback in the log file
        from enrich_crawl.preflight import first_line, log_exception

        log = log_exception(exc, f"enrich-crawl {args.command}")
        say_error(f"{type(exc).__name__}: {first_line(str(exc))}")
        say_error(f"(the full trace is in {log})")
        return 1


if __name__ == "__main__":
    sys.exit(main())
