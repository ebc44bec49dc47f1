"""Fuzzing the request decoder and the response encoder (server/protocol/messages.py), and the
server's framing over a socket.

- `parse_request` on arbitrary bytes and on damaged valid frames (bit flips, cuts,
  insertions, hostile lengths, whole other requests spliced in) returns a Request or an
  UnsupportedVersion or raises ProtocolError: never another exception, never a hang,
  and never a dead process (kio reserves memory for an array's declared count, so one
  hostile count used to abort the interpreter; the sweep runs in a subprocess so that
  such a regression fails cleanly).
- Every served (API, version) round-trips: kio encodes a request, parse_request gives
  back the same header and body, also with unknown tagged fields added.
- `encode_response` turns what the real handlers return, and an empty dict, into every
  served version of the response, and kio reads it back.
- Random frames sent to a running server leave it serving.

Hypothesis runs are bounded (max_examples, no deadline) so that the file takes seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time
import typing
import uuid
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader
from kio.static.primitive import Records

from compactlog.server.broker import Broker
from compactlog.server.handlers import register_all
from compactlog.server.protocol.frame_guard import encode_uvarint
from compactlog.server.protocol.messages import (
    ProtocolError,
    Request,
    UnknownFieldError,
    UnsupportedVersion,
    build,
    encode_response,
    parse_request,
)
from compactlog.storage.records import ProducerRecord, encode_batch
from compactlog.storage.store import LogStore
from support.kafka_server import logged_server
from support.paths import TESTS_DIR
from support.wire import Wire, encode_request

HERE = Path(__file__).parent  # this module's folder, for the child's `import test_protocol_fuzz`
# kio's `records` fields are a bytes subtype that Hypothesis cannot build by itself.
st.register_type_strategy(Records, st.binary(max_size=80).map(Records))


def served_table() -> dict[int, tuple[int, int]]:
    """API key -> (min, max) version, as the server advertises it, without a server."""
    with tempfile.TemporaryDirectory() as directory, LogStore.open(Path(directory)) as store:
        broker = Broker(store, "127.0.0.1", 9092)
        try:
            register_all(broker)
            return dict(broker.versions)
        finally:
            broker.close()


TABLE = served_table()
SERVED = [(key, version) for key, (low, high) in sorted(TABLE.items())
          for version in range(low, high + 1)]
FUZZ = settings(deadline=None, suppress_health_check=list(HealthCheck))


# -- bodies with one of everything -------------------------------------------------------

_SAMPLES: dict[str, Any] = {
    "int8": 1, "int16": 1, "int32": 1, "int64": 1, "uint16": 1, "uint32": 1, "uint64": 1,
    "float64": 1.0, "bool": True, "string": "x", "bytes": b"x", "records": b"x",
    "uuid": uuid.UUID(int=1), "error_code": ErrorCode.none,
    "timedelta_i32": datetime.timedelta(milliseconds=1),
    "timedelta_i64": datetime.timedelta(milliseconds=1),
}


def filled(cls: type) -> Any:
    """`cls` with every field set, every array holding one element and every tagged
    field off its default: a frame where every length and count of the schema occurs."""
    hints = typing.get_type_hints(cls)
    values = {}
    for field in dataclasses.fields(cls):
        hint = hints[field.name]
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        inner = args[0] if args and typing.get_origin(hint) is not tuple else hint
        if typing.get_origin(inner) is tuple:
            item = typing.get_args(inner)[0]
            values[field.name] = ((filled(item),) if isinstance(item, type)
                                  and dataclasses.is_dataclass(item)
                                  else (_SAMPLES[field.metadata["kafka_type"]],))
        elif isinstance(inner, type) and dataclasses.is_dataclass(inner):
            values[field.name] = filled(inner)
        else:
            values[field.name] = _SAMPLES[field.metadata["kafka_type"]]
    return cls(**values)


@pytest.mark.parametrize(("api_key", "version"), SERVED)
def test_every_served_version_round_trips(api_key: int, version: int) -> None:
    schema = load_request_schema(api_key, version)
    for body, client_id in [(filled(schema), "client"), (build(schema, {}), None)]:
        request = parse_request(encode_request(body, 123, client_id), TABLE)
        assert isinstance(request, Request)
        assert (request.api_key, request.api_version, request.correlation_id,
                request.client_id, request.body) == (api_key, version, 123, client_id, body)


# -- hostile values at every position, in a subprocess -----------------------------------

HOSTILE = [
    struct.pack(">i", 2**31 - 1),  # a legacy array or bytes length
    struct.pack(">i", -2),
    struct.pack(">h", 2**15 - 1),  # a legacy string length
    b"\xff\xff\xff\xff\x7f",  # the largest 5-byte unsigned varint: 2**35 - 1
    b"\xff\xff\xff\xff\x0f",  # 2**32 - 1
    b"\xff" * 6,  # a varint that never ends
]


def hostile_sweep() -> int:
    """Put each HOSTILE value at every byte of a filled request of every served version,
    overwriting and inserting; every parse must return or raise ProtocolError. Runs in
    a subprocess (see the test); returns the number of frames parsed."""
    parsed = 0
    for api_key, version in SERVED:
        frame = encode_request(filled(load_request_schema(api_key, version)))
        for position in range(8, len(frame)):
            for value in HOSTILE:
                for damaged in (frame[:position] + value + frame[position + len(value):],
                                frame[:position] + value + frame[position:]):
                    with contextlib.suppress(ProtocolError):
                        parse_request(damaged, TABLE)
                    parsed += 1
    return parsed


def test_hostile_lengths_at_every_position_never_kill_the_process() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(HERE), str(TESTS_DIR), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(
        [sys.executable, "-c", "import test_protocol_fuzz as t; print(t.hostile_sweep())"],
        capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, (
        f"the decoder killed the process (exit {done.returncode}):\n{done.stderr[-3000:]}")
    assert int(done.stdout.split()[-1]) > 10_000


# -- Hypothesis: arbitrary and damaged frames --------------------------------------------

def check_parse(frame: bytes) -> None:
    started = time.monotonic()
    try:
        result = parse_request(frame, TABLE)
    except ProtocolError:
        result = None
    assert time.monotonic() - started < 2.0, "parse_request took too long"
    assert result is None or isinstance(result, Request | UnsupportedVersion)


@st.composite
def requests(draw: st.DrawFn) -> tuple[Any, int, str | None]:
    """(kio request body of a served version, correlation id, client id)."""
    api_key, version = draw(st.sampled_from(SERVED))
    body = draw(st.from_type(load_request_schema(api_key, version)))
    correlation_id = draw(st.integers(-(2**31), 2**31 - 1))
    client_id = draw(st.none() | st.text(max_size=20))
    return body, correlation_id, client_id


@settings(FUZZ, max_examples=300)
@given(st.binary(max_size=300))
def test_parse_request_on_arbitrary_bytes(frame: bytes) -> None:
    check_parse(frame)


@settings(FUZZ, max_examples=300)
@given(st.sampled_from(SERVED), st.integers(-(2**31), 2**31 - 1), st.binary(max_size=200))
def test_parse_request_on_a_served_header_then_arbitrary_bytes(
        served: tuple[int, int], correlation_id: int, rest: bytes) -> None:
    check_parse(struct.pack(">hhi", *served, correlation_id) + rest)


mutations = st.lists(st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 1 << 16), st.integers(0, 7)),
    st.tuples(st.just("cut"), st.integers(0, 1 << 16)),
    st.tuples(st.just("insert"), st.integers(0, 1 << 16), st.binary(min_size=1, max_size=8)),
    st.tuples(st.just("hostile"), st.integers(0, 1 << 16), st.sampled_from(HOSTILE),
              st.booleans()),
    st.tuples(st.just("splice"), st.integers(0, 1 << 16), requests()),
), min_size=1, max_size=4)


def mutate(frame: bytes, changes: list[Any]) -> bytes:
    data = bytearray(frame)
    for change in changes:
        at = change[1] % (len(data) + 1)
        if change[0] == "flip" and data:
            data[at % len(data)] ^= 1 << change[2]
        elif change[0] == "cut":
            del data[at:]
        elif change[0] == "insert":
            data[at:at] = change[2]
        elif change[0] == "hostile":
            data[at:at + (len(change[2]) if change[3] else 0)] = change[2]
        elif change[0] == "splice":  # a whole other request, header and all
            data[at:at] = encode_request(*change[2])
    return bytes(data)


@settings(FUZZ, max_examples=400)
@given(requests(), mutations)
def test_parse_request_on_damaged_frames(request: tuple[Any, int, str | None],
                                         changes: list[Any]) -> None:
    check_parse(mutate(encode_request(*request), changes))


# -- Hypothesis: round trips -------------------------------------------------------------


unknown_tags = st.lists(st.tuples(st.integers(0, 2**31 - 1), st.binary(max_size=10)),
                        min_size=1, max_size=3)


def tag_section(tags: list[tuple[int, bytes]]) -> bytes:
    return encode_uvarint(len(tags)) + b"".join(
        encode_uvarint(tag) + encode_uvarint(len(data)) + data for tag, data in tags)


@settings(FUZZ, max_examples=250)
@given(requests(), unknown_tags, unknown_tags)
def test_requests_round_trip(request: tuple[Any, int, str | None],
                             header_tags: list[tuple[int, bytes]],
                             body_tags: list[tuple[int, bytes]]) -> None:
    body, correlation_id, client_id = request
    frame = encode_request(body, correlation_id, client_id)
    parsed = parse_request(frame, TABLE)
    assert isinstance(parsed, Request)
    assert (parsed.api_key, parsed.api_version, parsed.correlation_id, parsed.client_id,
            parsed.body) == (body.__api_key__, body.__version__, correlation_id, client_id,
                             body)
    if not body.__flexible__:
        return
    # Tagged fields the schema does not know are skipped (a newer client may send them):
    # in the header, after the client id, and at the end of the body when the body has
    # no tagged fields of its own (its tag count is then the frame's last byte, 0).
    after_client_id = 10 + (len(client_id.encode()) if client_id is not None else 0)
    assert frame[after_client_id] == 0
    frame = frame[:after_client_id] + tag_section(header_tags) + frame[after_client_id + 1:]
    if not any("tag" in f.metadata for f in dataclasses.fields(body)):
        assert frame[-1] == 0
        frame = frame[:-1] + tag_section(body_tags)
    parsed = parse_request(frame, TABLE)
    assert isinstance(parsed, Request)
    assert (parsed.correlation_id, parsed.client_id, parsed.body) == (
        correlation_id, client_id, body)


# -- responses: what the handlers return, in every served version ------------------------

def produce_records() -> bytes:
    return bytes(encode_batch([ProducerRecord(b"k", b"v"), ProducerRecord(b"k2", None)], 0))


# One plausible request per API, as a version-neutral dict (build drops what a version
# lacks); APIs not listed get build's neutral values.
SAMPLE_REQUESTS: dict[int, dict[str, Any]] = {
    0: {"acks": -1, "timeout": datetime.timedelta(seconds=5), "topic_data": [
        {"name": "t", "partition_data": [{"index": 0, "records": produce_records()},
                                         {"index": 9, "records": b"junk"}]},
        {"name": "missing", "partition_data": [{"index": 0, "records": b""}]}]},
    1: {"replica_id": -1, "max_wait": datetime.timedelta(0), "min_bytes": 1,
        "max_bytes": 1 << 20, "session_epoch": -1, "topics": [
            {"topic": "t", "partitions": [
                {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20},
                {"partition": 1, "fetch_offset": 99, "partition_max_bytes": 1 << 20}]},
            {"topic": "missing", "partitions": [
                {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}]}]},
    2: {"replica_id": -1, "topics": [{"name": "t", "partitions": [
        {"partition_index": 0, "timestamp": -2}, {"partition_index": 1, "timestamp": -1},
        {"partition_index": 0, "timestamp": 0}, {"partition_index": 7, "timestamp": -1}]}]},
    3: {"topics": [{"name": "t"}, {"name": "missing"}], "allow_auto_topic_creation": False},
    8: {"group_id": "g", "generation_id_or_member_epoch": -1, "member_id": "",
        "topics": [{"name": "t", "partitions": [
            {"partition_index": 0, "committed_offset": 1, "committed_metadata": "m"}]}]},
    9: {"group_id": "g", "topics": [{"name": "t", "partition_indexes": [0, 1]}],
        "groups": [{"group_id": "g", "topics": None}]},
    10: {"key": "g", "key_type": 0, "coordinator_keys": ["g", "h"]},
    11: {"group_id": "j", "session_timeout": datetime.timedelta(seconds=10),
         "rebalance_timeout": datetime.timedelta(seconds=10), "member_id": "",
         "protocol_type": "consumer", "protocols": [{"name": "range", "metadata": b""}]},
    12: {"group_id": "j", "generation_id": 1, "member_id": "nobody"},
    13: {"group_id": "j", "member_id": "nobody", "members": [{"member_id": "nobody"}]},
    14: {"group_id": "j", "generation_id": 1, "member_id": "nobody",
         "protocol_type": "consumer", "protocol_name": "range", "assignments": []},
    15: {"groups": ["g", "j", "none"]},
    16: {},
    18: {"client_software_name": "fuzz", "client_software_version": "1"},
    19: {"topics": [{"name": "new", "num_partitions": 2, "replication_factor": 1,
                     "configs": [{"name": "cleanup.policy", "value": "compact"}]},
                    {"name": "t", "num_partitions": 1, "replication_factor": 1},
                    {"name": "bad", "num_partitions": 1, "replication_factor": 1,
                     "configs": [{"name": "segment.bytes", "value": "tiny"}]}],
         "timeout": datetime.timedelta(seconds=5), "validate_only": True},
    20: {"topic_names": ["missing"], "topics": [{"name": "missing"}],
         "timeout": datetime.timedelta(seconds=5)},
    32: {"resources": [{"resource_type": 2, "resource_name": "t",
                        "configuration_keys": None},
                       {"resource_type": 2, "resource_name": "missing",
                        "configuration_keys": ["retention.ms"]}]},
    44: {"resources": [{"resource_type": 2, "resource_name": "t", "configs": [
        {"name": "retention.ms", "config_operation": 0, "value": "60000"}]}],
        "validate_only": True},
}


@cache
def handler_responses() -> dict[tuple[int, int], dict[str, Any] | None]:
    """What each handler returns for SAMPLE_REQUESTS[api] at every served version."""
    async def run(directory: Path) -> dict[tuple[int, int], dict[str, Any] | None]:
        with LogStore.open(directory) as store:
            store.create_topic("t", 2)
            store.append("t", [ProducerRecord(b"a", b"1"), ProducerRecord(b"b", b"2")])
            broker = Broker(store, "127.0.0.1", 9092, initial_rebalance_delay_s=0.0)
            register_all(broker)
            try:
                results = {}
                for api_key, version in SERVED:
                    fields = SAMPLE_REQUESTS.get(api_key, {})
                    if api_key == 11:  # a group of its own: a second member would wait
                        fields = {**fields, "group_id": f"join-{version}"}
                    body = build(load_request_schema(api_key, version), fields)
                    request = Request(api_key, version, 1, "fuzz", body, "127.0.0.1")
                    results[api_key, version] = await asyncio.wait_for(
                        broker.apis[api_key].handler(broker, request), 10)
                return results
            finally:
                broker.close()

    with tempfile.TemporaryDirectory() as directory:
        return asyncio.run(run(Path(directory)))


def decode_response(api_key: int, version: int, frame: bytes) -> tuple[int, Any]:
    (size,) = struct.unpack_from(">i", frame)
    assert size == len(frame) - 4
    schema = load_response_schema(api_key, version)
    header, used = entity_reader(schema.__header_schema__)(frame, 4)
    body, body_size = entity_reader(schema)(frame, 4 + used)
    assert 4 + used + body_size == len(frame)
    return header.correlation_id, body


@pytest.mark.parametrize("api_key", sorted(TABLE))
def test_handler_responses_encode_in_every_served_version(api_key: int) -> None:
    low, high = TABLE[api_key]
    for (key, asked), response in handler_responses().items():
        if key != api_key or response is None:
            continue
        # A handler's dict is version-neutral: any served version can carry it.
        for version in range(low, high + 1):
            correlation_id, body = decode_response(
                api_key, version, encode_response(api_key, version, asked, response))
            assert correlation_id == asked
            if "error_code" in response and hasattr(body, "error_code"):
                assert body.error_code == response["error_code"]


@pytest.mark.parametrize(("api_key", "version"), SERVED)
def test_an_empty_response_dict_encodes_with_neutral_values(api_key: int,
                                                           version: int) -> None:
    correlation_id, body = decode_response(
        api_key, version, encode_response(api_key, version, -5, {}))
    assert correlation_id == -5
    assert getattr(body, "error_code", ErrorCode.none) is ErrorCode.none


def test_a_response_key_of_no_version_is_refused_naming_it() -> None:
    # A key of another version is dropped (Fetch v4 has no log_start_offset)...
    encode_response(1, 4, 7, {"responses": [{"topic": "t", "partitions": [
        {"partition_index": 0, "log_start_offset": 5}]}]})
    # ...but a key of none, a typo in a handler, never becomes a valid-looking answer.
    with pytest.raises(UnknownFieldError) as refused:
        encode_response(1, 4, 7, {"responses": [{"topic": "t", "partitions": [
            {"partition_index": 0, "error_mesage": "x"}]}]})
    assert str(refused.value) == ("Fetch v4 response: 'error_mesage' is a field of no "
                                  "version (in responses.partitions)")
    with pytest.raises(UnknownFieldError, match=r"^Produce v3 response: 'not a field'"):
        encode_response(0, 3, 7, {"not a field": 1})


# -- random frames against a running server ----------------------------------------------

# CreateTopics is left out: a random valid request may ask for thousands of partitions.
SOCKET_SERVED = [(key, version) for key, version in SERVED if key != 19]


@st.composite
def wire_bytes(draw: st.DrawFn) -> bytes:
    """Bytes as a client might send them: length-prefixed frames, valid or damaged, with
    right or wrong lengths, or plain garbage."""
    kind = draw(st.sampled_from(["garbage", "damaged", "valid", "bad-length"]))
    if kind == "garbage":
        return draw(st.binary(max_size=200))
    api_key, version = draw(st.sampled_from(SOCKET_SERVED))
    body = draw(st.from_type(load_request_schema(api_key, version)))
    frame = encode_request(body, draw(st.integers(0, 2**31 - 1)))
    if kind == "damaged":
        frame = mutate(frame, draw(mutations))
    length = len(frame)
    if kind == "bad-length":
        length = draw(st.sampled_from([-1, 0, 3, len(frame) - 1, len(frame) + 1, 2**31 - 1]))
    return struct.pack(">i", length) + frame


def send_and_close(address: tuple[str, int], data: bytes) -> None:
    try:
        with socket.create_connection(address, timeout=5) as sock:
            sock.sendall(data)
    except OSError:
        pass  # the server may close first


@pytest.fixture
def fuzz_server(tmp_path: Path) -> Iterator[Any]:
    data = tmp_path / "data"
    with LogStore.open(data) as store:
        store.create_topic("plain", 2)
        store.append("plain", [ProducerRecord(b"k%d" % i, b"v%d" % i) for i in range(10)])
    with logged_server(data, tmp_path / "server.log") as server:
        yield server


def test_random_frames_leave_the_server_serving(fuzz_server: Any) -> None:
    server = fuzz_server

    @settings(FUZZ, max_examples=150, database=None)
    @given(wire_bytes())
    def send(data: bytes) -> None:
        send_and_close(server.address, data)

    send()
    server.assert_running()
    with Wire(server.address) as wire:
        versions = wire.call(18, 3, {"client_software_name": "t",
                                     "client_software_version": "1"})
        assert versions.error_code is ErrorCode.none
        assert {k.api_key for k in versions.api_keys} == set(TABLE)
        metadata = wire.call(3, 12, {"topics": [{"name": "plain"}]})
        assert [(t.name, t.error_code, len(t.partitions)) for t in metadata.topics] == [
            ("plain", ErrorCode.none, 2)]
    # A real client, and what was stored before.
    producer = KafkaProducer(bootstrap_servers=server.bootstrap, enable_idempotence=False)
    producer.send("plain", key=b"after", value=b"fuzz").get(timeout=15)
    producer.close()
    consumer = KafkaConsumer(bootstrap_servers=server.bootstrap, enable_auto_commit=False)
    partitions = [TopicPartition("plain", 0), TopicPartition("plain", 1)]
    consumer.assign(partitions)
    consumer.seek_to_beginning(*partitions)
    seen: list[tuple[bytes | None, bytes | None]] = []
    deadline = time.monotonic() + 20
    while len(seen) < 11 and time.monotonic() < deadline:
        for messages in consumer.poll(timeout_ms=200).values():
            seen += [(m.key, m.value) for m in messages]
    consumer.close()
    assert sorted(seen, key=repr) == sorted(
        [(b"k%d" % i, b"v%d" % i) for i in range(10)] + [(b"after", b"fuzz")], key=repr)
