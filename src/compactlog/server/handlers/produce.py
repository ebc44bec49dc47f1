"""Produce and InitProducerId: append the producer's record batches as they are.

Each partition's records are validated (structure, CRC32C, record decoding, keys on
compacted topics) and appended by the store, which assigns offsets by rewriting only
the batch's base offset (outside the CRC). acks=0 gets no response at all; if any of
its partitions failed (denied, unknown, invalid, storage), the connection is closed, as
Kafka's KafkaApis.handleProduceRequest closes it, so that the producer notices and
refreshes its metadata instead of sending into a void. On a local directory acks=1
and acks=-1 are the same: the response goes once the store has taken the batch under
the topic's flush policy. On an object store acks=-1 waits until the records are in the
bucket (server/uploads.py, `ack_after_upload`), and acks=1 until they are on this
server's disk. Either way a server whose writer lease lapsed answers
NOT_LEADER_OR_FOLLOWER instead of acknowledging (`_unless_still_the_owner`).

Batches with a producer id come from idempotent producers (KIP-98): InitProducerId
hands out the ids, and server/producers.py checks each such batch's epoch and sequence
numbers against the partition's producer state, answers a resent batch with its
original offsets instead of appending it again, and appends the rest, atomically per
partition. As in Kafka, such a partition's records must be exactly one batch.

Transactions are not supported: InitProducerId with a transactional id is answered
with TRANSACTIONAL_ID_AUTHORIZATION_FAILED, as FindCoordinator for a transaction
coordinator is (see handlers/transactions.py for why that code: librdkafka retries
UNSUPPORTED_VERSION every 500 ms until init_transactions() times out). Transactional
batches are refused with INVALID_TXN_STATE, as Kafka refuses them outside a
transaction it knows of.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from compactlog.errors import InvalidRecordError
from compactlog.log_throttle import Throttle, held_back
from compactlog.server.broker import Broker
from compactlog.server.handlers.grouping import by_topic
from compactlog.server.handlers.transactions import TRANSACTIONS_REFUSED, log_refusal
from compactlog.server.producers import (
    NO_EPOCH,
    NO_PRODUCER_ID,
    ProducerStateError,
    check_producer_fields,
)
from compactlog.server.protocol.error_codes import error_code, error_message
from compactlog.server.protocol.messages import ProtocolError, Request
from compactlog.server.security import access
from compactlog.server.security.acl_model import Operation, ResourceType
from compactlog.storage import iter_batches

if TYPE_CHECKING:
    from compactlog.storage import Partition

PRODUCE, INIT_PRODUCER_ID = 0, 22
LAST_OFFSET = "_last_offset"  # (partition, last offset) of an append; not sent
log = logging.getLogger("compactlog.server")


def register(broker: Broker) -> None:
    # v3 is the floor of kio's schemas (KIP-896); v13 addresses topics by id only.
    # Advertised from v0 as Kafka 4 does (KAFKA-18659): librdkafka before 2.10 sends
    # gzip, snappy and lz4 uncompressed unless the broker lists Produce v0
    # (librdkafka#4956). Requests below v3 are still refused.
    broker.register(PRODUCE, (3, 12), produce, advertised_min=0)
    # v3 adds the KIP-360 epoch bump; v6 adds KIP-939's two-phase commit, which is
    # for transactions only.
    broker.register(INIT_PRODUCER_ID, (0, 5), init_producer_id)


async def produce(broker: Broker, request: Request) -> dict[str, Any] | None:
    body = request.body
    work = [(topic.name, part.index, bytes(part.records or b""))
            for topic in body.topic_data for part in topic.partition_data]
    # Kafka: WRITE on each topic; a denied partition is not appended to.
    denied = access.denied_topics(broker, request, Operation.WRITE, (w[0] for w in work))
    results = await broker.run_io(_append_all, broker, work, denied)
    broker.notify_data()
    last_offsets = [result.pop(LAST_OFFSET, None) for result in results]
    if broker.uploads is not None and body.acks == -1 and broker.uploads.acks_all_waits:
        await _wait_for_uploads(broker, work, results, last_offsets,
                                int(body.timeout.total_seconds() * 1000))
    if body.acks != 0:
        _unless_still_the_owner(broker, work, results, last_offsets)
    if body.acks == 0:
        failed = [f"{name}/{index}: {ErrorCode(result['error_code']).name.upper()}"
                  for (name, index, _), result in zip(work, results, strict=True)
                  if result["error_code"] != ErrorCode.none]
        if failed:
            raise ProtocolError(
                f"a Produce with acks=0 (correlation id {request.correlation_id}) failed "
                f"for {', '.join(failed[:10])}{' ...' if len(failed) > 10 else ''}; the "
                "connection is closed so that the producer notices, as Kafka does")
        return None
    return {"responses": [{"name": name, "partition_responses": parts}
                          for name, parts in by_topic(work, results, "index").items()]}


async def _wait_for_uploads(broker: Broker, work: list[tuple[str, int, bytes]],
                            results: list[dict[str, Any]],
                            last_offsets: list[tuple[Partition, int] | None],
                            timeout_ms: int) -> None:
    """ack_after_upload (server/uploads.py): each appended partition's answer waits
    until its records are in the object store, or says REQUEST_TIMED_OUT."""
    assert broker.uploads is not None
    waits = [(index, found) for index, found in enumerate(last_offsets) if found is not None]
    done = await asyncio.gather(*(broker.uploads.wait(partition, last, timeout_ms / 1000)
                                  for _, (partition, last) in waits))
    for (index, _), uploaded in zip(waits, done, strict=True):
        if not uploaded:
            results[index]["error_code"] = ErrorCode.request_timed_out
            results[index]["error_message"] = (
                f"{work[index][0]}/{work[index][1]}: the records were not in the object "
                f"store within timeout_ms={timeout_ms} (ack_after_upload)")


def _unless_still_the_owner(broker: Broker, work: list[tuple[str, int, bytes]],
                            results: list[dict[str, Any]],
                            last_offsets: list[tuple[Partition, int] | None]) -> None:
    """A server whose writer lease lapsed while it appended or uploaded (lease.py step 4)
    acknowledges nothing: another server may own the partitions already, and its log,
    not this one's, is the partition's history. The producer retries there."""
    try:
        broker.store.require_serving()
        return
    except Exception as error:
        lapsed = error
    for index, appended in enumerate(last_offsets):
        if appended is not None and results[index]["error_code"] == ErrorCode.none:
            results[index].update(_failed(lapsed, work[index][0], work[index][1]))


def _append_all(broker: Broker, work: list[tuple[str, int, bytes]],
                denied: set[str]) -> list[dict[str, Any]]:
    return [{"error_code": access.TOPIC_DENIED, "base_offset": -1, "log_append_time": None,
             "log_start_offset": -1} if name in denied
            else _append_one(broker, name, index, records)
            for name, index, records in work]


def _append_one(broker: Broker, name: str, index: int, records: bytes) -> dict[str, Any]:
    try:
        broker.store.require_serving()  # no longer the owner: NOT_LEADER_OR_FOLLOWER
        partition = broker.store.topic(name).partition(index)
        batches = list(iter_batches(records))
        consumed = sum(header.size for _, header in batches)
        if not batches or consumed != len(records):
            raise InvalidRecordError(
                f"{name}/{index}: the records field holds {len(records)} bytes of which "
                f"{consumed} form whole record batches"
            )
        if len(batches) != 1:
            # Kafka refuses a v3+ produce of more than one batch per partition (INVALID_
            # RECORD), so that a partition's records are stored all or not at all.
            raise InvalidRecordError(
                f"{partition.name}: a produce carries exactly one record batch per "
                f"partition, not {len(batches)}"
            )
        (_, header), = batches
        check_producer_fields(header, partition.name)
        if header.producer_id >= 0:
            appended = broker.producers.append(partition, bytearray(records), header)
            first, append_time = appended.base_offset, appended.log_append_time
        else:
            result = partition.append_batch(bytearray(records))
            first, append_time = result.base_offset, result.log_append_time
        broker.metrics.records_in.labels(name).inc(header.record_count)
        broker.metrics.bytes_in.labels(name).inc(len(records))
        return {"error_code": ErrorCode.none, "base_offset": first,
                "log_append_time": _log_append_time(append_time),
                "log_start_offset": partition.log_start_offset,
                LAST_OFFSET: (partition, first + header.last_offset_delta)}
    except Exception as error:
        return _failed(error, name, index)


def _log_append_time(ms: int) -> datetime.datetime | None:
    """log_append_time_ms as kio takes it: None stands for -1 (a CreateTime topic)."""
    if ms < 0:
        return None
    return _EPOCH + datetime.timedelta(milliseconds=ms)


_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


# A full or failing disk refuses every produce, and producers retry within
# milliseconds: one line per partition per minute says it, with the count it stands for.
_STORAGE_FAILURES = Throttle(60.0)


def _failed(error: Exception, name: str, index: int) -> dict[str, Any]:
    code = error.code if isinstance(error, ProducerStateError) else error_code(error)
    if code is ErrorCode.unknown_server_error:
        log.exception("produce to %s/%d failed", name, index)
    elif code is ErrorCode.kafka_storage_error:
        held = _STORAGE_FAILURES.allow((name, index))
        if held is not None:
            log.warning("produce to %s/%d failed, the client retries: %s%s", name, index,
                        error, held_back(held))
    else:
        log.info("produce to %s/%d refused: %s", name, index, error)
    return {"error_code": code, "base_offset": -1, "log_append_time": None,
            "log_start_offset": -1, "error_message": error_message(error)}


async def init_producer_id(broker: Broker, request: Request) -> dict[str, Any]:
    body = request.body
    producer_id = getattr(body, "producer_id", NO_PRODUCER_ID)  # v3+
    epoch = getattr(body, "producer_epoch", NO_EPOCH)
    if body.transactional_id is not None:
        # Kafka answers an empty transactional id with INVALID_REQUEST.
        if body.transactional_id == "":
            return _no_producer_id(ErrorCode.invalid_request)
        log_refusal(request, body.transactional_id)
        return _no_producer_id(TRANSACTIONS_REFUSED)
    # Kafka: an idempotent producer needs IDEMPOTENT_WRITE on the cluster, or WRITE on
    # some topic.
    if not (access.cluster(broker, request, Operation.IDEMPOTENT_WRITE)
            or access.by_type(broker, request, Operation.WRITE, ResourceType.TOPIC)):
        return _no_producer_id(access.CLUSTER_DENIED)
    try:
        producer_id, epoch = await broker.run_io(
            broker.producers.init_producer_id, producer_id, epoch)
    except ProducerStateError as error:
        log.info("InitProducerId refused: %s", error)
        return _no_producer_id(error.code)
    return {"error_code": ErrorCode.none, "producer_id": producer_id,
            "producer_epoch": epoch}


def _no_producer_id(code: ErrorCode) -> dict[str, Any]:
    return {"error_code": code, "producer_id": NO_PRODUCER_ID, "producer_epoch": NO_EPOCH}
