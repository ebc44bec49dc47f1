"""Consumer groups over the Kafka protocol, for `compactlog groups` (as Kafka's
kafka-consumer-groups asks a broker).

Invariant: everything here goes through a server's Kafka listener with aiokafka, as any
Kafka client would; the server's group coordinator stays the one place that changes a
group. Offsets are reset by committing as the group with no member (generation -1),
which a coordinator accepts only while the group is empty: Kafka's rule that a group
with active members cannot have its offsets reset or be deleted is checked here first,
for a clear message, and enforced by the server anyway.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment
from aiokafka.errors import KafkaError
from aiokafka.protocol.admin import DeleteGroupsRequest
from aiokafka.structs import OffsetAndMetadata

from compactlog.errors import UserError

T = TypeVar("T")
CLIENT_ID = "compactlog-groups"
TIMEOUT_MS = 15_000
# Kafka's error codes that DeleteGroups answers with a group's state.
NON_EMPTY_GROUP, GROUP_ID_NOT_FOUND = 68, 69


@dataclass(frozen=True)
class Member:
    member_id: str
    client_id: str
    host: str
    partitions: tuple[tuple[str, int], ...]  # (topic, partition) assigned to it


@dataclass(frozen=True)
class Group:
    name: str
    state: str  # Kafka's: Empty, PreparingRebalance, CompletingRebalance, Stable, Dead
    members: tuple[Member, ...]

    @property
    def active(self) -> bool:
        return bool(self.members) or self.state not in ("Empty", "Dead")


@dataclass(frozen=True)
class PartitionRow:
    """One row of `groups describe`, as kafka-consumer-groups --describe prints it."""

    topic: str
    partition: int
    current_offset: int | None  # the committed offset; None: nothing committed
    log_end_offset: int
    member: Member | None

    @property
    def lag(self) -> int | None:
        if self.current_offset is None:
            return None
        return max(self.log_end_offset - self.current_offset, 0)


class GroupClient:
    """One server's groups, through its Kafka listener at `bootstrap`."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap

    def _run(self, work: Coroutine[Any, Any, T]) -> T:
        try:
            return asyncio.run(work)
        except KafkaError as error:
            raise UserError(f"the server at {self.bootstrap} refused it: {error}") from None

    # -- reading ----------------------------------------------------------------------

    def list_groups(self) -> list[Group]:
        async def work() -> list[Group]:
            admin = await self._admin()
            try:
                names = sorted(str(entry[0]) for entry in await admin.list_consumer_groups())
                return [await self._describe(admin, name) for name in names]
            finally:
                await admin.close()
        return self._run(work())

    def describe(self, name: str) -> tuple[Group, list[PartitionRow]]:
        async def work() -> tuple[Group, list[PartitionRow]]:
            admin = await self._admin()
            try:
                group = await self._describe(admin, name)
                committed = await self._committed(admin, name)
            finally:
                await admin.close()
            owners = {(topic, partition): member for member in group.members
                      for topic, partition in member.partitions}
            partitions = sorted({*committed, *owners})
            if not partitions and group.state == "Dead":
                raise UserError(f"consumer group {name!r} does not exist on the server at "
                                f"{self.bootstrap}")
            ends = await self._offsets(partitions, "end")
            rows = [PartitionRow(topic, partition, committed.get((topic, partition)),
                                 ends[(topic, partition)], owners.get((topic, partition)))
                    for topic, partition in partitions]
            return group, rows
        return self._run(work())

    # -- changing -----------------------------------------------------------------------

    def delete(self, name: str) -> None:
        async def work() -> None:
            admin = await self._admin()
            try:
                group = await self._describe(admin, name)
                self._refuse_active(group, "deleting it")
                node = await admin.find_coordinator(name)
                # aiokafka has DeleteGroups in its protocol module but no admin method.
                response = await admin._client.send(node, DeleteGroupsRequest([name]))
            finally:
                await admin.close()
            ((_, code),) = response.results
            if code == GROUP_ID_NOT_FOUND:
                raise UserError(f"consumer group {name!r} does not exist on the server at "
                                f"{self.bootstrap}")
            if code == NON_EMPTY_GROUP:
                raise UserError(f"consumer group {name!r} has active members: stop them "
                                "before deleting it")
            if code:
                raise UserError(f"the server at {self.bootstrap} refused to delete group "
                                f"{name!r}: Kafka error code {code}")
        self._run(work())

    def plan_reset(self, name: str, topics: list[str] | None, to: str,
                   value: int | datetime | None) -> dict[tuple[str, int], int]:
        """The offset each partition would be reset to. `topics` None: every topic the
        group has committed offsets for. `to`: earliest, latest, offset (`value`, kept
        within the log as Kafka keeps it) or datetime (`value`; the first offset at or
        after it, else the log end, as Kafka does)."""
        async def work() -> dict[tuple[str, int], int]:
            admin = await self._admin()
            try:
                group = await self._describe(admin, name)
                self._refuse_active(group, "resetting its offsets")
                committed = await self._committed(admin, name)
            finally:
                await admin.close()
            if topics is None:
                partitions = sorted(committed)
                if not partitions:
                    raise UserError(f"consumer group {name!r} has no committed offsets; "
                                    "name the topics with --topic")
            else:
                partitions = await self._partitions(topics)
            starts = await self._offsets(partitions, "start")
            ends = await self._offsets(partitions, "end")
            if to == "earliest":
                return starts
            if to == "latest":
                return ends
            if to == "offset":
                assert isinstance(value, int)
                return {tp: min(max(value, starts[tp]), ends[tp]) for tp in partitions}
            assert isinstance(value, datetime)
            found = await self._offsets(partitions, int(value.timestamp() * 1000))
            return {tp: found.get(tp, ends[tp]) for tp in partitions}
        return self._run(work())

    def commit(self, name: str, offsets: dict[tuple[str, int], int]) -> None:
        async def work() -> None:
            consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, group_id=name,
                                        client_id=CLIENT_ID, enable_auto_commit=False)
            await consumer.start()
            try:
                tps = [TopicPartition(topic, partition) for topic, partition in offsets]
                consumer.assign(tps)  # assigned, not subscribed: it never joins the group
                await consumer.commit({TopicPartition(t, p): OffsetAndMetadata(offset, "")
                                       for (t, p), offset in offsets.items()})
            finally:
                await consumer.stop()
        self._run(work())

    # -- helpers ------------------------------------------------------------------------

    async def _admin(self) -> AIOKafkaAdminClient:
        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap, client_id=CLIENT_ID,
                                    request_timeout_ms=TIMEOUT_MS)
        try:
            await admin.start()
        except KafkaError as error:
            await admin.close()
            raise UserError(f"no Kafka listener answers at {self.bootstrap}: {error}") from None
        return admin

    def _refuse_active(self, group: Group, action: str) -> None:
        if group.active:
            raise UserError(
                f"consumer group {group.name!r} has {len(group.members)} active member(s) "
                f"(state {group.state}): stop them before {action}, as Kafka requires")

    async def _describe(self, admin: AIOKafkaAdminClient, name: str) -> Group:
        (response,) = await admin.describe_consumer_groups([name])
        (described,) = response.groups
        # Fields by position: (error_code, group, state, protocol_type, protocol,
        # members, ...); a member is (member_id, [group_instance_id, v4+] client_id,
        # client_host, metadata, assignment).
        members = []
        for entry in described[5]:
            assignment = ConsumerProtocolMemberAssignment.decode(entry[-1]) if entry[-1] \
                else None
            partitions = tuple(sorted(
                (str(topic), int(partition))
                for topic, indexes in (assignment.assignment if assignment else [])
                for partition in indexes))
            members.append(Member(str(entry[0]), str(entry[-4]), str(entry[-3]).lstrip("/"),
                                  partitions))
        return Group(name, str(described[2]), tuple(members))

    async def _committed(self, admin: AIOKafkaAdminClient,
                         name: str) -> dict[tuple[str, int], int]:
        offsets = await admin.list_consumer_group_offsets(name)
        return {(tp.topic, tp.partition): meta.offset for tp, meta in offsets.items()
                if meta is not None and meta.offset >= 0}

    async def _partitions(self, topics: list[str]) -> list[tuple[str, int]]:
        admin = await self._admin()
        try:
            described = await admin.describe_topics(topics)
        finally:
            await admin.close()
        found = []
        for entry in described:
            if entry["error_code"]:
                raise UserError(f"unknown topic {entry['topic']!r} on the server at "
                                f"{self.bootstrap}")
            found += sorted((str(entry["topic"]), int(p["partition"]))
                            for p in entry["partitions"])
        return found

    async def _offsets(self, partitions: list[tuple[str, int]],
                       which: str | int) -> dict[tuple[str, int], int]:
        """Log start or end offsets ("start", "end"), or the first offset at or after a
        time in ms (partitions with none are left out)."""
        if not partitions:
            return {}
        consumer = self._consumer()
        await consumer.start()
        try:
            tps = [TopicPartition(topic, partition) for topic, partition in partitions]
            if which == "start":
                found = await consumer.beginning_offsets(tps)
            elif which == "end":
                found = await consumer.end_offsets(tps)
            else:
                times = await consumer.offsets_for_times({tp: which for tp in tps})
                found = {tp: at.offset for tp, at in times.items() if at is not None}
            return {(tp.topic, tp.partition): int(offset) for tp, offset in found.items()}
        finally:
            await consumer.stop()

    def _consumer(self) -> AIOKafkaConsumer:
        return AIOKafkaConsumer(bootstrap_servers=self.bootstrap, client_id=CLIENT_ID,
                                enable_auto_commit=False, request_timeout_ms=TIMEOUT_MS)
