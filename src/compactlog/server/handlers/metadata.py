"""ApiVersions and Metadata.

A Metadata request naming a topic (or a topic id) more than once is answered once for
it, in the order first named, as Kafka answers the set of topics asked for
(KafkaApis: `metadataRequest.topics.asScala.toSet`): a 4 MiB request naming one topic
1.4 million times costs the server its decoding, not 1.4 million answers.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from kio.schema.errors import ErrorCode

from compactlog.errors import CompactlogError, UnknownTopicError
from compactlog.log_throttle import held_back
from compactlog.server.broker import Broker
from compactlog.server.protocol.error_codes import error_code, error_message
from compactlog.server.protocol.messages import Request, api_version_entries
from compactlog.server.security import access
from compactlog.server.security.acl_model import Operation
from compactlog.storage import Topic

API_VERSIONS, METADATA = 18, 3
log = logging.getLogger("compactlog.server")


def register(broker: Broker) -> None:
    broker.register(API_VERSIONS, (0, 4), api_versions)
    # v13 adds a top-level error code; kio's schema has it, so all of 0..13 are served.
    broker.register(METADATA, (0, 13), metadata)


async def api_versions(broker: Broker, request: Request) -> dict[str, Any]:
    return {"error_code": ErrorCode.none, "api_keys": api_version_entries(broker.advertised)}


def topic_uuid(topic: Topic) -> uuid.UUID:
    return uuid.UUID(hex=topic.meta.topic_id)


class TopicIds:
    """Topic ids to names for one request: the store's map, built once (one listing of
    the topics) on the first id asked and only if one is, so that a request naming
    4,000 ids costs 4,000 dict lookups, not 4,000 scans of every topic. Blocking: use it
    off the event loop."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self._ids: dict[str, str] | None = None

    def name(self, topic_id: uuid.UUID | None) -> str | None:
        """The name of the topic with this id, or None."""
        if topic_id is None or topic_id.int == 0:
            return None
        if self._ids is None:
            self._ids = self._broker.store.topic_ids()
        return self._ids.get(topic_id.hex)


async def metadata(broker: Broker, request: Request) -> dict[str, Any]:
    # Opening a topic the first time recovers its partitions (file I/O): off the loop.
    return await broker.run_io(_metadata, broker, request)


def _metadata(broker: Broker, request: Request) -> dict[str, Any]:
    body = request.body
    # Metadata v10+ may ask by topic id, with a null name. Asked for every topic, a
    # client gets those it may DESCRIBE, as from Kafka.
    wanted: list[tuple[str | None, uuid.UUID | None]] = (
        [(name, None) for name in broker.store.list_topics()
         if access.topic(broker, request, Operation.DESCRIBE, name, audit=False)]
        if body.topics is None
        else list(dict.fromkeys((t.name, getattr(t, "topic_id", None))
                                for t in body.topics)))
    with_operations = getattr(body, "include_topic_authorized_operations", False)
    topics: list[dict[str, Any]] = []
    ids = TopicIds(broker)
    for name, topic_id in wanted:
        by_id = name is None
        if name is None:
            # A map lookup; the ACL is checked next, before the topic is opened (Kafka's
            # order: metadata cache, then authorization, then the work).
            name = ids.name(topic_id)
            if name is None:
                topics.append({"error_code": ErrorCode.unknown_topic_id, "name": None,
                               "topic_id": topic_id or uuid.UUID(int=0), "partitions": []})
                continue
        if not access.topic(broker, request, Operation.DESCRIBE, name):
            # Kafka answers a named topic the client may not describe with
            # TOPIC_AUTHORIZATION_FAILED, whether or not it exists (a topic id is not
            # secret: the name stays null).
            topics.append({"error_code": access.TOPIC_DENIED,
                           "name": None if by_id else name,
                           "topic_id": topic_id if by_id and topic_id else uuid.UUID(int=0),
                           "partitions": []})
            continue
        try:
            topic = broker.store.topic(name)
        except UnknownTopicError:
            # No auto-creation: a compacted topic needs its config chosen up front.
            topics.append({"error_code": ErrorCode.unknown_topic_or_partition, "name": name,
                           "topic_id": uuid.UUID(int=0), "partitions": []})
            continue
        except (OSError, CompactlogError) as error:
            # A topic that cannot be opened (a damaged file, the open-file limit) is
            # answered with its error; the others as usual.
            held = broker.failure_log.allow(("metadata", name))
            if held is not None:
                log.error("Metadata: topic %s cannot be opened: %s%s", name,
                          error_message(error), held_back(held))
            topics.append({"error_code": error_code(error), "name": name,
                           "topic_id": uuid.UUID(int=0), "partitions": []})
            continue
        topics.append({
            "error_code": ErrorCode.none,
            "name": name,
            "topic_id": topic_uuid(topic),
            "is_internal": False,
            "partitions": [
                {"error_code": ErrorCode.none, "partition_index": index,
                 "leader_id": broker.node_id, "leader_epoch": 0,
                 "replica_nodes": [broker.node_id], "isr_nodes": [broker.node_id],
                 "offline_replicas": []}
                for index in range(topic.meta.partitions)
            ],
            "topic_authorized_operations": (
                access.topic_operations(broker, request, name) if with_operations
                else -2147483648),  # "not requested"
        })
    return {
        "brokers": [{"node_id": broker.node_id, "host": broker.host, "port": broker.port,
                     "rack": None}],
        "cluster_id": broker.cluster_id,
        "controller_id": broker.node_id,
        "topics": topics,
        # v8-10 may ask for the cluster's operations too.
        "cluster_authorized_operations": (
            access.cluster_operations(broker, request)
            if getattr(body, "include_cluster_authorized_operations", False)
            else access.NOT_REQUESTED),
        "error_code": ErrorCode.none,
    }
