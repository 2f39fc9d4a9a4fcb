"""Selectors: `xpath` and `css` (one lxml XPath each, compiled and checked at load time, evaluated
once per page) and `jsonpath` (jsonpath-ng, on the page's JSON or on JSON text such as a JSON-LD
block)."""

from __future__ import annotations

import json
import math
import re
import threading
from typing import Any

import lxml.etree
import lxml.html
from cssselect import SelectorError
from parsel.csstranslator import HTMLTranslator

from enrich_crawl.extract.errors import MappingError
from enrich_crawl.extract.processors.registry import (
    NONEMPTY,
    PAGE,
    VARIABLES,
    Context,
    Fn,
    as_text,
    describe,
    fragment_root,
    is_element,
    processor,
)


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
                node = fragment_root(value)
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
        "expression": describe(NONEMPTY, "XPath 1.0; variables $url, $fragment, $id"),
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
    params={"expression": describe(NONEMPTY, "CSS selector; ::text and ::attr(name) as in parsel")},
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


def _extended_parser_class() -> Any:
    """jsonpath-ng's extended parser: `ExtendedJsonPathParser`, or in older releases (which have
    only that name) `ExtentedJsonPathParser`, deprecated since the spelling was fixed."""
    from jsonpath_ng.ext import parser

    try:
        return parser.ExtendedJsonPathParser
    except AttributeError:
        return parser.ExtentedJsonPathParser


def compile_jsonpath(expression: str, where: str) -> Any:
    """Parse a JSONPath (jsonpath-ng extended syntax) with one reused parser (a fresh parser per
    expression costs ~20 ms)."""
    global _JSONPATH_PARSER
    with _JSONPATH_LOCK:
        if _JSONPATH_PARSER is None:
            _JSONPATH_PARSER = _extended_parser_class()()
        try:
            return _JSONPATH_PARSER.parse(expression)
        except Exception as exc:  # jsonpath-ng raises plain Exception subclasses
            _JSONPATH_PARSER = None  # a failed parse may leave the parser in a bad state
            raise MappingError(where, f"invalid JSONPath {expression!r}: {exc}") from exc


@processor(
    "jsonpath",
    params={"expression": describe(NONEMPTY, "JSONPath, jsonpath-ng extended syntax")},
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
