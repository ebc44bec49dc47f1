"""Produce: append the producer's record batches as they are, without re-encoding.

Each partition's records are validated (structure, CRC32C, record decoding, keys on
compacted topics) and appended by the store, which assigns offsets by rewriting only
the batch's base offset (outside the CRC). acks=0 gets no response at all; acks=1 and
acks=-1 are the same on a single broker: the response goes once the store has taken
the batch under the topic's flush policy.
"""

from __future__ import annotations

import logging
from typing import Any

from kio.schema.errors import ErrorCode

from compactlog.errors import InvalidRecordError
from compactlog.server.broker import Broker
from compactlog.server.errors import error_code, error_message
from compactlog.server.protocol import Request
from compactlog.storage.records import iter_batches

PRODUCE = 0
log = logging.getLogger("compactlog.server")


def register(broker: Broker) -> None:
    # v3 is the floor of kio's schemas (KIP-896); v13 addresses topics by id only.
    broker.register(PRODUCE, (3, 12), produce)


async def produce(broker: Broker, request: Request) -> dict[str, Any] | None:
    body = request.body
    work = [(topic.name, part.index, bytes(part.records or b""))
            for topic in body.topic_data for part in topic.partition_data]
    results = await broker.run_io(_append_all, broker, work)
    broker.notify_data()
    if body.acks == 0:
        return None
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for (name, index, _), result in zip(work, results, strict=True):
        by_topic.setdefault(name, []).append({"index": index, **result})
    return {"responses": [{"name": name, "partition_responses": parts}
                          for name, parts in by_topic.items()]}


def _append_all(broker: Broker, work: list[tuple[str, int, bytes]]) -> list[dict[str, Any]]:
    return [_append_one(broker, name, index, records) for name, index, records in work]


def _append_one(broker: Broker, name: str, index: int, records: bytes) -> dict[str, Any]:
    try:
        partition = broker.store.topic(name).partition(index)
        batches = list(iter_batches(records))
        consumed = sum(header.size for _, header in batches)
        if not batches or consumed != len(records):
            raise InvalidRecordError(
                f"{name}/{index}: the records field holds {len(records)} bytes of which "
                f"{consumed} form whole record batches"
            )
        first = None
        for position, header in batches:
            result = partition.append_batch(bytearray(records[position:position + header.size]))
            first = result.base_offset if first is None else first
        return {"error_code": ErrorCode.none, "base_offset": first, "log_append_time": None,
                "log_start_offset": partition.log_start_offset}
    except Exception as error:
        return _failed(error, name, index)


def _failed(error: Exception, name: str, index: int) -> dict[str, Any]:
    code = error_code(error)
    if code is ErrorCode.unknown_server_error:
        log.exception("produce to %s/%d failed", name, index)
    else:
        log.info("produce to %s/%d refused: %s", name, index, error)
    return {"error_code": code, "base_offset": -1, "log_append_time": None,
            "log_start_offset": -1, "error_message": error_message(error)}
