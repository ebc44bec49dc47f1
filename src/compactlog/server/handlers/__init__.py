"""Protocol handlers, one module per group of APIs; `register_all` builds the table.

Each handler turns one decoded request into a version-neutral response dict (see
server/protocol/messages.py). The version ranges here are what the server advertises in
ApiVersions: only what is implemented (shared/notes/kafka-protocol.md §2).
"""

from __future__ import annotations

from compactlog.server.broker import Broker
from compactlog.server.handlers import (
    acls,
    cluster,
    configs,
    delete_records,
    fetch,
    groups,
    metadata,
    produce,
    producer_state,
    sasl,
    topics,
)


def register_all(broker: Broker) -> None:
    metadata.register(broker)
    produce.register(broker)
    fetch.register(broker)
    topics.register(broker)
    configs.register(broker)
    delete_records.register(broker)
    cluster.register(broker)
    producer_state.register(broker)
    groups.register(broker)
    sasl.register(broker)
    acls.register(broker)
