"""The one seam between handlers and the authorizer: what a request may do.

Of the three ACL modules this is the one the Kafka protocol handlers call: the rule
is acl_model.py's, the ACLs in force and their storage authorizer.py's.

Invariant: every handler asks here, with the request (its principal and host) and the
operation Kafka's KafkaApis checks for that API, before it reads or changes anything
the answer could reveal; with the authorizer off every question is answered yes. The
error codes are Kafka's: TOPIC_AUTHORIZATION_FAILED, GROUP_AUTHORIZATION_FAILED,
CLUSTER_AUTHORIZATION_FAILED.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from kio.schema.errors import ErrorCode

from compactlog.server.security.acl_model import CLUSTER_NAME, Operation, ResourceType

if TYPE_CHECKING:
    from compactlog.server.broker import Broker
    from compactlog.server.protocol.messages import Request

TOPIC_DENIED = ErrorCode.topic_authorization_failed
GROUP_DENIED = ErrorCode.group_authorization_failed
CLUSTER_DENIED = ErrorCode.cluster_authorization_failed

# Kafka's messages for the errors' exceptions, where a response has room for one.
CLUSTER_MESSAGE = "Cluster authorization failed."
TOPIC_MESSAGE = "Topic authorization failed."
GROUP_MESSAGE = "Group authorization failed."

# The operations of each resource type that authorized-operations bit fields list
# (Metadata, DescribeGroups, DescribeCluster): Kafka's AclEntry.supportedOperations.
SUPPORTED_OPERATIONS = {
    ResourceType.TOPIC: (Operation.READ, Operation.WRITE, Operation.CREATE,
                         Operation.DESCRIBE, Operation.DELETE, Operation.ALTER,
                         Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS),
    ResourceType.GROUP: (Operation.READ, Operation.DESCRIBE, Operation.DELETE,
                         Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS),
    ResourceType.CLUSTER: (Operation.CREATE, Operation.CLUSTER_ACTION,
                           Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS,
                           Operation.IDEMPOTENT_WRITE, Operation.ALTER, Operation.DESCRIBE),
}
NOT_REQUESTED = -2147483648  # an authorized-operations field not asked for


def allowed(broker: Broker, request: Request, operation: Operation,
            resource_type: ResourceType, name: str, audit: bool = True) -> bool:
    """`audit=False` for a question whose "no" only leaves something out of a listing
    (not logged as a denial)."""
    return broker.authorizer.authorize(request.principal, request.client_host, operation,
                                       resource_type, name, audit)


def topic(broker: Broker, request: Request, operation: Operation, name: str,
          audit: bool = True) -> bool:
    return allowed(broker, request, operation, ResourceType.TOPIC, name, audit)


def group(broker: Broker, request: Request, operation: Operation, name: str,
          audit: bool = True) -> bool:
    return allowed(broker, request, operation, ResourceType.GROUP, name, audit)


def cluster(broker: Broker, request: Request, operation: Operation,
            audit: bool = True) -> bool:
    return allowed(broker, request, operation, ResourceType.CLUSTER, CLUSTER_NAME, audit)


def by_type(broker: Broker, request: Request, operation: Operation,
            resource_type: ResourceType) -> bool:
    """Whether the request may do `operation` on some resource of the type."""
    return broker.authorizer.authorize_by_type(request.principal, request.client_host,
                                               operation, resource_type)


def denied_topics(broker: Broker, request: Request, operation: Operation,
                  names: Iterable[str], audit: bool = True) -> set[str]:
    """The names among `names` that the request may not `operation`."""
    if not broker.authorizer.enabled:
        return set()
    return {name for name in set(names)
            if not topic(broker, request, operation, name, audit)}


def operations(broker: Broker, request: Request, resource_type: ResourceType,
               name: str) -> int:
    """Kafka's authorized-operations bit field (bit n: operation code n) of a resource:
    those of its type's operations the request may do (all of them with the authorizer
    off, as Kafka answers with no authorizer)."""
    bits = 0
    for operation in SUPPORTED_OPERATIONS[resource_type]:
        if allowed(broker, request, operation, resource_type, name, audit=False):
            bits |= 1 << int(operation)
    return bits


def topic_operations(broker: Broker, request: Request, name: str) -> int:
    return operations(broker, request, ResourceType.TOPIC, name)


def cluster_operations(broker: Broker, request: Request) -> int:
    """DescribeCluster's and Metadata's field: 0 without DESCRIBE on the cluster (Kafka's
    KafkaApis), else the cluster's operations."""
    if not cluster(broker, request, Operation.DESCRIBE, audit=False):
        return 0
    return operations(broker, request, ResourceType.CLUSTER, CLUSTER_NAME)
