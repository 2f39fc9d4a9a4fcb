"""The processor registry and the chain: what a processor type is, how a list of them is compiled
(parameters checked against their JSON Schema, then by the processor itself) and run, and the
values that flow through a chain."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jsonschema
import lxml.etree
import lxml.html

from enrich_crawl.extract.errors import (
    MappingError,
    did_you_mean,
    schema_problems,
)

# A mapping must not be able to hang a worker. The `regex` module checks its timeout now and then,
# so a call that runs out stops after ~3x the timeout; the budget caps all calls of one run.
REGEX_TIMEOUT = 0.1  # seconds per regex call
REGEX_BUDGET = 1.0  # seconds of regex time per run of a mapping on a page, all calls together
MAX_REGEX_INPUT = 2_000_000  # characters a regex may scan
VARIABLES = ("url", "fragment", "id")


class _Page:
    def __repr__(self) -> str:
        return "PAGE"


PAGE: Any = _Page()  # the chain's initial state: "the whole page"


@dataclass
class Context:
    """What one run of a mapping on one page knows; collects the run's errors."""

    page: Any  # enrich_crawl.extract.page.Page
    fragment: str = ""
    record_id: str = ""
    errors: list[str] = field(default_factory=list)
    where: str = ""  # the field or url parser running, prefixed to errors
    regex_budget: float = REGEX_BUDGET
    run_cache: dict[Any, Any] = field(default_factory=dict)  # selector results of this run

    def __post_init__(self) -> None:
        self.variables = {"url": self.page.url, "fragment": self.fragment, "id": self.record_id}

    def error(self, message: str) -> None:
        text = f"{self.where}: {message}" if self.where else message
        if text not in self.errors:
            self.errors.append(text)


Fn = Callable[[list[Any], Context], list[Any]]


@dataclass(frozen=True)
class ProcessorType:
    """One processor type: its parameters as JSON Schema properties, and its compiler."""

    name: str
    compile: Callable[[dict[str, Any], str], Fn]
    params: dict[str, dict[str, Any]]
    required: tuple[str, ...] = ()
    doc: str = ""
    kind: str = "string"  # selector | string | list | convert, for documentation

    def params_schema(self) -> dict[str, Any]:
        schema: dict[str, Any] = {
            "type": "object",
            "properties": self.params,
            "additionalProperties": False,
        }
        if self.required:
            schema["required"] = list(self.required)
        return schema


REGISTRY: dict[str, ProcessorType] = {}
_VALIDATORS: dict[str, jsonschema.protocols.Validator] = {}


def processor(
    name: str,
    *,
    params: dict[str, dict[str, Any]] | None = None,
    required: tuple[str, ...] = (),
    kind: str = "string",
):
    def register(func: Callable[[dict[str, Any], str], Fn]):
        doc = " ".join((func.__doc__ or "").split())
        REGISTRY[name] = ProcessorType(name, func, params or {}, required, doc, kind)
        return func

    return register


# -- JSON Schema fragments of parameters -------------------------------------------------------

STRING = {"type": "string"}
NONEMPTY = {"type": "string", "minLength": 1}
BOOLEAN = {"type": "boolean"}
PATTERN = {"type": "string", "minLength": 1, "description": "Python `re` syntax"}


def describe(schema: dict[str, Any], text: str) -> dict[str, Any]:
    return {**schema, "description": text}


# ---------------------------------------------------------------------------------------------
# value helpers


def is_element(value: Any) -> bool:
    return isinstance(value, lxml.etree._Element)


_STRING_VALUE = lxml.etree.XPath("string()")


def as_text(value: Any) -> str | None:
    """The string value of a chain value (an element: all its text); None for JSON null."""
    if value is None or value is PAGE:
        return None
    if isinstance(value, str):
        return value
    if is_element(value):
        return _STRING_VALUE(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
            return None
        if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
            return str(int(value))
        return str(value)
    return json.dumps(value, ensure_ascii=False)


def string_values(values: list[Any], ctx: Context) -> list[str]:
    if len(values) == 1 and values[0] is PAGE:
        return [ctx.page.text]
    out = []
    for value in values:
        text = as_text(value)
        if text is not None:
            out.append(text)
    return out


def finalize(values: list[Any]) -> list[Any]:
    """End of a chain: elements become strings; empty strings and nulls are dropped."""
    if len(values) == 1 and values[0] is PAGE:
        return []
    out = []
    for value in values:
        if is_element(value):
            value = as_text(value)
        if value is None or (isinstance(value, str) and not value.strip()):
            continue
        if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
            continue
        out.append(value)
    return out


def _params_validator(ptype: ProcessorType) -> jsonschema.protocols.Validator:
    validator = _VALIDATORS.get(ptype.name)
    if validator is None:
        validator = jsonschema.Draft202012Validator(ptype.params_schema())
        _VALIDATORS[ptype.name] = validator
    return validator


def compile_processor(spec: Any, where: str) -> Fn:
    """Compile one `{"type", "parameters"}` object; `where` is its file and JSON path."""
    if not isinstance(spec, dict):
        raise MappingError(where, "a processor must be an object with 'type' and 'parameters'")
    ptype_name = spec.get("type")
    if not isinstance(ptype_name, str):
        raise MappingError(f"{where}.type", "required: the processor type")
    ptype = REGISTRY.get(ptype_name)
    if ptype is None:
        raise MappingError(
            f"{where}.type",
            f"unknown processor type {json.dumps(ptype_name)} (known: {', '.join(sorted(REGISTRY))})"
            + did_you_mean(ptype_name, REGISTRY),
        )
    extra = sorted(set(spec) - {"type", "parameters", "description"})
    if extra:
        raise MappingError(
            f"{where}.{extra[0]}",
            f"unknown key {extra[0]!r} (allowed here: description, parameters, type)"
            + did_you_mean(extra[0], ["description", "parameters", "type"]),
        )
    params = spec.get("parameters")
    if params is None:
        params = {}
    problems = schema_problems(_params_validator(ptype).iter_errors(params), None)
    if problems:
        fixed = [(f"{where}.parameters{path[1:]}", reason) for path, reason in problems]
        raise MappingError(fixed[0][0], fixed[0][1], problems=fixed)
    return ptype.compile(params, f"{where}.parameters")


def compile_chain(specs: Any, where: str) -> Fn:
    """Compile a list of processors into one function `([PAGE], ctx) -> final values`; every
    invalid processor is reported (one MappingError with all problems)."""
    if not isinstance(specs, list) or not specs:
        raise MappingError(where, "expected a non-empty list of processors")
    steps: list[Fn] = []
    errors: list[MappingError] = []
    for i, spec in enumerate(specs):
        try:
            steps.append(compile_processor(spec, f"{where}[{i}]"))
        except MappingError as exc:
            errors.append(exc)
    collected = MappingError.collect(errors)
    if collected is not None:
        raise collected

    def run(values: list[Any], ctx: Context) -> list[Any]:
        for step in steps:  # no early exit on an empty list: a later `default` may fill it
            values = step(values, ctx)
        return finalize(values)

    return run


def fragment_root(text: str) -> Any:
    try:
        return lxml.html.fragment_fromstring(text, create_parent="div")
    except (lxml.etree.ParserError, ValueError):
        return None


def map_strings(func: Callable[[str], Any]) -> Fn:
    def run(values: list[Any], ctx: Context) -> list[Any]:
        out = []
        for text in string_values(values, ctx):
            try:
                result = func(text)
            except (ValueError, OverflowError):
                continue
            if result is not None:
                out.append(result)
        return out

    return run
