"""MongoDB access with plain pymongo (works the same on a real MongoDB and on the embedded server).

Credentials only ever come from the URI or the resource's options (environment, `EnvVar`);
`redact_uri` is the form that may be shown and `scrub` removes secrets from any text (error
messages) before it is logged or put in metadata.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from pymongo import ASCENDING, MongoClient
from pymongo.collection import Collection

# userinfo = everything up to the LAST '@' of the authority (a password may hold a raw '@')
_CREDENTIALS = re.compile(r"(mongodb(?:\+srv)?://)([^/?#\s]*)@")
# query options whose value is a secret (tlsCertificateKeyFilePassword, AWS session tokens, ...)
_SECRET_OPTION = re.compile(
    r"((?:[?&])[^=&#\s]*(?:password|secret|token|authmechanismproperties)[^=&#\s]*=)([^&#\s]*)",
    re.IGNORECASE,
)

RECORD_INDEXES: tuple[tuple[str, list[tuple[str, int]]], ...] = (
    ("status", [("status", ASCENDING)]),
    ("missing", [("missing", ASCENDING)]),
    # lineage.<field>.source_url cannot be indexed for every field without a wildcard index;
    # the merge keeps the hosts of every lineage source_url in `source_hosts` instead
    ("source_hosts", [("source_hosts", ASCENDING)]),
    ("updated_at", [("updated_at", ASCENDING)]),
)


def redact_uri(uri: str) -> str:
    """`mongodb://user:secret@host/?tlsCertificateKeyFilePassword=x` ->
    `mongodb://***@host/?tlsCertificateKeyFilePassword=***` (never log or show the real one)."""
    text = _CREDENTIALS.sub(r"\1***@", uri or "")
    return _SECRET_OPTION.sub(r"\1***", text)


def _secrets_of(uri: str | None, extra: Iterable[str | None] = ()) -> list[str]:
    found: list[str] = []
    match = _CREDENTIALS.search(uri or "")
    if match:
        userinfo = match.group(2)
        _, _, password = userinfo.partition(":")
        found += [userinfo, unquote(userinfo), password, unquote(password)]
    for option in _SECRET_OPTION.finditer(uri or ""):
        found += [option.group(2), unquote(option.group(2))]
    found += [s for s in extra if s]
    # longest first, so a password inside the userinfo is not half-replaced
    return sorted({s for s in found if len(s) >= 3}, key=len, reverse=True)


def scrub(text: str, uri: str | None = None, secrets: Iterable[str | None] = ()) -> str:
    """`text` with the URI redacted and every credential it (or `secrets`) holds replaced by ***."""
    text = str(text)
    if uri:
        text = text.replace(uri, redact_uri(uri))
    for secret in _secrets_of(uri, secrets):
        text = text.replace(secret, "***")
    return _SECRET_OPTION.sub(r"\1***", _CREDENTIALS.sub(r"\1***@", text))


def resolve_uri(uri: str | None, embedded_dir: Path) -> str:
    """The URI to use: the given one, else the embedded server (started on demand)."""
    if uri:
        return uri
    from enrich_crawl.store.embedded import ensure_embedded_mongo

    return ensure_embedded_mongo(embedded_dir)


def connect(uri: str, **options: Any) -> MongoClient:
    """A client with enrich_crawl's defaults; `options` (TLS, auth, timeouts) go to pymongo as given."""
    options.setdefault("serverSelectionTimeoutMS", 10000)
    options.setdefault("connectTimeoutMS", 10000)
    options.setdefault("tz_aware", True)
    options.setdefault("appname", "enrich_crawl")
    return MongoClient(uri, **options)


def _key_pattern(keys: Any) -> tuple[tuple[str, Any], ...]:
    if isinstance(keys, dict):
        keys = keys.items()
    return tuple(
        (str(name), int(order) if isinstance(order, (int, float)) else order)
        for name, order in keys
    )


def ensure_indexes(collection: Collection) -> list[str]:
    """Create the record collection's indexes; idempotent. An index is matched by its key pattern,
    not its name (a server may name it differently, and MongoDB refuses the same keys under a second
    name). Returns the names of the indexes created now."""
    present = {
        _key_pattern(info.get("key", ())) for info in collection.index_information().values()
    }
    created = []
    for name, keys in RECORD_INDEXES:
        if _key_pattern(keys) not in present:
            created.append(collection.create_index(keys, name=name))
    return created
