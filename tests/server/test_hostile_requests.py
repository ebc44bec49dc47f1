"""Requests from an authenticated (or anonymous, on PLAINTEXT) client that cost the
server more than they should (issue 25, items 2, 3, 4, 5 and 10), against a real
`compactlog serve`, with what each cost read from the server process (/proc).

Each test names the numbers measured before its fix in its docstring.
"""

from __future__ import annotations

import itertools
import struct
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from kio.schema.errors import ErrorCode

from support.hostile_support import (
    API_VERSIONS,
    AUTHORIZER_ON,
    FETCH,
    JOIN_GROUP,
    METADATA,
    TOPIC,
    Hostile,
    fetch_frame,
    hostile_server,
    read_response,
)
from support.process_usage import MIB, Usage
from support.wire import Wire, request_frame

DESCRIBE_GROUPS, CREATE_PARTITIONS, FIND_COORDINATOR = 15, 37, 10


# -- item 5: the log throttle and what it is keyed by ----------------------------------


def test_denials_of_many_made_up_topics_cost_linear_cpu_and_log_one_line(
        tmp_path: Path) -> None:
    """A principal with no ACL fetches 13,000 made-up topic names. Every one is denied
    (TOPIC_AUTHORIZATION_FAILED), but the denial log is throttled by what the client
    cannot choose (principal, host, operation, resource type), so the throttle holds
    one key, not 13,000, and the server logs one line. Before: the throttle was keyed
    by topic name and rebuilt its dict on every call past 10,000 keys: 13,000 names
    took 7.6 s of server CPU and logged 13,000 lines."""
    names = [f"made-up-{n:05d}" for n in range(13_000)]
    with hostile_server(tmp_path, AUTHORIZER_ON) as hostile, \
            Wire(hostile.address(), timeout=60) as wire:
        mark = hostile.server.mark()
        with Usage(hostile.pid) as usage:
            wire.send(fetch_frame([(name, 0, 0) for name in names]))
            body = read_response(wire, FETCH, 12)
        codes = {part.error_code for topic in body.responses for part in topic.partitions}
        assert codes == {ErrorCode.topic_authorization_failed}
        assert sum(len(topic.partitions) for topic in body.responses) == len(names)
        print(f"13,000 denied names: {usage}")
        assert usage.cpu < 2.0, f"{usage}"
        denials = [line for line in hostile.server.log_since(mark).splitlines()
                   if "is Denied Operation = READ" in line]
        assert 1 <= len(denials) <= 2, denials[:5]
        assert "User:ANONYMOUS" in denials[0] and "TOPIC:made-up-" in denials[0]


# -- item 3: Fetch's response cap, and a partition named more than once ---------------


def fetched(body: object) -> list[tuple[str, int, bytes]]:
    return [(topic.topic, part.partition_index, bytes(part.records or b""))
            for topic in body.responses for part in topic.partitions]  # type: ignore[attr-defined]


def test_a_partition_named_many_times_is_read_once(tmp_path: Path) -> None:
    """A Fetch naming t/0 sixteen times, each with max_bytes 2**31-1 (4 MiB stored).
    Kafka keys a Fetch's partitions in a map: each is answered once, for the last of its
    entries. Before: sixteen answers of 4 MiB, a 64 MiB response, the server's peak RSS
    up 246 MiB; now one answer, +9 MiB."""
    with hostile_server(tmp_path, records=4096, value_size=1000) as hostile, \
            Wire(hostile.address(), timeout=60) as wire:
        with Usage(hostile.pid) as usage:
            wire.send(fetch_frame([(TOPIC, 0, 0)] * 16))
            answers = fetched(read_response(wire, FETCH, 12))
        print(f"t/0 named 16 times: {usage}")
        assert [(name, index) for name, index, _ in answers] == [(TOPIC, 0)]
        assert 4_000_000 < len(answers[0][2]) < 5_000_000
        assert usage.peak_growth < 40 * MIB, f"{usage}"
        # The last entry's offset is the one read, as from Kafka's map.
        wire.send(fetch_frame([(TOPIC, 0, 0), (TOPIC, 0, 1000)]))
        [(_, _, records)] = fetched(read_response(wire, FETCH, 12))
        assert struct.unpack_from(">q", records)[0] == 1000


def test_a_fetch_response_is_capped_by_fetch_max_bytes(tmp_path: Path) -> None:
    """Kafka's broker caps a Fetch response at fetch.max.bytes (55 MiB by default)
    whatever the request's max_bytes; here fetch_max_bytes = 1 MiB. Before: a Fetch
    with max_bytes 2**31-1 got all 4 MiB stored."""
    settings = "fetch_max_bytes = 1048576\n"
    with hostile_server(tmp_path, settings, records=4096, value_size=1000) as hostile, \
            Wire(hostile.address(), timeout=60) as wire:
        wire.send(fetch_frame([(TOPIC, 0, 0)]))
        [(_, _, records)] = fetched(read_response(wire, FETCH, 12))
        assert 0 < len(records) <= MIB
        # The first batch still goes out whole when it alone is over the cap.
        wire.send(fetch_frame([(TOPIC, 0, 0)], max_bytes=1))
        [(_, _, first)] = fetched(read_response(wire, FETCH, 12))
        assert struct.unpack_from(">qi", first)[1] + 12 == len(first) > 100_000


# -- item 4: Metadata naming one topic many times ----------------------------------------


def raw_metadata_v1(names: int, name: bytes = b"a", correlation_id: int = 9) -> bytes:
    """A Metadata v1 request naming `name` `names` times, framed by hand (kio would take
    seconds to build it): header v1, then the topics array of int16-length strings."""
    header = struct.pack(">hhih", METADATA, 1, correlation_id, 1) + b"x"
    topics = struct.pack(">i", names) + (struct.pack(">h", len(name)) + name) * names
    body = header + topics
    return struct.pack(">i", len(body)) + body


def test_metadata_answers_a_repeated_topic_once(tmp_path: Path) -> None:
    """A 2.1 MB Metadata v1 naming topic t 700,000 times from an anonymous client.
    Kafka answers the set of topics named; so does compactlog now: one topic, for 1.2 s
    of server CPU (decoding) and +45 MiB of peak RSS. Before: 700,000 answers, 33.9 s
    of server CPU and +950 MiB."""
    frame = raw_metadata_v1(700_000, TOPIC.encode())
    with hostile_server(tmp_path, "max_request_bytes = 4194304\n") as hostile, \
            Wire(hostile.address(), timeout=120) as wire:
        with Usage(hostile.pid) as usage:
            wire.send(frame)
            body = read_response(wire, METADATA, 1)
        print(f"Metadata naming t 700,000 times: {usage}")
        assert [(t.name, t.error_code) for t in body.topics] == [(TOPIC, ErrorCode.none)]
        assert usage.cpu < 3.0, f"{usage}"


def waits_of_another_client(hostile: Hostile, frame: bytes, api_key: int,
                            version: int) -> tuple[Any, float, float, int]:
    """Send `frame` and read its answer while another client, from 127.0.0.2, sends
    ApiVersions in a loop: (the answer, the request's seconds, the longest wait between
    the other client's answers meanwhile, how many answers it got)."""
    answered = threading.Event()
    stamps: list[float] = []

    def other_client(wire: Wire) -> None:
        while not answered.is_set():
            body = wire.call(API_VERSIONS, 3, {"client_software_name": "t",
                                               "client_software_version": "1"})
            assert body.error_code is ErrorCode.none
            stamps.append(time.monotonic())

    with Wire(hostile.address(), timeout=120) as wire, \
            Wire(hostile.address(), source="127.0.0.2", timeout=120) as other:
        thread = threading.Thread(target=other_client, args=(other,), daemon=True)
        thread.start()
        while not stamps:  # the other client is being answered
            time.sleep(0.01)
        sent = time.monotonic()
        wire.send(frame)
        body = read_response(wire, api_key, version)
        done = time.monotonic()
        answered.set()
        thread.join(30)
    during = [sent, *(stamp for stamp in stamps if sent < stamp < done), done]
    longest = max(b - a for a, b in itertools.pairwise(during))
    return body, done - sent, longest, len(during) - 2


def test_a_large_frame_is_decoded_off_the_event_loop(tmp_path: Path) -> None:
    """While a 4.2 MB Metadata naming t 1.4 million times is decoded (about 3 s here),
    another client's ApiVersions requests keep being answered: large frames are decoded
    on a thread of their own, so the event loop keeps its turns, except while kio's
    native decoder (about a third of the work) holds the interpreter lock. Measured as
    the longest wait between the other client's answers, against the whole request's
    time (a ratio, so a slower machine scales both). Before: the loop decoded it, and
    the other client waited 2.19 s of the request's 2.40 s (91 %) at once; now at most
    1.10 s of 4.79 s (23 %), with 525 answers meanwhile."""
    frame = raw_metadata_v1(1_400_000, TOPIC.encode())
    with hostile_server(tmp_path) as hostile:
        body, elapsed, longest, answers = waits_of_another_client(
            hostile, frame, METADATA, 1)
    print(f"while a 4.2 MB frame took {elapsed:.2f} s: {answers} answers "
          f"to another client, the longest wait {longest:.2f} s")
    assert [t.name for t in body.topics] == [TOPIC]
    assert longest < 0.6 * elapsed


def test_a_response_of_many_entries_is_encoded_off_the_event_loop(tmp_path: Path) -> None:
    """A 393 KiB DescribeGroups naming group g 131,072 times (found by the hostile-client
    fuzzer, tests/server/test_hostile_fuzz.py). Kafka answers each entry, so the response holds
    131,072 groups (2.4 MiB), which kio took 3.1 s to encode; the event loop did it, and
    another client waited 6.56 s of the request's 6.70 s (98 %) at once. Now responses of
    more than 2,000 entries are encoded on the decoding thread, and the loop keeps its
    turns: at most 1.09 s of 7.25 s (15 %), with 710 answers meanwhile."""
    frame = request_frame(DESCRIBE_GROUPS, 1, {"groups": ["g"] * 131_072})
    with hostile_server(tmp_path) as hostile:
        body, elapsed, longest, answers = waits_of_another_client(
            hostile, frame, DESCRIBE_GROUPS, 1)
    print(f"while DescribeGroups of 131,072 names took {elapsed:.2f} s: {answers} answers "
          f"to another client, the longest wait {longest:.2f} s")
    assert len(body.groups) == 131_072
    assert {group.group_id for group in body.groups} == {"g"}
    assert longest < 0.6 * elapsed


def test_a_request_of_many_entries_gives_other_clients_their_turns(tmp_path: Path) -> None:
    """The per-entry work of a handler (server/handlers/cooperative.py): a 1.6 MiB FindCoordinator
    v4 naming 200,000 group keys, each checked by the authorizer, is answered in slices
    of 256 keys with the event loop's turns between them. Before, the handler built all
    200,000 answers in one turn of the loop (the fuzzer's "1-3 s per 1 MiB request"):
    another client waited 0.97 s of the request's 7.27 s (13 %) at once; now 0.23 s of
    7.89 s (3 %), the rest being the decoding thread's hold on the interpreter lock.
    Measured, not asserted to that precision (a loaded machine stretches the decode's
    share): the assertion is a guard, and the slicing itself is tested by the count of
    the loop's turns below."""
    keys = [f"group-{number:06d}" for number in range(200_000)]
    frame = request_frame(FIND_COORDINATOR, 4, {"key_type": 0, "coordinator_keys": keys})
    with hostile_server(tmp_path, AUTHORIZER_ON + 'super_users = ["User:ANONYMOUS"]\n') \
            as hostile:
        body, elapsed, longest, answers = waits_of_another_client(
            hostile, frame, FIND_COORDINATOR, 4)
    print(f"while FindCoordinator of 200,000 keys took {elapsed:.2f} s: {answers} answers "
          f"to another client, the longest wait {longest:.2f} s")
    assert len(body.coordinators) == 200_000
    assert longest < 0.6 * elapsed  # a guard: the slices' own test is below


def test_per_entry_work_yields_to_the_event_loop_every_slice() -> None:
    """server/handlers/cooperative.py's `mapped`, as the handlers above use it: while it builds
    10,000 answers, another task on the loop gets a turn after every SLICE of them
    (deterministic: it counts the loop's turns, not time)."""
    import asyncio

    from compactlog.server.handlers.cooperative import SLICE, mapped

    async def run() -> tuple[list[int], int]:
        turns = 0

        async def other() -> None:
            nonlocal turns
            while True:
                turns += 1
                await asyncio.sleep(0)

        task = asyncio.create_task(other())
        await asyncio.sleep(0)  # the other task starts
        started = turns
        answers = await mapped(range(10_000), lambda n: n * 2)
        task.cancel()
        return answers, turns - started

    answers, turns = asyncio.run(run())
    assert answers == [n * 2 for n in range(10_000)]
    assert turns >= 10_000 // SLICE


# -- item 10: group session timeouts ---------------------------------------------------


def join(wire: Wire, session_timeout_ms: int, rebalance_timeout_ms: int = 60_000) -> object:
    return wire.call(JOIN_GROUP, 5, {
        "group_id": "g", "member_id": "", "group_instance_id": None,
        "session_timeout": timedelta(milliseconds=session_timeout_ms),
        "rebalance_timeout": timedelta(milliseconds=rebalance_timeout_ms),
        "protocol_type": "consumer",
        "protocols": [{"name": "range", "metadata": b"\0\0\0\0\0\0\0\0\0\0"}]})


def test_join_group_outside_the_session_timeout_bounds_is_refused(tmp_path: Path) -> None:
    """Kafka answers INVALID_SESSION_TIMEOUT to a JoinGroup whose session timeout is
    outside group.min.session.timeout.ms (6 s) .. group.max.session.timeout.ms (30 min).
    Before: 2**31-1 ms was accepted (MEMBER_ID_REQUIRED, the first step of a join), and
    a member that then went away held its group for 24.8 days."""
    with hostile_server(tmp_path) as hostile, Wire(hostile.address()) as wire:
        for refused in (2**31 - 1, 1_800_001, 5_999, 0):
            answer = join(wire, refused)
            assert answer.error_code is ErrorCode.invalid_session_timeout, (refused, answer)
            assert answer.member_id == ""
        for allowed in (6_000, 45_000, 1_800_000):
            answer = join(wire, allowed)
            assert answer.error_code is ErrorCode.member_id_required, (allowed, answer)


def test_session_timeout_bounds_are_settings(tmp_path: Path) -> None:
    settings = ("group_min_session_timeout_s = 1.0\n"
                "group_max_session_timeout_s = 20.0\n")
    with hostile_server(tmp_path, settings) as hostile, Wire(hostile.address()) as wire:
        assert join(wire, 1_000).error_code is ErrorCode.member_id_required
        assert join(wire, 20_001).error_code is ErrorCode.invalid_session_timeout


# -- found by the hostile-client fuzzer (tests/server/test_hostile_fuzz.py) -------------------


def test_create_partitions_of_many_topics_costs_linear_cpu(tmp_path: Path) -> None:
    """A CreatePartitions naming 30,000 made-up topics (about 0.5 MB), from a principal
    with no ACL: each is answered TOPIC_AUTHORIZATION_FAILED. Duplicates are found with
    a count of every name, once: 0.66 s of server CPU. Before: each name was counted in
    the whole list, on the event loop, so the cost was quadratic in the names: 10.1 s
    (the fuzzer's 1 MiB request held another client for 10.3 s)."""
    names = [f"made-up-{n:05d}" for n in range(30_000)]
    frame = request_frame(CREATE_PARTITIONS, 3, {
        "topics": [{"name": name, "count": 2, "assignments": None} for name in names],
        "timeout": timedelta(seconds=5), "validate_only": False})
    with hostile_server(tmp_path, AUTHORIZER_ON) as hostile, \
            Wire(hostile.address(), timeout=120) as wire:
        with Usage(hostile.pid) as usage:
            wire.send(frame)
            body = read_response(wire, CREATE_PARTITIONS, 3)
        print(f"CreatePartitions of 30,000 names: {usage}")
        assert [result.name for result in body.results] == names
        assert {result.error_code for result in body.results} == {
            ErrorCode.topic_authorization_failed}
        assert usage.cpu < 3.0, f"{usage}"
        # A name given twice is still refused as Kafka refuses it.
        body = wire.call(CREATE_PARTITIONS, 3, {
            "topics": [{"name": "twice", "count": 2, "assignments": None}] * 2 + [
                {"name": "once", "count": 2, "assignments": None}],
            "timeout": timedelta(seconds=5), "validate_only": False})
        assert [(r.name, r.error_code) for r in body.results] == [
            ("twice", ErrorCode.invalid_request), ("twice", ErrorCode.invalid_request),
            ("once", ErrorCode.topic_authorization_failed)]
