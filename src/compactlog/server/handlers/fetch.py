"""Fetch and ListOffsets.

Fetch long-polls: with too little data it waits for an append (or max_wait) instead of
answering empty at once, or clients spin. Fetch sessions (KIP-227) are declined with
session id 0, and clients fall back to full requests. On a compacted topic every read
is of the compacted view: the ledger up to the horizon, then the live log, with the
original offsets, gaps included, as a Kafka consumer of a cleaned log sees it.

What one Fetch costs is bounded whatever the client asks, as in Kafka: the response
holds at most the broker's `fetch_max_bytes` (Kafka's fetch.max.bytes, 55 MiB) of
records, or the request's max_bytes if smaller (the first batch goes out whole, so a
consumer can always make progress); and a partition named more than once is read and
answered once, for its last entry, as Kafka's FetchRequest keys its partitions in a
map (a LinkedHashMap: the first position, the last value).

A partition that cannot be served gets its error code and an empty record set, never a
null one, as in Kafka (MemoryRecords.EMPTY): librdkafka takes a null record set for a
parse failure and retries at once, in a tight loop. Storage failures are logged once
per partition per minute, since consumers retry them many times a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from kio.schema.errors import ErrorCode

from compactlog.log_throttle import held_back
from compactlog.server.broker import Broker
from compactlog.server.handlers.grouping import by_topic as answers_by_topic
from compactlog.server.protocol.error_codes import error_code, error_message
from compactlog.server.protocol.messages import Request
from compactlog.server.protocol.record_batches import read_batches, view_start_offset
from compactlog.server.security import access
from compactlog.server.security.acl_model import Operation
from compactlog.storage import iter_batches

FETCH, LIST_OFFSETS = 1, 2
EARLIEST, LATEST = -2, -1
READ_COMMITTED = 1  # Fetch and ListOffsets isolation_level
log = logging.getLogger("compactlog.server")


def register(broker: Broker) -> None:
    # Fetch 13+ addresses topics by id; names are enough for every client we serve.
    broker.register(FETCH, (4, 12), fetch)
    broker.register(LIST_OFFSETS, (1, 8), list_offsets)


async def fetch(broker: Broker, request: Request) -> dict[str, Any]:
    body = request.body
    # One entry per partition, where it was first named, with its last entry's offset
    # and limit (Kafka's map).
    entries: dict[tuple[str, int], tuple[int, int]] = {}
    for topic in body.topics:
        for part in topic.partitions:
            entries[(topic.topic, part.partition)] = (part.fetch_offset,
                                                      part.partition_max_bytes)
    wanted = [(name, index, offset, partition_max)
              for (name, index), (offset, partition_max) in entries.items()]
    # Kafka: READ on each topic, checked before anything is read.
    denied = access.denied_topics(broker, request, Operation.READ, (w[0] for w in wanted))
    max_bytes = max(min(body.max_bytes, broker.fetch_max_bytes), 1)
    max_wait = body.max_wait.total_seconds()
    deadline = time.monotonic() + max_wait
    while True:
        waiter = broker.data_arrived  # taken before reading, so no append is missed
        results = await broker.run_io(_read_all, broker, wanted, max_bytes, denied)
        size = sum(len(r.get("records") or b"") for r in results)
        failed = any(r["error_code"] is not ErrorCode.none for r in results)
        remaining = deadline - time.monotonic()
        if size >= max(body.min_bytes, 1) or failed or remaining <= 0:
            break
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(waiter.wait(), remaining)
    # Isolation levels: compactlog has no transactions (transactional producers are
    # refused, handlers/transactions.py), so nothing is uncommitted and a read_committed
    # fetch (librdkafka's default) reads up to the high watermark, which is also the
    # last stable offset; ListOffsets(latest) gives it for both levels. As Kafka does,
    # aborted transactions are listed (none) only to read_committed fetches, and null
    # to read_uncommitted ones.
    read_committed = getattr(body, "isolation_level", 0) == READ_COMMITTED
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for (name, index, _, _), result in zip(wanted, results, strict=True):
        part = {"partition_index": index, **result}
        if read_committed and result["error_code"] is ErrorCode.none:
            part["aborted_transactions"] = []
        by_topic.setdefault(name, []).append(part)
        if records := result.get("records"):
            # Counted on the reads sent, not on the long-poll's earlier, empty-handed ones.
            broker.metrics.records_out.labels(name).inc(
                sum(header.record_count for _, header in iter_batches(records)))
            broker.metrics.bytes_out.labels(name).inc(len(records))
    return {
        "error_code": ErrorCode.none,
        "session_id": 0,
        "responses": [{"topic": name, "partitions": parts} for name, parts in by_topic.items()],
    }


def _read_all(broker: Broker, wanted: list[tuple[str, int, int, int]],
              max_bytes: int, denied: set[str]) -> list[dict[str, Any]]:
    budget = max_bytes
    results = []
    for name, index, offset, partition_max in wanted:
        if name in denied:
            results.append({"error_code": access.TOPIC_DENIED, "high_watermark": -1,
                            "last_stable_offset": -1, "log_start_offset": -1,
                            "preferred_read_replica": -1, "records": b""})
            continue
        try:
            # A server that is no longer the owner serves nothing (NOT_LEADER_OR_FOLLOWER):
            # its state is frozen, and its consumers must go to the new owner.
            broker.store.require_serving()
            partition = broker.store.topic(name).partition(index)
            partition.require_owner()
            compacted = partition.config.compacted
            # Kafka's rule: the first batch of the response goes out whole even when it
            # is over the limits, so that a consumer can always make progress.
            limit = max(min(partition_max, budget), 0)
            # A compacted view starts below the log start when retention removed raw
            # segments that the ledger still covers.
            start, end = view_start_offset(partition, compacted), partition.log_end_offset
            if not start <= offset <= end:
                results.append(_out_of_range(start, partition.high_watermark))
                continue
            records = b""
            if limit > 0 or budget == max_bytes:
                read = read_batches(partition, offset, limit, compacted)
                # The watermarks of the view the records came from: an append since the
                # range check must not put records past the high watermark we report.
                records, start, end = read.records, read.log_start_offset, read.high_watermark
            budget -= len(records)
            results.append({
                "error_code": ErrorCode.none, "high_watermark": end,
                "last_stable_offset": end, "log_start_offset": start,
                "preferred_read_replica": -1, "records": records,
            })
        except Exception as error:
            code = error_code(error)
            _log_failure(broker, name, index, code, error)
            results.append({"error_code": code, "high_watermark": -1,
                            "last_stable_offset": -1, "log_start_offset": -1,
                            "preferred_read_replica": -1, "records": b""})
    return results


def _out_of_range(start: int, end: int) -> dict[str, Any]:
    return {"error_code": ErrorCode.offset_out_of_range, "high_watermark": end,
            "last_stable_offset": end, "log_start_offset": start,
            "preferred_read_replica": -1, "records": b""}


def _log_failure(broker: Broker, name: str, index: int, code: ErrorCode,
                 error: Exception) -> None:
    """Failures of the server or its disk are logged (the client's own mistakes, such
    as an unknown topic, are not), once per partition per minute."""
    if code not in (ErrorCode.kafka_storage_error, ErrorCode.unknown_server_error):
        return
    held = broker.failure_log.allow(("fetch", name, index))
    if held is None:
        return
    # A bug gets its traceback; a storage error's message names the file and the problem.
    log.error("fetch from %s/%d failed (%s): %s%s", name, index, code.name.upper(),
              error_message(error), held_back(held),
              exc_info=error if code is ErrorCode.unknown_server_error else None)


async def list_offsets(broker: Broker, request: Request) -> dict[str, Any]:
    wanted = [(topic.name, part.partition_index, part.timestamp)
              for topic in request.body.topics for part in topic.partitions]
    denied = access.denied_topics(broker, request, Operation.DESCRIBE, (w[0] for w in wanted))
    results = await broker.run_io(_lookup_all, broker, wanted, denied)
    return {"topics": [{"name": name, "partitions": parts} for name, parts
                       in answers_by_topic(wanted, results, "partition_index").items()]}


def _lookup_all(broker: Broker, wanted: list[tuple[str, int, int]],
                denied: set[str]) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    for name, index, timestamp in wanted:
        if name in denied:
            results.append({"error_code": access.TOPIC_DENIED, "timestamp": -1, "offset": -1,
                            "leader_epoch": -1})
            continue
        try:
            broker.store.require_serving()
            partition = broker.store.topic(name).partition(index)
            partition.require_owner()
            if timestamp == EARLIEST:
                found, at = view_start_offset(partition, partition.config.compacted), -1
            elif timestamp == LATEST:
                # Kafka's answer to both isolation levels: the high watermark.
                found, at = partition.high_watermark, -1
            elif timestamp < 0:
                raise ValueError(f"unsupported ListOffsets timestamp {timestamp}")
            else:
                offset = partition.offset_for_timestamp(timestamp)  # below the watermark
                if offset is None:
                    found, at = -1, -1
                else:
                    record = partition.read(offset, 1)
                    found, at = offset, record[0].timestamp if record else timestamp
            results.append({"error_code": ErrorCode.none, "timestamp": at, "offset": found,
                            "leader_epoch": 0})
        except ValueError:  # ListOffsets has no error message: the code says it all
            results.append({"error_code": ErrorCode.invalid_request, "timestamp": -1,
                            "offset": -1, "leader_epoch": -1})
        except Exception as error:
            results.append({"error_code": error_code(error), "timestamp": -1, "offset": -1,
                            "leader_epoch": -1})
    return results
