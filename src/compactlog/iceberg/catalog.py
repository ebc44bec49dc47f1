"""The read-only Iceberg REST catalog's answers: which tables there are, and each one's
current metadata (the routes are server/admin/iceberg_catalog.py's, on the admin listener).

Invariant: the catalog only reads. A table it names is a compacted topic's state table,
or a topic's raw table (iceberg.raw.enabled), whose metadata a sync has committed, and
the metadata it returns for one is the version
that `load_current` finds (the hint, then every newer version that exists), never
anything the catalog wrote or changed: tables change only by compaction and upkeep
(the package's "Commit").

Layout, as a user sees it (docs/querying.md, "The REST catalog"):
  namespace `state`   one table per compacted topic, named as the topic: its compacted
                      state (`SELECT * FROM c.state.prices` in DuckDB).
  namespace `raw`     one table per topic with iceberg.raw.enabled: its sealed log,
                      append-only (`SELECT * FROM c.raw.prices`).
  The namespace says which table of a topic it is, the table name which topic: a topic
  name may hold dots, which would split a namespace into levels (pyiceberg reads
  "a.b" as two), while a table name is one identifier.

What the clients call (seen through a logging proxy): pyiceberg 0.12's RestCatalog and
DuckDB 1.5.5's ATTACH (TYPE iceberg) both GET /v1/config (DuckDB with ?warehouse=<the
ATTACH path>, which is ignored: there is one), /v1/namespaces, .../tables and
.../tables/{table}, the last with `X-Iceberg-Access-Delegation: vended-credentials`,
which gets none (below); both then read the files themselves.

The answers follow the Iceberg REST catalog's OpenAPI spec (apache/iceberg,
open-api/rest-catalog-open-api.yaml): ConfigResponse with its `endpoints`,
ListNamespacesResponse, GetNamespaceResponse, ListTablesResponse, LoadTableResult and
the ErrorModel `{"error": {"message", "type", "code"}}`. LoadTableResult's `config` is
empty: the table's files are read with the client's own storage settings (a local path,
or s3:// URLs with the client's S3 credentials), the catalog vends none, so a reader
gets at the bucket by its own S3 identity and never by the server's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from compactlog.errors import UnknownTopicError
from compactlog.iceberg import RAW_TABLE, STATE_TABLE
from compactlog.iceberg.files import table_files
from compactlog.iceberg.state import HINT, load_current, metadata_name

if TYPE_CHECKING:
    from compactlog.storage import LogStore

STATE_NAMESPACE = "state"
RAW_NAMESPACE = "raw"
# namespace -> which table of each topic
NAMESPACES = {STATE_NAMESPACE: STATE_TABLE, RAW_NAMESPACE: RAW_TABLE}
# Where the catalog is on the admin listener: its clients' `uri` / ENDPOINT. Its own
# root keeps its /v1/... apart from the admin API's.
BASE = "/iceberg"
# The spec's separator of a multi-level namespace in a path (a unit separator, %1F).
NAMESPACE_SEPARATOR = "\x1f"

# What /v1/config says the catalog serves (the spec's `endpoints`, "METHOD /path"):
# clients check it before calling an optional route.
ENDPOINTS = [
    "GET /v1/{prefix}/namespaces",
    "GET /v1/{prefix}/namespaces/{namespace}",
    "HEAD /v1/{prefix}/namespaces/{namespace}",
    "GET /v1/{prefix}/namespaces/{namespace}/tables",
    "GET /v1/{prefix}/namespaces/{namespace}/tables/{table}",
    "HEAD /v1/{prefix}/namespaces/{namespace}/tables/{table}",
    "POST /v1/{prefix}/namespaces/{namespace}/tables/{table}/metrics",
]

# The ErrorModel's `type` for each status, as the spec's examples and Iceberg's own
# exception names give them.
ERROR_TYPES = {
    400: "BadRequestException",
    401: "NotAuthorizedException",
    403: "ForbiddenException",
    404: "NotFoundException",
    405: "UnsupportedOperationException",
    406: "UnsupportedOperationException",
    409: "AlreadyExistsException",
    500: "InternalServerError",
}


class CatalogError(Exception):
    """An answer in the spec's ErrorModel: `status` and the exception `kind` that
    Iceberg's clients map to their own (NoSuchTableException, ...)."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind


def error_body(status: int, message: str, kind: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind or ERROR_TYPES.get(status, "Exception"),
                      "code": status}}


def config_body() -> dict[str, Any]:
    """GET /v1/config: no prefix (the catalog has one warehouse, whatever a client
    names), no defaults or overrides, and the routes above."""
    return {"defaults": {}, "overrides": {}, "endpoints": ENDPOINTS}


def namespace_of(text: str) -> str:
    """The namespace a path names (its levels joined by %1F), or NoSuchNamespace."""
    if text not in NAMESPACES:
        shown = ".".join(text.split(NAMESPACE_SEPARATOR))
        raise CatalogError(404, "NoSuchNamespaceException",
                           f"namespace {shown!r} does not exist in the compactlog catalog "
                           f"(its namespaces: {', '.join(sorted(NAMESPACES))})")
    return text


def namespaces_body(parent: str | None) -> dict[str, Any]:
    """GET /v1/namespaces: the top level; a namespace here has none below it."""
    if parent:
        namespace_of(parent)
        return {"namespaces": []}
    return {"namespaces": [[name] for name in sorted(NAMESPACES)]}


def namespace_body(namespace: str) -> dict[str, Any]:
    return {"namespace": [namespace_of(namespace)], "properties": {}}


@dataclass(frozen=True)
class Table:
    """A topic's table: where its files are and its current metadata version."""

    topic: str
    location: str
    metadata_location: str
    metadata: dict[str, Any]


def _kept(store: LogStore, namespace: str, topic: str) -> bool:
    """Whether `topic` keeps the table of `namespace`: its state table if compacted,
    its raw table if iceberg.raw.enabled (UnknownTopicError if there is no topic)."""
    config = store.topic(topic).config
    if namespace == RAW_NAMESPACE:
        return bool(config["iceberg.raw.enabled"])
    return bool(config.compacted)


def has_table(store: LogStore, namespace: str, topic: str) -> bool:
    """Whether `topic` keeps the table and it has been committed (the hint exists
    after the first sync's step 6): what a listing shows."""
    try:
        if not _kept(store, namespace, topic):
            return False
    except UnknownTopicError:
        return False  # deleted since it was listed
    return table_files(store, topic, NAMESPACES[namespace]).size(HINT) is not None


def table_names(store: LogStore, namespace: str, topics: list[str]) -> list[str]:
    """Which of `topics` (the ones the principal may see) have a table in `namespace`."""
    namespace_of(namespace)
    return sorted(topic for topic in topics if has_table(store, namespace, topic))


def load_table(store: LogStore, namespace: str, topic: str) -> Table:
    """The table's current metadata, or NoSuchTable naming why there is none."""
    namespace_of(namespace)
    try:
        kept = _kept(store, namespace, topic)
    except UnknownTopicError:
        raise CatalogError(404, "NoSuchTableException",
                           f"table {namespace}.{topic} does not exist: there is no topic "
                           f"{topic!r}") from None
    if not kept:
        why = ("keeps no raw table (iceberg.raw.enabled is false)"
               if namespace == RAW_NAMESPACE
               else "is not compacted (cleanup.policy has no 'compact')")
        raise CatalogError(404, "NoSuchTableException",
                           f"table {namespace}.{topic} does not exist: topic {topic!r} "
                           f"{why}")
    files = table_files(store, topic, NAMESPACES[namespace])
    current = load_current(files)
    if current.body is None:
        made_by = ("the server's upkeep makes it once a segment is sealed"
                   if namespace == RAW_NAMESPACE else
                   "the first compaction or the server's upkeep creates it")
        raise CatalogError(404, "NoSuchTableException",
                           f"table {namespace}.{topic} does not exist yet ({made_by})")
    return Table(topic, files.url(""), files.url(metadata_name(current.version)),
                 current.body)


def load_table_body(table: Table) -> dict[str, Any]:
    """LoadTableResult: the metadata as committed, and no client config (the module's
    last paragraph)."""
    return {"metadata-location": table.metadata_location, "metadata": table.metadata,
            "config": {}}
