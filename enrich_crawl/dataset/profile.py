"""The profile of a loaded table: what is missing, outdated, invalid or rejected, for the UI.

`Profile.to_dict()` is the `profile` of `seed/manifest.json`; `ui_metadata()` turns a manifest into
the numbers, markdown tables and samples the `seed_dataset` asset shows (plain values: the Dagster
wiring wraps them); `profile_checks()` states the data-quality checks on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

TYPE_ERROR_SAMPLE = 5
REJECTED_SAMPLE = 20
SAMPLE_TEXT = (
    200  # characters of a quarantined row shown in samples (the full text is in rejected.jsonl)
)


@dataclass
class FieldProfile:
    missing: int = 0
    outdated: int = 0
    type_errors: int = 0
    type_error_sample: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Profile:
    rows: int = 0  # data records in the file (usable + rejected; empty rows not counted)
    usable: int = 0
    rejected: int = 0
    quarantined: int = 0  # malformed rows (wrong field count, not JSON, ...)
    duplicate_ids: int = 0
    missing_ids: int = 0
    urls: int = 0
    invalid_urls: int = 0
    records_with_invalid_urls: int = 0
    records_without_urls: int = 0
    records_to_enrich: int = 0
    type_errors: int = 0
    fields: dict[str, FieldProfile] = field(default_factory=dict)
    columns: dict[str, int] = field(default_factory=dict)  # missing cells per column
    rejected_sample: list[dict[str, Any]] = field(default_factory=list)
    new_columns: list[str] = field(default_factory=list)
    # fields that are not columns but nearly one (likely typos; filled as new columns)
    near_miss_fields: dict[str, str] = field(default_factory=dict)
    reading: dict[str, Any] = field(default_factory=dict)

    def reject(self, entry: dict[str, Any]) -> None:
        self.rejected += 1
        if len(self.rejected_sample) < REJECTED_SAMPLE:
            sample = dict(entry)
            sample.pop("data", None)
            if isinstance(sample.get("text"), str) and len(sample["text"]) > SAMPLE_TEXT:
                sample["text"] = sample["text"][:SAMPLE_TEXT] + "…"
            self.rejected_sample.append(sample)

    def add_columns(self, names: list[str], missing: np.ndarray) -> None:
        counts = missing.sum(axis=0) if missing.size else np.zeros(len(names), np.int64)
        for name, count in zip(names, counts.tolist(), strict=True):
            self.columns[name] = self.columns.get(name, 0) + int(count)

    def to_dict(self) -> dict[str, Any]:
        usable = self.usable

        def rate(count: int) -> float:
            return round(count / usable, 4) if usable else 0.0

        return {
            "rows": self.rows,
            "usable": self.usable,
            "rejected": self.rejected,
            "quarantined": self.quarantined,
            "duplicate_ids": self.duplicate_ids,
            "missing_ids": self.missing_ids,
            "urls": self.urls,
            "invalid_urls": self.invalid_urls,
            "records_with_invalid_urls": self.records_with_invalid_urls,
            "records_without_urls": self.records_without_urls,
            "records_to_enrich": self.records_to_enrich,
            "type_errors": self.type_errors,
            "new_columns": self.new_columns,
            "near_miss_fields": self.near_miss_fields,
            "rejected_sample": self.rejected_sample,
            "fields": {
                name: {
                    "missing": fp.missing,
                    "missing_rate": rate(fp.missing),
                    "outdated": fp.outdated,
                    "outdated_rate": rate(fp.outdated),
                    "type_errors": fp.type_errors,
                    "type_error_sample": fp.type_error_sample,
                }
                for name, fp in self.fields.items()
            },
            "columns": {
                name: {"missing": count, "missing_rate": rate(count)}
                for name, count in self.columns.items()
            },
            "reading": self.reading,
        }


# -- for the UI ---------------------------------------------------------------------------------


def markdown_table(header: list[str], rows: list[list[Any]]) -> str:
    def cell(value: Any) -> str:
        text = str(value).replace("|", "\\|").replace("\n", " ")
        return text if len(text) <= 120 else text[:119] + "…"

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def ui_metadata(manifest: dict[str, Any]) -> dict[str, Any]:
    """The asset metadata of a seed manifest, as plain values.

    Returns {"numbers": {key: int|float}, "markdown": {key: text}, "json": {key: value}}; every
    number is a separate key so the UI can plot it across materialisations.
    """
    profile = manifest["profile"]
    reading = profile.get("reading", {})
    usable = profile["usable"]
    numbers: dict[str, int | float] = {
        "rows": profile["rows"],
        "usable_records": usable,
        "rejected_rows": profile["rejected"],
        "quarantined_rows": profile.get("quarantined", 0),
        "duplicate_ids": profile["duplicate_ids"],
        "missing_ids": profile["missing_ids"],
        "invalid_urls": profile["invalid_urls"],
        "records_with_invalid_urls": profile.get("records_with_invalid_urls", 0),
        "records_without_urls": profile["records_without_urls"],
        "records_to_enrich": profile["records_to_enrich"],
        "type_errors": profile.get("type_errors", 0),
        "new_columns": len(profile.get("new_columns") or []),
        "empty_rows": reading.get("empty_rows", 0),
        "decoded_lines": reading.get("decoded_lines", 0),
        "undecodable_lines": reading.get("undecodable_lines", 0),
        "rejected_rate": round(profile["rejected"] / profile["rows"], 4)
        if profile["rows"]
        else 0.0,
        "seconds": manifest.get("seconds", 0.0),
    }
    for name, fp in profile["fields"].items():
        numbers[f"missing/{name}"] = fp["missing"]
        numbers[f"missing_rate/{name}"] = fp["missing_rate"]
        numbers[f"outdated/{name}"] = fp["outdated"]
        numbers[f"type_errors/{name}"] = fp["type_errors"]
    fields_table = markdown_table(
        ["field", "type", "missing", "missing rate", "outdated", "type errors", "to resolve"],
        [
            [
                name,
                manifest["spec"]["fields"].get(name, {}).get("type", "string"),
                fp["missing"],
                f"{fp['missing_rate']:.1%}",
                fp["outdated"],
                fp["type_errors"],
                fp["missing"] + fp["outdated"],
            ]
            for name, fp in profile["fields"].items()
        ],
    )
    summary = markdown_table(
        ["", "count"],
        [
            ["rows read", profile["rows"]],
            ["usable records", usable],
            ["rejected: malformed rows (quarantined)", profile.get("quarantined", 0)],
            ["rejected: missing id", profile["missing_ids"]],
            ["rejected: duplicate id", profile["duplicate_ids"]],
            ["empty rows (skipped)", reading.get("empty_rows", 0)],
            ["records to enrich", profile["records_to_enrich"]],
            ["records without URLs", profile["records_without_urls"]],
            ["invalid URL cells", profile["invalid_urls"]],
            ["type errors", profile.get("type_errors", 0)],
            [
                "lines decoded as " + str(reading.get("fallback_encoding") or "-"),
                reading.get("decoded_lines", 0),
            ],
        ],
    )
    markdown = {"profile": fields_table, "summary": summary}
    new_columns = profile.get("new_columns") or []
    if new_columns:
        # a field the table lacks becomes a column to fill; one whose name is close to a column's
        # is most likely a typo (`new: true` on the field says it is meant): shown so it is seen
        near = profile.get("near_miss_fields") or {}
        markdown["new_columns"] = markdown_table(
            ["field", "in the table"],
            [
                [
                    name,
                    f"no: a new column to fill; did you mean {near[name]!r}?"
                    if name in near
                    else "no: a new column to fill",
                ]
                for name in new_columns
            ],
        )
    if profile["rejected_sample"]:
        markdown["rejected_sample"] = markdown_table(
            ["row", "line", "id", "reason", "text"],
            [
                [e.get("row"), e.get("line", ""), e.get("id") or "", e["reason"], e.get("text", "")]
                for e in profile["rejected_sample"][:10]
            ],
        )
    errors = [
        [name, s["row"], s.get("id") or "", s["value"], s["reason"]]
        for name, fp in profile["fields"].items()
        for s in fp.get("type_error_sample", [])
    ]
    if errors:
        markdown["type_error_sample"] = markdown_table(
            ["field", "row", "id", "value", "reason"], errors[:20]
        )
    columns = profile.get("columns", {})
    if columns:
        markdown["columns"] = markdown_table(
            ["column", "missing", "missing rate"],
            [[c, v["missing"], f"{v['missing_rate']:.1%}"] for c, v in columns.items()],
        )
    info = {
        "shards": manifest["shards"],
        "encoding": {
            k: reading.get(k)
            for k in (
                "format",
                "encoding",
                "fallback_encoding",
                "decoded_sample",
                "undecodable_sample",
                "header_fixes",
            )
        },
        "timings": manifest.get("timings", {}),
    }
    return {"numbers": numbers, "markdown": markdown, "json": info}


def profile_checks(
    manifest: dict[str, Any],
    *,
    max_rejected_rate: float = 0.05,
    max_invalid_url_rate: float = 0.2,
) -> list[dict[str, Any]]:
    """Data-quality checks on a seed manifest: [{name, passed, severity, description, metadata}].

    `severity` is "ERROR" for what makes the run pointless (no usable record) and "WARN" for what a
    person should look at (many rejected rows, undecodable bytes, many invalid URLs).
    """
    profile = manifest["profile"]
    reading = profile.get("reading", {})
    rows = profile["rows"]
    rejected_rate = profile["rejected"] / rows if rows else 0.0
    cells = profile["urls"] + profile["invalid_urls"] if "urls" in profile else 0
    invalid_rate = profile["invalid_urls"] / cells if cells else 0.0
    return [
        {
            "name": "has_usable_records",
            "passed": profile["usable"] > 0,
            "severity": "ERROR",
            "description": "the table yields at least one usable record",
            "metadata": {"usable": profile["usable"], "rows": rows},
        },
        {
            "name": "few_rejected_rows",
            "passed": rejected_rate <= max_rejected_rate,
            "severity": "WARN",
            "description": f"at most {max_rejected_rate:.0%} of the rows are rejected "
            "(malformed, missing or duplicate id); see seed/rejected.jsonl",
            "metadata": {
                "rejected": profile["rejected"],
                "rejected_rate": round(rejected_rate, 4),
                "quarantined": profile.get("quarantined", 0),
                "missing_ids": profile["missing_ids"],
                "duplicate_ids": profile["duplicate_ids"],
            },
        },
        {
            "name": "text_decodes",
            "passed": reading.get("undecodable_lines", 0) == 0,
            "severity": "WARN",
            "description": "every line decodes (UTF-8, or the detected legacy encoding)",
            "metadata": {
                "undecodable_lines": reading.get("undecodable_lines", 0),
                "sample_lines": reading.get("undecodable_sample", []),
            },
        },
        {
            "name": "urls_mostly_valid",
            "passed": invalid_rate <= max_invalid_url_rate,
            "severity": "WARN",
            "description": f"at most {max_invalid_url_rate:.0%} of the URL cells are invalid",
            "metadata": {
                "invalid_urls": profile["invalid_urls"],
                "invalid_rate": round(invalid_rate, 4),
            },
        },
    ]
