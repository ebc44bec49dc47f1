"""State that a client, with few grants or none, could make the server hold or scan
without bound (issue 25, items 7, 11, 12 and 13), against a real `compactlog serve`, with
what each cost read from the server process (/proc).

Each test names the numbers measured before its fix in its docstring.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from kio.schema.errors import ErrorCode

from hostile_support import METADATA, TOPIC, hostile_server
from process_usage import Usage
from test_hostile_requests import AUTHORIZER_ON
from test_server_bad_input import Wire, request_frame

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
