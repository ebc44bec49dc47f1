"""Helpers for the admin API tests: a real `compactlog serve` on a data directory
prepared with the store, and requests built with kio and sent over a raw socket
(test_server_bad_input.Wire), so every test goes through the server's own decoding,
handlers and encoding for exactly the version it names."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kio.schema.errors import ErrorCode

from compactlog.storage.store import LogStore
from support.kafka_server import LoggedServer, logged_server
from support.wire import Wire

(DELETE_RECORDS, OFFSET_COMMIT, OFFSET_FETCH, JOIN_GROUP, LIST_GROUPS, API_VERSIONS,
 DESCRIBE_CONFIGS, ALTER_CONFIGS, INCREMENTAL_ALTER_CONFIGS) = 21, 8, 9, 11, 16, 18, 32, 33, 44
TOPIC, BROKER = 2, 4
DYNAMIC_TOPIC_CONFIG = 1


@contextmanager
def serve(root: Path, prepare: Callable[[LogStore], None]) -> Iterator[LoggedServer]:
    """A server on `root`/data after `prepare` filled it; new groups wait 0.1 s."""
    data = root / "data"
    with LogStore.open(data) as store:
        prepare(store)
    config = root / "server.toml"
    config.write_text("group_initial_rebalance_delay_s = 0.1\n")
    with logged_server(data, root / "server.log", "--config", str(config)) as server:
        yield server


def overrides(wire: Wire, topic: str) -> dict[str, str]:
    """The topic's own config (DescribeConfigs: the DYNAMIC_TOPIC_CONFIG entries)."""
    body = wire.call(DESCRIBE_CONFIGS, 4, {"resources": [
        {"resource_type": TOPIC, "resource_name": topic, "configuration_keys": None}]})
    (result,) = body.results
    assert result.error_code is ErrorCode.none, result
    return {c.name: c.value for c in result.configs if c.config_source == DYNAMIC_TOPIC_CONFIG}


def commit(wire: Wire, group: str, offsets: dict[tuple[str, int], int]) -> None:
    """Commit as a client outside any generation (as an admin client does)."""
    topics: dict[str, list[dict[str, Any]]] = {}
    for (topic, partition), offset in offsets.items():
        topics.setdefault(topic, []).append(
            {"partition_index": partition, "committed_offset": offset,
             "committed_leader_epoch": -1, "committed_metadata": ""})
    body = wire.call(OFFSET_COMMIT, 8, {
        "group_id": group, "generation_id_or_member_epoch": -1, "member_id": "",
        "topics": [{"name": name, "partitions": parts} for name, parts in topics.items()]})
    assert {p.error_code for t in body.topics for p in t.partitions} == {ErrorCode.none}


def committed(wire: Wire, group: str) -> dict[tuple[str, int], int]:
    """Every offset the group has committed (OffsetFetch with topics=null)."""
    body = wire.call(OFFSET_FETCH, 7, {"group_id": group, "topics": None})
    return {(t.name, p.partition_index): p.committed_offset
            for t in body.topics for p in t.partitions}


def listed_groups(wire: Wire) -> dict[str, str]:
    body = wire.call(LIST_GROUPS, 4, {"states_filter": []})
    return {g.group_id: g.group_state for g in body.groups}


def consumer_subscription(*topics: str) -> bytes:
    """ConsumerProtocolSubscription v0: version, then the topics, then no user data."""
    out = bytearray(b"\x00\x00" + len(topics).to_bytes(4, "big"))
    for topic in topics:
        out += len(topic).to_bytes(2, "big") + topic.encode()
    return bytes(out + b"\xff\xff\xff\xff")


def join(wire: Wire, group: str, protocol_type: str, metadata: bytes) -> str:
    """Become the only member of `group` (JoinGroup v3: no member-id round trip); the
    connection stays the member's, and the session lasts 60 s."""
    body = wire.call(JOIN_GROUP, 3, {
        "group_id": group, "session_timeout": _seconds(60), "rebalance_timeout": _seconds(60),
        "member_id": "", "protocol_type": protocol_type,
        "protocols": [{"name": "range", "metadata": metadata}]})
    assert body.error_code is ErrorCode.none, body
    return str(body.member_id)


def _seconds(value: float) -> Any:
    import datetime

    return datetime.timedelta(seconds=value)
