"""Errors of the mapping language, and how JSON Schema errors are told to a user.

Every problem is reported as `FILE: $.json.path: reason`, so a user can go straight to the spot.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from enrich_crawl.suggest import did_you_mean

__all__ = [
    "ExtractionError",
    "MappingError",
    "did_you_mean",
    "json_path",
    "json_syntax_problem",
    "schema_problems",
]


class MappingError(ValueError):
    """An invalid mapping: `where` is the file and JSON path, `reason` says what is wrong.

    One error may carry several problems of the same file (`problems`, `errors`); `where` and
    `reason` are those of the first.
    """

    def __init__(self, where: str, reason: str, *, problems: list[tuple[str, str]] | None = None):
        self.problems = problems or [(where, reason)]
        self.where, self.reason = self.problems[0]
        super().__init__("\n".join(f"{w}: {r}" for w, r in self.problems))

    @property
    def errors(self) -> list[str]:
        return [f"{where}: {reason}" for where, reason in self.problems]

    @classmethod
    def collect(cls, errors: Iterable[MappingError]) -> MappingError | None:
        problems = [p for error in errors for p in error.problems]
        if not problems:
            return None
        return cls(problems[0][0], problems[0][1], problems=problems)


class ExtractionError(RuntimeError):
    """A processor failed on one page (e.g. a regex ran out of time); the field gets no value."""


def _line_column(text: str, index: int) -> tuple[int, int]:
    line = text.count("\n", 0, index) + 1
    return line, index - (text.rfind("\n", 0, index) + 1) + 1


def json_syntax_problem(text: str, exc: json.JSONDecodeError) -> str:
    """Why `text` is not JSON, at the place to fix. Python's parser reports a missing comma at
    the token after it (often the next line) and a trailing comma at the closing bracket; a
    user looks for the end of the previous value, or for the comma itself."""
    before = exc.pos
    while before > 0 and text[before - 1] in " \t\r\n":
        before -= 1
    previous = text[before - 1] if before > 0 else ""
    found = text[exc.pos : exc.pos + 12].split("\n")[0]
    if exc.msg == "Expecting ',' delimiter":
        line, column = _line_column(text, before)
        next_line, next_column = _line_column(text, exc.pos)
        return (
            f"not valid JSON: a ',' is missing at line {line} column {column}, after the value "
            f"that ends there (the next one, {found!r}, starts at line {next_line} column "
            f"{next_column})"
        )
    if previous == "," and exc.msg.startswith(("Expecting property name", "Expecting value")):
        line, column = _line_column(text, before - 1)
        return f"not valid JSON: trailing comma at line {line} column {column} (before {found!r})"
    return f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"


def json_path(base: str, parts: Iterable[Any]) -> str:
    """`$.fields[0].processors` from ("fields", 0, "processors")."""
    out = base
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(part, str) and part.replace("_", "a").isalnum():
            out += f".{part}"
        else:
            out += f"[{json.dumps(part)}]"
    return out


_TYPE_NAMES = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "object": "an object",
    "array": "a list",
    "null": "null",
}


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."


def describe_schema_error(error: Any) -> tuple[list[Any], str]:
    """(JSON path parts, reason) of one `jsonschema.ValidationError`, in words for a user."""
    path = list(error.absolute_path)
    validator = error.validator
    value = error.validator_value
    instance = error.instance
    if validator == "additionalProperties" and isinstance(instance, dict):
        allowed = sorted(error.schema.get("properties", {}))
        extra = sorted(k for k in instance if k not in error.schema.get("properties", {}))
        known = ", ".join(allowed) if allowed else "none"
        if extra:
            return [*path, extra[0]], (
                f"unknown key {extra[0]!r} (allowed here: {known})"
                + did_you_mean(extra[0], allowed)
            )
    if validator == "required":
        missing = [k for k in value if isinstance(instance, dict) and k not in instance]
        if missing:
            return [*path, missing[0]], f"required key {missing[0]!r} is missing"
    if validator == "type":
        expected = value if isinstance(value, list) else [value]
        names = " or ".join(_TYPE_NAMES.get(t, t) for t in expected)
        return path, f"expected {names}, got {_json_type(instance)} {_short(instance)}"
    if validator == "enum":
        if error.schema.get("x-enum-name"):
            return path, (
                f"unknown {error.schema['x-enum-name']} {_short(instance)} "
                f"(known: {', '.join(map(str, value))})" + did_you_mean(instance, value)
            )
        return path, f"{_short(instance)} is not one of {', '.join(map(_short, value))}"
    if validator == "const":
        return path, f"expected {_short(value)}, got {_short(instance)}"
    if validator == "minLength":
        return path, "must not be empty" if value == 1 else f"needs at least {value} characters"
    if validator == "minItems":
        return path, "must not be an empty list" if value == 1 else f"needs {value}+ items"
    if validator == "minProperties":
        return path, "must not be an empty object"
    if validator == "pattern":
        hint = error.schema.get("x-pattern-hint") or f"must match {value}"
        return path, f"{_short(instance)}: {hint}"
    if validator in ("minimum", "maximum"):
        word = "at least" if validator == "minimum" else "at most"
        return path, f"must be {word} {value}, got {_short(instance)}"
    if validator == "uniqueItems":
        return path, "items must be unique"
    if validator == "format":
        return path, f"{_short(instance)} is not a valid {value}"
    return path, error.message


def schema_problems(errors: Iterable[Any], where_file: str | None) -> list[tuple[str, str]]:
    """(where, reason) pairs for jsonschema errors, deepest first within a path, deduplicated."""
    seen: set[tuple[str, str]] = set()
    out: list[tuple[str, str]] = []

    def order(error: Any) -> tuple:
        parts = [(0, p, "") if isinstance(p, int) else (1, 0, str(p)) for p in error.absolute_path]
        return (parts, str(error.validator))

    for error in sorted(errors, key=order):
        parts, reason = describe_schema_error(error)
        path = json_path("$", parts)
        where = f"{where_file}: {path}" if where_file else path
        if (where, reason) not in seen:
            seen.add((where, reason))
            out.append((where, reason))
    return out
