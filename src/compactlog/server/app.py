"""The asyncio server: connections, framing, dispatch, upkeep and graceful shutdown.

Each connection handles its requests one at a time, in order, so responses go out in
request order as Kafka clients require; a long-polling Fetch holds up the requests
behind it on the same connection, as in Kafka. A frame that cannot be parsed, a negative
or oversized length, an unsupported API version, or a client that closes the connection
in the middle of a request closes that connection after a log line naming the peer and
the problem; other connections carry on and nothing stored is touched.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import signal
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from compactlog.server.admin import AdminServer
from compactlog.server.broker import Broker
from compactlog.server.cleaner import Cleaner, CleanerConfig
from compactlog.server.handlers import register_all
from compactlog.server.metrics import ServerMetrics, StateCollector
from compactlog.server.protocol import (
    API_NAMES,
    API_VERSIONS_KEY,
    ProtocolError,
    UnsupportedVersion,
    encode_response,
    parse_request,
    unsupported_api_versions_response,
)
from compactlog.server.upkeep import Upkeep
from compactlog.storage.store import LogStore

log = logging.getLogger("compactlog.server")
_LENGTH = struct.Struct(">i")
T = TypeVar("T")


@dataclass
class ServerConfig:
    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 9092
    # Kafka's socket.request.max.bytes default (100 MiB).
    max_request_bytes: int = 104_857_600
    # How often the broker flushes by flush.ms, rolls and seals by segment.ms and
    # applies retention, and picks up manifests committed by other processes.
    upkeep_interval_s: float = 1.0
    # Kafka's group.initial.rebalance.delay.ms: a new group waits this long for more
    # members before its first generation.
    group_initial_rebalance_delay_s: float = 3.0
    # On SIGTERM, how long requests in flight (a long-polling Fetch, an fsync) may take
    # to be answered before their connections are closed anyway.
    shutdown_grace_s: float = 5.0
    # The admin and metrics HTTP listener; None: none.
    admin_host: str | None = None
    admin_port: int = 9093
    # Automatic compaction (server/cleaner.py).
    compaction: CleanerConfig = field(default_factory=CleanerConfig)


class Server:
    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.store = LogStore.open(config.data_dir)
        # Appends never wait for Parquet: upkeep seals rolled segments in the background.
        self.store.auto_seal = False
        self._upkeep_rounds = Upkeep(self.store)
        self.broker: Broker | None = None
        self.metrics = ServerMetrics()
        self._cleaner: Cleaner | None = None
        self.admin: AdminServer | None = None
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._busy: set[asyncio.Task[None]] = set()  # connections handling a request
        self._stopping = False
        self._upkeep: asyncio.Task[None] | None = None
        self.port = config.port

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._serve_connection, self.config.host, self.config.port,
            limit=1 << 20,
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self.broker = Broker(self.store, self.config.host, self.port,
                             initial_rebalance_delay_s=self.config.group_initial_rebalance_delay_s)
        self.broker.metrics = self.metrics
        register_all(self.broker)
        for key in self.broker.apis:  # every API served shows, at 0 until used
            self.metrics.requests.labels(API_NAMES.get(key, str(key)))
        self._cleaner = Cleaner(self.store, self.config.compaction, self.metrics,
                                self.broker.run_io)
        self.metrics.watch(StateCollector(self.store, self.broker.groups, self._cleaner))
        if self.config.admin_host is not None:
            self.admin = AdminServer(self, self.config.admin_host, self.config.admin_port)
            await self.admin.start()
        self._upkeep = asyncio.create_task(self._upkeep_loop())
        log.info("serving the Kafka protocol on %s:%d, data in %s; automatic compaction %s",
                 self.config.host, self.port, self.config.data_dir,
                 "on" if self.config.compaction.enabled else "off")

    @property
    def cleaner(self) -> Cleaner:
        assert self._cleaner is not None, "the server has not started"
        return self._cleaner

    async def run_io(self, call: Callable[..., T], *args: Any) -> T:
        assert self.broker is not None, "the server has not started"
        return await self.broker.run_io(call, *args)

    async def stop(self) -> None:
        """Stop accepting; answer the requests in flight (for up to shutdown_grace_s),
        close every connection, and make everything acknowledged durable."""
        self._stopping = True
        if self._server is not None:
            self._server.close()
        if self._upkeep is not None:
            self._upkeep.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._upkeep
        if self.admin is not None:
            await self.admin.stop()
        if self._cleaner is not None:
            await self._cleaner.stop()  # a run stopped midway leaves the old ledger
        for task in list(self._connections - self._busy):
            task.cancel()  # idle: waiting for a request that will not be served
        if self._busy:
            await asyncio.wait(set(self._busy), timeout=self.config.shutdown_grace_s)
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.gather(*self._connections, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
        if self.broker is not None:
            self.broker.close()  # waits for appends in flight
        self.store.flush()
        # Seal what upkeep had not sealed yet, so that a restart finds only whole
        # Parquet segments and the active log (a rolled log would be sealed on the
        # next open anyway; doing it now keeps start-up fast).
        for name in self.store.list_topics():
            for partition in self.store.topic(name).partitions:
                partition.seal_rolled()
        self.store.close()
        log.info("server stopped; everything acknowledged is flushed")

    async def _upkeep_loop(self) -> None:
        assert self.broker is not None
        while True:
            await asyncio.sleep(self.config.upkeep_interval_s)
            self.broker.groups.expire_sessions()
            try:
                # One partition's failure is logged there and the round goes on.
                await self.broker.run_io(self._upkeep_rounds.run_once)
            except Exception:
                log.exception("upkeep failed; retrying in %.1fs", self.config.upkeep_interval_s)
            try:
                await self.cleaner.tick()
            except Exception:
                log.exception("the cleaner's check failed; retrying in %.1fs",
                              self.config.upkeep_interval_s)

    async def _serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        peer = writer.get_extra_info("peername")
        host = peer[0] if isinstance(peer, tuple) else str(peer)
        try:
            await self._connection_loop(reader, writer, host)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client went away
        except ProtocolError as error:
            log.warning("closing connection from %s: %s", peer, error)
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("closing connection from %s after an internal error", peer)
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _connection_loop(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, client_host: str
    ) -> None:
        broker = self.broker
        assert broker is not None
        while True:
            try:
                prefix = await reader.readexactly(4)
            except asyncio.IncompleteReadError as error:
                if not error.partial:
                    return  # the client closed the connection between requests
                raise ProtocolError(
                    f"the client closed the connection after {len(error.partial)} of the "
                    f"4 bytes of a request's length"
                ) from None
            (size,) = _LENGTH.unpack(prefix)
            if size < 0:
                raise ProtocolError(f"negative request length {size}")
            if size > self.config.max_request_bytes:
                raise ProtocolError(
                    f"request of {size} bytes is over the limit of "
                    f"{self.config.max_request_bytes} (max_request_bytes)"
                )
            try:
                frame = await reader.readexactly(size)
            except asyncio.IncompleteReadError as error:
                raise ProtocolError(
                    f"the client closed the connection after {len(error.partial)} of the "
                    f"{size} bytes of a request"
                ) from None
            task = asyncio.current_task()
            assert task is not None
            self._busy.add(task)
            try:
                await self._handle(frame, writer, client_host)
            finally:
                self._busy.discard(task)
            if self._stopping:
                return  # the request in flight is answered; take no more

    async def _handle(self, frame: bytes, writer: asyncio.StreamWriter, client_host: str) -> None:
        broker = self.broker
        assert broker is not None
        request = parse_request(frame, broker.versions)
        if isinstance(request, UnsupportedVersion):
            if request.api_key == API_VERSIONS_KEY:
                writer.write(unsupported_api_versions_response(
                    request.correlation_id, broker.advertised))
                await writer.drain()
                return
            raise ProtocolError(
                f"unsupported API key {request.api_key} version {request.api_version} "
                f"(correlation id {request.correlation_id})"
            )
        api = broker.apis[request.api_key]
        self.metrics.requests.labels(API_NAMES.get(request.api_key, str(request.api_key))).inc()
        response = await api.handler(broker, dataclasses.replace(
            request, client_host=client_host))
        if response is None:
            return
        writer.write(encode_response(request.api_key, request.api_version,
                                     request.correlation_id, response))
        await writer.drain()


async def serve_forever(config: ServerConfig) -> None:
    """Run until SIGTERM or SIGINT, then shut down gracefully."""
    server = Server(config)
    await server.start()
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    print(f"compactlog serving on {config.host}:{server.port}", flush=True)
    if server.admin is not None:
        print(f"compactlog admin on {server.admin.url}", flush=True)
    try:
        await stopping.wait()
    finally:
        log.info("shutting down")
        await server.stop()
