"""DeleteGroups and OffsetDelete on the wire, every served version, against a real
server: Kafka's answers (NON_EMPTY_GROUP for a group with members, GROUP_ID_NOT_FOUND
for an unknown one, GROUP_SUBSCRIBED_TO_TOPIC for a topic a member subscribes to), and
what was deleted stays deleted after a restart."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode

from compactlog.storage.store import LogStore
from support.admin_wire import (
    commit,
    committed,
    consumer_subscription,
    join,
    listed_groups,
    serve,
)
from support.kafka_server import LoggedServer, logged_server
from support.wire import Wire

DELETE_GROUPS, OFFSET_DELETE = 42, 47
VERSIONS = [0, 1, 2]


def prepare(store: LogStore) -> None:
    store.create_topic("a", 2)
    store.create_topic("b", 1)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoggedServer]:
    with serve(tmp_path_factory.mktemp("groups"), prepare) as running:
        yield running


def delete_groups(wire: Wire, version: int, names: list[str]) -> list[tuple[str, ErrorCode]]:
    body = wire.call(DELETE_GROUPS, version, {"groups_names": names})
    return [(r.group_id, r.error_code) for r in body.results]


def offset_delete(wire: Wire, group: str, wanted: dict[str, list[int]]
                  ) -> tuple[ErrorCode, dict[tuple[str, int], ErrorCode]]:
    body = wire.call(OFFSET_DELETE, 0, {"group_id": group, "topics": [
        {"name": name, "partitions": [{"partition_index": i} for i in indexes]}
        for name, indexes in wanted.items()]})
    return body.error_code, {(t.name, p.partition_index): p.error_code
                             for t in body.topics for p in t.partitions}


@pytest.mark.parametrize("version", VERSIONS)
def test_delete_groups_deletes_empty_groups_only(server: LoggedServer, version: int) -> None:
    empty, busy = f"empty{version}", f"busy{version}"
    with Wire(server.address) as wire, Wire(server.address) as member:
        commit(wire, empty, {("a", 0): 5, ("b", 0): 2})
        join(member, busy, "consumer", consumer_subscription("a"))
        assert delete_groups(wire, version, [empty, busy, "nope"]) == [
            (empty, ErrorCode.none), (busy, ErrorCode.non_empty_group),
            ("nope", ErrorCode.group_id_not_found)]
        assert committed(wire, empty) == {}
        groups = listed_groups(wire)
        assert empty not in groups and busy in groups
        assert delete_groups(wire, version, [empty]) == [(empty, ErrorCode.group_id_not_found)]
        assert delete_groups(wire, version, []) == []


def test_offset_delete_spares_subscribed_topics(server: LoggedServer) -> None:
    with Wire(server.address) as wire, Wire(server.address) as member, \
            Wire(server.address) as other:
        commit(wire, "subs", {("a", 0): 1, ("a", 1): 2, ("b", 0): 3})
        join(member, "subs", "consumer", consumer_subscription("a"))
        assert offset_delete(wire, "subs", {"a": [0], "b": [0, 7], "missing": [0]}) == (
            ErrorCode.none, {
                ("a", 0): ErrorCode.group_subscribed_to_topic,
                ("b", 0): ErrorCode.none,
                ("b", 7): ErrorCode.unknown_topic_or_partition,
                ("missing", 0): ErrorCode.unknown_topic_or_partition})
        assert committed(wire, "subs") == {("a", 0): 1, ("a", 1): 2}
        # Nothing committed there: no error either.
        assert offset_delete(wire, "subs", {"b": [0]}) == (ErrorCode.none,
                                                            {("b", 0): ErrorCode.none})
        assert offset_delete(wire, "subs", {}) == (ErrorCode.none, {})
        assert offset_delete(wire, "nope", {"a": [0]}) == (ErrorCode.group_id_not_found, {})
        assert offset_delete(wire, "", {"a": [0]}) == (ErrorCode.invalid_group_id, {})
        # Members of another protocol say nothing of their topics: refused as a whole.
        join(other, "connectors", "connect", b"opaque")
        assert offset_delete(wire, "connectors", {"a": [0]}) == (
            ErrorCode.non_empty_group, {})
        # An empty group loses any of its offsets, and stays (as in Kafka).
        commit(wire, "idle", {("a", 0): 4, ("b", 0): 4})
        assert offset_delete(wire, "idle", {"a": [0, 1], "b": [0]})[0] is ErrorCode.none
        assert committed(wire, "idle") == {}
        assert listed_groups(wire)["idle"] == "Empty"


def test_deleted_groups_and_offsets_stay_deleted_after_a_restart(tmp_path: Path) -> None:
    with serve(tmp_path, prepare) as server, Wire(server.address) as wire:
        commit(wire, "gone", {("a", 0): 5})
        commit(wire, "kept", {("a", 0): 6, ("b", 0): 7})
        assert delete_groups(wire, 2, ["gone"]) == [("gone", ErrorCode.none)]
        assert offset_delete(wire, "kept", {"b": [0]})[0] is ErrorCode.none
    assert [p.name for p in (tmp_path / "data" / "groups").glob("*.json")] == ["kept.json"]
    with logged_server(tmp_path / "data", tmp_path / "again.log") as server, \
            Wire(server.address) as wire:
        assert committed(wire, "gone") == {}
        assert committed(wire, "kept") == {("a", 0): 6}
        assert set(listed_groups(wire)) == {"kept"}
