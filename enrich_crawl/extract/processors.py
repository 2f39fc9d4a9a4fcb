"""The processor registry of the mapping language (docs/mappings.md, whose processor reference
is generated from it by `enrich_crawl.extract.reference`).

A processor is compiled once, at mapping load time, from its `parameters` into a function
`(values, ctx) -> values` over a list. Parameters are checked against the processor's JSON Schema
(the same one `mappings/mapping.schema.json` is generated from) and then semantically (regexes,
XPath, CSS and JSONPath expressions compiled, date formats tried, ...); every problem raises
`MappingError` naming the JSON path.

Value model: a chain starts on the page (`PAGE`). A selector (`xpath`, `css`, `jsonpath`) runs on the
page first and then on each current value (an element as context node, a string as an HTML fragment
or JSON text, a JSON value as is). Text nodes, attributes and scalars are strings; an element stays an
element while selectors follow and becomes its string value when a string processor needs it or the
chain ends. String processors map over the list and pass over what they cannot use; `join`, `first`,
`last`, `nth` reduce it; `default` fills an empty list.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
import string
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import lxml.etree
import lxml.html
import regex
from cssselect import SelectorError
from parsel.csstranslator import HTMLTranslator

from enrich_crawl.extract.errors import (
    ExtractionError,
    MappingError,
    did_you_mean,
    schema_problems,
)
from enrich_crawl.extract.regex_safety import backtracking_hazard
from enrich_crawl.urls import join_url
from enrich_crawl.values import clean_text, parse_bool, parse_date, parse_number

__all__ = [
    "PAGE",
    "REGISTRY",
    "Context",
    "ExtractionError",
    "Fn",
    "MappingError",
    "ProcessorType",
    "as_text",
    "compile_chain",
    "compile_processor",
    "compile_regex",
]

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

_STR = {"type": "string"}
_NONEMPTY = {"type": "string", "minLength": 1}
_BOOL = {"type": "boolean"}
_PATTERN = {"type": "string", "minLength": 1, "description": "Python `re` syntax"}


def _desc(schema: dict[str, Any], text: str) -> dict[str, Any]:
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


def _strings(values: list[Any], ctx: Context) -> list[str]:
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


# ---------------------------------------------------------------------------------------------
# selectors


def _fragment_root(text: str) -> Any:
    try:
        return lxml.html.fragment_fromstring(text, create_parent="div")
    except (lxml.etree.ParserError, ValueError):
        return None


def _xpath_results(result: Any) -> list[Any]:
    if isinstance(result, list):
        out = []
        for item in result:
            if isinstance(item, str):
                out.append(str(item))
            elif is_element(item):
                out.append(item)
            elif isinstance(item, bytes):
                out.append(item.decode("utf-8", "replace"))
            elif isinstance(item, tuple):  # namespace nodes
                continue
            else:
                out.append(item)
        return out
    if isinstance(result, bool):
        return [result]
    if isinstance(result, float):
        if math.isnan(result) or math.isinf(result):
            return []
        return [int(result) if result.is_integer() and abs(result) < 2**53 else result]
    if isinstance(result, str):
        return [str(result)] if result != "" else []
    return []


_PROBE_DOC = lxml.html.document_fromstring("<html><body><p id='x'>x</p></body></html>")


XPATH_FUNCTIONS = frozenset(
    [
        "last",
        "position",
        "count",
        "id",
        "local-name",
        "namespace-uri",
        "name",
        "string",
        "concat",
        "starts-with",
        "contains",
        "substring-before",
        "substring-after",
        "substring",
        "string-length",
        "normalize-space",
        "translate",
        "boolean",
        "not",
        "true",
        "false",
        "lang",
        "number",
        "sum",
        "floor",
        "ceiling",
        "round",
    ]
)
_NOT_FUNCTIONS = frozenset({"node", "text", "comment", "processing-instruction", "and", "or"})
_NOT_FUNCTIONS |= {"div", "mod"}
_XPATH_TOKEN = re.compile(
    r"""(?P<string>"[^"]*"|'[^']*')"""
    r"|\$(?P<variable>[A-Za-z_][\w.-]*(?::[A-Za-z_][\w.-]*)?)"
    r"|(?P<name>[A-Za-z_][\w.-]*(?::[A-Za-z_][\w.-]*)?)(?P<call>\s*\()?"
    r"|(?P<other>.)",
    re.DOTALL,
)
EXSLT_REGEXP = "http://exslt.org/regular-expressions"


def _check_xpath_names(expression: str, namespaces: dict[str, str] | None) -> str | None:
    """Unknown variables and functions, found statically: libxml2 only reports them when the
    part of the expression that uses them is evaluated, i.e. on some page, mid-crawl."""
    previous = ""
    for token in _XPATH_TOKEN.finditer(expression):
        if token.group("variable"):
            name = token.group("variable")
            if name not in VARIABLES:
                return f"unknown variable ${name} (known: $url, $fragment, $id)"
        elif token.group("name") and token.group("call") and previous not in ("@", "::"):
            name = token.group("name")
            if ":" in name:
                prefix = name.split(":", 1)[0]
                uri = (namespaces or {}).get(prefix)
                if uri is None:
                    return f"unknown namespace prefix in {name}()"
                if uri == EXSLT_REGEXP:
                    return (
                        "EXSLT regular expressions are not available (they cannot be "
                        "time-limited): select with XPath, then use the regex processor"
                    )
            elif name not in XPATH_FUNCTIONS and name not in _NOT_FUNCTIONS:
                return f"unknown function {name}() (XPath 1.0 functions only)"
        previous = token.group(0).strip() or previous
    return None


def _xpath_error_position(exc: lxml.etree.XPathSyntaxError, expression: str) -> str:
    """Where libxml2 stopped reading the expression (its error log has the 0-based offset), so
    "Invalid predicate" comes with the spot to look at."""
    columns = [entry.column for entry in exc.error_log if entry.domain_name == "XPATH"]
    if not columns or columns[-1] < 0:
        return ""
    column = columns[-1]
    if column >= len(expression):
        return " at the end of the expression (an unclosed bracket, parenthesis or quote?)"
    if column == 0:
        return " at character 1"
    return f" at character {column + 1}, after {expression[:column]!r}"


def _compile_xpath(
    expression: str, where: str, namespaces: dict[str, str] | None = None, *, what: str = "XPath"
) -> lxml.etree.XPath:
    if EXSLT_REGEXP in (namespaces or {}).values():
        raise MappingError(
            where, "the EXSLT regular-expressions namespace is not available (no time limit)"
        )
    try:
        xpath = lxml.etree.XPath(expression, smart_strings=False, namespaces=namespaces)
    except lxml.etree.XPathSyntaxError as exc:
        # the position is only meaningful in an expression the user wrote (not a translated CSS)
        position = _xpath_error_position(exc, expression) if what == "XPath" else ""
        raise MappingError(where, f"invalid {what} {expression!r}: {exc}{position}") from exc
    problem = _check_xpath_names(expression, namespaces)
    if problem:
        raise MappingError(where, f"invalid {what} {expression!r}: {problem}")
    try:  # unknown functions and variables only show when the expression is evaluated
        xpath(_PROBE_DOC, url="", fragment="", id="")
    except lxml.etree.XPathEvalError as exc:
        reason = str(exc)
        if "Undefined variable" in reason:
            reason = "unknown variable (known: $url, $fragment, $id)"
        elif "Unregistered function" in reason:
            reason = "unknown function (XPath 1.0 functions only)"
        raise MappingError(where, f"invalid {what} {expression!r}: {reason}") from exc
    return xpath


PAGE_CACHE_ENTRIES = 4096


def _on_page(xpath: lxml.etree.XPath, key: str, uses: tuple[str, ...], ctx: Context) -> list:
    """The expression on the whole page, evaluated once per page however many fields and
    mappings use it (results are never mutated by later steps). Results holding elements are
    shared within the run only: kept on the page they would pin its tree in memory after the
    crawl's page cache dropped it."""
    variables = ctx.variables
    cache_key = (key, *(variables[name] for name in uses))
    cached = ctx.run_cache.get(cache_key)
    if cached is None:
        cached = ctx.page.selector_cache.get(cache_key)
    if cached is None:
        node = ctx.page.tree
        cached = _evaluate(xpath, node, variables, ctx) if node is not None else []
        ctx.run_cache[cache_key] = cached
        if not any(is_element(v) for v in cached):
            page_cache = ctx.page.selector_cache
            if len(page_cache) >= PAGE_CACHE_ENTRIES:
                page_cache.clear()
            page_cache[cache_key] = cached
    return cached


def _tree_selector(xpath: lxml.etree.XPath, key: str, uses: tuple[str, ...] = ()) -> Fn:
    def run(values: list[Any], ctx: Context) -> list[Any]:
        variables = ctx.variables
        out: list[Any] = []
        for value in values:
            if value is PAGE:
                out.extend(_on_page(xpath, key, uses, ctx))
                continue
            if is_element(value):
                node = value
            elif isinstance(value, str):
                node = _fragment_root(value)
            else:
                continue  # a JSON value or a number has no tree
            if node is not None:
                out.extend(_evaluate(xpath, node, variables, ctx))
        return out

    return run


def _evaluate(xpath: lxml.etree.XPath, node: Any, variables: dict[str, str], ctx: Context):
    try:
        return _xpath_results(xpath(node, **variables))
    except lxml.etree.XPathEvalError as exc:
        ctx.error(f"xpath {xpath.path!r}: {exc}")
        return []


@processor(
    "xpath",
    params={
        "expression": _desc(_NONEMPTY, "XPath 1.0; variables $url, $fragment, $id"),
        "namespaces": {
            "type": "object",
            "additionalProperties": {"type": "string"},
            "description": "prefix -> namespace URI, for XML pages (feeds, sitemaps)",
        },
    },
    required=("expression",),
    kind="selector",
)
def _xpath(params: dict[str, Any], where: str) -> Fn:
    """XPath 1.0 on the page, then on each value (an element as context node, a string as an
    HTML fragment). Variables `$url`, `$fragment`, `$id`. Node-sets give elements and strings;
    `count()`, `boolean()`, `string()` give numbers, booleans, strings."""
    expression = params["expression"]
    namespaces = params.get("namespaces") or None
    xpath = _compile_xpath(expression, f"{where}.expression", namespaces)
    key = "xpath\x00" + expression + "\x00" + json.dumps(namespaces, sort_keys=True)
    uses = tuple(sorted(set(re.findall(r"\$(url|fragment|id)(?![\w.-])", expression))))
    return _tree_selector(xpath, key, uses)


_CSS = HTMLTranslator()


@processor(
    "css",
    params={"expression": _desc(_NONEMPTY, "CSS selector; ::text and ::attr(name) as in parsel")},
    required=("expression",),
    kind="selector",
)
def _css(params: dict[str, Any], where: str) -> Fn:
    """CSS selector on the page or on each value, with parsel's `::text` and `::attr(name)`."""
    expression = params["expression"]
    try:
        translated = _CSS.css_to_xpath(expression)
    except (SelectorError, ValueError, TypeError, NotImplementedError) as exc:
        raise MappingError(
            f"{where}.expression", f"invalid CSS selector {expression!r}: {exc}"
        ) from exc
    xpath = _compile_xpath(translated, f"{where}.expression", what="CSS selector")
    return _tree_selector(xpath, "css\x00" + expression)


_COMMENT_WRAPPERS = re.compile(
    r"^\s*(?:<!--|//\s*<!\[CDATA\[|<!\[CDATA\[)|(?:-->|//\s*\]\]>|\]\]>)\s*$"
)
_TRAILING_COMMA = re.compile(r",(\s*[}\]])")


def loads_lenient(text: str) -> tuple[bool, Any]:
    """Parse JSON as found on web pages: (ok, value). Accepts what JSON-LD blocks carry in the wild:
    HTML comment or CDATA wrappers, raw control characters in strings, trailing commas, and several
    top-level values in one block (returned as a list)."""
    text = text.strip().lstrip("\ufeff")
    if not text:
        return False, None
    try:
        return True, json.loads(text)
    except ValueError:
        pass
    cleaned = _COMMENT_WRAPPERS.sub("", text).strip()
    decoder = json.JSONDecoder(strict=False)
    for candidate in (cleaned, _TRAILING_COMMA.sub(r"\1", cleaned)):
        try:
            return True, decoder.decode(candidate)
        except ValueError:
            pass
        values: list[Any] = []  # several values in a row: {...}{...} or {...}\n{...}
        position = 0
        try:
            while position < len(candidate):
                value, position = decoder.raw_decode(candidate, position)
                values.append(value)
                while position < len(candidate) and candidate[position] in " \t\r\n,;":
                    position += 1
        except ValueError:
            continue
        if values:
            return True, values if len(values) > 1 else values[0]
    return False, None


def _json_of(value: Any, ctx: Context) -> tuple[bool, Any]:
    if value is PAGE:
        data = ctx.page.json
        if data is not None:
            return True, data
        text = ctx.page.text.lstrip()
        if text[:1] not in ("{", "["):
            return False, None
        value = ctx.page.text
    if is_element(value):
        value = as_text(value)
    if isinstance(value, str):
        cache = ctx.page.selector_cache
        key = ("json", value)
        cached = cache.get(key)
        if cached is None:
            cached = loads_lenient(value)
            if len(cache) >= PAGE_CACHE_ENTRIES:
                cache.clear()
            cache[key] = cached
        if not cached[0]:
            ctx.error(f"jsonpath: value is not JSON: {value.strip()[:60]!r}")
        return cached
    return True, value


def _install_non_mutating_filter() -> None:
    """jsonpath-ng's filter (`[?(...)]`) replaces a dict it filters by the list of its values,
    in the data itself: a query like `$..*[?(@.price)]` changes the page's JSON for every later
    field. This version filters the same values without writing anything back."""
    from jsonpath_ng import DatumInContext, Index
    from jsonpath_ng.ext.filter import Filter

    def find(self: Any, datum: Any) -> Any:
        if not self.expressions:
            return datum
        datum = DatumInContext.wrap(datum)
        value = datum.value
        if isinstance(value, dict):
            value = list(value.values())
        if not isinstance(value, list):
            return []
        return [
            DatumInContext(item, path=Index(i), context=datum)
            for i, item in enumerate(value)
            if all(expression.find(item) for expression in self.expressions)
        ]

    Filter.find = find


_install_non_mutating_filter()
_JSONPATH_LOCK = threading.Lock()
_JSONPATH_PARSER: Any = None


def compile_jsonpath(expression: str, where: str) -> Any:
    """Parse a JSONPath (jsonpath-ng extended syntax) with one reused parser (a fresh parser per
    expression costs ~20 ms)."""
    global _JSONPATH_PARSER
    from jsonpath_ng.ext.parser import ExtentedJsonPathParser

    with _JSONPATH_LOCK:
        if _JSONPATH_PARSER is None:
            _JSONPATH_PARSER = ExtentedJsonPathParser()
        try:
            return _JSONPATH_PARSER.parse(expression)
        except Exception as exc:  # jsonpath-ng raises plain Exception subclasses
            _JSONPATH_PARSER = None  # a failed parse may leave the parser in a bad state
            raise MappingError(where, f"invalid JSONPath {expression!r}: {exc}") from exc


@processor(
    "jsonpath",
    params={"expression": _desc(_NONEMPTY, "JSONPath, jsonpath-ng extended syntax")},
    required=("expression",),
    kind="selector",
)
def _jsonpath(params: dict[str, Any], where: str) -> Fn:
    """JSONPath on the JSON body of the page, then on each value (JSON text, e.g. a JSON-LD
    `<script>` selected by xpath, or a JSON value). Objects and lists stay JSON values."""
    expression = params["expression"]
    compiled = compile_jsonpath(expression, f"{where}.expression")

    def run(values: list[Any], ctx: Context) -> list[Any]:
        out: list[Any] = []
        for value in values:
            ok, data = _json_of(value, ctx)
            if not ok:
                continue
            try:
                out.extend(match.value for match in compiled.find(data))
            except Exception as exc:  # a filter comparing incompatible types, ...
                ctx.error(f"jsonpath {expression!r}: {exc}")
        return out

    return run


# ---------------------------------------------------------------------------------------------
# regular expressions: Python `re` syntax, run by `regex` with a timeout


def compile_regex(pattern: str, where: str, *, flags: int = 0) -> Any:
    """Compile a user pattern: valid for Python `re`, free of catastrophic backtracking shapes,
    compiled by the `regex` module (whose matching functions take a timeout)."""
    try:
        re.compile(pattern, flags)  # the documented dialect is Python's re: refuse what re refuses
        hazard = backtracking_hazard(pattern, flags)
        compiled = regex.compile(pattern, flags | regex.VERSION0)
    except (re.error, regex.error, OverflowError, RecursionError) as exc:
        raise MappingError(where, f"invalid regular expression /{pattern}/: {exc}") from exc
    if hazard:
        raise MappingError(
            where,
            f"regular expression /{pattern}/ is refused: {hazard}; rewrite it so that each "
            "text has one way to match (e.g. [^,]+ instead of .*), or make the group atomic "
            "(?>...) or the quantifier possessive (a++)",
        )
    return compiled


def run_regex(ctx: Context, pattern: Any, call: Callable[[float], Any]) -> Any:
    """Run `call(timeout)` within the per-call timeout and the run's regex budget; None (and an
    error on the context) when time runs out."""
    if ctx.regex_budget <= 0:
        ctx.error(f"regex /{pattern.pattern}/ skipped: this page's regex time budget is spent")
        return None
    timeout = min(REGEX_TIMEOUT, ctx.regex_budget)
    started = time.perf_counter()
    try:
        return call(timeout)
    except TimeoutError:
        ctx.error(f"regex /{pattern.pattern}/ timed out after {timeout:.2f}s")
        return None
    finally:
        ctx.regex_budget -= time.perf_counter() - started


def _flags(params: dict[str, Any]) -> int:
    return re.IGNORECASE if params.get("ignore_case") else 0


@processor(
    "regex",
    params={
        "pattern": _PATTERN,
        "group": _desc(
            {"type": ["integer", "string"], "minimum": 0},
            "group number or name; default 1 if the pattern has groups, else 0 (whole match)",
        ),
        "all": _desc(_BOOL, "every match of each value, not only the first"),
        "ignore_case": _BOOL,
    },
    required=("pattern",),
)
def _regex(params: dict[str, Any], where: str) -> Fn:
    """Keep the match of `pattern` in each value: group 1 if the pattern has groups, else the whole
    match (or `group`); `all` keeps every match. Values without a match are dropped."""
    compiled = compile_regex(params["pattern"], f"{where}.pattern", flags=_flags(params))
    group = params.get("group", 1 if compiled.groups else 0)
    if isinstance(group, int) and group > compiled.groups:
        raise MappingError(
            f"{where}.group",
            f"the pattern has {compiled.groups} group(s), there is no group {group}",
        )
    if isinstance(group, str) and group not in compiled.groupindex:
        raise MappingError(f"{where}.group", f"the pattern has no group named {group!r}")
    find_all = params.get("all", False)

    def run(values: list[Any], ctx: Context) -> list[Any]:
        out: list[Any] = []
        for text in _strings(values, ctx):
            text = text[:MAX_REGEX_INPUT]
            if find_all:
                matches = run_regex(
                    ctx, compiled, lambda t, s=text: list(compiled.finditer(s, timeout=t))
                )
                out.extend(m.group(group) for m in matches or () if m.group(group) is not None)
            else:
                match = run_regex(ctx, compiled, lambda t, s=text: compiled.search(s, timeout=t))
                if match is not None and match.group(group) is not None:
                    out.append(match.group(group))
        return out

    return run


@processor(
    "replace",
    params={
        "pattern": _PATTERN,
        "replacement": _desc(_STR, "replacement, \\1 or \\g<name> for groups; default ''"),
        "count": _desc({"type": "integer", "minimum": 0}, "at most this many (0: all)"),
        "ignore_case": _BOOL,
    },
    required=("pattern",),
)
def _replace(params: dict[str, Any], where: str) -> Fn:
    """Replace every match of `pattern` (Python `re`) in each value by `replacement`."""
    compiled = compile_regex(params["pattern"], f"{where}.pattern", flags=_flags(params))
    replacement = params.get("replacement", "")
    count = params.get("count", 0)
    try:
        re.compile(params["pattern"], _flags(params)).sub(replacement, "")
        template = re.compile(params["pattern"], _flags(params))
        # a reference to a missing group only fails on a match: check the references now
        for ref in re.findall(r"\\(\d+)|\\g<(\w+)>", replacement):
            number, name = ref
            if number and int(number) > template.groups:
                raise re.error(f"invalid group reference {number}")
            if name and not name.isdigit() and name not in template.groupindex:
                raise re.error(f"unknown group name {name!r}")
            if name and name.isdigit() and int(name) > template.groups:
                raise re.error(f"invalid group reference {name}")
    except (re.error, IndexError) as exc:
        raise MappingError(
            f"{where}.replacement", f"invalid replacement {replacement!r}: {exc}"
        ) from exc

    def run(values: list[Any], ctx: Context) -> list[Any]:
        out = []
        for text in _strings(values, ctx):
            result = run_regex(
                ctx,
                compiled,
                lambda t, s=text: compiled.sub(
                    replacement, s[:MAX_REGEX_INPUT], count=count, timeout=t
                ),
            )
            if result is not None:
                out.append(result)
        return out

    return run


@processor(
    "filter",
    params={
        "pattern": _PATTERN,
        "invert": _desc(_BOOL, "keep the values that do not match"),
        "ignore_case": _BOOL,
    },
    required=("pattern",),
    kind="list",
)
def _filter(params: dict[str, Any], where: str) -> Fn:
    """Keep the values in which `pattern` is found (or, with `invert`, not found)."""
    compiled = compile_regex(params["pattern"], f"{where}.pattern", flags=_flags(params))
    invert = params.get("invert", False)

    def run(values: list[Any], ctx: Context) -> list[Any]:
        out = []
        for value in values:
            text = ctx.page.text if value is PAGE else as_text(value)
            if text is None:
                continue
            found = run_regex(
                ctx, compiled, lambda t, s=text: compiled.search(s[:MAX_REGEX_INPUT], timeout=t)
            )
            if (found is not None) != invert:
                out.append(value)
        return out

    return run


def _map_strings(func: Callable[[str], Any]) -> Fn:
    def run(values: list[Any], ctx: Context) -> list[Any]:
        out = []
        for text in _strings(values, ctx):
            try:
                result = func(text)
            except (ValueError, OverflowError):
                continue
            if result is not None:
                out.append(result)
        return out

    return run


@processor(
    "trim",
    params={
        "collapse": _desc(_BOOL, "collapse inner runs of whitespace to one space; default true"),
        "characters": _desc(_NONEMPTY, "strip these characters (not whitespace) from both ends"),
    },
)
def _trim(params: dict[str, Any], where: str) -> Fn:
    """Strip surrounding whitespace (Unicode, NFC) and collapse inner runs of whitespace unless
    `collapse` is false; with `characters`, strip those characters instead."""
    characters = params.get("characters")
    if characters is not None:
        return _map_strings(lambda text: text.strip(characters))
    if params.get("collapse", True):
        return _map_strings(clean_text)
    return _map_strings(str.strip)


@processor("lower")
def _lower(params: dict[str, Any], where: str) -> Fn:
    """Lower-case each value."""
    return _map_strings(str.lower)


@processor("upper")
def _upper(params: dict[str, Any], where: str) -> Fn:
    """Upper-case each value."""
    return _map_strings(str.upper)


@processor(
    "split",
    params={
        "separator": _desc(_NONEMPTY, "default ','"),
        "regex": _desc(_BOOL, "the separator is a regular expression"),
        "maxsplit": _desc({"type": "integer", "minimum": 0}, "at most this many splits (0: all)"),
    },
    kind="list",
)
def _split(params: dict[str, Any], where: str) -> Fn:
    """Split each value on `separator` (default ','; a regex with `regex`); parts are trimmed,
    empty parts dropped."""
    separator = params.get("separator", ",")
    maxsplit = params.get("maxsplit", 0)
    splitter = compile_regex(separator, f"{where}.separator") if params.get("regex") else None

    def run(values: list[Any], ctx: Context) -> list[Any]:
        out = []
        for text in _strings(values, ctx):
            if splitter is not None:
                parts = run_regex(
                    ctx,
                    splitter,
                    lambda t, s=text: splitter.split(
                        s[:MAX_REGEX_INPUT], maxsplit=maxsplit, timeout=t
                    ),
                )
                if parts is None:
                    continue
            else:
                parts = text.split(separator, maxsplit or -1)
            out.extend(part.strip() for part in parts if part and part.strip())
        return out

    return run


@processor("join", params={"separator": _desc(_STR, "default ' '")}, kind="list")
def _join(params: dict[str, Any], where: str) -> Fn:
    """Join all values into one string with `separator` (default ' '); empty values skipped. With
    separator '' the text reads as a reader sees it: a whitespace-only value between two others
    (the space between two inline elements, `<var>a</var> <var>b</var>`) is kept as one space."""
    separator = params.get("separator", " ")

    def run(values: list[Any], ctx: Context) -> list[Any]:
        texts = _strings(values, ctx)
        if separator:
            kept = [t for t in texts if t.strip()]
            return [separator.join(kept)] if kept else []
        out: list[str] = []
        gap = False  # a whitespace-only run since the last text: it separates two words
        for text in texts:
            if not text.strip():
                gap = gap or bool(text)
                continue
            if gap and out and not out[-1][-1:].isspace() and not text[:1].isspace():
                out.append(" ")
            gap = False
            out.append(text)
        return ["".join(out)] if out else []

    return run


@processor("first", kind="list")
def _first(params: dict[str, Any], where: str) -> Fn:
    """Keep the first value."""
    return lambda values, ctx: values[:1]


@processor("last", kind="list")
def _last(params: dict[str, Any], where: str) -> Fn:
    """Keep the last value."""
    return lambda values, ctx: values[-1:]


@processor(
    "nth",
    params={"index": _desc({"type": "integer"}, "0 is the first value, -1 the last")},
    required=("index",),
    kind="list",
)
def _nth(params: dict[str, Any], where: str) -> Fn:
    """Keep the value at `index` (0-based; negative counts from the end); none if out of range."""
    index = params["index"]

    def run(values: list[Any], ctx: Context) -> list[Any]:
        try:
            return [values[index]]
        except IndexError:
            return []

    return run


@processor("unique", kind="list")
def _unique(params: dict[str, Any], where: str) -> Fn:
    """Drop repeated values (by their string value), keeping the first of each."""

    def run(values: list[Any], ctx: Context) -> list[Any]:
        seen: set[str] = set()
        out = []
        for value in values:
            key = as_text(value)
            if key is None or value is PAGE:
                continue
            if key not in seen:
                seen.add(key)
                out.append(value)
        return out

    return run


_SKIPPED_TEXT = {"script", "style", "noscript", "template", "head"}
# elements that start a new line of text in a browser; inline ones (b, a, span...) do not
_BLOCKS = frozenset(
    [
        "address",
        "article",
        "aside",
        "blockquote",
        "body",
        "br",
        "caption",
        "dd",
        "details",
        "dialog",
        "div",
        "dl",
        "dt",
        "fieldset",
        "figcaption",
        "figure",
        "footer",
        "form",
        "h1",
        "h2",
        "h3",
        "h4",
        "h5",
        "h6",
        "header",
        "hr",
        "html",
        "legend",
        "li",
        "main",
        "nav",
        "ol",
        "option",
        "p",
        "pre",
        "section",
        "summary",
        "table",
        "tbody",
        "td",
        "tfoot",
        "th",
        "thead",
        "tr",
        "ul",
    ]
)


def _element_text(element: Any, separator: str) -> str:
    """Visible text: inline text runs joined as they are, block elements separated."""
    chunks: list[list[str]] = [[]]

    def walk(node: Any) -> None:
        tag = node.tag.lower() if isinstance(node.tag, str) else ""
        if tag in _SKIPPED_TEXT and node is not element:
            return
        block = tag in _BLOCKS
        if block:
            chunks.append([])
        if tag and node.text:
            chunks[-1].append(node.text)
        for child in node:
            walk(child)
            if child.tail:
                chunks[-1].append(child.tail)
        if block:
            chunks.append([])

    walk(element)
    pieces = (clean_text("".join(chunk)) for chunk in chunks)
    return separator.join(p for p in pieces if p)


@processor(
    "text",
    params={"separator": _desc(_STR, "between block elements; default ' '")},
)
def _text(params: dict[str, Any], where: str) -> Fn:
    """The visible text of each element (or HTML string), without `<script>`/`<style>` content:
    inline text as is, block elements (p, li, div, td, br...) joined with `separator`. Unlike the
    string value, `<li>a</li><li>b</li>` gives `a b`, not `ab`, and `<b>Kupfer</b>-Finish` stays
    `Kupfer-Finish`."""
    separator = params.get("separator", " ")

    def run(values: list[Any], ctx: Context) -> list[Any]:
        out = []
        for value in values:
            if value is PAGE:
                value = ctx.page.tree
            elif isinstance(value, str) and "<" in value:
                value = _fragment_root(value)
            if is_element(value):
                text = _element_text(value, separator)
            else:
                text = as_text(value)
            if text:
                out.append(text)
        return out

    return run


def _absolute_url(value: str) -> bool:
    parts = urlsplit(value)
    return parts.scheme in ("http", "https") and bool(parts.netloc)


@processor(
    "urljoin",
    params={"base": _desc(_NONEMPTY, "absolute http(s) URL to resolve against")},
)
def _urljoin(params: dict[str, Any], where: str) -> Fn:
    """Make each value an absolute URL against the page URL (its `<base href>` if any) or `base`."""
    fixed = params.get("base")
    if fixed is not None and not _absolute_url(fixed):
        raise MappingError(f"{where}.base", f"{fixed!r} is not an absolute http(s) URL")

    def run(values: list[Any], ctx: Context) -> list[Any]:
        base = fixed or ctx.page.base_url
        out = []
        for text in _strings(values, ctx):
            text = text.strip()
            if not text:
                continue
            url = join_url(base, text)  # as a browser resolves a link
            if url is None:  # e.g. an invalid IPv6 literal
                ctx.error(f"urljoin: not a URL: {text[:80]!r}")
            else:
                out.append(url)
        return out

    return run


@processor(
    "format",
    params={
        "template": _desc(
            _NONEMPTY, "with {value} and the variables {url}, {fragment}, {id}; {{ }} for braces"
        )
    },
    required=("template",),
)
def _format(params: dict[str, Any], where: str) -> Fn:
    """Put each value into `template` (`{value}`, `{url}`, `{fragment}`, `{id}`), e.g.
    `https://api.example/v1/{value}.json` to follow an id as a link."""
    template = params["template"]
    try:
        names = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError as exc:
        raise MappingError(f"{where}.template", f"invalid template {template!r}: {exc}") from exc
    unknown = sorted(names - {"value", "url", "fragment", "id"})
    if unknown:
        raise MappingError(
            f"{where}.template",
            f"unknown placeholder {{{unknown[0]}}} (known: value, url, fragment, id)",
        )
    try:
        template.format(value="", url="", fragment="", id="")
    except (ValueError, KeyError, IndexError, AttributeError) as exc:
        raise MappingError(f"{where}.template", f"invalid template {template!r}: {exc}") from exc

    def run(values: list[Any], ctx: Context) -> list[Any]:
        variables = ctx.variables
        return [template.format(value=text, **variables) for text in _strings(values, ctx)]

    return run


def _check_date_format(fmt: str, where: str) -> None:
    if "%" not in fmt:
        raise MappingError(where, f"date format {fmt!r} has no %-directive (e.g. %Y-%m-%d)")
    try:
        probe = dt.datetime(2001, 2, 3, 4, 5, 6).strftime(fmt)
        dt.datetime.strptime(probe, fmt)
    except ValueError as exc:
        raise MappingError(where, f"invalid date format {fmt!r}: {exc}") from exc


@processor(
    "date",
    params={
        "format": _desc(
            {"oneOf": [_NONEMPTY, {"type": "array", "items": _NONEMPTY, "minItems": 1}]},
            "strptime format(s), tried in order; default: ISO 8601 and common formats",
        )
    },
    kind="convert",
)
def _date(params: dict[str, Any], where: str) -> Fn:
    """Parse each value as a date (the `format`s given, else ISO 8601 and common formats like
    'March 5, 2024' or '05.03.2024') into ISO `YYYY-MM-DD`; values that are no date are dropped."""
    fmt = params.get("format")
    formats = [fmt] if isinstance(fmt, str) else list(fmt or [])
    for i, one in enumerate(formats):
        _check_date_format(one, f"{where}.format" + (f"[{i}]" if isinstance(fmt, list) else ""))

    def convert(text: str) -> str:
        if not formats:
            return parse_date(text)
        for one in formats:
            try:
                return parse_date(text, one)
            except ValueError:
                continue
        raise ValueError(f"not a date in the format(s) given: {text[:40]!r}")

    return _map_strings(convert)


def _number(text: str, decimal: str) -> int | float:
    number = parse_number(text, decimal=decimal)
    return int(number) if number.is_integer() and abs(number) < 2**53 else number


@processor(
    "number",
    params={
        "decimal": _desc(
            {"enum": [".", ","]}, "decimal mark: '.' (1,234.5, default) or ',' (1.234,5)"
        )
    },
    kind="convert",
)
def _number_proc(params: dict[str, Any], where: str) -> Fn:
    """The first number in each value ('1,200 staff' -> 1200, '-3.5e2' -> -350); integers stay
    integers; values without a number are dropped."""
    decimal = params.get("decimal", ".")

    def run(values: list[Any], ctx: Context) -> list[Any]:
        out: list[Any] = []
        for value in values:
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                if not (isinstance(value, float) and (math.isnan(value) or math.isinf(value))):
                    out.append(value)
                continue
            text = ctx.page.text if value is PAGE else as_text(value)
            if text is None:
                continue
            try:
                out.append(_number(text, decimal))
            except (ValueError, OverflowError):
                continue
        return out

    return run


_WORDS = {"type": "array", "items": _STR, "minItems": 1}


@processor(
    "boolean",
    params={
        "true": _desc(_WORDS, "extra words meaning true (case-insensitive)"),
        "false": _desc(_WORDS, "extra words meaning false (case-insensitive)"),
    },
    kind="convert",
)
def _boolean(params: dict[str, Any], where: str) -> Fn:
    """Parse each value as a boolean: yes/no, true/false, 1/0, on/off (and a few languages), plus
    the `true`/`false` word lists; other values are dropped."""
    trues = {clean_text(v).lower() for v in params.get("true", [])}
    falses = {clean_text(v).lower() for v in params.get("false", [])}
    both = sorted(trues & falses)
    if both:
        raise MappingError(f"{where}.false", f"{both[0]!r} is listed as both true and false")

    def convert(value: Any) -> bool | None:
        if isinstance(value, bool):
            return value
        text = clean_text(as_text(value) or "").lower()
        if text in trues:
            return True
        if text in falses:
            return False
        try:
            return parse_bool(text)
        except ValueError:
            return None

    def run(values: list[Any], ctx: Context) -> list[Any]:
        return [b for b in (convert(v) for v in values if v is not PAGE) if b is not None]

    return run


@processor(
    "default",
    params={"value": {"description": "any JSON value"}},
    required=("value",),
    kind="list",
)
def _default(params: dict[str, Any], where: str) -> Fn:
    """Use `value` when the chain has produced nothing (no value, or only empty strings)."""
    value = params["value"]

    def run(values: list[Any], ctx: Context) -> list[Any]:
        present = [
            v
            for v in values
            if v is not PAGE and v is not None and not (isinstance(v, str) and not v.strip())
        ]
        return present if present else [value]

    return run
