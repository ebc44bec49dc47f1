"""One exception hierarchy for compactlog.

Every error a user can meet derives from `CompactlogError` and carries a message that
names what was wrong and where. The CLI prints `str(error)` on one line; the Kafka
server maps each class to a protocol error code. The four branches say what the
caller can do about it:

- `UserError`: the request or input was wrong; fix it and try again.
- `CorruptionError`: stored data failed a check; the message names the file and the
  offset range, and the rest of the data stays readable.
- `ConflictError`: an optimistic-concurrency commit lost to another writer.
- `RetryableError`: a transient condition; the same call may succeed later. Its
  `StorageError` branch is a failed write, fsync or file operation (disk full, I/O
  error, out of file handles): Kafka's KAFKA_STORAGE_ERROR.
"""

from __future__ import annotations

from pathlib import Path


class CompactlogError(Exception):
    """Base of every error compactlog raises on purpose."""


class UserError(CompactlogError):
    """Bad input: a wrong argument, an unknown topic, an invalid config value."""


class InvalidConfigError(UserError):
    """A config key is unknown or its value is outside what the key allows."""

    def __init__(self, key: str, value: object, allowed: str) -> None:
        self.key = key
        self.value = value
        self.allowed = allowed
        super().__init__(f"invalid value {value!r} for config {key!r}: {allowed}")


class UnknownConfigError(UserError):
    def __init__(self, key: str, known: list[str]) -> None:
        self.key = key
        super().__init__(f"unknown config key {key!r}; known keys: {', '.join(sorted(known))}")


class RetiredConfigError(UnknownConfigError):
    """A topic config key an earlier build accepted: unknown now, with what replaced it."""

    def __init__(self, key: str, replacement: str) -> None:
        self.key = key
        UserError.__init__(self, f"config key {key!r} was removed: {replacement}")


class InvalidTopicNameError(UserError):
    pass


class UnknownTopicError(UserError):
    def __init__(self, topic: str) -> None:
        self.topic = topic
        super().__init__(f"unknown topic {topic!r}")


class TopicExistsError(UserError):
    def __init__(self, topic: str) -> None:
        self.topic = topic
        super().__init__(f"topic {topic!r} already exists")


class UnknownPartitionError(UserError):
    def __init__(self, topic: str, partition: int, count: int) -> None:
        self.topic = topic
        self.partition = partition
        super().__init__(
            f"topic {topic!r} has no partition {partition} (it has partitions 0..{count - 1})"
        )


class InvalidRecordError(UserError):
    """A record that the topic refuses: a null key on a compacted topic, an oversized record."""


class RecordTooLargeError(InvalidRecordError):
    """A record batch over max.message.bytes as sent, or whose records decompress to more
    than the server allows (Kafka's RecordTooLargeException, MESSAGE_TOO_LARGE)."""


class InvalidTimestampError(InvalidRecordError):
    """A record whose timestamp the topic refuses: too far from the server's clock
    (message.timestamp.before/after.max.ms), or a producer's batch that claims
    LogAppendTime on a CreateTime topic (Kafka's INVALID_TIMESTAMP)."""


class CorruptRecordError(InvalidRecordError):
    """A record batch whose checksum does not match: its bytes were damaged on the way."""


class OffsetOutOfRangeError(UserError):
    def __init__(self, topic: str, partition: int, offset: int, start: int, end: int) -> None:
        self.offset = offset
        self.log_start_offset = start
        self.log_end_offset = end
        super().__init__(
            f"offset {offset} is out of range for {topic}/{partition}: "
            f"valid offsets are {start}..{end}"
        )


class DataDirLockedError(UserError):
    def __init__(self, path: Path | str, holder: str) -> None:
        super().__init__(
            f"data directory {path} is in use by another writer ({holder}); "
            "stop it, or read with a read-only store"
        )


class ReadOnlyStoreError(UserError):
    pass


class CorruptionError(CompactlogError):
    """Stored bytes failed a check. Names the file, and the offsets or bytes concerned."""

    def __init__(self, path: Path | str, detail: str) -> None:
        self.path = Path(path)
        self.detail = detail
        super().__init__(f"corrupt file {path}: {detail}")


class ConflictError(CompactlogError):
    """An optimistic-concurrency commit was based on a version that is no longer current."""


class FencedError(ConflictError):
    """Another writer committed offsets this writer assigned too (two writers on one
    object-store prefix): this writer stops taking writes, and its records that no
    commit took stay in its local log."""


class RetryableError(CompactlogError):
    """A transient condition; the same call may succeed later."""


class StorageError(RetryableError):
    """A write, fsync or other file operation failed (disk full, I/O error, too many
    open files). Nothing the failed call was doing took effect; what was acknowledged
    before stays. Kafka's KAFKA_STORAGE_ERROR: a client retries."""


class PartitionFailedError(StorageError):
    """A partition stopped taking writes after an fsync failed: the page cache can no
    longer be trusted to hold what was written (PostgreSQL's "fsyncgate"). Reads go on;
    writes resume once the partition is reopened and recovered."""
