"""String processors: map over the values (`trim`, `lower`, `upper`, `text`, `urljoin`,
`format`)."""

from __future__ import annotations

import string
from typing import Any
from urllib.parse import urlsplit

from enrich_crawl.extract.errors import MappingError
from enrich_crawl.extract.processors.registry import (
    BOOLEAN,
    NONEMPTY,
    PAGE,
    STRING,
    Context,
    Fn,
    as_text,
    describe,
    fragment_root,
    is_element,
    map_strings,
    processor,
    string_values,
)
from enrich_crawl.urls import join_url
from enrich_crawl.values import clean_text


@processor(
    "trim",
    params={
        "collapse": describe(
            BOOLEAN, "collapse inner runs of whitespace to one space; default true"
        ),
        "characters": describe(NONEMPTY, "strip these characters (not whitespace) from both ends"),
    },
)
def _trim(params: dict[str, Any], where: str) -> Fn:
    """Strip surrounding whitespace (Unicode, NFC) and collapse inner runs of whitespace unless
    `collapse` is false; with `characters`, strip those characters instead."""
    characters = params.get("characters")
    if characters is not None:
        return map_strings(lambda text: text.strip(characters))
    if params.get("collapse", True):
        return map_strings(clean_text)
    return map_strings(str.strip)


@processor("lower")
def _lower(params: dict[str, Any], where: str) -> Fn:
    """Lower-case each value."""
    return map_strings(str.lower)


@processor("upper")
def _upper(params: dict[str, Any], where: str) -> Fn:
    """Upper-case each value."""
    return map_strings(str.upper)


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
    params={"separator": describe(STRING, "between block elements; default ' '")},
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
                value = fragment_root(value)
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
    params={"base": describe(NONEMPTY, "absolute http(s) URL to resolve against")},
)
def _urljoin(params: dict[str, Any], where: str) -> Fn:
    """Make each value an absolute URL against the page URL (its `<base href>` if any) or `base`."""
    fixed = params.get("base")
    if fixed is not None and not _absolute_url(fixed):
        raise MappingError(f"{where}.base", f"{fixed!r} is not an absolute http(s) URL")

    def run(values: list[Any], ctx: Context) -> list[Any]:
        base = fixed or ctx.page.base_url
        out = []
        for text in string_values(values, ctx):
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
        "template": describe(
            NONEMPTY, "with {value} and the variables {url}, {fragment}, {id}; {{ }} for braces"
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
        return [template.format(value=text, **variables) for text in string_values(values, ctx)]

    return run
