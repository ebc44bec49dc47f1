"""compactlog's exceptions as Kafka protocol error codes."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from compactlog.backend.lease import LeaseLostError
from compactlog.errors import (
    CompactlogError,
    ConflictError,
    CorruptionError,
    CorruptRecordError,
    FencedError,
    InvalidConfigError,
    InvalidRecordError,
    InvalidTimestampError,
    InvalidTopicNameError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    RetryableError,
    StorageError,
    TopicExistsError,
    UnknownConfigError,
    UnknownPartitionError,
    UnknownTopicError,
    UserError,
)

_CODES: list[tuple[type[Exception], ErrorCode]] = [
    (UnknownTopicError, ErrorCode.unknown_topic_or_partition),
    (UnknownPartitionError, ErrorCode.unknown_topic_or_partition),
    (TopicExistsError, ErrorCode.topic_already_exists),
    (InvalidTopicNameError, ErrorCode.invalid_topic_exception),
    (InvalidConfigError, ErrorCode.invalid_config),
    (UnknownConfigError, ErrorCode.invalid_config),
    # Kafka answers a batch that fails its checksum with CORRUPT_MESSAGE (its
    # CorruptRecordException, retriable: the bytes may have been damaged on the way),
    # and keeps INVALID_RECORD for records it refuses (InvalidRecordException).
    (CorruptRecordError, ErrorCode.corrupt_message),
    # A batch over max.message.bytes as sent, or whose records inflate past
    # max_uncompressed_batch_bytes: Kafka's RecordTooLargeException. The Java producer
    # splits such a batch and sends the halves.
    (RecordTooLargeError, ErrorCode.message_too_large),
    # Kafka answers a refused record (e.g. a null key on a compacted topic) with
    # INVALID_RECORD and a message, and the producer fails that batch only.
    # A timestamp out of the topic's range (message.timestamp.*): Kafka's
    # InvalidTimestampException, INVALID_TIMESTAMP (32).
    (InvalidTimestampError, ErrorCode.invalid_timestamp),
    (InvalidRecordError, ErrorCode.invalid_record),
    (OffsetOutOfRangeError, ErrorCode.offset_out_of_range),
    # A damaged segment is Kafka's KAFKA_STORAGE_ERROR: the client may retry elsewhere;
    # here it gets the message naming the file.
    (CorruptionError, ErrorCode.kafka_storage_error),
    # Another server took this store's writer lease (object stores, backend/lease.py):
    # Kafka's answer from a broker that is no longer a partition's leader, on which
    # clients refresh their metadata and retry (where the new owner now answers).
    (LeaseLostError, ErrorCode.not_leader_or_follower),
    (FencedError, ErrorCode.not_leader_or_follower),
    (ConflictError, ErrorCode.request_timed_out),  # a lost race: retriable
    # A failed write or fsync, a full disk, a partition that stopped taking writes after
    # a failed fsync: KAFKA_STORAGE_ERROR, which producers retry after a backoff.
    (StorageError, ErrorCode.kafka_storage_error),
    (RetryableError, ErrorCode.request_timed_out),
    (UserError, ErrorCode.invalid_request),
    # TimeoutError is an OSError in Python, but it is no fault of the disk.
    (TimeoutError, ErrorCode.request_timed_out),
    # Any other OSError from a store call is the disk or the process' files (EIO, ENOSPC,
    # EMFILE, a file gone): Kafka's KAFKA_STORAGE_ERROR, which clients retry after a
    # backoff. UNKNOWN_SERVER_ERROR would tell them nothing.
    (OSError, ErrorCode.kafka_storage_error),
]


def error_code(error: BaseException) -> ErrorCode:
    for cls, code in _CODES:
        if isinstance(error, cls):
            return code
    return ErrorCode.unknown_server_error


def error_message(error: BaseException) -> str:
    if isinstance(error, CompactlogError):
        return str(error)
    return f"{type(error).__name__}: {error}"
