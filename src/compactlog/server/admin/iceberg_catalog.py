"""The read-only Iceberg REST catalog's routes on the admin listener, under /iceberg
(what the catalog answers is compactlog/iceberg/catalog.py's).

  GET  /iceberg/v1/config                                   prefix-less config, endpoints
  GET  /iceberg/v1/namespaces                               [["state"]]
  GET  /iceberg/v1/namespaces/{namespace}                   HEAD too
  GET  /iceberg/v1/namespaces/{namespace}/tables            the topics' tables
  GET  /iceberg/v1/namespaces/{namespace}/tables/{table}    LoadTableResult; HEAD too
  POST /iceberg/v1/namespaces/{namespace}/tables/{table}/metrics   accepted, dropped
  anything else under /iceberg: 405 for a write, 404 for a read, as ErrorModel JSON

Invariant: a table is shown only to a principal that may DESCRIBE its topic, as the
admin API's topic routes and Kafka's Metadata do: listings leave the others out, and
loading one answers 403 (ForbiddenException) before it is looked up, so that the answer
does not tell whether the topic exists. The admin listener's authentication applies
(server/admin/route_access.py: a bearer token, which is what pyiceberg's `token` and DuckDB's
iceberg secret send, a TLS certificate, or User:ANONYMOUS). Store reads run off the
event loop.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from aiohttp import web

from compactlog.iceberg.catalog import (
    BASE,
    CatalogError,
    config_body,
    load_table,
    load_table_body,
    namespace_body,
    namespace_of,
    namespaces_body,
    table_names,
)
from compactlog.server.security.acl_model import Operation, ResourceType

if TYPE_CHECKING:
    from compactlog.server.admin.http_api import AdminServer

log = logging.getLogger("compactlog.admin")

_TABLES = BASE + "/v1/namespaces/{namespace}/tables"


class CatalogRoutes:
    def __init__(self, admin: AdminServer) -> None:
        self.admin = admin

    def routes(self) -> list[web.AbstractRouteDef]:
        return [
            web.get(BASE + "/v1/config", self.config),
            web.get(BASE + "/v1/namespaces", self.namespaces),
            web.get(BASE + "/v1/namespaces/{namespace}", self.namespace),  # HEAD too
            web.get(_TABLES, self.tables),
            web.get(_TABLES + "/{table}", self.table),
            web.post(_TABLES + "/{table}/metrics", self.metrics_report),
            # Last: what the routes above do not serve (aiohttp tries them in order).
            web.route("*", BASE + "/{rest:.*}", self.unsupported),
        ]

    async def config(self, request: web.Request) -> web.Response:
        return _json(config_body())

    async def namespaces(self, request: web.Request) -> web.Response:
        return _json(namespaces_body(request.query.get("parent")))

    async def namespace(self, request: web.Request) -> web.Response:
        body = namespace_body(request.match_info["namespace"])
        return web.Response(status=204) if request.method == "HEAD" else _json(body)

    async def tables(self, request: web.Request) -> web.Response:
        namespace = namespace_of(request.match_info["namespace"])
        server = self.admin.server
        visible = [name for name in await server.run_io(server.store.list_topics)
                   if self.admin.allowed(request, Operation.DESCRIBE, ResourceType.TOPIC,
                                          name)]
        names = await server.run_io(table_names, server.store, namespace, visible)
        return _json({"identifiers": [{"namespace": [namespace], "name": name}
                                      for name in names]})

    async def table(self, request: web.Request) -> web.Response:
        namespace = namespace_of(request.match_info["namespace"])
        topic = self._visible_topic(request)
        table = await self.admin.server.run_io(load_table, self.admin.server.store,
                                               namespace, topic)
        if request.method == "HEAD":
            return web.Response(status=204)
        return _json(load_table_body(table))

    async def metrics_report(self, request: web.Request) -> web.Response:
        """A client's scan report (Iceberg's Java client sends one per scan): nothing
        here keeps it, but it is no write, so it is not refused."""
        namespace_of(request.match_info["namespace"])
        self._visible_topic(request)
        return web.Response(status=204)

    async def unsupported(self, request: web.Request) -> web.Response:
        if request.method in ("GET", "HEAD"):
            raise CatalogError(404, "NotFoundException",
                               f"the compactlog catalog has no route {request.path} (it "
                               "serves config, namespaces and tables, read-only)")
        raise CatalogError(405, "UnsupportedOperationException",
                           f"the compactlog catalog is read-only: {request.method} "
                           f"{request.path} is not served (tables change only by "
                           "compaction)")

    def _visible_topic(self, request: web.Request) -> str:
        topic = request.match_info["table"]
        if not self.admin.allowed(request, Operation.DESCRIBE, ResourceType.TOPIC, topic):
            log.info("admin: %s may not %s %s (DESCRIBE on TOPIC %r)", request["principal"],
                     request.method, request.path, topic)
            raise CatalogError(403, "ForbiddenException",
                               f"{request['principal']} is not allowed DESCRIBE on topic "
                               f"{topic!r}")
        return topic


def is_catalog_path(path: str) -> bool:
    return path == BASE or path.startswith(BASE + "/")


def _json(body: Any) -> web.Response:
    return web.Response(text=json.dumps(body), content_type="application/json")
