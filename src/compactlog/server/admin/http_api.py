"""The admin and metrics HTTP listener (`compactlog serve --admin-listen HOST:PORT`).

  GET  /metrics                          Prometheus text format
  GET  /v1/health                        {"status": "ok"}
  GET  /v1/topics                        every topic, with its partitions' figures
  GET  /v1/topics/{topic}                one topic: config and partitions
  GET  /v1/topics/{topic}/compaction     per-partition compaction status, with failures
  POST /v1/topics/{topic}/compaction     start a run; body {"partitions": [0, 2]} optional.
                                         The active segments are rolled first, so that it
                                         covers every record until now (as Pulsar's
                                         manual compaction); "roll": false leaves them
                                         (Kafka's rule, as the automatic runs).
                                         202 with the run; 409 if one is going on;
                                         429 if max_concurrent_runs runs are going
  POST /v1/topics/{topic}/roll           roll and seal the active segments; body
                                         {"partitions": [0, 2]} optional (what
                                         `compactlog compact --local` asks of the server)
  GET  /v1/compactions                   recent runs, newest first
  GET  /v1/compactions/{id}              one run, with its report once finished
  /iceberg/v1/...                        the read-only Iceberg REST catalog of the
                                         topics' state tables (server/admin/iceberg_catalog.py)

Errors are JSON, {"error": "..."}, with 400 (bad request), 401 (no valid principal),
403 (the principal may not), 404 (unknown topic, partition or run), 409 (a compaction
of those partitions is already running) or 429 (the server runs as many compactions as
max_concurrent_runs allows; with "runs", the ones going, and Retry-After); under
/iceberg they have the Iceberg REST spec's shape, {"error": {"message", "type", "code"}}.
Store reads run off the event loop.

Authorization (server/admin/route_access.py establishes the principal): with the authorizer on,
each route needs what the Kafka listener would need for the same thing: DESCRIBE on a
topic to see it, its compaction status or its runs (listings show only those), also
DESCRIBE_CONFIGS to see its config, ALTER on the topic to start a compaction or roll
its segments (as
CreatePartitions needs ALTER on the topic: it changes how the topic is stored, not its
records), DESCRIBE on a topic to list or load its table in the Iceberg catalog, and
DESCRIBE on the cluster for /metrics and /v1/health unless they are open.
With the authorizer on, /metrics, open or not, shows a topic's or a group's samples only
to a principal that may DESCRIBE it (an open scrape without a token is User:ANONYMOUS);
server-wide figures are shown to every scrape that may reach it.
"""

from __future__ import annotations

import json
import logging
import ssl
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from compactlog.compaction.scheduler import BusyError
from compactlog.compaction.status import read_status
from compactlog.errors import (
    CompactlogError,
    ConflictError,
    UnknownPartitionError,
    UnknownTopicError,
    UserError,
)
from compactlog.iceberg.catalog import CatalogError, error_body
from compactlog.server.admin.iceberg_catalog import CatalogRoutes, is_catalog_path
from compactlog.server.admin.route_access import AdminAuth, Forbidden, TokenFile, Unauthenticated
from compactlog.server.cleaner import RunsFullError
from compactlog.server.metrics import CONTENT_TYPE, Visible
from compactlog.server.security.acl_model import CLUSTER_NAME, Operation, ResourceType

if TYPE_CHECKING:
    from compactlog.server.app import Server

log = logging.getLogger("compactlog.admin")


class AdminServer:
    def __init__(self, server: Server, host: str, port: int,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self.server = server
        self.host = host
        self.port = port
        # HTTPS with the server's TLS settings (server/security/tls.py), when set.
        self.ssl_context = ssl_context
        self._runner: web.AppRunner | None = None
        settings = server.config.authorization
        tokens = (TokenFile(Path(settings.admin_tokens_file))
                  if settings.admin_tokens_file else None)
        self.auth = AdminAuth(tokens)
        self.open_paths = ({"/metrics", "/v1/health"}
                           if settings.admin_open_health_and_metrics else set())

    async def start(self) -> None:
        app = web.Application(middlewares=[_errors_as_json, self._authenticate])
        app.add_routes([
            web.get("/metrics", self.metrics),
            web.get("/v1/health", self.health),
            web.get("/v1/topics", self.topics),
            web.get("/v1/topics/{topic}", self.topic),
            web.get("/v1/topics/{topic}/compaction", self.compaction_status),
            web.post("/v1/topics/{topic}/compaction", self.start_compaction),
            web.post("/v1/topics/{topic}/roll", self.roll),
            web.get("/v1/compactions", self.compactions),
            web.get("/v1/compactions/{id}", self.compaction),
            *CatalogRoutes(self).routes(),
        ])
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, ssl_context=self.ssl_context)
        await site.start()
        self.port = self._runner.addresses[0][1]  # the real one when asked for port 0
        log.info("admin and metrics on %s", self.url)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def url(self) -> str:
        scheme = "https" if self.ssl_context is not None else "http"
        return f"{scheme}://{self.host}:{self.port}"

    # -- authorization ------------------------------------------------------------------

    @web.middleware
    async def _authenticate(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path in self.open_paths:
            request["principal"] = None
        else:
            request["principal"] = self.auth.principal(request)
        response: web.StreamResponse = await handler(request)
        return response

    def allowed(self, request: web.Request, operation: Operation,
                 resource_type: ResourceType, name: str, audit: bool = False) -> bool:
        """`audit`: the authorizer logs a denial too (`_require` logs its own line,
        with the route)."""
        principal = request["principal"]
        if principal is None:  # an open path
            return True
        host = request.remote or ""
        return self.server.authorizer.authorize(principal, host, operation, resource_type,
                                                name, audit)

    def _require(self, request: web.Request, operation: Operation,
                 resource_type: ResourceType, name: str) -> None:
        if not self.allowed(request, operation, resource_type, name):
            log.info("admin: %s may not %s %s (%s on %s %r)", request["principal"],
                     request.method, request.path, operation.name, resource_type.name, name)
            raise Forbidden(f"{request['principal']} is not allowed {operation.name} on "
                            f"{resource_type.name.lower()} {name!r}")

    def _require_topic(self, request: web.Request, operation: Operation) -> str:
        name = request.match_info["topic"]
        self._require(request, operation, ResourceType.TOPIC, name)
        return name

    # -- handlers -----------------------------------------------------------------------

    async def metrics(self, request: web.Request) -> web.Response:
        self._require(request, Operation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_NAME)
        visible: Visible | None = None
        authorizer = self.server.authorizer
        if authorizer.enabled:
            # Topic and group samples name resources (and their offsets and lag): shown
            # as Metadata and ListGroups show them, to a principal that may DESCRIBE.
            principal = request["principal"] or self.auth.principal(request, required=False)
            host = request.remote or ""
            kinds = {"topic": ResourceType.TOPIC, "group": ResourceType.GROUP}

            def visible(kind: str, name: str) -> bool:
                return authorizer.authorize(principal, host, Operation.DESCRIBE,
                                            kinds[kind], name, audit=False)

        body = await self.server.run_io(self.server.metrics.render, visible)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    async def health(self, request: web.Request) -> web.Response:
        self._require(request, Operation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_NAME)
        return _json({"status": "ok"})

    async def topics(self, request: web.Request) -> web.Response:
        store = self.server.store
        names = [name for name in await self.server.run_io(store.list_topics)
                 if self.allowed(request, Operation.DESCRIBE, ResourceType.TOPIC, name)]
        bodies = [await self.server.run_io(self._topic_body, name) for name in names]
        return _json({"topics": bodies})

    async def topic(self, request: web.Request) -> web.Response:
        name = self._require_topic(request, Operation.DESCRIBE)
        with_config = self.allowed(request, Operation.DESCRIBE_CONFIGS, ResourceType.TOPIC,
                                    name)
        return _json(await self.server.run_io(self._topic_body, name, with_config))

    def _topic_body(self, name: str, with_config: bool = False) -> dict[str, Any]:
        topic = self.server.store.topic(name)
        body: dict[str, Any] = {
            "topic": name,
            "compacted": topic.config.compacted,
            "partitions": [{"partition": p.index, **p.stats()} for p in topic.partitions],
        }
        if with_config:
            body["config"] = topic.config.effective()
        return body

    async def compaction_status(self, request: web.Request) -> web.Response:
        name = self._require_topic(request, Operation.DESCRIBE)
        return _json(await self.server.run_io(self._status_body, name))

    def _status_body(self, name: str) -> dict[str, Any]:
        cleaner = self.server.cleaner
        topic = self.server.store.topic(name)
        running = {(r.job.topic, p): r.job.id for r in cleaner.running()
                   for p in r.job.partitions}
        failures = cleaner.scheduler.state.failures
        rows = []
        for partition in topic.partitions:
            # A run's process writes SUCCESS just before it exits: the horizon shown must
            # be the one it committed, not wait for the next upkeep's pickup.
            partition.refresh()
            key = (name, partition.index)
            failure = failures.get(key)
            rows.append({
                "partition": partition.index,
                **read_status(partition.directory).to_json(),
                "horizon": partition.stats()["horizon"],
                "running_run": running.get(key),
                "uncleanable": bool(failure and failure.uncleanable),
                "failures_in_a_row": failure.count if failure else 0,
                "retry_at_ms": int(failure.retry_at_s * 1000) if failure else None,
            })
        return {"topic": name, "compacted": topic.config.compacted,
                "auto_compaction": cleaner.config.enabled, "partitions": rows}

    async def start_compaction(self, request: web.Request) -> web.Response:
        name = self._require_topic(request, Operation.ALTER)
        partitions, roll = await _run_body(request)
        try:
            record = await self.server.cleaner.request(name, partitions, roll)
        except BusyError as error:
            # The runs in the way, so that a client can wait for them instead.
            runs = [r.job.id for r in self.server.cleaner.running()
                    if r.job.topic == name and set(r.job.partitions) & set(error.partitions)]
            return _json({"error": str(error), "runs": runs}, status=409)
        except RunsFullError as error:
            return _json({"error": str(error), "runs": error.running}, status=429,
                         headers={"Retry-After": "10"})
        return _json(record.to_json(), status=202,
                     headers={"Location": f"/v1/compactions/{record.job.id}"})

    async def roll(self, request: web.Request) -> web.Response:
        name = self._require_topic(request, Operation.ALTER)
        partitions, _ = await _run_body(request, with_roll=False)
        rolled = await self.server.run_io(self.server.cleaner.roll, name, partitions)
        return _json({"topic": name, "partitions": rolled})

    async def compactions(self, request: web.Request) -> web.Response:
        runs = [r for r in reversed(self.server.cleaner.runs.values())
                if self.allowed(request, Operation.DESCRIBE, ResourceType.TOPIC, r.job.topic)]
        return _json({"runs": [r.to_json() for r in runs]})

    async def compaction(self, request: web.Request) -> web.Response:
        text = request.match_info["id"]
        record = self.server.cleaner.runs.get(int(text)) if text.isdigit() else None
        if record is None:
            return _json({"error": f"no compaction run {text!r} (the server keeps the "
                                   "recent ones, since it started)"}, status=404)
        self._require(request, Operation.DESCRIBE, ResourceType.TOPIC, record.job.topic)
        return _json(record.to_json())


async def _run_body(request: web.Request, with_roll: bool = True
                    ) -> tuple[list[int] | None, bool]:
    """The partitions a compaction or roll request names (None: all), and its "roll"."""
    if not request.can_read_body:
        return None, True
    try:
        body = await request.json()
    except ValueError as error:
        raise UserError(f"the request body is not JSON: {error}") from None
    roll = True
    if with_roll and isinstance(body, dict) and "roll" in body:
        body = dict(body)
        roll = body.pop("roll")
        if not isinstance(roll, bool):
            raise UserError(f'"roll" must be true or false, got {roll!r}')
    return _partitions(body, with_roll), roll


def _partitions(body: Any, with_roll: bool = False) -> list[int] | None:
    if body is None or body == {}:
        return None
    if not isinstance(body, dict) or set(body) - {"partitions"}:
        if with_roll:
            raise UserError('the request body takes two fields, "partitions": a list of '
                            'partition numbers, and "roll": true or false')
        raise UserError('the request body takes one field, "partitions": a list of '
                        "partition numbers")
    value = body.get("partitions")
    if value is None:
        return None
    if (not isinstance(value, list) or not value
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)):
        raise UserError(f'"partitions" must be a non-empty list of integers, got {value!r}')
    return sorted(set(value))


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(text=json.dumps(body), status=status, headers=headers,
                        content_type="application/json")


@web.middleware
async def _errors_as_json(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        response: web.StreamResponse = await handler(request)
        return response
    except web.HTTPException as error:
        return _error(request, error.status, error.reason)
    except CatalogError as error:
        return _error(request, error.status, str(error), kind=error.kind)
    except Unauthenticated as error:
        log.info("admin: %s %s from %s refused: %s", request.method, request.path,
                 request.remote, error)
        return _error(request, 401, str(error),
                      headers={"WWW-Authenticate": 'Bearer realm="compactlog"'})
    except Forbidden as error:
        return _error(request, 403, str(error))
    except (BusyError, ConflictError) as error:
        return _error(request, 409, str(error))
    except (UnknownTopicError, UnknownPartitionError) as error:
        return _error(request, 404, str(error))
    except UserError as error:
        return _error(request, 400, str(error))
    except CompactlogError as error:
        log.warning("admin request %s %s failed: %s", request.method, request.path, error)
        return _error(request, 500, str(error))
    except Exception as error:
        log.exception("admin request %s %s failed", request.method, request.path)
        return _error(request, 500, f"internal error: {type(error).__name__}: {error}")


def _error(request: web.Request, status: int, message: str, kind: str | None = None,
           headers: dict[str, str] | None = None) -> web.Response:
    """The admin API's {"error": "..."}, or under /iceberg the REST spec's ErrorModel,
    which Iceberg's clients turn into their exceptions."""
    if is_catalog_path(request.path):
        if request.method == "HEAD":  # no body: the status says it
            return web.Response(status=status, headers=headers)
        return _json(error_body(status, message, kind), status=status, headers=headers)
    return _json({"error": message}, status=status, headers=headers)
