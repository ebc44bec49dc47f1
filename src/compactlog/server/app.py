"""The asyncio server: start, dispatch, upkeep and graceful shutdown (its settings are
server/server_config.py's).

Connections (admission, framing under the request memory budget, idle timeout, ordered
responses) are server/network/connections.py's. Each request frame is parsed here and handed to
its API's handler. A frame over DECODE_OFF_LOOP_BYTES is parsed on a thread of its own
(one, so that large decodes queue rather than pile up): the layout walk of a 4 MiB
request naming 1.4 million topics takes over a second of Python, during which the event
loop keeps its turns. (kio's native decoding, about a third of the work, holds the
interpreter lock throughout, so it still stalls the loop for its share.)

A frame that cannot be parsed, or an unsupported API version, closes that connection
after a log line naming the peer and the problem; other connections carry on and
nothing stored is touched.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import functools
import logging
import os
import signal
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from compactlog.errors import DataDirLockedError, UserError
from compactlog.log_throttle import Throttle, held_back
from compactlog.server.admin.http_api import AdminServer
from compactlog.server.broker import Broker
from compactlog.server.cleaner import Cleaner
from compactlog.server.handlers import register_all
from compactlog.server.info import ServerInfo
from compactlog.server.info import remove as remove_server_info
from compactlog.server.metrics import ConnectionCollector, ServerMetrics, StateCollector
from compactlog.server.network.connections import (
    STREAM_LIMIT,
    Connections,
    ConnectionSettings,
    Frame,
    connection_cap,
    data_file_cap,
    partition_budget,
)
from compactlog.server.network.request_budget import RequestBudget
from compactlog.server.protocol.error_codes import error_message
from compactlog.server.protocol.messages import (
    API_NAMES,
    API_VERSIONS_KEY,
    ProtocolError,
    UnsupportedVersion,
    encode_response,
    parse_request,
    response_entries,
    unsupported_api_versions_response,
)
from compactlog.server.security import log_escaping
from compactlog.server.security.authorizer import Authorizer
from compactlog.server.security.connection_security import SaslGate, Session
from compactlog.server.security.credentials import DIRECTORY as CREDENTIALS_DIR
from compactlog.server.security.credentials import CredentialStore
from compactlog.server.security.sasl_mechanisms import FailureDelay
from compactlog.server.security.sasl_users import DECOY_DOCUMENT, SaslUsers, decoy_secret
from compactlog.server.security.tls import ServerTls
from compactlog.server.server_config import ServerConfig
from compactlog.server.upkeep import Upkeep
from compactlog.server.uploads import Uploads
from compactlog.storage import LogStore

log = logging.getLogger("compactlog.server")
T = TypeVar("T")
# Frames larger than this are parsed off the event loop. A frame of a few chunks parses
# in well under a millisecond per 64 KiB of ordinary requests; the thread hop costs
# about a tenth of a millisecond.
DECODE_OFF_LOOP_BYTES = 256 * 1024
# Responses of more array entries than this are encoded off the event loop (kio takes
# about 25 microseconds an entry: 2,000 are 50 ms). A client chooses how many entries
# most responses hold (a DescribeGroups naming 131,072 groups is a 393 KiB request, and
# its response took 3.1 s to encode), and every other connection waits while the loop
# encodes.
ENCODE_OFF_LOOP_ENTRIES = 2_000


class Server:
    def __init__(self, config: ServerConfig) -> None:
        config.check()
        self.config = config
        # Parquet files held open at once (storage/filecache.py), within the open-file
        # limit; connections get what is left of it (network/connections.py).
        self.max_open_data_files, capped = data_file_cap(config.max_open_data_files)
        if capped:
            log.info("%s", capped)
        self.store = self._open_store()
        try:
            self._prepare(config)
        except BaseException:
            self.store.close()  # releases the writer lease: a standby may take over
            raise

    def _prepare(self, config: ServerConfig) -> None:
        # Appends never wait for Parquet: upkeep seals rolled segments in the background.
        self.store.auto_seal = False
        # Each open partition keeps its log file open: creates and opens past what the
        # open-file limit leaves for them are refused (store.py, PartitionBudgetError).
        self.store.max_open_partitions = partition_budget(self.max_open_data_files)
        self._check_partition_budget()
        self.store.max_uncompressed_batch_bytes = config.max_uncompressed_batch_bytes
        self._upkeep_rounds = Upkeep(self.store)
        self._upkeep_failures = Throttle(60.0)
        self.broker: Broker | None = None
        self.metrics = ServerMetrics()
        self._cleaner: Cleaner | None = None
        self.admin: AdminServer | None = None
        self._servers: list[asyncio.Server] = []
        self.listeners = [dataclasses.replace(listener)
                          for listener in config.kafka_listeners()]
        self.tls = ServerTls(config.tls) if config.tls is not None else None
        # The SASL users, in memory: a login never waits for the store (security/sasl_users.py).
        state = self.store.layout.state_document
        self.sasl_users = SaslUsers(CredentialStore(state(CREDENTIALS_DIR)),
                                    decoy_secret(state(DECOY_DOCUMENT)))
        self.sasl = SaslGate(self.sasl_users,
                             FailureDelay(config.sasl_failure_delay_s,
                                          config.sasl_failure_delay_max_s), self.metrics)
        self.connections: Connections | None = None
        self._loop_handler: Any = None  # the event loop's exception handler before ours
        self._decoder = ThreadPoolExecutor(1, thread_name_prefix="compactlog-decode")
        self._upkeep: asyncio.Task[None] | None = None
        self._uploads: asyncio.Task[None] | None = None
        self.port = config.port
        # Set when this server lost its writer lease (another server took over): it
        # serves nothing more, and serve_forever steps it down to stand by again.
        self.lease_lost = asyncio.Event()

    def _check_partition_budget(self) -> None:
        budget = self.store.max_open_partitions
        if budget is None:
            return
        held = self.store.partition_count()
        if held > budget:
            log.warning("the topics hold %d partitions, more than the %d the open-file "
                        "limit (RLIMIT_NOFILE) leaves for them; topics past it cannot be "
                        "opened and are answered with KAFKA_STORAGE_ERROR: raise the limit "
                        "(ulimit -n, LimitNOFILE=)", held, budget)

    def _open_store(self) -> LogStore:
        """Open the store; on an object store whose writer lease another server holds,
        wait as a standby until it is released or expires (backend/lease.py)."""
        config = self.config
        waiting = False
        while True:
            try:
                return LogStore.open(config.data_location or config.data_dir,
                                     max_open_files=self.max_open_data_files,
                                     local_dir=config.data_dir,
                                     lease_ttl_s=config.lease_ttl_s, keep_lease=True)
            except DataDirLockedError as error:
                if config.data_location is None:
                    raise
                if not waiting:
                    log.info("standing by: %s; taking over when its lease ends", error)
                    waiting = True
                time.sleep(max(0.1, config.lease_ttl_s / 3))

    async def start(self) -> None:
        config = self.config
        max_connections, capped = connection_cap(config.max_connections,
                                                 self.max_open_data_files)
        if capped:
            log.info("%s", capped)
        # The oldest frame may go past the budget by up to one request
        # (network/request_budget.py).
        budget = RequestBudget(config.queued_max_request_bytes, config.max_request_bytes)
        self.connections = Connections(
            ConnectionSettings(max_connections, config.max_connections_per_ip,
                               config.connections_max_idle_s, config.max_request_bytes,
                               config.queued_max_unauthenticated_bytes),
            budget, self.metrics, self._handle)
        if self.tls is not None:
            self.connections.tls_context = self.tls.context
        self.metrics.watch(ConnectionCollector(self.connections))
        loop = asyncio.get_running_loop()
        self._loop_handler = loop.get_exception_handler()
        loop.set_exception_handler(self.connections.loop_exception)
        # A small stream buffer: what a connection buffers beyond the budget's count.
        for listener in self.listeners:
            server = await asyncio.start_server(
                functools.partial(self.connections.serve, listener), listener.host,
                listener.port, limit=STREAM_LIMIT)  # TLS: Connections.serve
            self._servers.append(server)
            listener.bound_port = server.sockets[0].getsockname()[1]
        first = self.listeners[0]
        self.port = first.bound_port
        self.broker = Broker(
            self.store, first.advertised[0], self.port,
            initial_rebalance_delay_s=self.config.group_initial_rebalance_delay_s,
            authorization=self.config.authorization,
            allowed_functions=frozenset(self.config.compaction.allowed_strategy_functions),
            fetch_max_bytes=self.config.fetch_max_bytes,
            sasl_users=self.sasl_users,
            session_timeout_bounds_s=(self.config.group_min_session_timeout_s,
                                      self.config.group_max_session_timeout_s),
            max_groups=self.config.max_groups)
        self.broker.metrics = self.metrics
        register_all(self.broker)
        for key in self.broker.apis:  # every API served shows, at 0 until used
            self.metrics.requests.labels(API_NAMES.get(key, str(key)))
        self._cleaner = Cleaner(self.store, self.config.compaction, self.metrics,
                                self.broker.run_io)
        self.metrics.watch(StateCollector(self.store, self.broker.groups, self._cleaner))
        if self.config.admin_host is not None:
            self.admin = AdminServer(
                self, self.config.admin_host, self.config.admin_port,
                self.tls.context if self.config.admin_tls and self.tls is not None else None)
            await self.admin.start()
        self._upkeep = asyncio.create_task(self._upkeep_loop())
        if config.data_location is not None:
            self.broker.uploads = Uploads(config.upload_interval_s, config.ack_after_upload)
            self._uploads = asyncio.create_task(self.broker.uploads.run(self.broker))
        # Where the CLI's write commands find this server (server/info.py).
        plain = [lis for lis in self.listeners if lis.protocol == "PLAINTEXT"]
        kafka = (plain or self.listeners)[0].advertised
        ServerInfo(os.getpid(), f"{kafka[0]}:{kafka[1]}",
                   self.admin.url if self.admin is not None else None,
                   {lis.name: {"protocol": lis.protocol,
                               "address": f"{lis.advertised[0]}:{lis.advertised[1]}"}
                    for lis in self.listeners}).write(self.config.data_dir)
        for listener in self.listeners:
            log.info("serving the Kafka protocol on %s:%d (listener %s, %s%s)",
                     listener.host, listener.bound_port, listener.name, listener.protocol,
                     f", SASL {' '.join(listener.sasl_mechanisms)}" if listener.sasl else "")
        log.info("data in %s; automatic compaction %s", self.config.data_dir,
                 "on" if self.config.compaction.enabled else "off")

    def reload_tls(self) -> None:
        """SIGHUP: read the certificate, key and CA files again, off the event loop
        (server/security/tls.py)."""
        if self.tls is None:
            log.info("SIGHUP: no TLS settings to reload")
            return
        self.tls.reload_in_background()

    @property
    def authorizer(self) -> Authorizer:
        assert self.broker is not None, "the server has not started"
        return self.broker.authorizer

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
        if self.connections is not None:
            self.connections.stopping = True  # each connection ends after its request
        for server in self._servers:
            server.close()
        for task in (self._upkeep, self._uploads):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self.admin is not None:
            await self.admin.stop()
        if self._cleaner is not None:
            await self._cleaner.stop()  # a run stopped midway leaves the old ledger
        if self.connections is not None:
            await self.connections.close(self.config.shutdown_grace_s)
        for server in self._servers:
            await server.wait_closed()
        if self._servers:
            asyncio.get_running_loop().set_exception_handler(self._loop_handler)
        if self.broker is not None:
            self.broker.close()  # waits for appends in flight
        self._decoder.shutdown(wait=True)
        self.store.flush()
        # Seal what upkeep had not sealed yet, so that a restart finds only whole
        # Parquet segments and the active log (a rolled log would be sealed on the
        # next open anyway; doing it now keeps start-up fast).
        if self.store.lease_lost is None:
            self._seal_rolled_at_stop()
        # else: the partitions are another server's now; what this one did not upload
        # is set aside when a writer opens this local directory again (recovery.py).
        remove_server_info(self.config.data_dir)
        lost = self.store.lease_lost is not None
        self.store.close()
        if lost:
            log.info("server stopped; it no longer owned the data (another server took "
                     "the writer lease)")
        else:
            log.info("server stopped; everything acknowledged is flushed")

    def _seal_rolled_at_stop(self) -> None:
        """Seal every open partition's rolled logs; a topic or partition that fails (one
        that could never be opened, a damaged file) is logged and stops nothing: its logs
        stay, and the next start seals them."""
        for name in self.store.list_topics():
            try:
                partitions = self.store.topic(name).partitions
            except Exception as error:
                log.error("stopping: topic %s cannot be opened, so its rolled logs stay "
                          "for the next start: %s", name, error_message(error))
                continue
            for partition in partitions:
                try:
                    partition.seal_rolled()
                except Exception as error:
                    log.error("stopping: sealing %s failed; its logs stay for the next "
                              "start: %s", partition.name, error_message(error))

    async def _upkeep_loop(self) -> None:
        assert self.broker is not None
        while True:
            await asyncio.sleep(self.config.upkeep_interval_s)
            self.broker.groups.expire_sessions()
            try:
                # One partition's failure is logged there and the round goes on.
                await self.broker.run_io(self._upkeep_rounds.run_once)
            except Exception as error:
                self._log_upkeep_failure("upkeep", error)
            if self.store.lease_lost is not None:
                self.lease_lost.set()
                return
            try:
                await self.cleaner.tick()
            except Exception as error:
                self._log_upkeep_failure("the cleaner's check", error)
            try:
                # ACLs committed by `compactlog acls` take effect within one round.
                await self.broker.run_io(self.broker.authorizer.refresh)
            except Exception as error:
                self._log_upkeep_failure("reading the ACLs again (the ones read before stay "
                                         "in force)", error)
            try:
                # So do users added or deleted by `compactlog users`.
                await self.broker.run_io(self.sasl_users.refresh)
            except Exception as error:
                self._log_upkeep_failure("reading the SASL credentials again (the ones "
                                         "read before stay in force)", error)

    def _log_upkeep_failure(self, step: str, error: Exception) -> None:
        """Once a minute per step: an OSError (out of file handles, a full or failing
        disk) in one line, as the partitions' own failures are logged; anything else
        with its traceback, which is a bug."""
        held = self._upkeep_failures.allow(step)
        if held is None:
            return
        retry = f"retrying every {self.config.upkeep_interval_s:.1f}s{held_back(held)}"
        if isinstance(error, OSError):
            log.error("%s failed: %s; %s", step, error, retry)
        else:
            log.error("%s failed; %s", step, retry, exc_info=error)

    async def _handle(self, frame: Frame, session: Session) -> bytes | None:
        """The response frame to one request frame; None: no response (acks=0)."""
        broker = self.broker
        assert broker is not None
        if session.raw_tokens:  # after SaslHandshake v0 (server/security/connection_security.py)
            return await self.sasl.raw_token(session, bytes(frame.take()))
        # The frame is freed once parsed; the budget counts it until the answer is sent.
        data = frame.take()
        if len(data) > DECODE_OFF_LOOP_BYTES:
            request = await asyncio.get_running_loop().run_in_executor(
                self._decoder, parse_request, data, broker.versions)
        else:
            request = parse_request(data, broker.versions)
        del data
        if isinstance(request, UnsupportedVersion):
            if request.api_key == API_VERSIONS_KEY:
                return unsupported_api_versions_response(request.correlation_id,
                                                         broker.advertised)
            raise ProtocolError(
                f"unsupported API key {request.api_key} version {request.api_version} "
                f"(correlation id {request.correlation_id})"
            )
        api = broker.apis[request.api_key]
        self.metrics.requests.labels(API_NAMES.get(request.api_key, str(request.api_key))).inc()
        if not session.authenticated:
            self.sasl.check_allowed(session, request)
            if request.api_key != API_VERSIONS_KEY:
                return encode_response(request.api_key, request.api_version,
                                       request.correlation_id,
                                       await self.sasl.handle(session, request))
        response = await api.handler(broker, dataclasses.replace(
            request, client_host=session.host, principal=session.principal))
        if response is None:
            return None
        if response_entries(response) > ENCODE_OFF_LOOP_ENTRIES:
            return await asyncio.get_running_loop().run_in_executor(
                self._decoder, encode_response, request.api_key, request.api_version,
                request.correlation_id, response)
        return encode_response(request.api_key, request.api_version,
                               request.correlation_id, response)


async def serve_forever(config: ServerConfig) -> None:
    """Run until SIGTERM or SIGINT, then shut down gracefully. On an object store, a
    server that loses its writer lease (another server took over after it stalled past
    the lease) stops serving, closes its connections so that clients go to the new
    owner, and stands by again, to take over when that one's lease ends."""
    log_escaping.install()  # client strings in messages cannot start lines of their own
    while True:
        try:
            lost = await _serve_once(config)
        except Exception as error:
            if not _retry_start(config, error):
                raise
            delay = max(1.0, config.lease_ttl_s / 3)
            log.error("could not start serving %s: %s; standing by, trying again in %.0fs",
                      config.data_location, error_message(error), delay)
            await asyncio.sleep(delay)
            continue
        if not lost:
            return
        log.warning("stepped down: another server holds the writer lease of %s; "
                    "standing by", config.data_location)


def _retry_start(config: ServerConfig, error: Exception) -> bool:
    """Whether a server on an object store that failed to start (a full local disk, the
    bucket failing requests, fenced by a server that took over meanwhile) should stand by
    and try again, as a standby does, rather than exit: not for the user's own mistakes
    (a bad setting, a port in use), which trying again cannot mend.
    test_a_server_that_fails_to_start_on_s3_stands_by_and_tries_again"""
    if config.data_location is None or isinstance(error, UserError):
        return False
    return not (isinstance(error, OSError)
                and error.errno in (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES))


async def _serve_once(config: ServerConfig) -> bool:
    """Serve until a signal (False) or until the writer lease is lost (True)."""
    # Standing by blocks; SIGTERM then ends the process, which holds nothing yet.
    server = Server(config)
    try:
        await server.start()
    except BaseException:
        await _abandon(server)
        raise
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    loop.add_signal_handler(signal.SIGHUP, server.reload_tls)
    first = server.listeners[0]
    print(f"compactlog serving on {first.host}:{first.bound_port}", flush=True)
    if server.admin is not None:
        print(f"compactlog admin on {server.admin.url}", flush=True)
    for listener in server.listeners:
        print(f"compactlog listener {listener.name} ({listener.protocol}) on "
              f"{listener.host}:{listener.bound_port}", flush=True)
    waits = [asyncio.create_task(stopping.wait()), asyncio.create_task(server.lease_lost.wait())]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
        log.info("shutting down" if stopping.is_set() else "lost the writer lease: shutting down")
        await server.stop()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(sig)
    return not stopping.is_set()


async def _abandon(server: Server) -> None:
    """After a failed start: stop what started, and close the store whatever that stop
    meets, so that the writer lease is released (or, if the bucket fails, expires)."""
    try:
        await server.stop()
    except Exception as error:  # the store is closed below all the same
        log.warning("stopping after a failed start: %s", error_message(error))
    finally:
        server.store.close()
