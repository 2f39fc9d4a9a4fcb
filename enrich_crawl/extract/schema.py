"""The JSON Schema of mappings, generated from the processor registry.

`mappings/mapping.schema.json` is this schema written out, so editors can complete and check
mappings (`"$schema": "./mapping.schema.json"`); a test keeps the file equal to `build_schema()`.
Regenerate it after adding a processor type:

    python -m enrich_crawl.extract.schema mappings/mapping.schema.json
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

import jsonschema

from enrich_crawl.extract.processors import REGISTRY
from enrich_crawl.extract.vocabulary import (
    FIELD_TYPES,
    NAME_PATTERN,
    RENDER_MODES,
    URL_PATTERN_TYPES,
)

SCHEMA_ID = "https://github.com/enrich-crawl/enrich_crawl/blob/main/mappings/mapping.schema.json"


def build_schema() -> dict[str, Any]:
    """The mapping JSON Schema (draft 2020-12)."""
    names = sorted(REGISTRY)
    branches = []
    params_defs = {}
    for name in names:
        ptype = REGISTRY[name]
        params_defs[f"parameters_{name}"] = {
            "description": ptype.doc,
            **ptype.params_schema(),
        }
        then: dict[str, Any] = {
            "properties": {"parameters": {"$ref": f"#/$defs/parameters_{name}"}}
        }
        if ptype.required:
            then["required"] = ["parameters"]
        branches.append(
            {
                "if": {"properties": {"type": {"const": name}}, "required": ["type"]},
                "then": then,
            }
        )
    string = {"type": "string"}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "enrich_crawl mapping",
        "description": (
            "One mapping: which pages it handles (url_patterns), which links it follows "
            "(url_parsers) and which dataset fields it fills (fields), each a chain of processors. "
            "Reference: docs/mappings.md."
        ),
        "type": "object",
        "required": ["name", "url_patterns"],
        "additionalProperties": False,
        "properties": {
            "$schema": string,
            "name": {
                "type": "string",
                "pattern": NAME_PATTERN,
                "x-pattern-hint": "letters, digits, '_', '.', '-' (starting with a letter/digit)",
                "description": "unique among the mappings of a folder; recorded in lineage",
            },
            "description": string,
            "url_patterns": {
                "type": "array",
                "minItems": 1,
                "items": {"$ref": "#/$defs/url_pattern"},
                "description": "the mapping handles a page when any pattern matches its final URL",
            },
            "url_parsers": {"type": "array", "items": {"$ref": "#/$defs/url_parser"}},
            "fields": {"type": "array", "items": {"$ref": "#/$defs/field"}},
            "render": {
                "enum": list(RENDER_MODES),
                "x-enum-name": "render mode",
                "description": "static (default), js (always render), auto (render when the "
                "static page yields none of the fields)",
            },
            "priority": {"type": "integer", "description": "higher first; default 0"},
            "wait_for": {
                "type": "string",
                "minLength": 1,
                "description": "CSS selector the browser waits for (render js/auto)",
            },
            "learned": {"$ref": "#/$defs/learned"},
        },
        "$defs": {
            "learned": {
                "type": "object",
                "description": (
                    "how a learned mapping was learned (`enrich-crawl mapping learn`): the "
                    "example records, the held-out precision and recall of each field's rule, "
                    "when; informative only, the engine ignores it"
                ),
                "required": ["examples", "learned_at"],
                "properties": {
                    "examples": {"type": "integer", "minimum": 0},
                    "learned_at": {"type": "string", "description": "ISO 8601 date-time"},
                    "precision": {
                        "type": "object",
                        "additionalProperties": {"type": "number", "minimum": 0, "maximum": 1},
                        "description": "field -> held-out precision of its rule",
                    },
                    "recall": {
                        "type": "object",
                        "additionalProperties": {"type": "number", "minimum": 0, "maximum": 1},
                        "description": "field -> held-out recall of its rule",
                    },
                    "held_out": {
                        "type": "object",
                        "additionalProperties": {"type": "integer", "minimum": 0},
                        "description": "field -> held-out examples its rule was judged on",
                    },
                    "rules": {
                        "type": "object",
                        "additionalProperties": string,
                        "description": "field -> kind of rule (label, id, class, meta, jsonld...)",
                    },
                },
            },
            "url_pattern": {
                "type": ["object", "string"],
                "minLength": 1,
                "description": "a regex string, or {type: regex|glob|prefix, pattern}",
                "required": ["pattern"],
                "additionalProperties": False,
                "properties": {
                    "type": {"enum": list(URL_PATTERN_TYPES), "x-enum-name": "URL pattern type"},
                    "pattern": {"type": "string", "minLength": 1},
                    "description": string,
                },
            },
            "url_parser": {
                "type": "object",
                "required": ["processors"],
                "additionalProperties": False,
                "properties": {
                    "description": string,
                    "processors": {"$ref": "#/$defs/processors"},
                },
            },
            "field": {
                "type": "object",
                "required": ["name", "processors"],
                "additionalProperties": False,
                "properties": {
                    "name": {
                        "type": "string",
                        "minLength": 1,
                        "description": "the dataset field this rule fills",
                    },
                    "type": {
                        "enum": list(FIELD_TYPES),
                        "x-enum-name": "field type",
                        "description": "used when the dataset does not type the field",
                    },
                    "description": string,
                    "processors": {"$ref": "#/$defs/processors"},
                },
            },
            "processors": {
                "type": "array",
                "minItems": 1,
                "items": {"$ref": "#/$defs/processor"},
            },
            "processor": {
                "type": "object",
                "required": ["type"],
                "additionalProperties": False,
                "properties": {
                    "type": {"enum": names, "x-enum-name": "processor type"},
                    "parameters": {"type": "object"},
                    "description": string,
                },
                "allOf": branches,
            },
            **params_defs,
        },
    }


@lru_cache(maxsize=1)
def validator() -> jsonschema.protocols.Validator:
    # the schema itself is checked by the tests (test_mapping_load: the shipped file is this schema
    # and a valid one), not by every process that loads mappings: the check costs ~0.4 s of CPU
    return jsonschema.Draft202012Validator(build_schema())


def schema_text() -> str:
    return json.dumps(build_schema(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="write (or check) the mapping JSON Schema")
    parser.add_argument("path", nargs="?", help="file to write (default: stdout)")
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is outdated")
    args = parser.parse_args(argv)
    text = schema_text()
    if not args.path:
        sys.stdout.write(text)
        return 0
    path = Path(args.path)
    if args.check:
        current = path.read_text(encoding="utf-8") if path.exists() else ""
        if current != text:
            sys.stderr.write(f"{path} is outdated: python -m enrich_crawl.extract.schema {path}\n")
            return 1
        return 0
    path.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
