"""Static group membership (KIP-345) on the wire, against a real server, with Kafka's
answers (GroupMetadataManager.updateStaticMemberThenRebalanceOrCompleteJoin,
ClassicGroup.replaceStaticMember and validateMember): a static member that rejoins with
an empty member id and its group instance id replaces its old member id, keeps its
assignment, and a Stable group whose protocol stays the same does not rebalance; the
old member id is fenced (FENCED_INSTANCE_ID) on JoinGroup, SyncGroup, Heartbeat and
OffsetCommit. A static member that does not rejoin a rebalance stays a member. And a
real client (confluent-kafka with group.instance.id) that restarts
takes its partitions back without a rebalance, from its committed offset.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from confluent_kafka import Consumer
from kio.schema.errors import ErrorCode

from compactlog.storage.records import ProducerRecord
from compactlog.storage.store import LogStore
from support.admin_wire import serve
from support.group_wire import JOIN_GROUP, SUBSCRIPTION, answer, join_fields, kept, state
from support.kafka_server import LoggedServer
from support.wire import Wire, request_frame

SYNC_GROUP, HEARTBEAT, OFFSET_COMMIT = 14, 12, 8
ASSIGNED = b"\x00\x01assignment of i1"


def prepare(store: LogStore) -> None:
    store.create_topic("t", 1)
    store.append("t", [ProducerRecord(b"k%d" % i, b"v%d" % i) for i in range(6)])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoggedServer]:
    with serve(tmp_path_factory.mktemp("static"), prepare) as running:
        yield running


@pytest.fixture
def wire(server: LoggedServer) -> Iterator[Wire]:
    with Wire(server.address) as connection:
        yield connection


def join(wire: Wire, group: str, member_id: str = "", instance: str | None = "i1",
         version: int = 5, protocols: list[tuple[str, bytes]] | None = None) -> Any:
    fields = join_fields(group, member_id, instance)
    if protocols is not None:
        fields["protocols"] = [{"name": n, "metadata": m} for n, m in protocols]
    wire.send(request_frame(JOIN_GROUP, version, fields, 11))
    return answer(wire, JOIN_GROUP, version)


def sync(wire: Wire, group: str, member_id: str, generation: int, instance: str | None = "i1",
         assignments: dict[str, bytes] | None = None) -> Any:
    return wire.call(SYNC_GROUP, 5, {
        "group_id": group, "member_id": member_id, "generation_id": generation,
        "group_instance_id": instance, "protocol_type": "consumer", "protocol_name": "range",
        "assignments": [{"member_id": m, "assignment": a}
                        for m, a in (assignments or {}).items()]})


def heartbeat(wire: Wire, group: str, member_id: str, generation: int,
              instance: str | None = "i1") -> ErrorCode:
    body = wire.call(HEARTBEAT, 4, {"group_id": group, "generation_id": generation,
                                    "member_id": member_id, "group_instance_id": instance})
    return body.error_code  # type: ignore[no-any-return]


def commit(wire: Wire, group: str, member_id: str, generation: int,
           instance: str | None = "i1") -> set[ErrorCode]:
    body = wire.call(OFFSET_COMMIT, 8, {
        "group_id": group, "generation_id_or_member_epoch": generation,
        "member_id": member_id, "group_instance_id": instance,
        "topics": [{"name": "t", "partitions": [
            {"partition_index": 0, "committed_offset": 2, "committed_leader_epoch": -1,
             "committed_metadata": ""}]}]})
    return {p.error_code for t in body.topics for p in t.partitions}


def stable_static(wire: Wire, group: str) -> tuple[str, int]:
    """The group's only member, static with instance id i1, assigned ASSIGNED."""
    first = join(wire, group)
    assert first.error_code is ErrorCode.none, first
    assert first.member_id.startswith("i1-")  # Kafka's generateMemberId
    synced = sync(wire, group, first.member_id, first.generation_id,
                  assignments={first.member_id: ASSIGNED})
    assert (synced.error_code, synced.assignment) == (ErrorCode.none, ASSIGNED), synced
    return str(first.member_id), int(first.generation_id)


def test_a_static_member_rejoining_replaces_its_old_member_id(wire: Wire) -> None:
    """Before, the rejoin became a second member, and the group rebalanced."""
    group = kept(wire, "replace")
    old, generation = stable_static(wire, group)
    again = join(wire, group)
    assert again.error_code is ErrorCode.none, again
    new = again.member_id
    assert new != old and new.startswith("i1-")
    # No rebalance: the same generation at once; before v9 the leader named is the one
    # the group had (the old id), and no member list.
    assert (again.generation_id, again.leader, list(again.members)) == (generation, old, [])
    assert state(wire, group) == ("Stable", [new])
    # The assignment is kept.
    synced = sync(wire, group, new, generation)
    assert (synced.error_code, synced.assignment) == (ErrorCode.none, ASSIGNED)
    assert heartbeat(wire, group, new, generation) is ErrorCode.none
    assert commit(wire, group, new, generation) == {ErrorCode.none}
    # The old member id is fenced.
    assert heartbeat(wire, group, old, generation) is ErrorCode.fenced_instance_id
    assert sync(wire, group, old, generation).error_code is ErrorCode.fenced_instance_id
    assert commit(wire, group, old, generation) == {ErrorCode.fenced_instance_id}
    assert join(wire, group, old).error_code is ErrorCode.fenced_instance_id
    # Without its instance id the old id is simply unknown; an instance id nobody
    # holds, too (Kafka's validateMember).
    assert heartbeat(wire, group, old, generation, None) is ErrorCode.unknown_member_id
    assert heartbeat(wire, group, new, generation, "i2") is ErrorCode.unknown_member_id
    assert state(wire, group) == ("Stable", [new])


def test_a_leader_rejoining_with_v9_is_told_it_leads_and_not_to_assign(wire: Wire) -> None:
    """KIP-814: JoinGroup v9+ tells a static leader that took its own place over that it
    leads (its new id), with the members, and skip_assignment."""
    group = kept(wire, "replace-v9")
    old, generation = stable_static(wire, group)
    again = join(wire, group, version=9)
    assert again.error_code is ErrorCode.none, again
    new = again.member_id
    assert (again.generation_id, again.leader, again.skip_assignment) == (
        generation, new, True)
    assert [(m.member_id, m.group_instance_id, m.metadata) for m in again.members] == [
        (new, "i1", SUBSCRIPTION)]
    synced = sync(wire, group, new, generation)
    assert (synced.error_code, synced.assignment) == (ErrorCode.none, ASSIGNED)
    assert heartbeat(wire, group, old, generation) is ErrorCode.fenced_instance_id


def test_a_static_member_rejoining_with_another_protocol_rebalances(wire: Wire) -> None:
    """The protocol the group would choose changes: Kafka rebalances."""
    group = kept(wire, "replace-protocol")
    old, generation = stable_static(wire, group)
    again = join(wire, group, protocols=[("roundrobin", SUBSCRIPTION), ("range", SUBSCRIPTION)])
    assert again.error_code is ErrorCode.none, again
    assert (again.generation_id, again.protocol_name, again.leader) == (
        generation + 1, "roundrobin", again.member_id)
    assert again.member_id != old
    assert state(wire, group) == ("CompletingRebalance", [again.member_id])
    assert heartbeat(wire, group, old, again.generation_id) is ErrorCode.fenced_instance_id


def test_a_static_member_rejoining_during_a_rebalance_takes_its_place_in_it(
        server: LoggedServer, wire: Wire) -> None:
    """Static A is Stable; dynamic B's join starts a rebalance that waits for A. A,
    restarted, rejoins with an empty member id: it replaces its old id in the
    rebalance, which completes at once with the new id as leader (the old id's
    place), and the old id is fenced."""
    group = kept(wire, "replace-preparing")
    old, generation = stable_static(wire, group)
    with Wire(server.address) as b_wire:
        b_wire.send(request_frame(JOIN_GROUP, 3, join_fields(group), 11))
        deadline = time.monotonic() + 5
        while state(wire, group)[0] != "PreparingRebalance":
            assert time.monotonic() < deadline
            time.sleep(0.02)
        started = time.monotonic()
        again = join(wire, group)
        assert again.error_code is ErrorCode.none, again
        b = answer(b_wire, JOIN_GROUP, 3)
        assert time.monotonic() - started < 5  # not the 30 s rebalance timeout
        assert b.error_code is ErrorCode.none, b
        assert again.generation_id == b.generation_id == generation + 1
        assert again.leader == b.leader == again.member_id != old
        assert {m.member_id for m in again.members} == {again.member_id, b.member_id}
        assert heartbeat(wire, group, old, again.generation_id) is (
            ErrorCode.fenced_instance_id)


def test_a_static_member_that_does_not_rejoin_a_rebalance_stays_a_member(
        server: LoggedServer, wire: Wire) -> None:
    """Static A and dynamic B, Stable; B rejoins and A does not. At the rebalance
    timeout (1 s here) Kafka's completeClassicGroupJoin removes only dynamic members
    that did not rejoin: A stays, and B, which rejoined, leads. Before, A was removed."""
    group = kept(wire, "static-stays")

    def fields(member_id: str = "", instance: str | None = None) -> dict[str, Any]:
        return {**join_fields(group, member_id, instance),
                "rebalance_timeout": timedelta(seconds=1)}

    with Wire(server.address) as a_wire, Wire(server.address) as b_wire:
        a_wire.send(request_frame(JOIN_GROUP, 5, fields(instance="i1"), 11))
        b_wire.send(request_frame(JOIN_GROUP, 3, fields(), 11))
        a, b = answer(a_wire, JOIN_GROUP, 5), answer(b_wire, JOIN_GROUP, 3)
        assert a.error_code is b.error_code is ErrorCode.none, (a, b)
        leader, leader_wire = (a, a_wire) if a.leader == a.member_id else (b, b_wire)
        follower, follower_wire = (b, b_wire) if leader is a else (a, a_wire)
        assigned = {a.member_id: b"A", b.member_id: b"B"}
        synced = sync(leader_wire, group, leader.member_id, leader.generation_id,
                      "i1" if leader is a else None, assigned)
        assert synced.error_code is ErrorCode.none, synced
        synced = sync(follower_wire, group, follower.member_id, follower.generation_id,
                      "i1" if follower is a else None)
        assert synced.error_code is ErrorCode.none, synced
        assert state(wire, group)[0] == "Stable"
        started = time.monotonic()
        b_wire.send(request_frame(JOIN_GROUP, 3, fields(b.member_id), 11))
        again = answer(b_wire, JOIN_GROUP, 3)
        assert 0.5 < time.monotonic() - started < 5  # the rebalance timeout
        assert again.error_code is ErrorCode.none, again
        assert (again.generation_id, again.leader) == (b.generation_id + 1, b.member_id)
        assert {m.member_id for m in again.members} == {a.member_id, b.member_id}
        assert state(wire, group) == ("CompletingRebalance", [a.member_id, b.member_id])
        # A, back, is told to rejoin.
        assert heartbeat(wire, group, a.member_id, a.generation_id) is (
            ErrorCode.illegal_generation)


# -- a real client ------------------------------------------------------------------


def wait_until(check: Any, what: str, timeout: float = 8.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def static_consumer(server: LoggedServer, group: str) -> Consumer:
    consumer = Consumer({"bootstrap.servers": server.bootstrap, "group.id": group,
                         "group.instance.id": "i1", "session.timeout.ms": 6000,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe(["t"])
    return consumer


def described(wire: Wire, group: str) -> tuple[str, list[tuple[str, str | None]]]:
    body = wire.call(15, 5, {"groups": [group], "include_authorized_operations": False})
    (found,) = body.groups
    return found.group_state, [(m.member_id, m.group_instance_id) for m in found.members]


def test_a_restarted_confluent_kafka_static_consumer_takes_its_partitions_back(
        server: LoggedServer, wire: Wire) -> None:
    """librdkafka sends no LeaveGroup for a static member when it closes: the group
    keeps it, Stable. A new consumer with the same group.instance.id replaces it at
    once (no rebalance, no waiting out the old session), gets the same partition, and
    consumes from the committed offset."""
    group = f"confluent-static-{time.monotonic_ns()}"
    first = static_consumer(server, group)
    try:
        message = None
        deadline = time.monotonic() + 8
        while message is None or message.error() is not None:
            assert time.monotonic() < deadline, "no message for the first consumer"
            message = first.poll(0.1)
        assert message.offset() == 0
        first.commit(offsets=None, message=message, asynchronous=False)  # next: offset 1
        group_state, members = described(wire, group)
        assert group_state == "Stable" and [i for _, i in members] == ["i1"]
        (old_id, _), = members
    finally:
        first.close()
    assert described(wire, group) == ("Stable", [(old_id, "i1")])  # no LeaveGroup sent
    started = time.monotonic()
    second = static_consumer(server, group)
    try:
        message = None
        while message is None or message.error() is not None:
            assert time.monotonic() - started < 8, "no message for the restarted consumer"
            message = second.poll(0.1)
        assert (message.partition(), message.offset()) == (0, 1)
        # Well inside the 6 s session timeout the old member would otherwise hold, and
        # no rebalance's initial delay.
        assert time.monotonic() - started < 3
        group_state, members = described(wire, group)
        assert group_state == "Stable"
        assert [i for _, i in members] == ["i1"] and members[0][0] != old_id
    finally:
        second.close()



def test_an_empty_group_takes_a_commit_outside_any_generation_whatever_member_it_names(
        wire: Wire) -> None:
    """Kafka's ClassicGroup.validateOffsetCommit: generation -1 on an Empty group is an
    admin client or a consumer that assigns its own partitions, and commits whatever
    member id it names; on a group with members, the member id is checked."""
    assert commit(wire, "outside", "gone-member", -1, instance=None) == {ErrorCode.none}
    stable_static(wire, "outside-busy")
    assert commit(wire, "outside-busy", "gone-member", -1, instance=None) == {
        ErrorCode.unknown_member_id}
