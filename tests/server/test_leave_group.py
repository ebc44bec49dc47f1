"""LeaveGroup on the wire, every served version (0-5), against a real server, with
Kafka's answers (GroupMetadataManager.classicGroupLeaveToClassicGroup): v0-v2 name one
member and get one code; v3+ name many and get a code each, UNKNOWN_MEMBER_ID for an
unknown one, and may name a static member by its group instance id alone
(FENCED_INSTANCE_ID when the member id named is not the one holding it). A pending
member id (MEMBER_ID_REQUIRED's) is forgotten. A leave in PreparingRebalance completes
the join of those waiting; a member leaving with its JoinGroup pending gets that join
answered UNKNOWN_MEMBER_ID; a leave in CompletingRebalance fails the waiting SyncGroups
with REBALANCE_IN_PROGRESS. And real clients (kafka-python, confluent-kafka) empty
their group when they close.

Each group is given a committed offset before its members join: a group left Empty
without any is forgotten at the server's next upkeep round, and these tests look at
it after its members left."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer
from kafka import KafkaAdminClient, KafkaConsumer
from kafka.admin import MemberToRemove
from kafka.errors import NoError, UnknownMemberIdError
from kio.schema.errors import ErrorCode

from compactlog.storage.records import ProducerRecord
from compactlog.storage.store import LogStore
from support.admin_wire import listed_groups, serve
from support.group_wire import JOIN_GROUP, LEAVE_GROUP, SYNC_GROUP, answer, join_fields, kept, state
from support.kafka_server import LoggedServer
from support.wire import Wire, request_frame


def prepare(store: LogStore) -> None:
    store.create_topic("t", 1)
    store.append("t", [ProducerRecord(b"k%d" % i, b"v") for i in range(3)])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoggedServer]:
    with serve(tmp_path_factory.mktemp("leave"), prepare) as running:
        yield running


@pytest.fixture
def wire(server: LoggedServer) -> Iterator[Wire]:
    with Wire(server.address) as connection:
        yield connection


def send_join(wire: Wire, group: str, member_id: str = "", instance: str | None = None,
              version: int = 5) -> None:
    """Send a JoinGroup without waiting for its answer (`answer(wire, JOIN_GROUP)`)."""
    wire.send(request_frame(JOIN_GROUP, version, join_fields(group, member_id, instance), 11))


def joined(wire: Wire, group: str, member_id: str = "", instance: str | None = None) -> Any:
    """JoinGroup v3 (no member-id round trip) or, with `instance`, v5; its answer."""
    send_join(wire, group, member_id, instance, 5 if instance else 3)
    return answer(wire, JOIN_GROUP, 5 if instance else 3)


def sync(wire: Wire, group: str, member_id: str, generation: int,
         assignments: tuple[str, ...] = ()) -> Any:
    return wire.call(SYNC_GROUP, 5, {
        "group_id": group, "member_id": member_id, "generation_id": generation,
        "group_instance_id": None, "protocol_type": "consumer", "protocol_name": "range",
        "assignments": [{"member_id": m, "assignment": b""} for m in assignments]})


def stable_member(wire: Wire, group: str, instance: str | None = None) -> tuple[str, int]:
    """Make the group's only member, and the group Stable: (member id, generation)."""
    body = joined(wire, group, instance=instance)
    assert body.error_code is ErrorCode.none, body
    synced = sync(wire, group, body.member_id, body.generation_id, (body.member_id,))
    assert synced.error_code is ErrorCode.none, synced
    return str(body.member_id), int(body.generation_id)


def leave(wire: Wire, version: int, group: str,
          members: list[tuple[str, str | None]]) -> Any:
    if version < 3:
        ((member_id, _),) = members
        return wire.call(LEAVE_GROUP, version, {"group_id": group, "member_id": member_id})
    return wire.call(LEAVE_GROUP, version, {"group_id": group, "members": [
        {"member_id": m, "group_instance_id": i, "reason": "closing"} for m, i in members]})


def codes(body: Any) -> list[tuple[str, str | None, ErrorCode]]:
    assert body.error_code is ErrorCode.none, body
    return [(m.member_id, m.group_instance_id, m.error_code) for m in body.members]


@pytest.mark.parametrize("version", [0, 1, 2, 3, 4, 5])
def test_a_member_leaves_with_every_version(server: LoggedServer, wire: Wire,
                                            version: int) -> None:
    group = kept(wire, f"every{version}")
    member_id, _ = stable_member(wire, group)
    assert leave_codes(wire, version, group, ["nobody"]) == [ErrorCode.unknown_member_id]
    assert state(wire, group) == ("Stable", [member_id])
    if version >= 3:  # one request, many members, a code each
        assert leave_codes(wire, version, group, ["nobody", member_id]) == [
            ErrorCode.unknown_member_id, ErrorCode.none]
    else:
        assert leave_codes(wire, version, group, [member_id]) == [ErrorCode.none]
    assert state(wire, group) == ("Empty", [])
    assert listed_groups(wire)[group] == "Empty"
    assert leave_codes(wire, version, group, [member_id]) == [ErrorCode.unknown_member_id]
    assert leave_codes(wire, version, "no-such-group", [member_id]) == [
        ErrorCode.unknown_member_id]


def leave_codes(wire: Wire, version: int, group: str, member_ids: list[str]) -> list[ErrorCode]:
    """Each member's code: v0-v2's one top-level code, v3+'s per member (the top-level
    code NONE)."""
    body = leave(wire, version, group, [(m, None) for m in member_ids])
    if version < 3:
        return [body.error_code]
    return [code for _, _, code in codes(body)]


@pytest.mark.parametrize("version", [1, 3])
def test_a_pending_member_id_is_forgotten_when_it_leaves(server: LoggedServer, wire: Wire,
                                                         version: int) -> None:
    """A client closed between its two JoinGroups (KIP-394) leaves with the member id
    MEMBER_ID_REQUIRED gave it, as librdkafka does: Kafka removes the pending member
    and answers NONE. Before, the server answered UNKNOWN_MEMBER_ID and kept the id
    until its session timeout."""
    group = kept(wire, f"pending{version}")
    send_join(wire, group)
    first = answer(wire, JOIN_GROUP)
    assert first.error_code is ErrorCode.member_id_required, first
    pending = first.member_id
    if version < 3:
        assert leave(wire, version, group, [(pending, None)]).error_code is ErrorCode.none
    else:
        assert codes(leave(wire, version, group, [(pending, None)])) == [
            (pending, None, ErrorCode.none)]
    send_join(wire, group, pending)
    assert answer(wire, JOIN_GROUP).error_code is ErrorCode.unknown_member_id
    assert state(wire, group) == ("Empty", [])


def test_a_static_member_is_removed_by_its_instance_id(server: LoggedServer,
                                                       wire: Wire) -> None:
    """v3+: an admin names a static member by its group instance id and an empty member
    id (AdminClient.removeMembersFromConsumerGroup); a member id that does not hold the
    instance id is fenced; an instance id nobody holds is unknown."""
    group = kept(wire, "static")
    member_id, _ = stable_member(wire, group, instance="i1")
    assert codes(leave(wire, 3, group, [("", "nobody"), ("impostor", "i1"),
                                        (member_id, "nobody")])) == [
        ("", "nobody", ErrorCode.unknown_member_id),
        ("impostor", "i1", ErrorCode.fenced_instance_id),
        (member_id, "nobody", ErrorCode.unknown_member_id)]
    assert state(wire, group) == ("Stable", [member_id])
    assert codes(leave(wire, 4, group, [("", "i1"), ("", "i1")])) == [
        ("", "i1", ErrorCode.none), ("", "i1", ErrorCode.unknown_member_id)]
    assert state(wire, group) == ("Empty", [])


def test_a_static_member_leaves_by_its_own_ids(server: LoggedServer, wire: Wire) -> None:
    group = kept(wire, "static-self")
    member_id, _ = stable_member(wire, group, instance="i2")
    assert codes(leave(wire, 5, group, [(member_id, "i2")])) == [
        (member_id, "i2", ErrorCode.none)]
    assert state(wire, group) == ("Empty", [])


def test_a_leave_while_preparing_completes_the_join_of_the_others(
        server: LoggedServer, wire: Wire) -> None:
    """A is Stable; B's JoinGroup waits for A to rejoin. A leaves instead: the join
    completes at once with B alone (Kafka's maybeCompleteJoinPhase), not after the
    rebalance timeout."""
    group = kept(wire, "preparing")
    a, generation = stable_member(wire, group)
    with Wire(server.address) as b_wire:
        send_join(b_wire, group, version=3)
        deadline = time.monotonic() + 5
        while state(wire, group)[0] != "PreparingRebalance":
            assert time.monotonic() < deadline
            time.sleep(0.02)
        started = time.monotonic()
        assert codes(leave(wire, 3, group, [(a, None)])) == [(a, None, ErrorCode.none)]
        b = answer(b_wire, JOIN_GROUP, 3)
        assert time.monotonic() - started < 5  # not the 30 s rebalance timeout
        assert b.error_code is ErrorCode.none, b
        assert (b.generation_id, b.leader) == (generation + 1, b.member_id)
        assert [m.member_id for m in b.members] == [b.member_id]


def test_a_member_leaving_with_its_join_pending_gets_unknown_member_id(
        server: LoggedServer, wire: Wire) -> None:
    """Kafka's removeMemberAndUpdateClassicGroup: the pending JoinGroup of a member
    that leaves is answered UNKNOWN_MEMBER_ID; the group still waits for the others."""
    group = kept(wire, "pending-join")
    a, generation = stable_member(wire, group)
    with Wire(server.address) as b_wire:
        send_join(b_wire, group, version=3)
        deadline = time.monotonic() + 5
        while len((described := state(wire, group))[1]) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert described[0] == "PreparingRebalance"
        (b_id,) = set(described[1]) - {a}
        assert codes(leave(wire, 3, group, [(b_id, None)])) == [(b_id, None, ErrorCode.none)]
        assert answer(b_wire, JOIN_GROUP, 3).error_code is ErrorCode.unknown_member_id
    assert state(wire, group) == ("PreparingRebalance", [a])
    again = joined(wire, group, a)
    assert again.error_code is ErrorCode.none, again
    assert (again.generation_id, again.leader) == (generation + 1, a)


def test_a_leave_while_completing_fails_the_waiting_sync(server: LoggedServer,
                                                          wire: Wire) -> None:
    """A and B form a generation; B's SyncGroup waits for the leader's. The leader
    leaves instead: B's SyncGroup gets REBALANCE_IN_PROGRESS and B, rejoining, forms
    the next generation alone."""
    group = kept(wire, "completing")
    with Wire(server.address) as a_wire, Wire(server.address) as b_wire:
        send_join(a_wire, group, version=3)
        send_join(b_wire, group, version=3)
        a, b = answer(a_wire, JOIN_GROUP, 3), answer(b_wire, JOIN_GROUP, 3)
        leader, follower = (a, b) if a.leader == a.member_id else (b, a)
        follower_wire = b_wire if follower is b else a_wire
        assert state(wire, group)[0] == "CompletingRebalance"
        follower_wire.send(request_frame(SYNC_GROUP, 5, {
            "group_id": group, "member_id": follower.member_id,
            "generation_id": follower.generation_id, "group_instance_id": None,
            "protocol_type": "consumer", "protocol_name": "range", "assignments": []}, 12))
        time.sleep(0.1)  # the SyncGroup is waiting for the leader's
        assert codes(leave(wire, 3, group, [(leader.member_id, None)])) == [
            (leader.member_id, None, ErrorCode.none)]
        assert answer(follower_wire, SYNC_GROUP).error_code is (
            ErrorCode.rebalance_in_progress)
        again = joined(follower_wire, group, follower.member_id)
        assert again.error_code is ErrorCode.none, again
        assert (again.generation_id, again.leader) == (
            follower.generation_id + 1, follower.member_id)


# -- real clients -------------------------------------------------------------------


def wait_until(check: Any, what: str, timeout: float = 8.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_kafka_python_empties_its_group_when_it_closes(server: LoggedServer,
                                                       wire: Wire) -> None:
    group = kept(wire, "kafka-python")
    consumer = KafkaConsumer("t", bootstrap_servers=server.bootstrap, group_id=group,
                             session_timeout_ms=6000, auto_offset_reset="earliest",
                             enable_auto_commit=False)
    try:
        wait_until(lambda: bool(consumer.poll(100)) or bool(consumer.assignment()),
                   "kafka-python to be assigned")
        assert state(wire, group)[0] == "Stable"
    finally:
        consumer.close()
    assert state(wire, group) == ("Empty", [])


def test_confluent_kafka_empties_its_group_when_it_closes(server: LoggedServer,
                                                          wire: Wire) -> None:
    group = kept(wire, "confluent-kafka")
    consumer = Consumer({"bootstrap.servers": server.bootstrap, "group.id": group,
                         "session.timeout.ms": 6000, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    try:
        consumer.subscribe(["t"])
        wait_until(lambda: consumer.poll(0.1) is not None or bool(consumer.assignment()),
                   "confluent-kafka to be assigned")
        assert state(wire, group)[0] == "Stable"
    finally:
        consumer.close()
    assert state(wire, group) == ("Empty", [])


def test_kafka_python_admin_removes_members_by_instance_id_and_member_id(
        server: LoggedServer, wire: Wire) -> None:
    """KafkaAdminClient.remove_group_members sends LeaveGroup v3+ naming a static
    member by its group instance id alone. Before, every such removal got
    UNKNOWN_MEMBER_ID."""
    group = kept(wire, "removed")
    static_id, _ = stable_member(wire, group, instance="i9")
    admin = KafkaAdminClient(bootstrap_servers=server.bootstrap)
    try:
        removed = admin.remove_group_members(group, [
            MemberToRemove(group_instance_id="i9"), MemberToRemove(member_id="nobody")])
        assert sorted((k, v) for k, v in removed.items()) == [
            ("i9", NoError), ("nobody", UnknownMemberIdError)]
        assert state(wire, group) == ("Empty", [])
        dynamic_id, _ = stable_member(wire, group)
        assert admin.remove_group_members(group, [MemberToRemove(member_id=dynamic_id)]) == {
            dynamic_id: NoError}
        assert state(wire, group) == ("Empty", [])
    finally:
        admin.close()
    assert static_id != dynamic_id
