"""Client connections: admission against the connection limits, request frames read
under the request memory budget, the idle timeout, and responses written in order.

Invariants:
- An open connection is counted once in `open_count` and once under its client's
  address, from admission until its task ends. A connection over `max_connections` or
  `max_connections_per_ip` is closed at once and never counted (Kafka closes new
  connections over max.connections.per.ip the same way).
- Every byte a connection takes from a request budget goes back when its request has
  been answered or when the connection ends, whichever comes first. An authenticated
  connection's frames count against the shared budget (`queued_max_request_bytes`).
  Before SASL authentication they never do: a frame of one chunk or less is read
  uncounted (it is within the per-connection bound below), and a larger one counts
  against its listener's own allowance (`queued_max_unauthenticated_bytes`), so that
  clients without a credential cannot starve authenticated ones, as Kafka reads
  pre-authentication frames outside its request memory pool.
- Before SASL authentication a frame's API key is checked as soon as its header has
  arrived (security/connection_security.py): a request of another API closes the
  connection before the rest of its frame is read.
- A connection is closed as idle while it waits for its client (for bytes of a
  request, or to take a response) and while it waits for request memory, for
  connections_max_idle_s: a client that holds part of a budget and keeps a byte a
  second coming would otherwise hold it for ever. Never while a request of it is being
  handled (a long-polling Fetch).
- A connection handles its requests one at a time, in order, so responses leave in
  request order, as Kafka clients require.

Memory not counted by the budget is bounded per connection (PER_CONNECTION_BUFFER):
asyncio's StreamReader buffers at most twice STREAM_LIMIT before it stops reading the
socket, one socket read of up to 256 KiB may land on top of that, and one chunk may
wait in hand for the budget.

One concept past 500 lines: a connection's life, from admission to its last response,
with the budget and idle rules that hold across all of it.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import ssl
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from compactlog.log_throttle import Throttle, held_back
from compactlog.server.metrics import ServerMetrics
from compactlog.server.network import listeners
from compactlog.server.network.listeners import Listener
from compactlog.server.network.request_budget import RequestBudget
from compactlog.server.protocol.frame_guard import FrameBytes
from compactlog.server.protocol.messages import ProtocolError, peek_header
from compactlog.server.security.connection_security import Session, check_before_authentication

log = logging.getLogger("compactlog.server")
_LENGTH = struct.Struct(">i")

STREAM_LIMIT = 64 * 1024
CHUNK = 64 * 1024  # frames are read, and counted, in chunks of at most this
_SOCKET_READ = 256 * 1024  # what asyncio's selector transports read at once
PER_CONNECTION_BUFFER = 2 * STREAM_LIMIT + _SOCKET_READ + CHUNK
# Open files kept for the process itself (rolled log segments waiting to be sealed, the
# admin listener, the compaction processes' pipes, libraries) besides data files,
# partitions' active logs and connections, when the open-file limit (RLIMIT_NOFILE) caps
# them: this many, or a quarter of the limit.
FILE_RESERVE = 128
# The largest frame a client may send before it is authenticated on a SASL listener
# (Kafka's sasl.server.max.receive.size default): an anonymous client cannot make the
# server buffer max_request_bytes.
SASL_MAX_RECEIVE = 512 * 1024
_HEADER_SIZE = 8  # api_key, api_version, correlation_id: all the check before SASL needs
# Refused connections and failed accepts come in floods: one line per reason per this.
REFUSAL_LOG_INTERVAL_S = 10.0


@dataclass(frozen=True)
class ConnectionSettings:
    max_connections: int
    max_connections_per_ip: int
    idle_s: float
    max_request_bytes: int
    # Bytes of frames larger than a chunk that a SASL listener's connections may hold
    # before they are authenticated, for every connection of the listener together.
    queued_max_unauthenticated_bytes: int = 8 << 20


def open_file_limit() -> int | None:
    """The soft RLIMIT_NOFILE, or None when unlimited."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft


def data_file_cap(requested: int) -> tuple[int, str | None]:
    """max_open_data_files as the open-file limit allows (a quarter of it at most), and
    why, if it is lower."""
    soft = open_file_limit()
    if soft is None or requested <= max(16, soft // 4):
        return requested, None
    room = max(16, soft // 4)
    return room, (f"max_open_data_files is {room}, not {requested}: the open-file limit "
                  f"(RLIMIT_NOFILE) is {soft}; raise it (ulimit -n) to keep more data "
                  f"files open")


def partition_budget(data_files: int) -> int | None:
    """How many partitions the server may hold open (each keeps its active log file
    open): what the open-file limit leaves after `data_files`, the process' reserve and a
    quarter of the limit kept for connections; None when the limit is unlimited."""
    soft = open_file_limit()
    if soft is None:
        return None
    return max(soft - data_files - min(FILE_RESERVE, soft // 4) - soft // 4, 0)


def connection_cap(requested: int, data_files: int) -> tuple[int, str | None]:
    """max_connections as the open-file limit allows after `data_files` and the process'
    own reserve, and why, if it is lower."""
    soft = open_file_limit()
    if soft is None:
        return requested, None
    reserve = data_files + min(FILE_RESERVE, soft // 4)
    room = max(soft - reserve, 1)
    if requested <= room:
        return requested, None
    return room, (f"max_connections is {room}, not {requested}: the open-file limit "
                  f"(RLIMIT_NOFILE) is {soft}, of which {data_files} are kept for data "
                  f"files and {reserve - data_files} for the process; raise the limit "
                  f"(ulimit -n) to allow more connections")


class Frame:
    """A request frame's bytes, handed over once: the taker holds the only reference,
    so the frame is freed as soon as it is parsed, while its request is handled."""

    __slots__ = ("_data",)

    def __init__(self, data: FrameBytes) -> None:
        self._data = data

    def take(self) -> FrameBytes:
        data, self._data = self._data, b""
        return data


# Answers a request frame of a connection's session with a whole response frame, or None
# when the request gets no response (Produce with acks=0).
Handler = Callable[[Frame, Session], Awaitable[bytes | None]]


def _certificate_principal(writer: asyncio.StreamWriter) -> str | None:
    """The principal of the client certificate of a TLS connection, if it sent one."""
    ssl_object = writer.get_extra_info("ssl_object")
    if ssl_object is None:
        return None
    from compactlog.server.security.tls import certificate_principal

    return certificate_principal(ssl_object.getpeercert(binary_form=True))


class IdleError(Exception):
    """The client sent nothing, or took none of a response, for connections_max_idle_s."""


class _Connection:
    __slots__ = ("budget", "held", "host", "peer", "session")

    def __init__(self, peer: Any, host: str, session: Session) -> None:
        self.peer = peer
        self.host = host
        self.session = session
        self.budget: RequestBudget | None = None  # the one its current frame counts in
        self.held = 0  # bytes of `budget` this connection holds


class Connections:
    def __init__(self, settings: ConnectionSettings, budget: RequestBudget,
                 metrics: ServerMetrics, handle: Handler) -> None:
        self.settings = settings
        self.budget = budget
        self.metrics = metrics
        self._handle = handle
        self._tasks: set[asyncio.Task[None]] = set()
        self._busy: set[asyncio.Task[None]] = set()  # handling a request
        self._per_host: dict[str, int] = {}
        # Each SASL listener's allowance for frames before authentication, by name.
        self._unauthenticated: dict[str, RequestBudget] = {}
        self._floods = Throttle(REFUSAL_LOG_INTERVAL_S)
        # The server side of TLS listeners (server/security/tls.py), set by the server.
        self.tls_context: ssl.SSLContext | None = None
        self.stopping = False
        self._aborting = False  # shutting down, past the grace: close without flushing

    @property
    def open_count(self) -> int:
        return len(self._tasks)

    @property
    def max_connections(self) -> int:
        return self.settings.max_connections

    @property
    def bytes_in_flight(self) -> int:
        return self.budget.in_use

    @property
    def paused_s(self) -> float:
        return self.budget.paused_s

    async def serve(self, listener: Listener | None, reader: asyncio.StreamReader,
                    writer: asyncio.StreamWriter) -> None:
        """One connection of `listener`, from admission to close (asyncio.start_server's
        callback, with the listener bound). A TLS listener's handshake happens here,
        after admission, so that it counts against the connection limits and a failed
        one is logged with its reason."""
        peer = writer.get_extra_info("peername")
        host = peer[0] if isinstance(peer, tuple) else str(peer)
        if self._refused(host):
            writer.close()
            return
        task = asyncio.current_task()
        assert task is not None
        listeners.current.set(listener)  # this task's context: its requests'
        connection = _Connection(peer, host, Session(host, listener))
        self._tasks.add(task)
        self._per_host[host] = self._per_host.get(host, 0) + 1
        hard = False
        try:
            if listener is not None and listener.tls:
                hard = True  # until the handshake is done, nothing is worth flushing
                if not await self._start_tls(connection, listener, writer):
                    return
                hard = False
            await self._converse(connection, reader, writer)
        except IdleError as idle:
            hard = True  # what is left unsent would never be taken
            self.metrics.connections_closed_idle.inc()
            log.debug("closing connection from %s: %s (connections_max_idle_s)", peer, idle)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client went away
        except ssl.SSLError as error:  # a TLS record the client broke: its fault, not ours
            hard = True
            log.info("closing TLS connection from %s: %s", peer, error)
        except ProtocolError as error:
            log.warning("closing connection from %s: %s", peer, error)
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("closing connection from %s after an internal error", peer)
        finally:
            self._give_back(connection)
            self._busy.discard(task)
            try:
                await self._close(writer, hard or self._aborting)
            finally:  # counted until its socket is closed
                self._tasks.discard(task)
                if self._per_host[host] > 1:
                    self._per_host[host] -= 1
                else:
                    del self._per_host[host]

    async def _start_tls(self, connection: _Connection, listener: Listener,
                         writer: asyncio.StreamWriter) -> bool:
        """The TLS handshake; False (after a log line) when it failed."""
        assert self.tls_context is not None, "a TLS listener without a TLS context"
        try:
            await writer.start_tls(self.tls_context,
                                   ssl_handshake_timeout=self.settings.idle_s)
        except (OSError, TimeoutError) as error:  # ssl.SSLError is an OSError
            self.metrics.tls_handshakes_failed.inc()
            held = self._floods.allow("tls")
            if held is not None:
                log.info("TLS handshake from %s on listener %s failed: %s%s",
                         connection.host, listener.name,
                         getattr(error, "verify_message", None) or error or "timed out",
                         held_back(held))
            return False
        principal = _certificate_principal(writer)
        if principal is not None:
            connection.session.principal = principal
            log.info("TLS client certificate from %s on listener %s: %s", connection.host,
                     listener.name, principal)
        return True

    async def close(self, grace_s: float) -> None:
        """Take no more requests; give those in flight `grace_s` to be answered; close
        every connection."""
        self.stopping = True
        for task in self._tasks - self._busy:
            task.cancel()  # waiting for a request that will not be served
        if self._busy:
            await asyncio.wait(set(self._busy), timeout=grace_s)
        self._aborting = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _close(self, writer: asyncio.StreamWriter, hard: bool) -> None:
        """Close after sending what is buffered, unless `hard`, or unless the client
        takes none of it for connections_max_idle_s: a close that waits for a client
        that never reads would hold the connection (and stop a shutdown) for ever."""
        if hard:
            writer.transport.abort()
            return
        writer.close()
        try:
            async with asyncio.timeout(self.settings.idle_s):
                await writer.wait_closed()
        except asyncio.CancelledError:
            writer.transport.abort()
            raise
        except Exception:  # the timeout, or the client went away: nothing to send to
            writer.transport.abort()

    def loop_exception(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """The event loop's exception handler. asyncio survives accept() failing for
        want of files (EMFILE, ENFILE, ENOBUFS, ENOMEM) by pausing the listener for a
        second, but logs a traceback for every connection it could not take; this makes
        that one warning line per interval."""
        error = context.get("exception")
        if (isinstance(error, OSError)
                and str(context.get("message", "")).startswith("socket.accept() out of")):
            held = self._floods.allow("accept")
            if held is not None:
                log.warning("cannot accept connections: %s; retrying each second "
                            "(%d connections open, max_connections %d)%s", error,
                            self.open_count, self.settings.max_connections, held_back(held))
            return
        loop.default_exception_handler(context)

    # -- admission ----------------------------------------------------------------------

    def _refused(self, host: str) -> bool:
        settings = self.settings
        if len(self._tasks) >= settings.max_connections:
            reason, text = "total", (f"{len(self._tasks)} connections are open, the "
                                     f"max_connections limit")
        elif self._per_host.get(host, 0) >= settings.max_connections_per_ip:
            reason, text = "per_ip", (f"{self._per_host[host]} connections from that address "
                                      f"are open, the max_connections_per_ip limit")
        else:
            return False
        self.metrics.connections_refused.labels(reason).inc()
        held = self._floods.allow(reason)
        if held is not None:
            log.warning("refused a connection from %s: %s%s", host, text, held_back(held))
        return True

    # -- requests and responses -----------------------------------------------------------

    async def _converse(self, connection: _Connection, reader: asyncio.StreamReader,
                        writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        while True:
            frame = await self._read_frame(connection, reader)
            if frame is None:
                return  # the client closed the connection between requests
            self._busy.add(task)
            try:
                response = await self._handle(frame, connection.session)
                if response is not None:
                    writer.write(response)
                    del response
                    await self._drain(writer)
                if connection.session.close_after:
                    # answered; closed as Kafka closes it (security/connection_security.py)
                    return
            finally:
                self._busy.discard(task)
                self._give_back(connection)  # the request is answered
            if self.stopping:
                return  # the request in flight is answered; take no more

    async def _read_frame(self, connection: _Connection,
                          reader: asyncio.StreamReader) -> Frame | None:
        prefix = b""
        while len(prefix) < 4:
            data = await self._read_some(reader, 4 - len(prefix))
            if not data:
                if not prefix:
                    return None
                raise ProtocolError(f"the client closed the connection after {len(prefix)} "
                                    f"of the 4 bytes of a request's length")
            prefix += data
        (size,) = _LENGTH.unpack(prefix)
        if size < 0:
            raise ProtocolError(f"negative request length {size}")
        if not connection.session.authenticated and size > SASL_MAX_RECEIVE:
            raise ProtocolError(f"request of {size} bytes before SASL authentication is "
                                f"over the limit of {SASL_MAX_RECEIVE} (Kafka's "
                                f"sasl.server.max.receive.size)")
        if size > self.settings.max_request_bytes:
            raise ProtocolError(f"request of {size} bytes is over the limit of "
                                f"{self.settings.max_request_bytes} (max_request_bytes)")
        budget = connection.budget = self._budget_for(connection.session, size)
        if budget is not None:
            budget.begin_frame(connection)
        try:
            return Frame(await self._read_body(connection, reader, size, budget))
        finally:
            if budget is not None:
                budget.end_frame(connection)

    def _budget_for(self, session: Session, size: int) -> RequestBudget | None:
        """The budget a frame of `size` bytes counts against; None: not counted."""
        if session.authenticated:
            return self.budget
        if size <= CHUNK:
            return None  # within the connection's own buffer bound (module doc)
        name = session.listener.name if session.listener is not None else ""
        budget = self._unauthenticated.get(name)
        if budget is None:
            # The oldest frame may go past it by one frame, so nothing deadlocks.
            budget = self._unauthenticated[name] = RequestBudget(
                self.settings.queued_max_unauthenticated_bytes, SASL_MAX_RECEIVE,
                setting="queued_max_unauthenticated_bytes")
        return budget

    async def _read_body(self, connection: _Connection, reader: asyncio.StreamReader,
                         size: int, budget: RequestBudget | None) -> FrameBytes:
        """The frame's bytes, counted against `budget` chunk by chunk as they arrive
        (a declared length is only a claim). Waiting for the budget, the connection
        reads nothing more, and its socket fills up and stops its client. Before
        authentication the API key is checked once the header is in."""
        session = connection.session
        header_checked = session.authenticated or session.raw_tokens
        whole: bytearray | None = None
        data, got = b"", 0
        while got < size:
            data = await self._read_some(reader, min(CHUNK, size - got))
            if not data:
                raise ProtocolError(f"the client closed the connection after {got} of the "
                                    f"{size} bytes of a request")
            if not header_checked and got + len(data) >= min(size, _HEADER_SIZE):
                head = data if whole is None else bytes(whole) + data[:_HEADER_SIZE]
                api_key, _, correlation_id = peek_header(head)
                check_before_authentication(session, api_key, correlation_id)
                header_checked = True
            if budget is not None:
                await self._acquire(budget, connection, len(data))
                connection.held += len(data)
            got += len(data)
            if whole is not None or got < size:
                whole = bytearray() if whole is None else whole
                whole += data
        if whole is None:
            return data  # one chunk: no copy
        # Read-only, as the protocol decoder wants, without copying a large frame.
        return memoryview(whole).toreadonly()

    async def _acquire(self, budget: RequestBudget, connection: _Connection,
                       size: int) -> None:
        """Take `size` bytes of `budget` for the connection, waiting at most
        connections_max_idle_s for them (then IdleError)."""
        if budget.fits(connection, size):
            await budget.acquire(connection, size)
            return
        deadline = asyncio.timeout(self.settings.idle_s)
        try:
            async with deadline:
                await budget.acquire(connection, size)
        except TimeoutError:
            if not deadline.expired():
                raise
            raise IdleError(f"waited {self.settings.idle_s:g} s for request memory "
                            f"({budget.setting})") from None

    def _give_back(self, connection: _Connection) -> None:
        """Return what the connection holds of its budget (its request is answered, or
        the connection is ending)."""
        budget = connection.budget
        if budget is not None:
            budget.end_frame(connection)
            budget.release(connection.held)
        connection.held = 0

    async def _read_some(self, reader: asyncio.StreamReader, size: int) -> bytes:
        deadline = asyncio.timeout(self.settings.idle_s)
        try:
            async with deadline:
                return await reader.read(size)
        except TimeoutError as error:
            if not deadline.expired():  # the socket's own ETIMEDOUT: the client is gone
                raise ConnectionError(str(error)) from error
            raise IdleError(f"no bytes for {self.settings.idle_s:g} s") from None

    async def _drain(self, writer: asyncio.StreamWriter) -> None:
        """Wait until the client has taken most of the response. A client that takes
        nothing of it for connections_max_idle_s is idle too (its unread response would
        otherwise hold the connection, and its memory, for ever); a slow one that keeps
        taking bytes is not."""
        transport = writer.transport
        while True:
            pending = transport.get_write_buffer_size()
            deadline = asyncio.timeout(self.settings.idle_s)
            try:
                async with deadline:
                    await writer.drain()
                return
            except TimeoutError as error:
                if not deadline.expired():
                    raise ConnectionError(str(error)) from error
                if transport.get_write_buffer_size() >= pending:
                    raise IdleError(f"its client took none of a response for "
                                    f"{self.settings.idle_s:g} s") from None
