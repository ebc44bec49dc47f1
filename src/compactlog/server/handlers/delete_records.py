"""DeleteRecords: move partitions' log start offsets (Kafka's low watermark) forward.

Invariant: after a successful DeleteRecords no view of the partition, raw or compacted,
serves an offset below the one asked for (the store's `Partition.delete_records`), and
the low watermark answered is where the partition's view now starts: what Fetch
reports as its log start offset and ListOffsets(earliest) answers, so a consumer that
starts from the earliest offset starts there.

As Kafka's `Partition.deleteRecordsOnLeader`: offset -1 means the high watermark; an
offset below 0 or past the high watermark gets OFFSET_OUT_OF_RANGE; one at or below the
current start changes nothing and answers the current start; and a topic whose
cleanup.policy does not include `delete` (compact alone) refuses with POLICY_VIOLATION,
since there records leave only when a newer record of their key supersedes them.
`compact,delete` allows it, and the compacted view loses the records below the offset
too (docs/server.md, "Deleting records").
"""

from __future__ import annotations

import logging
from typing import Any

from kio.schema.errors import ErrorCode

from compactlog.server.broker import Broker
from compactlog.server.handlers.grouping import by_topic
from compactlog.server.protocol.error_codes import error_code
from compactlog.server.protocol.messages import Request
from compactlog.server.protocol.record_batches import view_start_offset
from compactlog.server.security import access
from compactlog.server.security.acl_model import Operation

DELETE_RECORDS = 21
HIGH_WATERMARK = -1  # Kafka's DeleteRecordsRequest.HIGH_WATERMARK
log = logging.getLogger("compactlog.server")


def register(broker: Broker) -> None:
    broker.register(DELETE_RECORDS, (0, 2), delete_records)


async def delete_records(broker: Broker, request: Request) -> dict[str, Any]:
    wanted = [(topic.name, part.partition_index, part.offset)
              for topic in request.body.topics for part in topic.partitions]
    # Kafka: DELETE on each topic.
    denied = access.denied_topics(broker, request, Operation.DELETE, (w[0] for w in wanted))
    results = await broker.run_io(_delete_all, broker, wanted, denied)
    return {"topics": [{"name": name, "partitions": parts} for name, parts
                       in by_topic(wanted, results, "partition_index").items()]}


def _delete_all(broker: Broker, wanted: list[tuple[str, int, int]],
                denied: set[str]) -> list[dict[str, Any]]:
    return [{"low_watermark": -1, "error_code": access.TOPIC_DENIED} if name in denied
            else _delete_one(broker, name, index, offset) for name, index, offset in wanted]


def _delete_one(broker: Broker, name: str, index: int, offset: int) -> dict[str, Any]:
    # The response has no room for a message: refusals are logged instead.
    try:
        partition = broker.store.topic(name).partition(index)
        config = partition.config
        if "delete" not in config.cleanup_policy.split(","):
            log.info("DeleteRecords on %s refused: cleanup.policy=%s has no 'delete' "
                     "(POLICY_VIOLATION, as Kafka)", partition.name, config.cleanup_policy)
            return {"low_watermark": -1, "error_code": ErrorCode.policy_violation}
        before = partition.high_watermark if offset == HIGH_WATERMARK else offset
        partition.delete_records(before)  # OffsetOutOfRangeError below 0 or past the end
        return {"low_watermark": view_start_offset(partition, config.compacted),
                "error_code": ErrorCode.none}
    except Exception as error:
        code = error_code(error)
        if code not in (ErrorCode.unknown_topic_or_partition, ErrorCode.offset_out_of_range):
            log.warning("DeleteRecords on %s/%d failed (%s): %s", name, index,
                        code.name.upper(), error)
        return {"low_watermark": -1, "error_code": code}
