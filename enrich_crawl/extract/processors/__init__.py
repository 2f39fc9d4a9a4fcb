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

Modules: registry (the registry, the chain, its values), selectors, regexes, strings, lists,
converters; each processor type registers itself when its module is imported, here.
"""

from enrich_crawl.extract.errors import ExtractionError, MappingError
from enrich_crawl.extract.processors import converters, lists, strings  # noqa: F401 (registers)
from enrich_crawl.extract.processors.regexes import compile_regex
from enrich_crawl.extract.processors.registry import (
    PAGE,
    REGEX_TIMEOUT,
    REGISTRY,
    Context,
    Fn,
    ProcessorType,
    as_text,
    compile_chain,
    compile_processor,
)
from enrich_crawl.extract.processors.selectors import loads_lenient

__all__ = [
    "PAGE",
    "REGEX_TIMEOUT",
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
    "loads_lenient",
]
