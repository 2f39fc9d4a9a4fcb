"""The fixed words of the mapping format (docs/datasets.md, docs/mappings.md)."""

RENDER_MODES = ("static", "js", "auto")
FIELD_TYPES = ("string", "integer", "number", "boolean", "date", "list")
URL_PATTERN_TYPES = ("regex", "glob", "prefix")
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
