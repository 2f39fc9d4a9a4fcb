"""What `enrich-crawl run` says when the run ends: the cause of each failed step, the failed
asset checks, the seed's figures and the counts of enrich_crawl.counts."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from enrich_crawl.home import enrich_crawl_hint
from enrich_crawl.preflight import first_line
from enrich_crawl.progress import read_json_or_none
from enrich_crawl.staging import DatasetStage


@dataclass
class RunOutcome:
    success: bool
    run_id: str
    seconds: float
    summary: dict[str, Any] = field(default_factory=dict)
    failure: str = ""
    checks: list[dict[str, Any]] = field(default_factory=list)  # failed asset checks

    @property
    def error_checks(self) -> list[dict[str, Any]]:
        """Failed checks of severity ERROR: they fail the command (non-zero exit)."""
        return [c for c in self.checks if c["severity"] == "ERROR"]


# Dagster's wrappers around the exception that made a step fail: the reason is the cause inside
_WRAPPERS = (
    "DagsterExecutionStepExecutionError",
    "DagsterUserCodeExecutionError",
    "RetryRequestedFromPolicy",
    "RetryRequested",
)
_OWN_ERRORS = (
    "Failure",
    "DatasetError",
    "SpecError",
    "MergeError",
    "MappingLoadError",
    "EmbeddedMongoError",
    "ReadError",
)


def root_cause(error: Any) -> str:
    """The message of the exception a step raised (its first line), from Dagster's
    SerializableErrorInfo chain: not the wrapper's "Error occurred while executing op ..."."""
    while error is not None:
        cls = error.cls_name or ""
        head = (error.message or "").strip().split("\n", 1)[0]
        if cls not in _WRAPPERS and head:
            # messages read "module.Class: text"
            name, sep, text = head.partition(": ")
            if sep and name.rsplit(".", 1)[-1] == cls:
                head = text
            # our own errors name the file/key/service already; others say what they are
            return head if cls in _OWN_ERRORS else f"{cls}: {head}"
        error = error.cause or getattr(error, "context", None)
    return ""


def failure_reason(run: Any) -> str:
    """One line per failed step: its own exception's message; the full traces go to the log file
    (named on the last line)."""
    lines = []
    traces = []
    for event in run.all_events:
        if event.is_step_failure and event.step_failure_data and event.step_failure_data.error:
            error = event.step_failure_data.error
            reason = root_cause(error) or "failed"
            lines.append(f"step {event.step_key} failed: {reason}")
            traces.append(f"step {event.step_key} of run {run.run_id}:\n{error.to_string()}")
    if not lines:
        return "the run failed"
    log = _log_traces(traces)
    shown = list(dict.fromkeys(lines))[:3]
    if len(lines) > len(shown):
        shown.append(f"... {len(lines) - len(shown)} more failed step(s)")
    return "\n                    ".join(shown) + (f"\n  full traces       {log}" if log else "")


def _log_traces(traces: list[str]) -> str:
    import datetime as dt

    from enrich_crawl.preflight import log_file

    path = log_file()
    stamp = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as fh:
            for trace in traces:
                fh.write(f"--- {stamp} {trace}\n")
    except OSError:
        return ""
    return str(path)


def failed_checks(instance: Any, run_id: str) -> list[dict[str, Any]]:
    """The asset checks of the run that failed: [{check, asset, severity, description}]."""
    import dagster as dg

    failed = []
    records = instance.get_records_for_run(
        run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION, limit=1000
    ).records
    for record in records:
        event = record.event_log_entry.dagster_event
        evaluation = event.event_specific_data if event else None
        if evaluation is None or evaluation.passed:
            continue
        failed.append(
            {
                "check": evaluation.check_name,
                "asset": evaluation.asset_key.to_user_string(),
                "severity": evaluation.severity.value,
                "description": evaluation.description or "",
            }
        )
    # one line per check (a partitioned asset's check may be evaluated once per partition)
    return list({(c["asset"], c["check"]): c for c in failed}.values())


def summarize(
    stage: DatasetStage, *, learned: bool = False, started_at: float = 0.0
) -> dict[str, Any]:
    """The seed's figures (rows, usable records, rejected and the file that keeps them), what
    learning wrote when the run learned (`learned`; written since `started_at`, epoch seconds),
    and the staged fallbacks of the run's counts (used only when MongoDB cannot be read:
    enrich_crawl.counts is the definition)."""
    summary: dict[str, Any] = {"dataset": stage.dataset}
    if learned:
        summary["learned"] = learned_summary(stage.learned_dir, since=started_at)
    manifest = read_json_or_none(stage.seed_manifest)
    if manifest is None:
        return summary
    profile = manifest["profile"]
    summary.update(rows=profile["rows"], records=profile["usable"], rejected=profile["rejected"])
    if profile["rejected"] and stage.rejected.exists():
        summary["rejected_file"] = str(stage.rejected)
    from enrich_crawl.counts import pages_fetched

    summary["pages"] = pages_fetched(stage.crawl_stats(shard) for shard in manifest["shards"])
    return summary


def learned_summary(learned_dir: Path, *, since: float = 0.0) -> dict[str, Any]:
    """What the run's learning wrote: the folder, its mapping files, the fields they fill (with
    the mappings filling them) and, per field it could not learn, the report's reason. A report
    older than `since` is an earlier run's (this one failed before learning): nothing then."""
    from enrich_crawl.learning.mappings import REPORT_FILE
    from enrich_crawl.learning.summary import learned_fields, read_learned

    report_path = learned_dir / REPORT_FILE
    if not report_path.exists() or report_path.stat().st_mtime < since:
        return {"dir": str(learned_dir), "files": [], "report": "", "fields": {}, "nothing": {}}
    mappings, report = read_learned(learned_dir)
    fields = {
        name: [rule["mapping"] for rule in rules]
        for name, rules in sorted(learned_fields(mappings).items())
    }
    nothing = {
        name: str(entry.get("why_nothing") or "no rule kept")
        for name, entry in sorted((report.get("fields") or {}).items())
        if name not in fields and isinstance(entry, dict)
    }
    return {
        "dir": str(learned_dir),
        "files": [f"{m.get('name')}.json" for m in mappings],
        "report": str(learned_dir / REPORT_FILE) if report else "",
        "fields": fields,
        "nothing": nothing,
    }


def _learned_lines(learned: dict[str, Any]) -> list[str]:
    files = learned["files"]
    if files:
        # a mapping per site template: name them only while they are few
        filled = ", ".join(
            f"{name} ({', '.join(mappings) if len(mappings) <= 2 else f'{len(mappings)} mappings'})"
            for name, mappings in learned["fields"].items()
        )
        lines = [f"{len(files)} mapping file(s) in {learned['dir']}: fields {filled or '-'}"]
    elif learned["report"]:
        lines = [f"no mapping (no rule kept above the precision bar), in {learned['dir']}"]
    else:
        return ["nothing: the run ended before learning did"]
    shown = list(learned["nothing"].items())[:3]
    lines += [f"nothing for {name}: {first_line(why, 120)}" for name, why in shown]
    if len(learned["nothing"]) > len(shown):
        lines.append(f"... {len(learned['nothing']) - len(shown)} more field(s) not learned")
    if learned["report"]:
        lines.append(f"report {learned['report']}")
    return lines


def print_summary(
    outcome: RunOutcome,
    stream: TextIO,
    *,
    counts: dict[str, Any] | None = None,
    results: str | None = None,
) -> None:
    """The summary: records, status, the counts of enrich_crawl.counts, failed checks, reason."""
    s = outcome.summary
    out = stream.write
    verdict = "succeeded" if outcome.success else "FAILED"
    if outcome.success and outcome.error_checks:
        verdict = "succeeded, but ERROR check(s) failed"
    out(f"\nenrich_job {verdict}{'  run ' + outcome.run_id if outcome.run_id else ''}\n")
    if "records" in s:
        where = (
            f"rows and reasons in {s['rejected_file']}"
            if s.get("rejected_file")
            else "reasons in the seed_dataset metadata"
        )
        out(
            f"  records           {s['records']} usable of {s['rows']} rows "
            f"({s['rejected']} rejected, {where})\n"
        )
    if "learned" in s:
        lines = _learned_lines(s["learned"])
        out(f"  learned           {lines[0]}\n")
        for line in lines[1:]:
            out(f"                    {line}\n")
    if counts:
        out(
            "  status            "
            + (", ".join(f"{k} {v}" for k, v in counts["status"].items()) or "no documents")
            + "\n"
        )
        detail = ", ".join(f"{k} {v}" for k, v in sorted(counts["fields"].items()) if v)
        out(f"  fields resolved   {counts['fields_resolved']}" + (f" ({detail})" if detail else ""))
        out("\n")
        out(f"  pages fetched     {counts['pages']}\n")
        ratio = counts["pages_per_resolved_record"]
        out(
            "  pages/resolved    "
            + (f"{ratio:.2f}" if ratio is not None else "n/a")
            + "  (pages fetched / records resolved)\n"
        )
        errors = counts["errors"]
        out(
            "  errors by kind    "
            + (", ".join(f"{k} {v}" for k, v in errors.items()) or "none")
            + "\n"
        )
    elif "pages" in s:
        out(f"  pages fetched     {s['pages']}\n")
    for check in outcome.checks:
        out(
            f"  check failed      {check['check']} ({check['asset']}, {check['severity']}): "
            f"{check['description']}\n"
        )
    out(f"  time              {outcome.seconds:.1f} s\n")
    if not outcome.success:
        out(f"  reason            {outcome.failure}\n")
    if results:
        out(f"  results           {results}\n")
    out(f"  Dagster UI        {enrich_crawl_hint('ui')}   (http://127.0.0.1:3000)\n")
    stream.flush()
