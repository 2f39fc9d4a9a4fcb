"""Mappings: load, validate and compile `mappings/*.json`, and run them on pages (docs/mappings.md).

Loading is strict and complete: a mapping is checked against the JSON Schema
(`mappings/mapping.schema.json`, generated from the processor registry), then compiled (regexes,
XPath, CSS, JSONPath, formats...), and every problem is reported as `FILE: $.json.path: reason`
before any page is fetched. A compiled mapping runs on a `Page` (parsed once, shared by all the
mappings that match it) for one (fragment, record id).
"""

from __future__ import annotations

import fnmatch
import functools
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from enrich_crawl.extract.errors import MappingError, json_syntax_problem, schema_problems
from enrich_crawl.extract.page import Page
from enrich_crawl.extract.processors import (
    PAGE,
    REGEX_TIMEOUT,
    Context,
    Fn,
    as_text,
    compile_chain,
    compile_regex,
)
from enrich_crawl.extract.vocabulary import FIELD_TYPES, RENDER_MODES
from enrich_crawl.urls import resolve_link
from enrich_crawl.values import coerce

__all__ = [
    "FIELD_TYPES",
    "RENDER_MODES",
    "FieldRule",
    "Mapping",
    "MappingError",
    "MappingLoadError",
    "MappingResult",
    "MappingSet",
    "UrlParser",
    "compile_mapping",
    "extract",
    "load_mapping_file",
    "mapping_files",
    "run_mapping",
    "try_mappings",
]


class MappingLoadError(ValueError):
    """One or more mapping files are invalid; `errors` lists every `file: $.path: reason`."""

    def __init__(self, errors: list[str]):
        super().__init__("invalid mappings:\n  " + "\n  ".join(errors))
        self.errors = errors


@dataclass(frozen=True)
class FieldRule:
    name: str
    run: Fn
    type: str | None = None  # optional type declared in the mapping (the dataset's type wins)


@dataclass(frozen=True)
class UrlParser:
    description: str
    run: Fn


@dataclass
class Mapping:
    name: str
    path: Path | None
    patterns: list[Any]
    url_parsers: list[UrlParser]
    fields: list[FieldRule]
    render: str = "static"
    priority: int = 0
    wait_for: str | None = None
    uses_fragment: bool = False
    uses_id: bool = False
    raw: dict[str, Any] = field(default_factory=dict, repr=False)
    description: str = ""

    def matches(self, url: str) -> bool:
        return any(pattern(url) for pattern in self.patterns)

    @property
    def field_names(self) -> list[str]:
        return [rule.name for rule in self.fields]

    @functools.cached_property
    def field_set(self) -> frozenset[str]:
        return frozenset(rule.name for rule in self.fields)


@dataclass
class MappingResult:
    mapping: str
    priority: int
    fields: dict[str, Any]
    links: list[str]
    errors: list[str]


def _where(path: Path | str | None, json_path: str) -> str:
    return f"{path}: {json_path}" if path else json_path


def _compile_pattern(spec: Any, where: str) -> Any:
    if isinstance(spec, str):
        spec = {"type": "regex", "pattern": spec}
    ptype = spec.get("type", "regex")
    pattern = spec["pattern"]
    if ptype == "regex":
        compiled = compile_regex(pattern, f"{where}.pattern")

        def match_regex(url: str) -> bool:
            try:
                return compiled.search(url[:65536], timeout=REGEX_TIMEOUT) is not None
            except TimeoutError:
                return False

        return match_regex
    if ptype == "glob":
        compiled_glob = re.compile(fnmatch.translate(pattern))
        return lambda url: compiled_glob.match(url) is not None
    return lambda url: url.startswith(pattern)


_XPATH_VARIABLE = re.compile(r"\$(fragment|id)(?![\w.-])")
_TEMPLATE_VARIABLE = re.compile(r"(?<!\{)\{(fragment|id)\}")


def _variables_used(raw: dict[str, Any]) -> set[str]:
    """Which of $fragment / $id the mapping's processors read (the spider caches extraction
    results per page when they read neither)."""
    used: set[str] = set()
    chains = [p.get("processors") for p in raw.get("url_parsers") or []]
    chains += [f.get("processors") for f in raw.get("fields") or []]
    for chain in chains:
        for spec in chain or []:
            params = spec.get("parameters") or {}
            if spec.get("type") == "xpath":
                used.update(_XPATH_VARIABLE.findall(params.get("expression", "")))
            elif spec.get("type") == "format":
                used.update(_TEMPLATE_VARIABLE.findall(params.get("template", "")))
    return used


def _related(a: str, b: str) -> bool:
    """Is one JSON path (`FILE: $.x[0].y`) the other one or inside it?"""
    if a == b:
        return True
    shorter, longer = sorted((a, b), key=len)
    return longer.startswith(shorter) and longer[len(shorter)] in ".["


def _path_order(where: str) -> list[tuple[int, int, str]]:
    """Sort key of `FILE: $.fields[10].x`: by JSON path, indexes compared as numbers."""
    return [
        (0, int(part), "") if part.isdigit() else (1, 0, part)
        for part in re.findall(r"\d+|[^\d\[\].]+", where.rsplit(": $", 1)[-1])
    ]


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def compile_mapping(raw: Any, path: Path | None = None) -> Mapping:
    """Validate and compile one mapping; raises MappingError naming the file and JSON path of
    every problem found (`.errors`): the JSON Schema's, and those only compiling shows (invalid
    regexes, XPath, CSS, JSONPath, date formats, group references, ...)."""
    from enrich_crawl.extract.schema import validator  # not at import: `python -m ...schema`

    where_file = str(path) if path else None
    problems = schema_problems(validator().iter_errors(raw), where_file)
    if problems and not isinstance(raw, dict):
        raise MappingError(problems[0][0], problems[0][1], problems=problems)
    errors: list[MappingError] = []

    def attempt(func, *args):
        try:
            return func(*args)
        except MappingError as exc:
            errors.append(exc)
        except (TypeError, KeyError, AttributeError, ValueError):
            if not problems:  # a shape the schema accepts must compile: that is a bug here
                raise
        return None

    patterns = []
    for i, spec in enumerate(_list(raw.get("url_patterns"))):
        patterns.append(attempt(_compile_pattern, spec, _where(path, f"$.url_patterns[{i}]")))
    url_parsers = []
    for i, parser in enumerate(_list(raw.get("url_parsers"))):
        if isinstance(parser, dict):
            run = attempt(
                compile_chain, parser.get("processors"), _where(path, f"$.url_parsers[{i}]")
            )
            description = parser.get("description") or f"url_parsers[{i}]"
            url_parsers.append(UrlParser(str(description), run))
    fields = []
    seen: dict[str, int] = {}
    for i, rule in enumerate(_list(raw.get("fields"))):
        if not isinstance(rule, dict):
            continue
        where = _where(path, f"$.fields[{i}]")
        name = rule.get("name")
        if isinstance(name, str) and name in seen:
            errors.append(
                MappingError(
                    f"{where}.name",
                    f"field {name!r} is defined twice (also $.fields[{seen[name]}]); "
                    "one rule per field and mapping",
                )
            )
        if isinstance(name, str):
            seen.setdefault(name, i)
        run = attempt(compile_chain, rule.get("processors"), f"{where}.processors")
        fields.append(FieldRule(str(name), run, rule.get("type")))
    if not fields and not url_parsers and not problems:
        errors.append(
            MappingError(_where(path, "$"), "a mapping needs fields or url_parsers (or both)")
        )
    if raw.get("wait_for") and raw.get("render", "static") == "static":
        errors.append(
            MappingError(
                _where(path, "$.wait_for"),
                'wait_for needs "render": "js" or "auto" (a static page is never waited for)',
            )
        )
    for error in errors:  # what compiling found, minus what the schema already said
        for where, reason in error.problems:
            if not any(_related(where, known) for known, _ in problems):
                problems.append((where, reason))
    if problems:
        problems.sort(key=lambda problem: _path_order(problem[0]))
        raise MappingError(problems[0][0], problems[0][1], problems=problems)
    used = _variables_used(raw)
    return Mapping(
        name=raw["name"],
        path=path,
        patterns=patterns,
        url_parsers=url_parsers,
        fields=fields,
        render=raw.get("render", "static"),
        priority=raw.get("priority", 0),
        wait_for=raw.get("wait_for"),
        uses_fragment="fragment" in used,
        uses_id="id" in used,
        raw=raw,
        description=raw.get("description", ""),
    )


NOT_MAPPINGS = ("learn-report.json",)  # written beside learned mappings (SPEC 3b)


def mapping_files(directory: Path) -> list[Path]:
    """The mapping files of a folder: its `*.json` but JSON Schemas and learn reports."""
    return sorted(
        p
        for p in Path(directory).glob("*.json")
        if not p.name.endswith(".schema.json") and p.name not in NOT_MAPPINGS
    )


class MappingSet:
    """The compiled mappings of a folder, matched against pages by URL, highest priority first."""

    def __init__(self, mappings: Iterable[Mapping]):
        self.mappings = sorted(mappings, key=lambda m: (-m.priority, m.name))
        self.by_name = {m.name: m for m in self.mappings}
        self.errors: list[str] = []

    def __len__(self) -> int:
        return len(self.mappings)

    def __iter__(self) -> Iterator[Mapping]:
        return iter(self.mappings)

    def matching(self, url: str) -> list[Mapping]:
        """The mappings whose url_patterns match `url` (the final URL, with the fragment of the
        URL that led to it), highest priority first."""
        return [m for m in self.mappings if m.matches(url)]

    @classmethod
    def load(cls, directory: str | Path, *, strict: bool = True) -> MappingSet:
        """Load every `*.json` of `directory` (a single mapping file works too); with strict, any
        invalid file raises MappingLoadError listing all problems; otherwise invalid files are
        skipped (their errors in `.errors`)."""
        directory = Path(directory)
        if directory.is_file():
            files = [directory]
        elif directory.is_dir():
            files = mapping_files(directory)
        else:
            raise MappingLoadError([f"{directory}: mappings folder not found"])
        errors: list[str] = []
        mappings: list[Mapping] = []
        names: dict[str, Path] = {}
        for path in files:
            try:
                mapping = load_mapping_file(path)
            except MappingError as exc:
                errors.extend(exc.errors)
                continue
            if mapping.name in names:
                errors.append(
                    f"{path}: $.name: duplicate mapping name {mapping.name!r} "
                    f"(also in {names[mapping.name].name})"
                )
                continue
            names[mapping.name] = path
            mappings.append(mapping)
        if errors and strict:
            raise MappingLoadError(errors)
        result = cls(mappings)
        result.errors = errors
        return result

    def with_learned(self, learned: MappingSet) -> MappingSet:
        """These mappings plus the learned ones, these taking precedence: a learned mapping named
        like one of these is left out, and the learned ones rank below every one of these (their
        priorities shifted down together, so their own order holds)."""
        kept = [m for m in learned if m.name not in self.by_name]
        if len(self) and kept:
            shift = min(0, min(m.priority for m in self) - 1 - max(m.priority for m in kept))
            for mapping in kept:
                mapping.priority += shift
        combined = MappingSet([*self, *kept])
        combined.errors = [*self.errors, *learned.errors]
        return combined


def load_mapping_file(path: str | Path) -> Mapping:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
        raw = json.loads(text)
    except OSError as exc:
        raise MappingError(f"{path}: $", f"cannot read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise MappingError(f"{path}: $", f"not UTF-8 text: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise MappingError(f"{path}: $", json_syntax_problem(text, exc)) from exc
    return compile_mapping(raw, path)


# -- running ---------------------------------------------------------------------------------------


def _to_type(value: Any, ftype: str) -> Any:
    if ftype == "string" or not isinstance(value, (str, int, float, bool)):
        value = as_text(value) if not isinstance(value, str) else value
        if value is None:
            raise ValueError("null")
    return coerce(value, ftype)


def _typed(values: list[Any], ftype: str | None) -> tuple[Any, str | None]:
    """The field's value from the chain's final values: the first that converts to the type and
    is not empty; a list field takes all of them."""
    if ftype == "list":
        items: list[str] = []
        for value in values:
            for item in value if isinstance(value, list) else [value]:
                text = as_text(item)
                if text is not None:
                    text = coerce(text, "string")
                    if text:
                        items.append(text)
        return (items, None) if items else (None, None)
    error = None
    for value in values:
        if ftype is None:
            if isinstance(value, str):
                value = coerce(value, "string")
                if not value:
                    continue
            return value, None
        try:
            typed = _to_type(value, ftype)
        except ValueError as exc:
            error = f"cannot convert {as_text(value)[:60]!r} to {ftype}: {exc}"
            continue
        if typed == "" or typed is None:
            continue
        return typed, None
    return None, error


def extract_links(mapping: Mapping, page: Page, ctx: Context) -> list[str]:
    """The url_parsers' values as absolute http(s) URLs, resolved as a browser resolves them
    (against the page's URL or its `<base href>`), deduplicated."""
    links: list[str] = []
    seen: set[str] = set()
    base = page.base_url
    for parser in mapping.url_parsers:
        ctx.where = f"url_parsers[{parser.description}]"
        for value in parser.run([PAGE], ctx):
            text = as_text(value)
            text = text.strip() if text else ""
            if not text or text == "#":
                continue
            url, _reason = resolve_link(base, text)
            if url is not None and url not in seen:
                seen.add(url)
                links.append(url)
    ctx.where = ""
    return links


def run_mapping(
    mapping: Mapping,
    page: Page,
    *,
    fragment: str = "",
    record_id: str = "",
    field_types: dict[str, str] | None = None,
    only_fields: Iterable[str] | None = None,
    with_links: bool = True,
) -> MappingResult:
    """Run one mapping on a page for one (fragment, record): typed field values and links."""
    ctx = Context(page=page, fragment=fragment or "", record_id=record_id or "")
    wanted = set(only_fields) if only_fields is not None else None
    values: dict[str, Any] = {}
    for rule in mapping.fields:
        if wanted is not None and rule.name not in wanted:
            continue
        ctx.where = rule.name
        ftype = (field_types or {}).get(rule.name) or rule.type
        value, error = _typed(rule.run([PAGE], ctx), ftype)
        if value is not None:
            values[rule.name] = value
        elif error:
            ctx.error(error)
    ctx.where = ""
    links = extract_links(mapping, page, ctx) if with_links else []
    return MappingResult(mapping.name, mapping.priority, values, links, ctx.errors)


def extract(
    page: Page,
    mappings: Iterable[Mapping],
    *,
    fragment: str = "",
    record_id: str = "",
    field_types: dict[str, str] | None = None,
) -> list[MappingResult]:
    return [
        run_mapping(m, page, fragment=fragment, record_id=record_id, field_types=field_types)
        for m in mappings
    ]


def try_mappings(
    mappings: Iterable[Mapping],
    page: Page,
    *,
    fragment: str = "",
    record_id: str = "",
    field_types: dict[str, str] | None = None,
    force: bool = False,
) -> tuple[dict[str, Any], list[str]]:
    """What `enrich-crawl mapping test` prints: `{"mappings", "fields", "links"}` for the mappings
    whose url_patterns match the page URL (with `#fragment`), or all of them with `force`; a field
    takes the value of the highest-priority mapping that yields one. Returns (output, errors)."""
    url = page.url + (f"#{fragment}" if fragment else "")
    candidates = sorted(mappings, key=lambda m: (-m.priority, m.name))
    matched = candidates if force else [m for m in candidates if m.matches(url)]
    fields: dict[str, Any] = {}
    links: list[str] = []
    errors: list[str] = []
    for mapping in matched:
        result = run_mapping(
            mapping, page, fragment=fragment, record_id=record_id, field_types=field_types
        )
        for name, value in result.fields.items():
            fields.setdefault(name, value)
        links.extend(link for link in result.links if link not in links)
        errors.extend(f"{mapping.name}: {e}" for e in result.errors)
    output = {"mappings": [m.name for m in matched], "fields": fields, "links": links}
    return output, errors
