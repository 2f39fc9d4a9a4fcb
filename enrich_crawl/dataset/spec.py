"""The dataset spec (docs/datasets.md): a YAML file beside the table it describes."""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from enrich_crawl.config import CrawlConfig
from enrich_crawl.suggest import did_you_mean

FIELD_TYPES = ("string", "integer", "number", "boolean", "date", "list")
SOURCE_FORMATS = {
    ".csv": "csv",
    ".tsv": "tsv",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".parquet": "parquet",
    ".pq": "parquet",
}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_TOP_KEYS = {
    "name",
    "source",
    "id",
    "urls",
    "fields",
    "missing_values",
    "crawl",
    "virtual_web",
    "stale",
    "format",
    "description",
    "learn",
}


class SpecError(ValueError):
    """An invalid dataset spec; the message names the file and the key."""


FIELD_OPTIONS = ("type", "refresh", "new")


@dataclass(frozen=True)
class FieldSpec:
    name: str
    type: str = "string"
    refresh: bool = False
    # the field is meant as a new column even though a column of the table has a name close to
    # it (without it, such a field is taken for a misspelt column and refused at load)
    new: bool = False


@dataclass(frozen=True)
class StaleRule:
    """Fields are outdated when `column` (a date) is older than `days` (optional)."""

    column: str
    days: float
    fields: tuple[str, ...] = ()  # empty: every enriched field


@dataclass(frozen=True)
class DatasetSpec:
    path: Path
    name: str
    source: Path
    id: str
    urls: tuple[str, ...]
    fields: dict[str, FieldSpec]
    missing_values: tuple[str, ...] = ()
    crawl: CrawlConfig = field(default_factory=CrawlConfig)
    virtual_web: Path | None = None
    stale: StaleRule | None = None
    format: dict[str, Any] = field(default_factory=dict)
    # learn mappings from the dataset's known values before crawling (SPEC 3b)
    learn: bool = False

    @property
    def source_format(self) -> str:
        return SOURCE_FORMATS[self.source.suffix.lower()]

    def field_types(self) -> dict[str, str]:
        return {name: spec.type for name, spec in self.fields.items()}

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "name": self.name,
            "source": str(self.source),
            "id": self.id,
            "urls": list(self.urls),
            "fields": {n: _field_dict(f) for n, f in self.fields.items()},
            "missing_values": list(self.missing_values),
            "crawl": self.crawl.to_dict(),
            "virtual_web": str(self.virtual_web) if self.virtual_web else None,
            "format": dict(self.format),
            "learn": self.learn,
            "stale": None
            if self.stale is None
            else {
                "column": self.stale.column,
                "days": self.stale.days,
                "fields": list(self.stale.fields),
            },
        }


def _field_dict(spec: FieldSpec) -> dict[str, Any]:
    out: dict[str, Any] = {"type": spec.type, "refresh": spec.refresh}
    if spec.new:
        out["new"] = True
    return out


def _fail(path: Path, key: str, reason: str) -> SpecError:
    return SpecError(f"{path}: {key}: {reason}")


def _str_list(path: Path, key: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise _fail(path, key, f"expected a list of column names, got {value!r}")
    return tuple(value)


FORMAT_OPTIONS = {
    "delimiter": "CSV/TSV field separator, one character (default: ',' or tab for .tsv)",
    "quote_char": "CSV quote character (default '\"'); false for none",
    "encoding": "text encoding of the whole file (default: detected; UTF-8 lines are read as "
    "UTF-8 and the others with a detected legacy encoding)",
    "fallback_encoding": "the legacy encoding of the lines that are not UTF-8 (default: detected)",
}


def _format_options(path: Path, fmt: Any) -> dict[str, Any]:
    """`format:` (an optional key of the spec): how to read the table."""
    if not isinstance(fmt, dict):
        raise _fail(path, "format", "expected a mapping (delimiter, quote_char, encoding, ...)")
    for key, value in fmt.items():
        where = f"format.{key}"
        if key not in FORMAT_OPTIONS:
            raise _fail(
                path,
                where,
                f"unknown option (known: {', '.join(FORMAT_OPTIONS)})"
                + did_you_mean(key, FORMAT_OPTIONS),
            )
        if key == "delimiter" and not (isinstance(value, str) and len(value) == 1):
            raise _fail(path, where, f"expected one character, got {value!r}")
        if (
            key == "quote_char"
            and value not in (False, None)
            and not (isinstance(value, str) and len(value) == 1)
        ):
            raise _fail(path, where, f"expected one character or false, got {value!r}")
        if key in ("encoding", "fallback_encoding"):
            try:
                codecs.lookup(value)
            except (LookupError, TypeError) as exc:
                raise _fail(path, where, f"unknown encoding {value!r}") from exc
    if fmt.get("delimiter") is not None and fmt.get("delimiter") == fmt.get("quote_char"):
        raise _fail(path, "format.quote_char", "must differ from the delimiter")
    return dict(fmt)


# parsed specs by resolved path: (the file's bytes, the spec). A run reads its spec from many
# places (CLI, resources, every asset and check, the resolver); parsing the YAML once per process
# and content keeps that cheap while an edited file is always read afresh.
_PARSED: dict[Path, tuple[bytes, DatasetSpec]] = {}


def load_spec(path: str | Path) -> DatasetSpec:
    """Read and validate a dataset spec; raises SpecError naming the file and the key.

    The result is shared by every caller in the process until the file's content changes: treat
    it as read-only."""
    path = Path(path).expanduser().resolve()
    if not path.is_file():
        raise SpecError(f"{path}: dataset spec not found")
    try:
        content = path.read_bytes()
    except OSError as exc:
        raise SpecError(f"{path}: cannot read the dataset spec: {exc}") from exc
    cached = _PARSED.get(path)
    if cached is not None and cached[0] == content:
        return cached[1]
    spec = _parse_spec(path, content)
    _PARSED[path] = (content, spec)
    return spec


def _parse_spec(path: Path, content: bytes) -> DatasetSpec:
    try:
        raw = yaml.safe_load(content.decode("utf-8"))
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: not valid YAML: {exc}") from exc
    except UnicodeDecodeError as exc:
        raise SpecError(f"{path}: not UTF-8 text: {exc}") from exc
    if not isinstance(raw, dict):
        raise SpecError(f"{path}: a dataset spec must be a YAML mapping")
    unknown = sorted(set(raw) - _TOP_KEYS)
    if unknown:
        raise _fail(
            path,
            unknown[0],
            f"unknown key (known: {', '.join(sorted(_TOP_KEYS))})"
            + did_you_mean(unknown[0], _TOP_KEYS),
        )
    for key in ("name", "source", "id", "fields"):
        if key not in raw:
            raise _fail(path, key, "required key missing")

    name = raw["name"]
    if not isinstance(name, str) or not _NAME.match(name):
        raise _fail(path, "name", "1-128 letters, digits, '_', '.', '-' (it names a collection)")
    source = raw["source"]
    if not isinstance(source, str) or not source:
        raise _fail(path, "source", "expected a file path relative to the spec")
    source_path = (path.parent / source).resolve()
    if source_path.suffix.lower() not in SOURCE_FORMATS:
        raise _fail(
            path,
            "source",
            f"unsupported format {source_path.suffix!r} (use {', '.join(sorted(SOURCE_FORMATS))})",
        )
    id_column = raw["id"]
    if not isinstance(id_column, str) or not id_column:
        raise _fail(path, "id", "expected the name of the record key column")
    urls = _str_list(path, "urls", raw.get("urls", []))
    repeated = sorted({u for u in urls if urls.count(u) > 1})
    if repeated:
        raise _fail(path, "urls", f"column {repeated[0]!r} is listed twice")

    fields_raw = raw["fields"]
    if not isinstance(fields_raw, dict) or not fields_raw:
        raise _fail(path, "fields", "expected a mapping of field name -> options")
    fields: dict[str, FieldSpec] = {}
    for fname, options in fields_raw.items():
        key = f"fields.{fname}"
        if not isinstance(fname, str) or not fname:
            raise _fail(path, key, "field names must be non-empty strings")
        options = options or {}
        if not isinstance(options, dict):
            raise _fail(path, key, f"expected a mapping like {{type: string}}, got {options!r}")
        extra = sorted(set(options) - set(FIELD_OPTIONS))
        if extra:
            raise _fail(
                path,
                f"{key}.{extra[0]}",
                f"unknown option (known: {', '.join(FIELD_OPTIONS)})"
                + did_you_mean(extra[0], FIELD_OPTIONS),
            )
        ftype = options.get("type", "string")
        if ftype not in FIELD_TYPES:
            raise _fail(
                path,
                f"{key}.type",
                f"unknown type {ftype!r} (use {', '.join(FIELD_TYPES)})"
                + did_you_mean(ftype, FIELD_TYPES),
            )
        refresh = options.get("refresh", False)
        if not isinstance(refresh, bool):
            raise _fail(path, f"{key}.refresh", "expected true or false")
        new = options.get("new", False)
        if not isinstance(new, bool):
            raise _fail(path, f"{key}.new", "expected true or false")
        if fname == id_column:
            raise _fail(path, key, "the id column cannot be a field to enrich")
        fields[fname] = FieldSpec(fname, ftype, refresh, new)

    missing = raw.get("missing_values", [])
    if not isinstance(missing, list) or not all(isinstance(m, (str, int, float)) for m in missing):
        raise _fail(path, "missing_values", "expected a list of strings")
    try:
        crawl = CrawlConfig.from_mapping(raw.get("crawl"), where="crawl")
    except ValueError as exc:
        raise SpecError(f"{path}: {exc}") from exc

    virtual_web = None
    if raw.get("virtual_web") is not None:
        if not isinstance(raw["virtual_web"], str):
            raise _fail(path, "virtual_web", "expected a folder path relative to the spec")
        virtual_web = (path.parent / raw["virtual_web"]).resolve()
        if not virtual_web.is_dir():
            raise _fail(path, "virtual_web", f"folder {virtual_web} does not exist")

    stale = None
    if raw.get("stale") is not None:
        rule = raw["stale"]
        extra = sorted(set(rule) - {"column", "days", "fields"}) if isinstance(rule, dict) else []
        if extra:  # before the required keys: `colum:` is a typo of `column:`, not a missing one
            raise _fail(
                path,
                f"stale.{extra[0]}",
                "unknown option (known: column, days, fields)"
                + did_you_mean(extra[0], ("column", "days", "fields")),
            )
        if not isinstance(rule, dict) or "column" not in rule or "days" not in rule:
            raise _fail(path, "stale", "expected {column: <date column>, days: <number>}")
        if not isinstance(rule["column"], str) or not rule["column"]:
            raise _fail(path, "stale.column", "expected the name of a date column")
        days = rule["days"]
        if isinstance(days, bool) or not isinstance(days, (int, float)) or days < 0:
            raise _fail(path, "stale.days", f"expected a number of days >= 0, got {days!r}")
        stale_fields = _str_list(path, "stale.fields", rule.get("fields", []))
        for fname in stale_fields:
            if fname not in fields:
                raise _fail(
                    path,
                    "stale.fields",
                    f"{fname!r} is not one of the fields" + did_you_mean(fname, fields),
                )
        stale = StaleRule(rule["column"], float(days), stale_fields)

    fmt = _format_options(path, raw.get("format") or {})
    learn = raw.get("learn", False)
    if not isinstance(learn, bool):
        raise _fail(path, "learn", f"expected true or false, got {learn!r}")

    return DatasetSpec(
        path=path,
        name=name,
        source=source_path,
        id=id_column,
        urls=urls,
        fields=fields,
        missing_values=tuple(str(m) for m in missing),
        crawl=crawl,
        virtual_web=virtual_web,
        stale=stale,
        format=dict(fmt),
        learn=learn,
    )
