"""What a topic's config does to a batch before it is appended, as Kafka's LogValidator:
the size and key checks, the batch's own checks (CRC, framing, how far it decompresses),
timestamp checks, LogAppendTime stamping, recompression to compression.type.

Invariant: a batch that reaches the log has passed `check_timestamps` against the
topic's config at `now_ms`, carries the topic's codec unless compression.type is
`producer`, and, on a LogAppendTime topic, has timestamp type LogAppendTime and
max timestamp `now_ms` (which every reader takes as each record's timestamp, as
Kafka's clients and aiokafka's decoder do). Its records, offset deltas and producer
fields (id, epoch, base sequence) are never changed, so idempotence and the sequence
checks of server/producers.py see the batch the producer sent.

Kafka's rules (storage/.../internals/log/LogValidator.java, apache/kafka 1eb7644):
- CreateTime: a record whose timestamp lies more than message.timestamp.before.max.ms
  before or message.timestamp.after.max.ms after the broker's clock fails its batch
  with INVALID_TIMESTAMP; records without a timestamp (-1) pass. A batch that claims
  LogAppendTime on a CreateTime topic fails the same way.
- LogAppendTime: no range check; the batch's attributes get the LogAppendTime bit and
  its max timestamp the broker's clock (in place, the CRC recomputed).
- A batch whose codec differs from compression.type (unless `producer`) is rebuilt
  with the topic's codec.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import crc32c
from aiokafka.record._crecords import DefaultRecordBatch, DefaultRecordBatchBuilder

from compactlog.config import TopicConfig
from compactlog.config_key import LONG_MAX
from compactlog.errors import (
    CorruptRecordError,
    InvalidRecordError,
    InvalidTimestampError,
    RecordTooLargeError,
)
from compactlog.storage.inflate import InflateTooLarge
from compactlog.storage.records import (
    CODECS,
    CRC_START,
    MAGIC_V2,
    NO_TIMESTAMP,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_MASK,
    BatchError,
    BatchHeader,
    ChecksumError,
    ProducerRecord,
    Record,
    RecordFacts,
    check_batch,
    encode_batch,
    parse_header,
    set_base_offset,
    validate_records,
)

_ATTRIBUTES = struct.Struct(">h")
_ATTRIBUTES_AT = 21
_MAX_TIMESTAMP = struct.Struct(">q")
_MAX_TIMESTAMP_AT = 35
_CRC = struct.Struct(">I")
_CRC_AT = 17
_NO_SIZE_LIMIT = 2**31 - 1
CODEC_NAMES = {codec: name for name, codec in CODECS.items()}


def check_size(where: str, config: TopicConfig, batch_bytes: int) -> None:
    """A batch as sent may not exceed max.message.bytes (Kafka checks it before anything
    is decompressed)."""
    limit = config["max.message.bytes"]
    if batch_bytes > limit:
        raise RecordTooLargeError(
            f"{where}: record batch of {batch_bytes} bytes exceeds max.message.bytes={limit}")


def first_null_key(records: Sequence[ProducerRecord | Record]) -> int | None:
    """The position of the first record without a key, if any."""
    return next((position for position, record in enumerate(records) if record.key is None),
                None)


def check_null_key(where: str, topic: str, config: TopicConfig, position: int | None) -> None:
    """Refuse a record without a key (at `position`) on a compacted topic whose
    null.key.policy is reject."""
    if position is not None and config.compacted and config["null.key.policy"] == "reject":
        raise InvalidRecordError(
            f"{where}: record {position} has no key; compacted topic "
            f"{topic!r} refuses null keys (null.key.policy=reject)")


def check_producer_batch(where: str, config: TopicConfig, batch: bytearray,
                         limit: int) -> tuple[BatchHeader, RecordFacts]:
    """Check a v2 batch built elsewhere (a Kafka producer): its size as sent, its frame
    and CRC, and its records, decompressing no further than `limit` bytes."""
    check_size(where, config, len(batch))
    try:
        header = check_batch(batch, 0, len(batch))
        if header.size != len(batch):
            raise BatchError(f"{len(batch) - header.size} trailing bytes")
        facts = validate_records(batch, header, limit, timestamps=checks_timestamps(config))
    except ChecksumError as error:
        raise CorruptRecordError(f"{where}: rejected record batch: {error}") from None
    except BatchError as error:
        raise InvalidRecordError(f"{where}: rejected record batch: {error}") from None
    except InflateTooLarge:
        raise RecordTooLargeError(
            f"{where}: the records of a compressed batch of {len(batch)} bytes "
            f"decompress to more than max_uncompressed_batch_bytes={limit}") from None
    return header, facts


def admit(where: str, config: TopicConfig, batch: bytearray, header: BatchHeader,
          facts: RecordFacts, now_ms: int) -> tuple[bytearray, int]:
    """A producer's validated batch checked and made as the topic stores it (`conform`)."""
    check_timestamps(where, config, header, facts.min_timestamp, facts.max_timestamp, now_ms)
    return conform(batch, header, config, now_ms)


def encode_for(where: str, config: TopicConfig, records: Sequence[ProducerRecord],
               now_ms: int) -> bytearray:
    """The records of an append through the library (CLI, Python API) as one batch the
    topic stores: in its codec, checked and stamped as a producer's batch would be."""
    batch = encode_batch(records, 0, now_ms, CODEC_NAMES[config.codec or 0])
    header = parse_header(batch)
    stamps = [record.timestamp for record in records if record.timestamp is not None]
    stamps.append(now_ms)  # records without a timestamp get the clock's
    check_timestamps(where, config, header, min(stamps), max(stamps), now_ms)
    return conform(batch, header, config, now_ms)[0]


def checks_timestamps(config: TopicConfig) -> bool:
    """Whether the topic limits CreateTime timestamps at all (Kafka's default does not)."""
    return not config.log_append_time and config.timestamp_limits != (LONG_MAX, LONG_MAX)


def check_timestamps(where: str, config: TopicConfig, header: BatchHeader,
                     min_timestamp: int, max_timestamp: int, now_ms: int) -> None:
    """Refuse the batch (InvalidTimestampError) where Kafka's LogValidator would."""
    if config.log_append_time:
        return  # the server's clock replaces the producer's timestamps
    if header.attributes & TIMESTAMP_TYPE_MASK:
        raise InvalidTimestampError(
            f"{where}: the batch's timestamp type is LogAppendTime, and the topic's "
            "message.timestamp.type is CreateTime; a producer may not set LogAppendTime")
    if min_timestamp == NO_TIMESTAMP:
        return
    before, after = config.timestamp_limits
    # Python's integers do not overflow where Kafka's longs would: Long.MAX is no limit.
    if now_ms - min_timestamp > before or max_timestamp - now_ms > after:
        bad = min_timestamp if now_ms - min_timestamp > before else max_timestamp
        raise InvalidTimestampError(
            f"{where}: record timestamp {bad} is out of range; the topic takes timestamps "
            f"within [{now_ms - before}, {now_ms + after}] of the server's clock {now_ms} "
            "(message.timestamp.before.max.ms / after.max.ms)")


def conform(batch: bytearray, header: BatchHeader, config: TopicConfig,
            now_ms: int) -> tuple[bytearray, int]:
    """The batch as the topic stores it, and its log append time (-1 on a CreateTime
    topic, as Kafka's ProduceResponse says). `batch` may be changed in place."""
    codec = config.codec
    if codec is not None and codec != header.codec:
        batch = recompress(batch, header, codec)
    if not config.log_append_time:
        return batch, NO_TIMESTAMP
    attributes = _ATTRIBUTES.unpack_from(batch, _ATTRIBUTES_AT)[0] | TIMESTAMP_TYPE_MASK
    _ATTRIBUTES.pack_into(batch, _ATTRIBUTES_AT, attributes)
    _MAX_TIMESTAMP.pack_into(batch, _MAX_TIMESTAMP_AT, now_ms)
    _CRC.pack_into(batch, _CRC_AT, crc32c.crc32c(memoryview(batch)[CRC_START:]))
    return batch, now_ms


def recompress(batch: bytearray, header: BatchHeader, codec: int) -> bytearray:
    """The same records, offset deltas, timestamps and producer fields in one batch
    compressed with `codec` (0: uncompressed). The batch has passed validate_records,
    so its records decode within the server's decompression limit."""
    builder = DefaultRecordBatchBuilder(
        MAGIC_V2, codec, int(bool(header.attributes & TRANSACTIONAL_MASK)),
        header.producer_id, header.producer_epoch, header.base_sequence, _NO_SIZE_LIMIT)
    base = header.base_offset
    for record in DefaultRecordBatch(bytes(batch)):
        builder.append(record.offset - base, record.timestamp, record.key, record.value,
                       list(record.headers) if record.headers else [])
    rebuilt: bytearray = builder.build()
    set_base_offset(rebuilt, base)
    return rebuilt
