"""The mapping language: declarative extraction of fields and links from pages (docs/mappings.md).

`MappingSet.load(dir)` loads and validates a folder of mappings; `MappingSet.matching(url)` gives
the mappings for a page; `run_mapping(mapping, Page(url, body), ...)` extracts its fields and links.
"""

from enrich_crawl.extract.errors import ExtractionError, MappingError
from enrich_crawl.extract.mapping import (
    Mapping,
    MappingLoadError,
    MappingResult,
    MappingSet,
    compile_mapping,
    extract,
    load_mapping_file,
    run_mapping,
    try_mappings,
)
from enrich_crawl.extract.page import Page
from enrich_crawl.extract.processors import REGISTRY

__all__ = [
    "REGISTRY",
    "ExtractionError",
    "Mapping",
    "MappingError",
    "MappingLoadError",
    "MappingResult",
    "MappingSet",
    "Page",
    "compile_mapping",
    "extract",
    "load_mapping_file",
    "run_mapping",
    "try_mappings",
]
