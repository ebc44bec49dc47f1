"""FindCoordinator, the classic consumer-group APIs, and the group admin APIs
(DeleteGroups, OffsetDelete), over server/coordinator/group_coordinator.py."""

from __future__ import annotations

import functools
from typing import Any

from kio.schema.errors import ErrorCode

from compactlog.errors import UnknownPartitionError, UnknownTopicError
from compactlog.server.broker import Broker
from compactlog.server.coordinator.group_model import GroupError, subscribed_topics
from compactlog.server.handlers.cooperative import mapped
from compactlog.server.handlers.transactions import (
    NOT_SUPPORTED,
    TRANSACTIONS_REFUSED,
    log_refusal,
)
from compactlog.server.protocol.messages import Request
from compactlog.server.security import access
from compactlog.server.security.acl_model import Operation, ResourceType

(OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR, JOIN_GROUP, HEARTBEAT, LEAVE_GROUP,
 SYNC_GROUP, DESCRIBE_GROUPS, LIST_GROUPS) = 8, 9, 10, 11, 12, 13, 14, 15, 16
DELETE_GROUPS, OFFSET_DELETE = 42, 47
GROUP_KEY, TRANSACTION_KEY = 0, 1


def register(broker: Broker) -> None:
    broker.register(FIND_COORDINATOR, (0, 6), find_coordinator)
    broker.register(JOIN_GROUP, (0, 9), join_group)
    broker.register(SYNC_GROUP, (0, 5), sync_group)
    broker.register(HEARTBEAT, (0, 4), heartbeat)
    broker.register(LEAVE_GROUP, (0, 5), leave_group)
    # v10 of both addresses topics by id only.
    broker.register(OFFSET_COMMIT, (2, 9), offset_commit)
    broker.register(OFFSET_FETCH, (1, 9), offset_fetch)
    broker.register(LIST_GROUPS, (0, 5), list_groups)
    broker.register(DESCRIBE_GROUPS, (0, 5), describe_groups)
    broker.register(DELETE_GROUPS, (0, 2), delete_groups)
    broker.register(OFFSET_DELETE, (0, 0), offset_delete)


def _coordinator(broker: Broker, request: Request, key: str, key_type: int) -> dict[str, Any]:
    """The answer for one key, in the fields that v0-v3 hold at the top level and v4+
    in each entry of `coordinators` (which adds the key)."""
    if key_type == TRANSACTION_KEY:
        # No transaction coordinator: a code that clients take as final, at once
        # (handlers/transactions.py); any other makes librdkafka ask again until
        # init_transactions() times out.
        log_refusal(request, key)
        return {"error_code": TRANSACTIONS_REFUSED, "node_id": -1,
                "host": "", "port": -1, "error_message": NOT_SUPPORTED}
    if key_type != GROUP_KEY:
        # Share groups (KIP-932): as Kafka answers when it has no share coordinator.
        return {"error_code": ErrorCode.invalid_request, "node_id": -1,
                "host": "", "port": -1, "error_message": "only group coordinators exist here"}
    if not access.group(broker, request, Operation.DESCRIBE, key):
        return {"error_code": access.GROUP_DENIED, "node_id": -1, "host": "",
                "port": -1, "error_message": access.GROUP_MESSAGE}
    return {"error_code": ErrorCode.none, "node_id": broker.node_id,
            "host": broker.host, "port": broker.port}


async def find_coordinator(broker: Broker, request: Request) -> dict[str, Any]:
    body = request.body
    if request.api_version >= 4:  # batched keys
        return {"coordinators": await mapped(
            body.coordinator_keys, lambda key: {"key": key, **_coordinator(
                broker, request, key, body.key_type)})}
    return _coordinator(broker, request, body.key, getattr(body, "key_type", GROUP_KEY))


def _failed(error: GroupError, **fields: Any) -> dict[str, Any]:
    return {"error_code": error.code, **fields}


async def join_group(broker: Broker, request: Request) -> dict[str, Any]:
    body = request.body
    if not access.group(broker, request, Operation.READ, body.group_id):
        return {"error_code": access.GROUP_DENIED, "generation_id": -1, "leader": "",
                "member_id": body.member_id, "members": []}
    session_timeout = body.session_timeout.total_seconds()
    rebalance = getattr(body, "rebalance_timeout", None)
    try:
        return await broker.groups.join(
            body.group_id, body.member_id, getattr(body, "group_instance_id", None),
            request.client_id or "", request.client_host, session_timeout,
            rebalance.total_seconds() if rebalance is not None else session_timeout,
            body.protocol_type, [(p.name, bytes(p.metadata)) for p in body.protocols],
            require_known_member_id=request.api_version >= 4,
            skip_assignment=request.api_version >= 9,
        )
    except GroupError as error:
        return _failed(error, generation_id=-1, leader="", member_id=body.member_id,
                       members=[])


async def sync_group(broker: Broker, request: Request) -> dict[str, Any]:
    body = request.body
    if not access.group(broker, request, Operation.READ, body.group_id):
        return {"error_code": access.GROUP_DENIED, "assignment": b""}
    try:
        return await broker.groups.sync(
            body.group_id, body.member_id, body.generation_id,
            {a.member_id: bytes(a.assignment) for a in body.assignments},
            getattr(body, "group_instance_id", None),  # v3+
        )
    except GroupError as error:
        return _failed(error, assignment=b"")


async def heartbeat(broker: Broker, request: Request) -> dict[str, Any]:
    body = request.body
    if not access.group(broker, request, Operation.READ, body.group_id):
        return {"error_code": access.GROUP_DENIED}
    try:
        broker.groups.heartbeat(body.group_id, body.member_id, body.generation_id,
                                getattr(body, "group_instance_id", None))  # v3+
        return {"error_code": ErrorCode.none}
    except GroupError as error:
        return _failed(error)


async def leave_group(broker: Broker, request: Request) -> dict[str, Any]:
    body = request.body
    if not access.group(broker, request, Operation.READ, body.group_id):
        return {"error_code": access.GROUP_DENIED, "members": []}
    if request.api_version >= 3:
        codes = broker.groups.leave(body.group_id, [
            (m.member_id, m.group_instance_id, getattr(m, "reason", None))  # reason: v5+
            for m in body.members])
        return {"error_code": ErrorCode.none, "members": [
            {"member_id": m.member_id, "group_instance_id": m.group_instance_id,
             "error_code": code}
            for m, code in zip(body.members, codes, strict=True)]}
    (code,) = broker.groups.leave(body.group_id, [(body.member_id, None, None)])
    return {"error_code": code}


async def offset_commit(broker: Broker, request: Request) -> dict[str, Any]:
    body = request.body
    generation = getattr(body, "generation_id_or_member_epoch", None)
    if generation is None:
        generation = body.generation_id
    codes: dict[tuple[str, int], ErrorCode] = {}
    offsets: dict[tuple[str, int], tuple[int, int, str | None]] = {}
    # Kafka: READ on the group (else every partition gets GROUP_AUTHORIZATION_FAILED),
    # then READ on each topic.
    group_allowed = access.group(broker, request, Operation.READ, body.group_id)
    denied = access.denied_topics(broker, request, Operation.READ,
                                 (t.name for t in body.topics))
    for topic in body.topics:
        for part in topic.partitions:
            key = (topic.name, part.partition_index)
            if not group_allowed:
                codes[key] = access.GROUP_DENIED
                continue
            if topic.name in denied:
                codes[key] = access.TOPIC_DENIED
                continue
            if not _partition_exists(broker, *key):
                codes[key] = ErrorCode.unknown_topic_or_partition
                continue
            offsets[key] = (part.committed_offset,
                            getattr(part, "committed_leader_epoch", -1),
                            part.committed_metadata)
    try:
        if offsets or group_allowed:
            await broker.groups.commit(body.group_id, body.member_id, generation, offsets,
                                       getattr(body, "group_instance_id", None))  # v7+
        for key in offsets:
            codes[key] = ErrorCode.none
    except GroupError as error:
        for key in offsets:
            codes[key] = error.code
    return {"topics": [
        {"name": topic.name, "partitions": [
            {"partition_index": p.partition_index,
             "error_code": codes[(topic.name, p.partition_index)]}
            for p in topic.partitions]}
        for topic in body.topics
    ]}


def _partition_exists(broker: Broker, topic: str, partition: int) -> bool:
    try:
        broker.store.topic(topic).partition(partition)
        return True
    except (UnknownTopicError, UnknownPartitionError):
        return False


async def _fetched_topics(broker: Broker, request: Request, group_id: str,
                          topics: Any) -> list[dict[str, Any]]:
    committed = broker.groups.fetch_offsets(group_id)
    if topics is None:  # null: every partition the group committed
        wanted: dict[str, list[int]] = {}
        for name, index in sorted(committed):
            wanted.setdefault(name, []).append(index)
    else:
        wanted = {t.name: list(t.partition_indexes) for t in topics}
    # Kafka: DESCRIBE on each topic; asked for all, the others are left out.
    denied = access.denied_topics(broker, request, Operation.DESCRIBE, wanted,
                                 audit=topics is not None)
    if topics is None:
        wanted = {name: indexes for name, indexes in wanted.items() if name not in denied}
    def entry(name: str, index: int) -> dict[str, Any]:
        if name in denied:
            return {"partition_index": index, "committed_offset": -1,
                    "committed_leader_epoch": -1, "metadata": "",
                    "error_code": access.TOPIC_DENIED}
        found = committed.get((name, index))
        return {"partition_index": index,
                "committed_offset": found.offset if found else -1,
                "committed_leader_epoch": found.leader_epoch if found else -1,
                "metadata": found.metadata if found else "",
                "error_code": ErrorCode.none}

    return [{"name": name, "partitions": await mapped(indexes, functools.partial(entry, name))}
            for name, indexes in wanted.items()]


async def offset_fetch(broker: Broker, request: Request) -> dict[str, Any]:
    body = request.body
    if request.api_version >= 8:  # batched groups
        groups = []
        for g in body.groups:
            if not access.group(broker, request, Operation.READ, g.group_id):
                groups.append({"group_id": g.group_id, "topics": [],
                               "error_code": access.GROUP_DENIED})
                continue
            groups.append({"group_id": g.group_id, "error_code": ErrorCode.none,
                           "topics": await _fetched_topics(broker, request, g.group_id,
                                                           g.topics)})
        return {"groups": groups}
    if not access.group(broker, request, Operation.READ, body.group_id):
        # Kafka: the top-level error (v2+); v1 has none, so each partition gets it.
        return {"error_code": access.GROUP_DENIED, "topics": [
            {"name": t.name, "partitions": [
                {"partition_index": index, "committed_offset": -1,
                 "committed_leader_epoch": -1, "metadata": "",
                 "error_code": access.GROUP_DENIED} for index in t.partition_indexes]}
            for t in body.topics or ()]}
    return {"topics": await _fetched_topics(broker, request, body.group_id, body.topics),
            "error_code": ErrorCode.none}


async def list_groups(broker: Broker, request: Request) -> dict[str, Any]:
    states = set(getattr(request.body, "states_filter", ()) or ())
    # Kafka: DESCRIBE on the cluster lists every group, else those the client may
    # DESCRIBE.
    every = access.cluster(broker, request, Operation.DESCRIBE, audit=False)
    groups = [
        {"group_id": g.group_id, "protocol_type": g.protocol_type or "consumer",
         "group_state": g.state, "group_type": "classic"}
        for g in broker.groups.groups.values()
        if (not states or g.state in states)
        and (every or access.group(broker, request, Operation.DESCRIBE, g.group_id,
                                  audit=False))
    ]
    return {"error_code": ErrorCode.none, "groups": groups}


async def describe_groups(broker: Broker, request: Request) -> dict[str, Any]:
    with_operations = getattr(request.body, "include_authorized_operations", False)

    def described(group_id: str) -> dict[str, Any]:
        if not access.group(broker, request, Operation.DESCRIBE, group_id):
            return {"group_id": group_id, "error_code": access.GROUP_DENIED,
                    "group_state": "", "protocol_type": "", "protocol_data": "",
                    "members": [], "authorized_operations": -2147483648}
        return {**broker.groups.describe(group_id), "authorized_operations": (
            access.operations(broker, request, ResourceType.GROUP, group_id)
            if with_operations else access.NOT_REQUESTED)}

    return {"groups": await mapped(request.body.groups, described)}


async def delete_groups(broker: Broker, request: Request) -> dict[str, Any]:
    names = list(request.body.groups_names)
    # Kafka: DELETE on each group.
    allowed = [n for n in names if access.group(broker, request, Operation.DELETE, n)]
    deleted = dict(zip(allowed, await broker.groups.delete_groups(allowed), strict=True))
    return {"results": [{"group_id": name, "error_code": deleted.get(name, access.GROUP_DENIED)}
                        for name in names]}


async def offset_delete(broker: Broker, request: Request) -> dict[str, Any]:
    """Kafka's OffsetDelete (KafkaApis.handleOffsetDeleteRequest, OffsetMetadataManager.
    deleteOffsets): partitions of unknown topics get UNKNOWN_TOPIC_OR_PARTITION, topics
    an active member subscribes to GROUP_SUBSCRIBED_TO_TOPIC, the rest lose their
    committed offsets (none committed is no error)."""
    body = request.body
    if not body.group_id:
        return {"error_code": ErrorCode.invalid_group_id, "topics": []}
    # Kafka: DELETE on the group, then READ on each topic.
    if not access.group(broker, request, Operation.DELETE, body.group_id):
        return {"error_code": access.GROUP_DENIED, "topics": []}
    denied = access.denied_topics(broker, request, Operation.READ,
                                 (t.name for t in body.topics))
    wanted = [(topic.name, part.partition_index)
              for topic in body.topics for part in topic.partitions]
    existing = await broker.run_io(
        lambda: {key for key in wanted if _partition_exists(broker, *key)})
    # From here on no await until the deletion has changed the group in memory, so the
    # group checked is the group changed.
    try:
        group = broker.groups.offsets_deletable(body.group_id)
    except GroupError as error:
        return {"error_code": error.code, "topics": []}
    subscribed = subscribed_topics(group)
    codes: dict[tuple[str, int], ErrorCode] = {}
    for key in wanted:
        if key[0] in denied:
            codes[key] = access.TOPIC_DENIED
        elif key not in existing:
            codes[key] = ErrorCode.unknown_topic_or_partition
        elif (key[0] in subscribed if subscribed is not None
              else group.protocol_type == "consumer"):  # unknown: assume in use, as Kafka
            codes[key] = ErrorCode.group_subscribed_to_topic
        else:
            codes[key] = ErrorCode.none
    try:
        await broker.groups.delete_offsets(
            group, [key for key, code in codes.items() if code is ErrorCode.none])
    except GroupError as error:
        return {"error_code": error.code, "topics": []}
    return {"error_code": ErrorCode.none, "topics": [
        {"name": topic.name, "partitions": [
            {"partition_index": p.partition_index,
             "error_code": codes[(topic.name, p.partition_index)]}
            for p in topic.partitions]}
        for topic in body.topics]}
