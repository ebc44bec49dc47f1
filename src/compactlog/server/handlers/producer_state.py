"""DescribeProducers: each partition's active idempotent producers (kafka-python's
describe_producers, Kafka's kafka-transactions.sh describe-producers).

Invariant: the answer is read from the state the Produce path keeps and checks
(server/producers.py), loaded the same way, so it lists exactly the producers whose
sequence numbers the partition checks. Transactions are not supported, so no producer
has a transaction open (coordinator epoch and transaction start -1, as Kafka answers
for an idempotent producer).
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from compactlog.server.broker import Broker
from compactlog.server.producers import rebuild_entries
from compactlog.server.protocol.error_codes import error_code, error_message
from compactlog.server.protocol.messages import Request
from compactlog.server.security import access
from compactlog.server.security.acl_model import Operation

DESCRIBE_PRODUCERS = 61


def register(broker: Broker) -> None:
    broker.register(DESCRIBE_PRODUCERS, (0, 0), describe_producers)


async def describe_producers(broker: Broker, request: Request) -> dict[str, Any]:
    # Kafka: READ on each topic.
    denied = access.denied_topics(broker, request, Operation.READ,
                                 (t.name for t in request.body.topics))
    return {"topics": await broker.run_io(_describe_producers, broker, request.body.topics,
                                          denied)}


def _describe_producers(broker: Broker, topics: Any,
                        denied: set[str]) -> list[dict[str, Any]]:
    return [{"name": topic.name, "partitions": [
        {"partition_index": index, "error_code": access.TOPIC_DENIED,
         "error_message": access.TOPIC_MESSAGE, "active_producers": []}
        if topic.name in denied else _producers_of(broker, topic.name, index)
        for index in topic.partition_indexes]}
        for topic in topics]


def _producers_of(broker: Broker, name: str, index: int) -> dict[str, Any]:
    try:
        partition = broker.store.topic(name).partition(index)
        producers = broker.producers
        state = producers.state_of(partition)
        now_ms = int(producers.clock() * 1000)
        with state.lock:
            if not state.loaded:
                # What the first idempotent produce after a restart would load
                # (ProducerStates.append), so the answer is the state that produce checks.
                state.entries = rebuild_entries(partition, now_ms)
                state.loaded = True
            entries = [entry for entry in state.entries.values()
                       if now_ms - entry.last_written_ms < producers.expiration_ms]
        return {"partition_index": index, "error_code": ErrorCode.none, "error_message": None,
                "active_producers": [
                    # last_timestamp: the broker's clock at the producer's last append (or
                    # at the rebuild after a restart), which is what expiry counts from.
                    {"producer_id": e.producer_id, "producer_epoch": e.epoch,
                     "last_sequence": e.last_seq, "last_timestamp": e.last_written_ms,
                     "coordinator_epoch": -1, "current_txn_start_offset": -1}
                    for e in sorted(entries, key=lambda e: e.producer_id)]}
    except Exception as error:
        return {"partition_index": index, "error_code": error_code(error),
                "error_message": error_message(error), "active_producers": []}
