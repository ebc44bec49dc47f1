"""Consumer-group requests on the wire (JoinGroup, SyncGroup, LeaveGroup,
DescribeGroups) and their answers, for the group tests."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from support.admin_wire import commit, consumer_subscription
from support.wire import Wire

JOIN_GROUP, SYNC_GROUP, LEAVE_GROUP, DESCRIBE_GROUPS = 11, 14, 13, 15
SUBSCRIPTION = consumer_subscription("t")


def kept(wire: Wire, group: str) -> str:
    """A new group name, with a committed offset so that it outlives its members."""
    commit(wire, group, {("t", 0): 1})
    return group


def join_fields(group: str, member_id: str = "", instance: str | None = None) -> dict[str, Any]:
    return {"group_id": group, "member_id": member_id, "group_instance_id": instance,
            "session_timeout": timedelta(seconds=30),
            "rebalance_timeout": timedelta(seconds=30), "protocol_type": "consumer",
            "protocols": [{"name": "range", "metadata": SUBSCRIPTION}]}


def answer(wire: Wire, api_key: int, version: int = 5) -> Any:
    _, body = wire.response(api_key, version)
    return body


def state(wire: Wire, group: str) -> tuple[str, list[str]]:
    """The group's state and its members' ids (DescribeGroups)."""
    body = wire.call(DESCRIBE_GROUPS, 5, {"groups": [group],
                                          "include_authorized_operations": False})
    (described,) = body.groups
    return described.group_state, [m.member_id for m in described.members]
