"""Static group membership (KIP-345): a member named by its group instance id.

Invariant: in a group, a group instance id is held by at most one member id. A member
that joins with an empty member id and an instance id the group already knows takes
that instance id over under a new member id (Kafka's ClassicGroup.replaceStaticMember):
it keeps the old member's assignment, and the old member id is fenced from then on. A
request that names an instance id together with a member id not holding it gets
FENCED_INSTANCE_ID, and one naming an instance id nobody holds UNKNOWN_MEMBER_ID
(ClassicGroup.validateMember), so a zombie of a restarted static member can neither
heartbeat, sync, commit nor rejoin. Whether the takeover rebalances the group is the
coordinator's decision (group_coordinator.py, GroupCoordinator._rejoin_static).
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING

from kio.schema.errors import ErrorCode

if TYPE_CHECKING:
    from compactlog.server.coordinator.group_model import Group, Member


def holder(group: Group, instance_id: str) -> Member | None:
    """The member holding `instance_id` (Kafka's staticMemberId), if any."""
    return next((m for m in group.members.values() if m.group_instance_id == instance_id),
                None)


def invalid_member(group: Group, member_id: str,
                   instance_id: str | None) -> tuple[ErrorCode, str] | None:
    """Kafka's ClassicGroup.validateMember: None when `member_id` may act in `group`
    (with `instance_id`, when it is the member holding it), else the code and why."""
    if instance_id is None:
        if member_id in group.members:
            return None
        return (ErrorCode.unknown_member_id,
                f"member {member_id!r} is not in group {group.group_id!r}")
    held = holder(group, instance_id)
    if held is None:
        return (ErrorCode.unknown_member_id,
                f"no member of group {group.group_id!r} has instance id {instance_id!r}")
    if held.member_id != member_id:
        return (ErrorCode.fenced_instance_id,
                f"instance id {instance_id!r} of group {group.group_id!r} is held by "
                f"member {held.member_id!r}, not {member_id!r}")
    return None


def new_member_id(instance_id: str, unique: str) -> str:
    """A static member's id: its instance id first, as Kafka's generateMemberId."""
    return f"{instance_id}-{unique}"


def replace(group: Group, old: Member, new_id: str) -> Member:
    """Kafka's ClassicGroup.replaceStaticMember: `new_id` takes `old`'s place, with its
    instance id, client, timeouts, protocols and assignment, and its leadership; `old`
    is gone from `group`. The caller fences `old`'s waiting JoinGroup and SyncGroup."""
    del group.members[old.member_id]
    member = dataclasses.replace(old, member_id=new_id, join_waiter=None, sync_waiter=None,
                                 last_heartbeat=time.monotonic())
    group.members[new_id] = member
    if group.leader_id == old.member_id:
        group.leader_id = new_id
    return member
