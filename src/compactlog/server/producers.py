"""Idempotent producers (KIP-98): producer ids, and each partition's producer state.

An idempotent producer gets a producer id and epoch from InitProducerId, and numbers
the records it sends to each partition: a batch carries the sequence number of its first
record (`base_sequence`), its records follow on. The broker keeps, per partition and
producer, the epoch and the last five batches appended (first and last sequence, base
and last offset), as Kafka's ProducerStateManager does (`ProducerStateEntry`,
NUM_BATCHES_TO_RETAIN = 5), and checks every batch that carries a producer id:

- a batch with the epoch and the exact sequence range of one of those five is a
  *duplicate* (a retry whose response was lost): it is answered with success and its
  original base offset, and nothing is appended;
- an epoch below the producer's current one is refused with INVALID_PRODUCER_EPOCH;
- a newer epoch must start at sequence 0, and a batch of the current epoch must start
  right after the last one (last + 1, wrapping from 2**31 - 1 to 0); anything else is
  refused with OUT_OF_ORDER_SEQUENCE_NUMBER;
- a producer the partition knows nothing about (new, expired, or whose batches are
  past the rebuild bound below) may start at any sequence. This is Kafka's rule since
  KIP-360 (2.5): `ProducerAppendInfo.checkSequence` accepts any sequence when the
  entry has no epoch, and brokers no longer answer a produce with UNKNOWN_PRODUCER_ID.
  Refusing instead would fail a producer that was merely idle past the expiration.

The check and the append run under one lock per partition (`PartitionProducers.lock`),
so two requests of one producer cannot both pass the check. Only batches with a
producer id take it; other appends go straight to the partition.

Batches are stored as they came, header included, so the producer id, epoch and base
sequence are in the log segments and in the sealed Parquet columns (`producer_id`,
`producer_epoch`, `base_sequence`, `batch_base_offset`, `batch_last_offset`). That is
what state is rebuilt from after a restart, lazily, the first time a partition gets a
batch with a producer id: the batch headers of every log segment (active and rolled,
not yet sealed), plus the last sealed segment, plus earlier sealed segments sealed
within the last REBUILD_WINDOW_MS, as many as fit in REBUILD_MAX_SEALED times the
topic's segment.bytes (and at least in REBUILD_MIN_BYTES). A retry across a restart or
a take-over comes within the client's delivery timeout (2 minutes in the Java client
and kafka-python, 5 in librdkafka), so its original batch is in that tail. The bound
is on bytes, not on the number of segments: on an object store a segment is sealed
every upload_interval_s, so eight of them (the bound this once had) held well under a
second, and a batch resent after a take-over was appended a second time (found by the
Jepsen harness, tests/faults/test_jepsen.py;
test_a_resend_is_recognised_however_many_small_segments_were_sealed_since). Kafka
instead snapshots the state at each segment roll; a producer whose last batch is older
than the bound is simply unknown after a restart, as if expired.

Expiry: an entry not written to for PRODUCER_ID_EXPIRATION_MS (1 day, Kafka's
`producer.id.expiration.ms` default since KIP-854) is dropped. Kafka measures this
from the batch's max timestamp, which under CreateTime is the client's clock; here it is
the broker's clock when the batch was appended, and an entry rebuilt after a restart
counts as written at the rebuild, so replayed history with old timestamps does not
expire its producer at once.

Producer ids come from server/producer_ids.py.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import pyarrow as pa
from kio.schema.errors import ErrorCode

from compactlog.errors import (
    CompactlogError,
    CorruptionError,
    CorruptRecordError,
    InvalidRecordError,
)
from compactlog.server.producer_ids import ProducerIdAllocator
from compactlog.storage import (
    CONTROL_MASK,
    TRANSACTIONAL_MASK,
    BatchError,
    BatchHeader,
    ChecksumError,
    SegmentInfo,
    check_batch,
)

if TYPE_CHECKING:
    from compactlog.storage import Partition

log = logging.getLogger("compactlog.server.producers")

INT32_MAX = 2**31 - 1
NO_PRODUCER_ID = -1
NO_EPOCH = -1
NO_SEQUENCE = -1
# Kafka gives a new producer id rather than an epoch at or past Short.MAX_VALUE - 1
# (TransactionMetadata.isEpochExhausted).
MAX_BUMPED_EPOCH = 32766
BATCHES_TO_RETAIN = 5  # Kafka's ProducerStateEntry.NUM_BATCHES_TO_RETAIN
PRODUCER_ID_EXPIRATION_MS = 86_400_000  # Kafka's producer.id.expiration.ms default
EXPIRATION_CHECK_INTERVAL_MS = 600_000  # producer.id.expiration.check.interval.ms
REBUILD_WINDOW_MS = 15 * 60 * 1000
REBUILD_MAX_SEALED = 8  # full segments' worth of bytes (segment.bytes each)
REBUILD_MIN_BYTES = 64 << 20
_SEALED_COLUMNS = ["offset", "batch_base_offset", "batch_last_offset", "batch_attributes",
                   "producer_id", "producer_epoch", "base_sequence"]

Clock = Callable[[], float]


class ProducerStateError(CompactlogError):
    """A batch or request refused by the producer checks; `code` is Kafka's answer."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def last_sequence(base_sequence: int, last_offset_delta: int) -> int:
    """The sequence of a batch's last record (Kafka's DefaultRecordBatch.incrementSequence)."""
    if base_sequence > INT32_MAX - last_offset_delta:
        return last_offset_delta - (INT32_MAX - base_sequence) - 1
    return base_sequence + last_offset_delta


def in_sequence(last_seq: int, next_seq: int) -> bool:
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == INT32_MAX)


def check_producer_fields(header: BatchHeader, where: str) -> None:
    """What Kafka refuses in any client batch before producer state is consulted."""
    if header.attributes & TRANSACTIONAL_MASK:
        # Kafka (KIP-890) refuses transactional records outside a verified transaction
        # with INVALID_TXN_STATE; there are no transactions here at all.
        raise ProducerStateError(
            ErrorCode.invalid_txn_state,
            f"{where}: transactional record batches are refused: compactlog does not "
            "support transactions",
        )
    if header.producer_id >= 0 and header.base_sequence < 0:
        # As Kafka's LogValidator.
        raise InvalidRecordError(
            f"{where}: invalid sequence number {header.base_sequence} in a record batch "
            f"with producer id {header.producer_id}"
        )


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    first_seq: int
    last_seq: int
    base_offset: int
    last_offset: int


@dataclass(slots=True)
class ProducerEntry:
    """One producer's state in one partition: its epoch and its last five batches."""

    producer_id: int
    epoch: int = NO_EPOCH
    batches: deque[BatchMetadata] = field(
        default_factory=lambda: deque(maxlen=BATCHES_TO_RETAIN))
    last_written_ms: int = 0

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE

    def duplicate_of(self, epoch: int, first_seq: int, last_seq: int) -> BatchMetadata | None:
        if epoch != self.epoch:
            return None
        for batch in self.batches:
            if batch.first_seq == first_seq and batch.last_seq == last_seq:
                return batch
        return None

    def add(self, epoch: int, batch: BatchMetadata, now_ms: int) -> None:
        if epoch != self.epoch:
            self.batches.clear()
            self.epoch = epoch
        self.batches.append(batch)
        self.last_written_ms = now_ms


def check_sequence(entry: ProducerEntry | None, header: BatchHeader,
                   where: str) -> BatchMetadata | None:
    """The stored batch that `header` duplicates, or None when it may be appended.

    Raises ProducerStateError (INVALID_PRODUCER_EPOCH or OUT_OF_ORDER_SEQUENCE_NUMBER)
    when it may not. The order is Kafka's: the duplicate check, then the epoch, then
    the sequence (UnifiedLog.analyzeAndValidateProducerState, ProducerAppendInfo).
    """
    if entry is None or entry.epoch == NO_EPOCH:
        return None  # unknown producer: any sequence, as Kafka since KIP-360
    epoch, first = header.producer_epoch, header.base_sequence
    last = last_sequence(first, header.last_offset_delta)
    duplicate = entry.duplicate_of(epoch, first, last)
    if duplicate is not None:
        return duplicate
    pid = header.producer_id
    if epoch < entry.epoch:
        raise ProducerStateError(
            ErrorCode.invalid_producer_epoch,
            f"{where}: producer {pid} sent epoch {epoch}, older than its current epoch "
            f"{entry.epoch}",
        )
    if epoch != entry.epoch:
        if first != 0:
            raise ProducerStateError(
                ErrorCode.out_of_order_sequence_number,
                f"{where}: producer {pid} began epoch {epoch} at sequence {first}; a new "
                "epoch starts at sequence 0",
            )
    elif not in_sequence(entry.last_seq, first):
        raise ProducerStateError(
            ErrorCode.out_of_order_sequence_number,
            f"{where}: out of order sequence number for producer {pid} epoch {epoch}: "
            f"{first} (incoming), {entry.last_seq} (last appended)",
        )
    return None


class Appended(NamedTuple):
    base_offset: int
    last_offset: int
    duplicate: bool
    # The LogAppendTime stamped on the batch, or -1 (a CreateTime topic, or a resent
    # batch, for which Kafka too answers NO_TIMESTAMP).
    log_append_time: int = -1


class PartitionProducers:
    """The producer state of one partition, and the lock over check and append."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.entries: dict[int, ProducerEntry] = {}
        self.loaded = False
        self.next_expiry_check_ms = 0


class ProducerStates:
    """Every partition's producer state, and producer id allocation, for one broker."""

    def __init__(self, ids: Path | ProducerIdAllocator,
                 expiration_ms: int = PRODUCER_ID_EXPIRATION_MS,
                 clock: Clock = time.time) -> None:
        """`ids`: a local data directory (its producer-ids.json), or the allocator."""
        self.ids = ProducerIdAllocator(ids) if isinstance(ids, Path) else ids
        self.expiration_ms = expiration_ms
        self.clock = clock
        self._lock = threading.Lock()
        # Keyed by the Partition object: a deleted and re-created topic starts afresh.
        self._partitions: weakref.WeakKeyDictionary[Partition, PartitionProducers] = (
            weakref.WeakKeyDictionary())

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    # -- InitProducerId -----------------------------------------------------------------

    def init_producer_id(self, producer_id: int, epoch: int) -> tuple[int, int]:
        """(producer id, epoch) for an idempotent producer's InitProducerId.

        Without an id: a new id at epoch 0. With its current id and epoch (KIP-360,
        v3+, sent after an error that needs a fresh epoch): the same id at epoch + 1,
        which fences the producer's batches still in flight under the old epoch; a new
        id instead when the epoch is exhausted or the id was never handed out here.
        (Kafka's own broker answers every non-transactional InitProducerId with a new
        id; kafka-python and librdkafka accept either.)
        """
        if producer_id == NO_PRODUCER_ID and epoch == NO_EPOCH:
            return self.ids.allocate(), 0
        if producer_id < 0 or epoch < 0:
            raise ProducerStateError(
                ErrorCode.invalid_request,
                f"producer id {producer_id} and epoch {epoch}: give both or neither")
        if epoch >= MAX_BUMPED_EPOCH or not self.ids.was_issued(producer_id):
            new_id = self.ids.allocate()
            log.info("producer %d epoch %d cannot be bumped (%s); gave it producer id %d",
                     producer_id, epoch, "epoch exhausted" if epoch >= MAX_BUMPED_EPOCH
                     else "id never issued here", new_id)
            return new_id, 0
        log.info("producer %d bumped its epoch to %d", producer_id, epoch + 1)
        return producer_id, epoch + 1

    # -- Produce ------------------------------------------------------------------------

    def state_of(self, partition: Partition) -> PartitionProducers:
        with self._lock:
            state = self._partitions.get(partition)
            if state is None:
                state = self._partitions[partition] = PartitionProducers()
            return state

    def append(self, partition: Partition, batch: bytearray, header: BatchHeader) -> Appended:
        """Check one batch with a producer id against the partition's state and append
        it, or find the batch it duplicates; atomic per partition."""
        try:
            # The checksum first, as Kafka: a damaged header must not be taken for a
            # duplicate. (append_batch checks it again, and decodes the records.)
            check_batch(batch, 0, len(batch))
        except ChecksumError as error:
            raise CorruptRecordError(
                f"{partition.name}: rejected record batch: {error}") from None
        except BatchError as error:
            raise InvalidRecordError(
                f"{partition.name}: rejected record batch: {error}") from None
        state = self.state_of(partition)
        pid = header.producer_id
        with state.lock:
            now = self._now_ms()
            if not state.loaded:
                state.entries = rebuild_entries(partition, now)
                state.loaded = True
            self._expire(state, now)
            entry = state.entries.get(pid)
            if entry is not None and now - entry.last_written_ms >= self.expiration_ms:
                del state.entries[pid]
                entry = None
            duplicate = check_sequence(entry, header, partition.name)
            if duplicate is not None:
                log.info("%s: producer %d epoch %d resent sequences %d..%d; answered with "
                         "the original offsets %d..%d", partition.name, pid,
                         header.producer_epoch, duplicate.first_seq, duplicate.last_seq,
                         duplicate.base_offset, duplicate.last_offset)
                return Appended(duplicate.base_offset, duplicate.last_offset, True)
            result = partition.append_batch(batch)
            if entry is None:
                entry = state.entries[pid] = ProducerEntry(pid)
            entry.add(header.producer_epoch, BatchMetadata(
                header.base_sequence,
                last_sequence(header.base_sequence, header.last_offset_delta),
                result.base_offset, result.last_offset), now)
            return Appended(result.base_offset, result.last_offset, False,
                            result.log_append_time)

    def _expire(self, state: PartitionProducers, now: int) -> None:
        if now < state.next_expiry_check_ms:
            return
        state.next_expiry_check_ms = now + EXPIRATION_CHECK_INTERVAL_MS
        expired = [pid for pid, entry in state.entries.items()
                   if now - entry.last_written_ms >= self.expiration_ms]
        for pid in expired:
            del state.entries[pid]


# -- rebuilding after a restart ------------------------------------------------------------


def rebuild_entries(partition: Partition, now_ms: int) -> dict[int, ProducerEntry]:
    """Producer state from the tail of the partition's log (the bound is in the module
    doc). Damaged or vanished sealed segments are skipped with a warning: their
    producers are then unknown, which costs deduplication, not availability."""
    view = partition.view()  # one consistent view of the manifest and the log segments
    segments = view.manifest.segments
    logs = list(zip(view.logs, view.log_batches, strict=True))
    entries: dict[int, ProducerEntry] = {}
    next_offset = -1  # batches below this were taken already

    def add(pid: int, epoch: int, base_seq: int, base: int, last: int) -> None:
        entry = entries.get(pid)
        if entry is None:
            entry = entries[pid] = ProducerEntry(pid)
        entry.add(epoch, BatchMetadata(base_seq, last_sequence(base_seq, last - base),
                                       base, last), now_ms)

    batches = 0
    budget = max(REBUILD_MAX_SEALED * int(partition.config["segment.bytes"]),
                 REBUILD_MIN_BYTES)
    for info in _recent_sealed(segments, now_ms, budget):
        try:
            for pid, epoch, base_seq, base, last in _sealed_batches(partition, info):
                if base >= next_offset:
                    add(pid, epoch, base_seq, base, last)
                    batches += 1
        except CorruptionError as error:
            log.warning("%s: producer state skips a sealed segment: %s", partition.name, error)
        next_offset = max(next_offset, info.last_offset + 1)
    for segment, count in logs:
        for header in segment.iter_headers(count):
            if (header.base_offset < next_offset or header.producer_id < 0
                    or header.attributes & CONTROL_MASK):
                continue
            add(header.producer_id, header.producer_epoch, header.base_sequence,
                header.base_offset, header.last_offset)
            batches += 1
    if entries:
        log.info("%s: rebuilt the state of %d producers from %d batches", partition.name,
                 len(entries), batches)
    return entries


def _recent_sealed(segments: tuple[SegmentInfo, ...], now_ms: int,
                   max_bytes: int) -> list[SegmentInfo]:
    """The last sealed segment, and those before it sealed within REBUILD_WINDOW_MS, up
    to `max_bytes` in all."""
    chosen: list[SegmentInfo] = []
    total = 0
    for info in reversed(segments):
        if chosen and (total + info.size_bytes > max_bytes
                       or info.sealed_at_ms < now_ms - REBUILD_WINDOW_MS):
            break
        chosen.append(info)
        total += info.size_bytes
    chosen.reverse()
    return chosen


def _sealed_batches(partition: Partition,
                    info: SegmentInfo) -> Iterator[tuple[int, int, int, int, int]]:
    """(producer id, epoch, base sequence, base offset, last offset) of each batch with
    a producer id in a sealed segment, from its batch columns (one row per record)."""
    with partition.files.lease(partition.data_path(f"segments/{info.file}"), info) as segment:
        yield from _batches_of(segment.iter_tables(info.base_offset, _SEALED_COLUMNS))


def _batches_of(tables: Iterator[pa.Table]) -> Iterator[tuple[int, int, int, int, int]]:
    previous_base = -1
    for table in tables:
        if not table.num_rows:
            continue
        bases = table.column("batch_base_offset").to_numpy()
        starts = np.flatnonzero(np.concatenate(([bases[0] != previous_base],
                                                bases[1:] != bases[:-1])))
        previous_base = int(bases[-1])
        pids = table.column("producer_id").to_numpy()[starts]
        control = (table.column("batch_attributes").to_numpy()[starts] & CONTROL_MASK) != 0
        starts = starts[(pids >= 0) & ~control]
        if not starts.size:
            continue
        yield from zip(
            table.column("producer_id").to_numpy()[starts].tolist(),
            table.column("producer_epoch").to_numpy()[starts].tolist(),
            table.column("base_sequence").to_numpy()[starts].tolist(),
            bases[starts].tolist(),
            table.column("batch_last_offset").to_numpy()[starts].tolist(),
            strict=True,
        )
