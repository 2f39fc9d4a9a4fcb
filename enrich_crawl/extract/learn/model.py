"""What the learner is given and what it returns (plain data, no crawling)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class ExamplePage:
    """One fetched page that a record's URLs led to."""

    url: str  # final URL after redirects, without fragment
    body: bytes
    content_type: str | None = None
    fragment: str = ""  # decoded fragment of the record URL that led here ($fragment)
    depth: int = 0
    status: int = 200


@dataclass
class Example:
    """One record with known values: field -> value after the dataset's cleaning and coercion."""

    record_id: str
    values: dict[str, Any]
    pages: list[ExamplePage] = field(default_factory=list)


@dataclass
class LearnResult:
    mappings: list[dict]  # mapping JSON documents, each with a "learned" object
    report: dict  # the content of learn-report.json
