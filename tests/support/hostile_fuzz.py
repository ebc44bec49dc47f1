"""The hostile-client fuzzer of tests/server/test_hostile_fuzz.py (issue 25): request frames
for every API and version a server advertises, with repeated, empty, null, huge and
random fields (kio's schema classes) and raw malformed frames, sent over connections
that never authenticate or that log in as a principal with narrow grants, while a
well-behaved client produces and fetches and the server's memory is sampled.

Everything random comes from one `random.Random(seed)`: the same seed, server settings
and advertised versions give the same frames in the same order, so a failure is
reproduced by running again with FUZZ_SEED=<the seed printed>.

What counts as a server fault (`Findings.faults`): a well-formed request answered with
a frame that is not that API's response at that version (or with another correlation
id), and a request the server neither answers nor closes within `answer_timeout_s`
(HUGE_TIMEOUT_S for a huge one: its cost grows with its size, but is bounded) unless
the request may legitimately wait (a long-polling Fetch, a JoinGroup or SyncGroup
waiting for its group, a Produce with acks=0 that has no response).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import io
import random
import socket
import struct
import threading
import time
import typing
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer

from compactlog.server.protocol.frame_guard import encode_uvarint
from compactlog.storage.records import ProducerRecord, encode_batch
from support.hostile_support import API_VERSIONS, FETCH, PRODUCE, SASL_AUTHENTICATE, SASL_HANDSHAKE
from support.process_usage import peak_rss, rss
from support.security_support import PASSWORD
from support.wire import Wire, request_frame

JOIN_GROUP, SYNC_GROUP = 11, 14
# APIs whose well-formed requests may wait for other clients or for data: no answer
# within the timeout is not a fault for them.
MAY_WAIT = {FETCH, JOIN_GROUP, SYNC_GROUP}
# Names the fuzzer's principal has grants on, mixed into strings so that requests reach
# past the ACL check; the rest are denied.
KNOWN_NAMES = ["t", "g", "alice", "User:alice", "t0000", ""]
HOSTILE_VARINTS = [
    struct.pack(">i", 2**31 - 1), struct.pack(">i", -2), struct.pack(">h", 2**15 - 1),
    b"\xff\xff\xff\xff\x7f", b"\xff\xff\xff\xff\x0f", b"\xff" * 6,
]
_INT_RANGES = {
    "int8": (-(2**7), 2**7 - 1), "int16": (-(2**15), 2**15 - 1),
    "int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1),
    "uint16": (0, 2**16 - 1), "uint32": (0, 2**32 - 1), "uint64": (0, 2**64 - 1),
    "timedelta_i32": (-(2**31), 2**31 - 1),
    "timedelta_i64": (-(2**56), 2**56),  # within what datetime.timedelta holds
}
MALFORMED_TIMEOUT_S = 0.3
HUGE_TIMEOUT_S = 90.0
MODES = ("null", "empty", "full", "repeated", "huge", "random")


def advertised_versions(address: tuple[str, int], source: str | None = None,
                        ) -> dict[int, tuple[int, int]]:
    """API key -> (min, max) version from the live server's ApiVersions v3 answer."""
    with Wire(address, source=source) as wire:
        body = wire.call(API_VERSIONS, 3, {"client_software_name": "fuzz",
                                            "client_software_version": "1"})
    assert body.error_code == ErrorCode.none, body
    return {entry.api_key: (entry.min_version, entry.max_version)
            for entry in body.api_keys}


# -- request bodies from kio's schema classes -----------------------------------------


class Bodies:
    """Random kio request bodies in one of MODES; `huge_bytes` bounds a huge field."""

    def __init__(self, rng: random.Random, huge_bytes: int) -> None:
        self.rng = rng
        self.huge_bytes = huge_bytes

    def body(self, api_key: int, version: int, mode: str) -> Any:
        return self._entity(load_request_schema(api_key, version), mode, top=True)

    def _entity(self, cls: type, mode: str, top: bool = False) -> Any:
        hints = typing.get_type_hints(cls)
        fields = dataclasses.fields(cls)
        # In "huge" mode one field of the top-level entity is the huge one.
        huge_field = (self.rng.choice(fields).name if top and mode == "huge" and fields
                      else None)
        values = {}
        for entry in fields:
            field_mode = mode if mode != "huge" else (
                "huge" if entry.name == huge_field else "full")
            if mode == "random":
                field_mode = self.rng.choice(MODES[:4])
            values[entry.name] = self._value(hints[entry.name], entry, field_mode)
        return cls(**values)

    def _value(self, hint: Any, entry: dataclasses.Field[Any], mode: str) -> Any:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        optional = type(None) in typing.get_args(hint)
        if optional and (mode == "null" or (mode == "random" and self.rng.random() < 0.2)):
            return None
        inner = args[0] if optional and args else hint
        if typing.get_origin(inner) is tuple:
            item = typing.get_args(inner)[0]
            return self._array(item, entry, mode)
        if isinstance(inner, type) and dataclasses.is_dataclass(inner):
            return self._entity(inner, mode)
        return self._scalar(entry.metadata["kafka_type"], mode)

    def _array(self, item: Any, entry: dataclasses.Field[Any], mode: str) -> tuple[Any, ...]:
        def one(item_mode: str) -> Any:
            if isinstance(item, type) and dataclasses.is_dataclass(item):
                return self._entity(item, item_mode)
            return self._scalar(entry.metadata["kafka_type"], item_mode)

        if mode in ("null", "empty"):
            return ()
        if mode == "full":
            return tuple(one("full") for _ in range(self.rng.randint(1, 3)))
        if mode == "repeated":  # the same entry many times (Kafka keys most in a map)
            return (one("full"),) * self.rng.choice([2, 16, 300])
        if mode == "huge":
            element = one("full")
            size = max(_encoded_size(element), 1)
            return (element,) * max(1, self.huge_bytes // size)
        return tuple(one("random") for _ in range(self.rng.choice([0, 1, 2, 5])))

    def _scalar(self, kafka_type: str, mode: str) -> Any:
        rng = self.rng
        if kafka_type in _INT_RANGES:
            low, high = _INT_RANGES[kafka_type]
            if mode in ("null", "empty"):
                number = 0
            elif mode == "huge":
                number = high
            else:
                number = rng.choice([0, 1, -1, 2, 100, low, high, rng.randint(low, high)])
                number = min(max(number, low), high)
            if kafka_type.startswith("timedelta"):
                return datetime.timedelta(milliseconds=number)
            return number
        if kafka_type == "bool":
            return mode not in ("null", "empty") and rng.random() < 0.5
        if kafka_type == "float64":
            return rng.choice([0.0, -1.0, 1e308, float("nan"), float("inf")])
        if kafka_type == "error_code":
            return rng.choice(list(ErrorCode))
        if kafka_type == "uuid":
            return rng.choice([uuid.UUID(int=0), uuid.UUID(int=rng.getrandbits(128))])
        if kafka_type == "string":
            if mode in ("null", "empty"):
                return ""
            if mode == "huge":
                return "a" * min(self.huge_bytes, 32_000)  # int16 lengths below v-flexible
            return rng.choice([*KNOWN_NAMES, "x" * rng.randint(1, 300), "../../etc",
                               "a\nERROR forged line", "\u00e9\u4e2d\U0001f600", "\x00"])
        if kafka_type in ("bytes", "records"):
            if mode in ("null", "empty"):
                return b""
            if mode == "huge":
                return bytes(rng.getrandbits(8) for _ in range(64)) * max(
                    1, self.huge_bytes // 64)
            return rng.choice([b"", rng.randbytes(rng.randint(1, 200)), _valid_batch(),
                               _valid_batch()[:-3], b"\0PLAIN\0x"])
        raise TypeError(f"the fuzzer has no values for kio type {kafka_type!r}")


def _valid_batch() -> bytes:
    return bytes(encode_batch([ProducerRecord(b"k", b"v"), ProducerRecord(b"k2", None)], 0))


def _encoded_size(element: Any) -> int:
    """About how many bytes `element` takes in a frame."""
    if isinstance(element, str):
        return len(element.encode()) + 2
    if isinstance(element, bytes):
        return len(element) + 4
    if not dataclasses.is_dataclass(element):
        return 8
    out = io.BytesIO()
    entity_writer(type(element))(out, element)
    return len(out.getvalue())


def encode(body: Any, correlation_id: int, client_id: str | None = "fuzz") -> bytes:
    """A request frame of kio `body`, length prefix included."""
    return request_frame(body.__api_key__, body.__version__, body, correlation_id,
                         client_id)


# -- raw malformed frames --------------------------------------------------------------


def malformed(frame: bytes, rng: random.Random, flexible: bool) -> tuple[str, bytes]:
    """(kind, bytes) of a damaged version of the well-formed `frame` (prefix included).
    Kinds "long" claim more bytes than they send: the sender abandons the connection."""
    body = frame[4:]
    kinds = ["truncated", "short_length", "long", "negative_length", "huge_length",
             "flip", "hostile_length", "garbage", "bad_version", "bad_api"]
    if flexible:
        kinds += ["garbage_tags", "bad_compact_length"]
    kind = rng.choice(kinds)
    prefix = struct.Struct(">i")
    if kind == "truncated":
        cut = body[:rng.randint(0, max(len(body) - 1, 0))]
        return kind, prefix.pack(len(cut)) + cut
    if kind == "short_length":  # the rest of the frame is read as a next, garbled, frame
        return kind, prefix.pack(rng.randint(0, len(body))) + body
    if kind == "long":
        return kind, prefix.pack(len(body) + rng.randint(1, 1000)) + body
    if kind == "negative_length":
        return kind, prefix.pack(rng.choice([-1, -(2**31)])) + body
    if kind == "huge_length":
        return kind, prefix.pack(2**31 - 1) + body[:100]
    if kind == "flip":
        data = bytearray(body)
        for _ in range(rng.randint(1, 8)):
            if data:
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        return kind, prefix.pack(len(data)) + bytes(data)
    if kind in ("hostile_length", "bad_compact_length"):
        value = (rng.choice(HOSTILE_VARINTS) if kind == "hostile_length"
                 else rng.choice([b"\xff\xff\xff\xff\x0f", b"\xff" * 6, b"\x80\x80\x80\x80\x80",
                                  encode_uvarint(rng.randint(2, 2**31))]))
        at = rng.randint(8, max(len(body), 8))
        data = body[:at] + value + body[at + (len(value) if rng.random() < 0.5 else 0):]
        return kind, prefix.pack(len(data)) + data
    if kind == "garbage":
        data = body[:8] + rng.randbytes(rng.randint(0, 400))
        return kind, prefix.pack(len(data)) + data
    if kind == "bad_version":
        data = body[:2] + struct.pack(">h", rng.choice([-1, 99, 2**15 - 1])) + body[4:]
        return kind, prefix.pack(len(data)) + data
    if kind == "bad_api":
        data = struct.pack(">h", rng.choice([-1, 99, 1000, 2**15 - 1])) + body[2:]
        return kind, prefix.pack(len(data)) + data
    # garbage_tags: a tag section of random tags and sizes in place of the body's last
    # (empty) one, or after the header's client id.
    tags = rng.randint(1, 3)
    section = encode_uvarint(rng.choice([tags, 2**31])) + b"".join(
        encode_uvarint(rng.randint(0, 2**31)) + encode_uvarint(rng.choice([0, 4, 2**30]))
        + rng.randbytes(4) for _ in range(tags))
    data = body[:-1] + section if rng.random() < 0.5 else body + section
    return "garbage_tags", prefix.pack(len(data)) + data


# -- connections, outcomes and findings -------------------------------------------------


@dataclass
class Findings:
    sent: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    kinds: Counter[str] = field(default_factory=Counter)  # "where mode outcome"
    faults: list[str] = field(default_factory=list)
    waited: list[str] = field(default_factory=list)  # requests that may wait, and did
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, outcome: str) -> None:
        with self.lock:
            self.sent += 1
            self.outcomes[outcome] += 1

    def count_kind(self, kind: str) -> None:
        with self.lock:
            self.kinds[kind] += 1

    def fault(self, text: str) -> None:
        with self.lock:
            if len(self.faults) < 50:
                self.faults.append(text)


class FuzzConnection:
    """A connection the fuzzer sends on: before authentication (`login` None) or logged
    in with SASL/PLAIN as `login`; reopened whenever the server closes it."""

    def __init__(self, address: tuple[str, int], source: str, login: str | None,
                 answer_timeout_s: float) -> None:
        self.address = address
        self.source = source
        self.login = login
        self.answer_timeout_s = answer_timeout_s
        self.wire: Wire | None = None

    def _open(self) -> Wire:
        if self.wire is None:
            wire = Wire(self.address, timeout=30, source=self.source)
            if self.login is not None:
                handshake = wire.call(SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"})
                assert handshake.error_code == 0, handshake
                answer = wire.call(SASL_AUTHENTICATE, 2, {
                    "auth_bytes": b"\0" + self.login.encode() + b"\0" + PASSWORD.encode()})
                assert answer.error_code == 0, answer
            self.wire = wire
        return self.wire

    def close(self) -> None:
        if self.wire is not None:
            self.wire.sock.close()
            self.wire = None

    def exchange(self, frame: bytes, timeout_s: float | None = None,
                 ) -> tuple[str, bytes | None]:
        """Send `frame`; ("answered", response frame), ("closed", None) or
        ("silent", None) when nothing came within `timeout_s` (default
        `answer_timeout_s`; the connection is then dropped, as a client would)."""
        wire = self._open()
        try:
            wire.sock.settimeout(30)
            wire.send(frame)
            wire.sock.settimeout(timeout_s or self.answer_timeout_s)
            (size,) = struct.unpack(">i", wire.read_exactly(4))
            wire.sock.settimeout(30)
            return "answered", wire.read_exactly(size)
        except TimeoutError:
            self.close()
            return "silent", None
        except (ConnectionError, OSError):
            self.close()
            return "closed", None

    def abandon(self, frame: bytes) -> None:
        """Send `frame`, which claims more bytes than it holds, and hang up."""
        wire = self._open()
        with contextlib.suppress(OSError):
            wire.send(frame)
        self.close()


def check_answer(api_key: int, version: int, correlation_id: int, response: bytes,
                 advertised: dict[int, tuple[int, int]]) -> str | None:
    """Why `response` is not a `version` response of `api_key` to `correlation_id`."""
    if api_key == API_VERSIONS and not (advertised[API_VERSIONS][0] <= version
                                        <= advertised[API_VERSIONS][1]):
        version = 0  # KIP-511: an unknown ApiVersions version gets the v0 answer
    try:
        schema = load_response_schema(api_key, version)
        header, used = entity_reader(schema.__header_schema__)(response, 0)
        _, size = entity_reader(schema)(response, used)
    except Exception as error:
        return f"undecodable response: {type(error).__name__}: {error}"
    if header.correlation_id != correlation_id:
        return f"correlation id {header.correlation_id}, sent {correlation_id}"
    if used + size != len(response):
        return f"{len(response) - used - size} trailing bytes"
    return None


def fuzz_pass(connection: FuzzConnection, advertised: dict[int, tuple[int, int]],
              rng: random.Random, findings: Findings, huge_bytes: int,
              modes: tuple[str, ...], malformed_per_version: int,
              stop: Callable[[], bool]) -> None:
    """Every advertised API at every version (and one past its range): one request per
    mode, then `malformed_per_version` malformed frames."""
    bodies = Bodies(rng, huge_bytes)
    where = "authenticated" if connection.login else "unauthenticated"
    for api_key, (low, high) in sorted(advertised.items()):
        for version in range(low, high + 1):
            try:
                load_request_schema(api_key, version)
            except Exception:
                # (Produce below v3, advertised for old librdkafka): a header and
                # garbage, which must be refused by closing.
                outcome, response = connection.exchange(
                    struct.pack(">ihhi", 8 + 40, api_key, version, 3) + rng.randbytes(40))
                findings.count(outcome)
                if outcome != "closed":
                    findings.fault(f"{where} api {api_key} v{version} (no schema): "
                                   f"{outcome}")
                continue
            for mode in modes:
                if stop():
                    return
                correlation_id = rng.randint(-(2**31), 2**31 - 1)
                try:
                    body = bodies.body(api_key, version, mode)
                    frame = encode(body, correlation_id,
                                   rng.choice(["fuzz", None, "", "c" * 300]))
                except (struct.error, ValueError, OverflowError, TypeError):
                    continue  # a value kio cannot write (out of its type's range)
                expects_none = api_key == PRODUCE and getattr(body, "acks", 1) == 0
                # A huge request costs in proportion (a DescribeGroups of 349,000
                # names takes 20 s here): it is given longer, not excused.
                outcome, response = connection.exchange(
                    frame, MALFORMED_TIMEOUT_S if expects_none
                    else HUGE_TIMEOUT_S if mode == "huge" else None)
                findings.count(outcome)
                findings.count_kind(f"{where} {mode} {outcome}")
                label = f"{where} api {api_key} v{version} {mode} ({len(frame)} bytes)"
                if outcome == "answered" and response is not None:
                    problem = check_answer(api_key, version, correlation_id, response,
                                           advertised)
                    if problem is not None:
                        findings.fault(f"{label}: {problem}")
                elif outcome == "silent" and (api_key in MAY_WAIT or expects_none):
                    findings.waited.append(label)
                elif outcome == "silent":
                    findings.fault(f"{label}: no answer in time")
            template = encode(Bodies(rng, 0).body(api_key, version, "full"), 1)
            flexible = bool(load_request_schema(api_key, version).__flexible__)
            for _ in range(malformed_per_version):
                if stop():
                    return
                kind, frame = malformed(template, rng, flexible)
                if kind == "long":
                    connection.abandon(frame)
                    findings.count("abandoned")
                    continue
                # A damaged length may leave the server waiting for bytes that never
                # come: silence is no fault here, so it is not waited for long.
                outcome, _ = connection.exchange(frame, MALFORMED_TIMEOUT_S)
                findings.count(outcome)
            # One version past the range: refused (closed), never served.
            if stop():
                return
            outcome, _ = connection.exchange(
                struct.pack(">i", 8) + struct.pack(">hhi", api_key, high + 1, 5))
            findings.count(outcome)
            if outcome != ("answered" if api_key == API_VERSIONS else "closed"):  # KIP-511
                findings.fault(f"{where} api {api_key} v{high + 1} (past the range): "
                               f"{outcome}")


# -- the well-behaved client and the memory sampler ------------------------------------


class GoodClient(threading.Thread):
    """Produces one record to `topic` and fetches from offset 0, in a loop, over its own
    connection; keeps each request's latency in seconds."""

    def __init__(self, address: tuple[str, int], topic: str) -> None:
        super().__init__(daemon=True)
        self.address = address
        self.topic = topic
        self.latencies: list[float] = []
        self.errors: list[str] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        try:
            with Wire(self.address, timeout=60) as wire:
                number = 0
                while not self.stopping.is_set():
                    number += 1
                    self.round(wire, number)
                    time.sleep(0.01)
        except Exception as error:
            self.errors.append(f"{type(error).__name__}: {error}")

    def round(self, wire: Wire, number: int) -> None:
        """One Produce and one Fetch, each timed."""
        self._timed(wire, PRODUCE, 9, {
                        "acks": -1, "timeout": datetime.timedelta(seconds=30),
                        "topic_data": [{"name": self.topic, "partition_data": [
                            {"index": 0, "records": bytes(encode_batch(
                                [ProducerRecord(b"k%d" % (number % 10), b"v")], 0))}]}]},
                        number)
        self._timed(wire, FETCH, 12, {
            "replica_id": -1, "max_wait": datetime.timedelta(0), "min_bytes": 1,
            "max_bytes": 1 << 20, "session_epoch": -1,
            "topics": [{"topic": self.topic, "partitions": [
                {"partition": 0, "fetch_offset": max(number - 20, 0),
                 "current_leader_epoch": -1, "log_start_offset": -1,
                 "partition_max_bytes": 1 << 20}]}]}, number)

    def _timed(self, wire: Wire, api_key: int, version: int, fields: dict[str, Any],
               correlation_id: int) -> None:
        started = time.monotonic()
        body = wire.call(api_key, version, fields, correlation_id)
        self.latencies.append(time.monotonic() - started)
        codes = ([part.error_code for topic in body.responses
                  for part in getattr(topic, "partition_responses", None)
                  or getattr(topic, "partitions", ())])
        if any(code != ErrorCode.none for code in codes):
            self.errors.append(f"api {api_key}: {codes}")


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(len(ordered) * fraction), len(ordered) - 1)] if ordered else 0.0


class MemorySampler(threading.Thread):
    """The largest VmRSS seen every `interval_s`; VmHWM is read at the end too."""

    def __init__(self, pid: int, interval_s: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.interval_s = interval_s
        self.largest = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(self.interval_s):
            try:
                self.largest = max(self.largest, rss(self.pid))
            except OSError:  # the process is gone: the test says so
                return

    def peak(self) -> int:
        try:
            return max(self.largest, peak_rss(self.pid))
        except OSError:
            return self.largest


def loopback_source(number: int) -> str:
    """A loopback address of its own (127.0.0.N) for one kind of fuzzing connection, so
    that per-address throttles (failed logins) do not slow the others."""
    assert socket.inet_aton(f"127.0.0.{number}")
    return f"127.0.0.{number}"
