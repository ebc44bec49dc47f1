"""What a client without a credential can make the server spend (issue 25, items 1 and
6), against a real `compactlog serve` with a SASL_PLAINTEXT listener; and that a
connection waiting for request memory is still closed as idle.

Before authentication a client may send only ApiVersions, SaslHandshake and
SaslAuthenticate, in frames of at most 512 KiB (Kafka's sasl.server.max.receive.size).
The API key is read from the header as soon as it arrives, and any other closes the
connection before the body is read or decoded, as Kafka's SaslServerAuthenticator does.
Larger frames are counted against the listener's own allowance
(`queued_max_unauthenticated_bytes`), never the request budget that authenticated
clients share (Kafka reads pre-authentication frames outside its request memory pool).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from datetime import timedelta
from pathlib import Path

from kio.schema.errors import ErrorCode

from support.admin import metrics, sample, wait_until
from support.hostile_support import (
    API_VERSIONS,
    METADATA,
    PRODUCE,
    SASL_AUTHENTICATE,
    TOPIC,
    hostile_server,
    plain_login,
    produce_frame,
)
from support.process_usage import Usage
from support.wire import Wire, request_frame

MIB = 1 << 20


def metadata_frame(names: int, correlation_id: int = 3) -> bytes:
    """A Metadata v1 request naming topic "a" `names` times (3 bytes each)."""
    return request_frame(METADATA, 1, {"topics": [{"name": "a"}] * names}, correlation_id)


def send_quietly(wire: Wire, data: bytes) -> None:
    """Send what the server takes; it may close the connection before the end."""
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        wire.send(data)


def closed_within(wire: Wire, seconds: float) -> bool:
    """True if the server closes the connection within `seconds` (sending nothing)."""
    wire.sock.settimeout(seconds)
    try:
        return wire.is_closed_by_server()
    except TimeoutError:
        return False


# -- item 6: the API key is checked from the header ------------------------------------


def test_an_unauthenticated_frame_of_another_api_is_refused_from_its_header(
        tmp_path: Path) -> None:
    """Three unauthenticated connections each send a 500 KiB Metadata frame (170,000
    topic names). Before: each was read and decoded whole before its API key was
    checked, 0.89 s of server CPU for the three. Now the key is read from the first
    bytes and the connection closed, the rest never read or decoded (0.00 s)."""
    frame = metadata_frame(170_000)
    assert 490_000 < len(frame) < 512 * 1024
    with hostile_server(tmp_path, sasl=True) as hostile:
        mark = hostile.server.mark()
        wires = [Wire(hostile.address("SASL_PLAINTEXT")) for _ in range(3)]
        with Usage(hostile.pid) as usage:
            for wire in wires:
                send_quietly(wire, frame)
            for wire in wires:
                assert closed_within(wire, 10)
                wire.sock.close()
            for wire in wires:
                hostile.server.wait_for_log(
                    rf"closing connection from \('127\.0\.0\.1', {wire.port}\): unexpected "
                    r"Metadata request \(correlation id 3\) before SASL authentication on "
                    r"listener SASL_PLAINTEXT", mark)
        print(f"three 500 KiB Metadata frames before authentication: {usage}")
        assert usage.cpu < 0.2, f"{usage}"
        with Wire(hostile.address("SASL_PLAINTEXT")) as wire:
            plain_login(wire)
            assert wire.call(METADATA, 1, {"topics": []}).brokers


# -- item 1: pre-authentication bytes have their own allowance -------------------------


def authenticate_frame(token_size: int) -> bytes:
    return request_frame(SASL_AUTHENTICATE, 2, {"auth_bytes": b"x" * token_size}, 11)


def test_unauthenticated_frames_do_not_take_the_shared_request_budget(
        tmp_path: Path) -> None:
    """Six connections that never authenticate each send 400 KiB of a 500 KiB
    SaslAuthenticate frame and stop, on a server whose request budget is 1 MiB. Before:
    they took the budget, and a Produce on the PLAINTEXT listener and a new SASL login
    got no answer (timed out after 10 s). Now they hold only their listener's allowance
    (1 MiB here), and both are answered; a login's small frames are never held back."""
    settings = ("max_request_bytes = 1048576\nqueued_max_request_bytes = 1048576\n"
                "queued_max_unauthenticated_bytes = 1048576\n")
    frame = authenticate_frame(500 * 1024)
    with hostile_server(tmp_path, settings, sasl=True, admin=True) as hostile:
        attackers = [Wire(hostile.address("SASL_PLAINTEXT"), source="127.0.0.2")
                     for _ in range(6)]
        try:
            for wire in attackers:
                wire.send(frame[:400 * 1024])
            time.sleep(1.0)  # what the server can take of them, it has taken
            with Wire(hostile.address(), timeout=10) as producer:
                producer.send(produce_frame(1000))
                _, body = producer.response(PRODUCE, 9)
                assert body.responses[0].partition_responses[0].error_code is ErrorCode.none
            with Wire(hostile.address("SASL_PLAINTEXT"), timeout=10) as login:
                plain_login(login)
                assert [t.name for t in login.call(METADATA, 1, {"topics": None}).topics] \
                    == [TOPIC]
            assert sample(metrics(hostile.server),
                          "compactlog_server_request_bytes_in_flight") == 0
        finally:
            for wire in attackers:
                wire.sock.close()
        hostile.server.assert_running()


# -- a connection waiting for request memory is idle too ---------------------------------


class Trickle(threading.Thread):
    """Send `data` one byte every `every` seconds until stopped (a slow loris)."""

    def __init__(self, sock: socket.socket, data: bytes, every: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.sock, self.data, self.every = sock, data, every
        self.stop = threading.Event()

    def run(self) -> None:
        for byte in self.data:
            if self.stop.wait(self.every):
                return
            try:
                self.sock.send(bytes([byte]))
            except OSError:
                return


def test_a_connection_waiting_for_request_memory_is_closed_as_idle(tmp_path: Path) -> None:
    """A slow loris holds most of a 1 MiB request budget and keeps sending a byte every
    0.25 s (as the oldest frame it may read on); a second one sends 300 KiB and then
    trickles too, waiting for memory. Before: the waiting connection was never closed
    (still open after 8 s with connections_max_idle_s = 1.5): waiting for the budget did
    not count as idle, so slow lorises could hold the budget for ever. Now it is closed
    once it has waited connections_max_idle_s."""
    settings = ("max_request_bytes = 1048576\nqueued_max_request_bytes = 1048576\n"
                "connections_max_idle_s = 1.5\n")
    holder_frame = produce_frame(1_000_000, correlation_id=1)
    waiter_frame = produce_frame(500_000, correlation_id=2)
    with hostile_server(tmp_path, settings, admin=True) as hostile, \
            Wire(hostile.address(), source="127.0.0.2") as holder, \
            Wire(hostile.address(), source="127.0.0.3") as waiter:
        holder.send(holder_frame[:950_000])
        wait_until(lambda: sample(metrics(hostile.server),
                                  "compactlog_server_request_bytes_in_flight") > 900_000,
                   "the holder's bytes to be counted", 10)
        holding = Trickle(holder.sock, holder_frame[950_000:])
        holding.start()
        waiter.send(waiter_frame[:300_000])
        waiting = Trickle(waiter.sock, waiter_frame[300_000:])
        waiting.start()
        try:
            wait_until(lambda: sample(metrics(hostile.server),
                                      "compactlog_server_read_paused_seconds_total") > 0,
                       "the waiter to wait for the budget", 10)
            assert closed_within(waiter, 8.0), "the waiting connection was not closed"
            # The holder, reading on, is not idle.
            assert not closed_within(holder, 0.5)
            assert sample(metrics(hostile.server),
                          "compactlog_server_connections_closed_idle_total") == 1
        finally:
            holding.stop.set()
            waiting.stop.set()
        hostile.server.assert_running()


def test_api_versions_and_login_still_work_before_authentication(tmp_path: Path) -> None:
    """The refusals above leave what a client must do first as it was."""
    with hostile_server(tmp_path, sasl=True) as hostile, \
            Wire(hostile.address("SASL_PLAINTEXT")) as wire:
        body = wire.call(API_VERSIONS, 3, {"client_software_name": "t",
                                           "client_software_version": "1"})
        assert body.error_code is ErrorCode.none
        plain_login(wire)
        fetch = wire.call(1, 12, {
            "replica_id": -1, "max_wait": timedelta(milliseconds=10), "min_bytes": 1,
            "max_bytes": MIB, "isolation_level": 0, "session_epoch": -1,
            "topics": [{"topic": TOPIC, "partitions": [
                {"partition": 0, "fetch_offset": 0, "partition_max_bytes": MIB}]}]})
        assert fetch.responses[0].partitions[0].error_code is ErrorCode.none
