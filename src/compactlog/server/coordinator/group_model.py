"""A consumer group as the coordinator holds it: its state, its members and their
protocols, its committed offsets (values the coordinator changes, group_coordinator.py),
and what can be read off them.

Invariant: these are plain values: nothing here changes a group or writes anything;
every change is the coordinator's, on the event loop, in the order of the requests.
"""

from __future__ import annotations

import asyncio
import struct
import time
from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode

MIN_SESSION_TIMEOUT_S = 6.0  # Kafka's group.min.session.timeout.ms default
MAX_SESSION_TIMEOUT_S = 1800.0  # Kafka's group.max.session.timeout.ms default
MAX_GROUPS = 100_000  # groups held, and pending member ids (about 1 KiB each)

EMPTY, PREPARING, COMPLETING, STABLE, DEAD = (
    "Empty", "PreparingRebalance", "CompletingRebalance", "Stable", "Dead")


class GroupError(Exception):
    def __init__(self, code: ErrorCode, message: str = "") -> None:
        super().__init__(message or code.name)
        self.code = code


@dataclass
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_s: float
    rebalance_timeout_s: float
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    assignment: bytes = b""
    last_heartbeat: float = field(default_factory=time.monotonic)
    join_waiter: asyncio.Future[dict[str, Any]] | None = None
    sync_waiter: asyncio.Future[bytes] | None = None

    def metadata_for(self, protocol: str) -> bytes:
        return next(data for name, data in self.protocols if name == protocol)


@dataclass
class CommittedOffset:
    offset: int
    leader_epoch: int
    metadata: str | None
    commit_ms: int


# What a change did to each offset it touched: (before, after); None is "absent".
Undo = dict[tuple[str, int], tuple["CommittedOffset | None", "CommittedOffset | None"]]


@dataclass
class Group:
    group_id: str
    state: str = EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    # Member ids handed out by a JoinGroup with an empty id, and when each expires.
    pending_ids: dict[str, float] = field(default_factory=dict)
    offsets: dict[tuple[str, int], CommittedOffset] = field(default_factory=dict)
    rebalance_task: asyncio.Task[None] | None = None
    # A rebalance of an empty group waits a moment for more members before completing.
    initial_wait: bool = False


def subscribed_topics(group: Group) -> set[str] | None:
    """The topics a consumer group's members subscribe to, from the consumer protocol
    metadata of the group's protocol (its version-0 prefix, which every version keeps:
    Kafka's ClassicGroup.computeSubscribedTopics); None when not known."""
    if group.protocol_type != "consumer":
        return None
    if not group.members:
        return set()
    if group.protocol_name is None:
        return None
    topics: set[str] = set()
    try:
        for member in group.members.values():
            data = member.metadata_for(group.protocol_name)
            (count,) = struct.unpack_from(">i", data, 2)  # after the int16 version
            position = 6
            for _ in range(count):
                (size,) = struct.unpack_from(">h", data, position)
                position += 2
                if not 0 <= size <= len(data) - position:
                    return None
                topics.add(data[position:position + size].decode())
                position += size
    except (StopIteration, struct.error, UnicodeDecodeError):
        return None
    return topics


def forgettable(group: Group) -> bool:
    return (group.state == EMPTY and not group.members and not group.pending_ids
            and not group.offsets and group.rebalance_task is None)


def joining(member: Member) -> bool:
    return member.join_waiter is not None and not member.join_waiter.done()
