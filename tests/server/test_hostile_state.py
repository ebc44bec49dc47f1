"""State that a client, with few grants or none, could make the server hold or scan
without bound (issue 25, items 7, 11, 12 and 13), against a real `compactlog serve`, with
what each cost read from the server process (/proc).

Each test names the numbers measured before its fix in its docstring.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from kio.schema.errors import ErrorCode

from compactlog.storage.store import LogStore
from support.admin import get, http, wait_until
from support.hostile_support import AUTHORIZER_ON, JOIN_GROUP, METADATA, TOPIC, hostile_server
from support.paths import TESTS_DIR
from support.process_usage import Usage
from support.wire import Wire, request_frame

# -- item 7: lookups by topic id -----------------------------------------------------------


def metadata_by_ids(ids: list[uuid.UUID], correlation_id: int = 11) -> bytes:
    return request_frame(METADATA, 12, {
        "topics": [{"topic_id": topic_id, "name": None} for topic_id in ids],
        "allow_auto_topic_creation": False,
        "include_topic_authorized_operations": False}, correlation_id)


def test_topic_ids_are_resolved_through_one_map_per_request(tmp_path: Path) -> None:
    """A Metadata v12 naming 2,000 made-up topic ids, on a server of 100 topics. Kafka
    looks each id up in its metadata cache; compactlog now builds one map of the
    topics' ids per request. Before: every id listed the topics and looked at each
    (100 x 2,000 directory entries): 1.18 s of server CPU, on the I/O threads that
    every Produce and Fetch shares; now 0.12 s."""
    made_up = [uuid.uuid4() for _ in range(2_000)]
    with hostile_server(tmp_path, extra_topics=100) as hostile, \
            Wire(hostile.address(), timeout=60) as wire:
        everything = wire.call(METADATA, 12, {"topics": None,
                                              "allow_auto_topic_creation": False})
        ids = {topic.name: topic.topic_id for topic in everything.topics}
        assert len(ids) == 101
        with Usage(hostile.pid) as usage:
            wire.send(metadata_by_ids(made_up))
            _, body = wire.response(METADATA, 12)
        print(f"2,000 unknown topic ids on 100 topics: {usage}")
        assert [t.error_code for t in body.topics] == [ErrorCode.unknown_topic_id] * 2_000
        assert usage.cpu < 0.5, f"{usage}"
        # Known ids still resolve, and in the order asked.
        wire.send(metadata_by_ids([ids["t0042"], ids[TOPIC], made_up[0]]))
        _, body = wire.response(METADATA, 12)
        assert [(t.name, t.error_code) for t in body.topics] == [
            ("t0042", ErrorCode.none), (TOPIC, ErrorCode.none),
            (None, ErrorCode.unknown_topic_id)]


def test_topic_ids_denied_by_acl_cost_a_map_lookup_each(tmp_path: Path) -> None:
    """Kafka's order: an id is resolved to a name (a map lookup), DESCRIBE is checked,
    and only then is any work done on the topic. With the authorizer on, a principal
    without ACLs asks by the ids of 100 real topics and 2,000 made-up ones: the real
    ones get TOPIC_AUTHORIZATION_FAILED with no name (an id is not secret, a name is),
    the others UNKNOWN_TOPIC_ID, for little server CPU. Before: each id scanned every
    topic first, 1.24 s of server CPU; now 0.12 s."""
    with hostile_server(tmp_path, AUTHORIZER_ON, extra_topics=100) as hostile, \
            Wire(hostile.address(), timeout=60) as wire:
        real = ids_on_disk(hostile.data_dir)
        made_up = [uuid.uuid4() for _ in range(2_000)]
        with Usage(hostile.pid) as usage:
            wire.send(metadata_by_ids(real + made_up))
            _, body = wire.response(METADATA, 12)
        print(f"101 denied and 2,000 unknown topic ids: {usage}")
        assert [(t.name, t.error_code) for t in body.topics] == (
            [(None, ErrorCode.topic_authorization_failed)] * len(real)
            + [(None, ErrorCode.unknown_topic_id)] * len(made_up))
        assert usage.cpu < 0.5, f"{usage}"


def ids_on_disk(data_dir: Path) -> list[uuid.UUID]:
    """Every topic's id, read from its metadata document (not through the server)."""
    return [uuid.UUID(hex=json.loads(meta.read_text())["body"]["topic_id"])
            for meta in sorted((data_dir / "topics").glob("*/meta/current.json"))]


# -- item 11: group state expires, and is bounded ------------------------------------------

LIST_GROUPS, OFFSET_COMMIT = 16, 8


def join_frame(group_id: str, member_id: str = "", session_timeout_ms: int = 1_000,
               correlation_id: int = 1) -> bytes:
    return request_frame(JOIN_GROUP, 5, {
        "group_id": group_id, "member_id": member_id, "group_instance_id": None,
        "session_timeout": timedelta(milliseconds=session_timeout_ms),
        "rebalance_timeout": timedelta(milliseconds=session_timeout_ms),
        "protocol_type": "consumer",
        "protocols": [{"name": "range", "metadata": b"\0\0\0\0\0\0\0\0\0\0"}]},
        correlation_id)


def joins(wire: Wire, group_ids: list[str]) -> list[Any]:
    """A JoinGroup with an empty member id for each group, pipelined; the answers."""
    wire.send(b"".join(join_frame(group_id, correlation_id=number)
                       for number, group_id in enumerate(group_ids)))
    return [wire.response(JOIN_GROUP, 5)[1] for _ in group_ids]


def listed_groups(wire: Wire) -> set[str]:
    return {group.group_id for group in wire.call(LIST_GROUPS, 3, {}).groups}


def commit_offset(wire: Wire, group_id: str) -> ErrorCode:
    """A commit outside any generation (a consumer that assigned its partitions)."""
    answer = wire.call(OFFSET_COMMIT, 2, {
        "group_id": group_id, "generation_id_or_member_epoch": -1, "member_id": "",
        "retention_time_ms": -1, "topics": [{"name": TOPIC, "partitions": [
            {"partition_index": 0, "committed_offset": 0, "committed_metadata": None}]}]})
    code: ErrorCode = answer.topics[0].partitions[0].error_code
    return code


GROUPS_FAST = ("group_min_session_timeout_s = 1.0\ngroup_initial_rebalance_delay_s = 0.0\n"
               "upkeep_interval_s = 0.2\n")


def test_pending_member_ids_and_empty_groups_expire(tmp_path: Path) -> None:
    """5,000 JoinGroups with an empty member id, each for a new group (Kafka's first
    step of a join, MEMBER_ID_REQUIRED), whose clients never come back. Kafka forgets a
    pending member id after its session timeout and removes a group left empty with
    no committed offsets; so does compactlog now: after the session timeout (1 s here)
    ListGroups lists only the group that has committed offsets. Before: all 5,001 stayed
    until a restart, and a pending id could still join long after."""
    names = [f"g{number:05d}" for number in range(5_000)]
    with hostile_server(tmp_path, GROUPS_FAST) as hostile, \
            Wire(hostile.address(), timeout=60) as wire:
        answers = joins(wire, names)
        assert {a.error_code for a in answers} == {ErrorCode.member_id_required}
        assert commit_offset(wire, "kept") == ErrorCode.none
        # Groups expire a session timeout after their join: on a loaded machine the
        # first ones may already be gone, the newest are there.
        listed = listed_groups(wire)
        assert {names[-1], "kept"} <= listed <= {*names, "kept"}
        deadline = time.monotonic() + 30  # the session timeout, and a few upkeep rounds
        while listed != {"kept"} and time.monotonic() < deadline:
            time.sleep(0.25)
            listed = listed_groups(wire)
        assert listed == {"kept"}
        # The pending id expired: coming back with it is an unknown member, as in Kafka.
        late = wire.call(JOIN_GROUP, 5, join_frame_fields(names[0], answers[0].member_id))
        assert late.error_code == ErrorCode.unknown_member_id


def join_frame_fields(group_id: str, member_id: str) -> dict[str, Any]:
    return {"group_id": group_id, "member_id": member_id, "group_instance_id": None,
            "session_timeout": timedelta(seconds=1), "rebalance_timeout": timedelta(seconds=1),
            "protocol_type": "consumer",
            "protocols": [{"name": "range", "metadata": b"\0\0\0\0\0\0\0\0\0\0"}]}


def test_a_server_holds_at_most_max_groups(tmp_path: Path) -> None:
    """With max_groups = 100, JoinGroups and offset commits for 150 new groups: the
    first 100 are served, the others get COORDINATOR_NOT_AVAILABLE (retriable: groups
    expire) and the server logs why, naming the setting. Groups it holds go on being
    served. Before: no bound (80,000 groups held 72 MiB until a restart)."""
    names = [f"g{number:03d}" for number in range(150)]
    with hostile_server(tmp_path, GROUPS_FAST + "max_groups = 100\n") as hostile, \
            Wire(hostile.address(), timeout=60) as wire:
        mark = hostile.server.mark()
        answers = joins(wire, names[:120])
        codes = [a.error_code for a in answers]
        assert codes == ([ErrorCode.member_id_required] * 100
                         + [ErrorCode.coordinator_not_available] * 20)
        assert commit_offset(wire, names[140]) == ErrorCode.coordinator_not_available
        assert commit_offset(wire, names[0]) == ErrorCode.none  # a group it holds
        hostile.server.wait_for_log(r"max_groups \(100\)", mark)
        assert len(listed_groups(wire)) == 100


# -- item 12: compactions asked for over the admin API ----------------------------------


def children(pid: int) -> set[int]:
    """The server's child processes (compaction workers)."""
    with open(f"/proc/{pid}/task/{pid}/children") as listed:
        return {int(child) for child in listed.read().split()}


def test_admin_compactions_count_against_max_concurrent_runs(tmp_path: Path) -> None:
    """A principal with ALTER on a 4-partition topic asks for a compaction of each
    partition at once; max_concurrent_runs is 1. The first runs, the others get 429
    with a message naming the limit and the run in the way, and the warm pool never
    holds more workers than max_concurrent_runs. Once that run is over, the next is
    taken, by the same warm worker. Before: four 202s and four compaction processes at
    once (16 on a 16-partition topic, each a JVM with Spark)."""
    settings = ("[compaction]\nenabled = false\nmax_concurrent_runs = 1\n"
                "keep_warm_s = 60.0\nservice = \"slow_compaction:SlowFactory\"\n")
    env = {"PYTHONPATH": os.pathsep.join([str(TESTS_DIR), os.environ.get("PYTHONPATH", "")]),
           "COMPACTLOG_TEST_COMPACTION_SLEEP_S": "3"}
    with hostile_server(tmp_path, settings, admin=True, partitions=4,
                        topic_config={"cleanup.policy": "compact"}, env=env) as hostile:
        url = f"{hostile.server.admin_url}/v1/topics/{TOPIC}/compaction"
        answers = [http("POST", url, {"partitions": [index]}) for index in range(4)]
        assert [status for status, _ in answers] == [202, 429, 429, 429], answers
        first = answers[0][1]["id"]
        refused = answers[1][1]
        assert "max_concurrent_runs (1)" in refused["error"], refused
        assert refused["runs"] == [first]
        seen: set[int] = set()
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            seen |= children(hostile.pid)
            time.sleep(0.05)
        assert len(seen) == 1, f"{len(seen)} compaction processes"
        done = wait_until(lambda: (r := get(hostile.server, f"/v1/compactions/{first}"))
                          ["state"] != "RUNNING" and r, "the first run", timeout=60)
        assert done["state"] == "SUCCESS", done
        status, second = http("POST", url, {"partitions": [1]})
        assert status == 202, second
        assert children(hostile.pid) <= seen  # the warm worker took it


# -- item 13: the open-file budget, at CreateTopics and at start ---------------------------

CREATE_TOPICS = 19


def create_topic_frame(name: str, partitions: int) -> bytes:
    return request_frame(CREATE_TOPICS, 5, {
        "topics": [{"name": name, "num_partitions": partitions, "replication_factor": 1,
                    "assignments": [], "configs": []}],
        "timeout": timedelta(seconds=30), "validate_only": False})


def test_a_create_topics_over_the_open_file_budget_is_refused_before_anything_is_written(
        tmp_path: Path) -> None:
    """Under an open-file limit of 256, each partition holding its active log file open,
    a CreateTopics of 300 partitions is refused with POLICY_VIOLATION (Kafka's answer
    to a request for too many partitions) and a message naming the limit, before
    anything is written; a smaller one is made as usual, and the server stops cleanly.
    Before: the topic was written, then answered KAFKA_STORAGE_ERROR (56, too many open
    files) yet left on disk, and the server exited with an error on SIGTERM."""
    with hostile_server(tmp_path, open_files=256) as hostile, \
            Wire(hostile.address(), timeout=60) as wire:
        wire.send(create_topic_frame("big", 300))
        _, body = wire.response(CREATE_TOPICS, 5)
        [answer] = body.topics
        assert answer.error_code == ErrorCode.policy_violation, answer
        assert "open-file limit" in answer.error_message, answer.error_message
        assert not (hostile.data_dir / "topics" / "big").exists()
        assert list((hostile.data_dir / "staging").iterdir()) == []
        wire.send(create_topic_frame("small", 8))
        _, body = wire.response(CREATE_TOPICS, 5)
        assert body.topics[0].error_code == ErrorCode.none, body.topics[0]
    # hostile_server checked that the server exited 0 on SIGTERM.


def test_a_topic_that_cannot_be_opened_does_not_stop_the_server(tmp_path: Path) -> None:
    """A compacted topic of 300 partitions made while the open-file limit was higher;
    the server now starts under a limit of 256. It starts, serves the other topics,
    answers for that one with KAFKA_STORAGE_ERROR and a log line saying why, and stops
    with exit code 0. Before: the server could not start (opening every compacted
    topic at start failed with too many open files)."""
    data = tmp_path / "data"
    with LogStore.open(data) as store:
        store.create_topic("big", 300, {"cleanup.policy": "compact"})
    with hostile_server(tmp_path, open_files=256) as hostile, \
            Wire(hostile.address(), timeout=60) as wire:
        body = wire.call(METADATA, 12, {"topics": [{"name": TOPIC, "topic_id": None},
                                                   {"name": "big", "topic_id": None}],
                                        "allow_auto_topic_creation": False})
        codes = {t.name: t.error_code for t in body.topics}
        assert codes == {TOPIC: ErrorCode.none, "big": ErrorCode.kafka_storage_error}
        hostile.server.wait_for_log(r"big.*open-file limit", 0)
        hostile.server.assert_running()
