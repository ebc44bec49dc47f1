"""Record batches for Fetch (server/protocol/record_batches.py), on real files.

Every test decodes the bytes as a client would (aiokafka's compiled codec, and
kafka-python's pure-Python one where it matters, since real clients must accept them)
and checks the records against `Partition.read` / `read_compacted`, the batch fields
against what was appended, and the CRCs.
"""

from __future__ import annotations

import itertools
import random
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import crc32c
import pytest
from aiokafka.record._crecords import DefaultRecordBatch, DefaultRecordBatchBuilder
from kafka.record.default_records import DefaultRecordBatch as KafkaPythonBatch
from kafka.record.memory_records import MemoryRecords

from compactlog.compaction import load_factory
from compactlog.errors import CorruptionError
from compactlog.server.protocol.record_batches import read_batches, view_start_offset
from compactlog.storage.partition import Partition
from compactlog.storage.records import (
    CRC_START,
    HEADER,
    HEADER_SIZE,
    LOG_OVERHEAD,
    ProducerRecord,
    Record,
    parse_header,
)
from compactlog.storage.sealed import SealedSegment
from compactlog.storage.store import LogStore
from support.fakes import T0, FakeClock

BIG = 1 << 30
COMPACT = {"cleanup.policy": "compact", "min.compaction.lag.ms": "0",
           "delete.retention.ms": "0"}


@pytest.fixture(params=["whole", "split"])
def row_groups(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test as is, and again with every row group handed over in slices of three
    rows, so that batches straddle the tables the reader gets (a ledger's row groups
    may end inside a batch)."""
    if request.param == "split":
        original = SealedSegment.iter_tables

        def sliced(self: SealedSegment, start: int, columns: Any = None) -> Iterator[Any]:
            for table in original(self, start, columns):
                for first in range(0, max(table.num_rows, 1), 3):
                    yield table.slice(first, 3)

        monkeypatch.setattr(SealedSegment, "iter_tables", sliced)
    return str(request.param)


def compact(store: LogStore, topic: str, clock: FakeClock) -> None:
    factory = load_factory("local_engine:LocalCompactionServiceFactory")
    factory.new_service(store, topic, {"clock": clock}).compact()


# -- decoding, as a client does ------------------------------------------------------


@dataclass(frozen=True)
class Batch:
    base_offset: int
    last_offset: int
    attributes: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int
    records: list[Record]
    raw: bytes

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1


def decode(data: bytes) -> list[Batch]:
    """Split `data` into whole batches, check each CRC32C, decode the records."""
    batches = []
    position = 0
    while position < len(data):
        header = parse_header(data, position)
        raw = data[position : position + header.size]
        assert len(raw) == header.size, "a partial batch at the end"
        batch = DefaultRecordBatch(raw)
        assert batch.validate_crc()
        assert crc32c.crc32c(raw[CRC_START:]) == header.crc
        records = [
            Record(r.offset, r.timestamp, r.key, r.value, tuple(r.headers)) for r in batch
        ]
        assert len(records) == header.record_count
        assert all(header.base_offset <= r.offset <= header.last_offset for r in records)
        assert [r.offset for r in records] == sorted({r.offset for r in records})
        batches.append(Batch(
            header.base_offset, header.last_offset, header.attributes, header.producer_id,
            header.producer_epoch, header.base_sequence, header.record_count, records, raw,
        ))
        position += header.size
    return batches


def decode_with_kafka_python(data: bytes) -> list[tuple[int, int, list[Record]]]:
    """(base offset, next offset, records) of each batch, by kafka-python's reader."""
    found = []
    memory = MemoryRecords(data)
    while (batch := memory.next_batch()) is not None:
        assert isinstance(batch, KafkaPythonBatch)
        assert batch.validate_crc()
        records = [
            Record(r.offset, r.timestamp, r.key, r.value, tuple(r.headers)) for r in batch
        ]
        found.append((batch.base_offset, batch.next_offset, records))
    return found


def records_of(data: bytes) -> list[Record]:
    return [record for batch in decode(data) for record in batch.records]


def consume(partition: Partition, offset: int, compacted: bool, max_bytes: int) -> list[Record]:
    """Fetch to the high watermark as a consumer does: skip records below the position,
    and move the position to each batch's next offset."""
    position = offset
    consumed: list[Record] = []
    for _ in range(10_000):
        read = read_batches(partition, position, max_bytes, compacted)
        if position >= read.high_watermark:
            assert read.records == b""
            return consumed
        batches = decode(read.records)
        assert batches, f"no progress at {position}"
        for batch in batches:
            consumed += [r for r in batch.records if r.offset >= position]
            position = max(position, batch.next_offset)
        assert read.next_offset == position
    raise AssertionError("the consumer never reached the high watermark")


def expected_raw(partition: Partition, offset: int = 0) -> list[Record]:
    records: list[Record] = []
    while chunk := partition.read(offset, 1000):
        records += chunk
        offset = chunk[-1].offset + 1
    return records


def expected_compacted(partition: Partition, offset: int = 0) -> list[Record]:
    records: list[Record] = []
    while chunk := partition.read_compacted(offset, 1000):
        records += chunk
        offset = chunk[-1].offset + 1
    return records


def produce_batches(
    store: LogStore, topic: str, batches: list[list[tuple[bytes | None, bytes | None]]],
    clock: FakeClock,
) -> dict[int, int]:
    """Append each list as one batch; returns {base offset: last offset}."""
    spans = {}
    for number, pairs in enumerate(batches):
        records = [
            ProducerRecord(key, value, ((("n", b"%d" % i), ("none", None)) if i % 2 else ()),
                           clock.ms + number * 10 - i)
            for i, (key, value) in enumerate(pairs)
        ]
        (result,) = store.append(topic, records, partition=0)
        spans[result.base_offset] = result.last_offset
    return spans


def producer_batch(
    records: list[tuple[bytes, bytes | None]], *, codec: int = 0, transactional: bool = False,
    producer: tuple[int, int, int] = (-1, -1, -1), extra_attributes: int = 0,
    timestamp: int = int(T0 * 1000),
) -> bytearray:
    """A batch as a Kafka producer sends it, built by the same compiled codec."""
    builder = DefaultRecordBatchBuilder(2, codec, int(transactional), *producer, 2**31 - 1)
    for delta, (key, value) in enumerate(records):
        builder.append(delta, timestamp + delta, key, value, [])
    batch: bytearray = builder.build()
    if extra_attributes:
        attributes = struct.unpack_from(">h", batch, 21)[0] | extra_attributes
        struct.pack_into(">h", batch, 21, attributes)
        struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[CRC_START:])))
    return batch


# -- the raw view -----------------------------------------------------------------------


def test_log_segment_batches_are_served_byte_for_byte(store: LogStore, clock: FakeClock) -> None:
    store.create_topic("t")
    spans = produce_batches(store, "t", [[(b"a", b"1"), (b"b", None)], [(None, b"x")] * 3,
                                         [(b"c", b"")]], clock)
    partition = store.topic("t").partitions[0]
    (log_file,) = sorted((partition.directory / "log").glob("*.log"))

    read = read_batches(partition, 0, BIG)

    assert read.records == log_file.read_bytes()
    batches = decode(read.records)
    assert {b.base_offset: b.last_offset for b in batches} == spans
    assert records_of(read.records) == expected_raw(partition)
    assert (read.next_offset, read.high_watermark, read.log_start_offset) == (6, 6, 0)


def test_sealed_batches_are_rebuilt_exactly(store: LogStore, clock: FakeClock) -> None:
    store.create_topic("t", config={"segment.bytes": "1024"})
    batches = [[(b"k%d" % (i * 7 + j), b"v" * (i * j)) for j in range(1 + i % 4)]
               for i in range(30)]
    batches[3] = [(None, None), (b"tomb", None), (b"\x00", b"\xff")]
    partition = store.topic("t").partitions[0]
    partition.auto_seal = False  # keep every log file, to compare with
    spans = produce_batches(store, "t", batches, clock)
    original = b"".join(path.read_bytes()
                        for path in sorted((partition.directory / "log").glob("*.log")))
    partition.auto_seal = True
    partition.roll()
    assert len(partition.manifest.segments) > 2 and partition.active.is_empty

    read = read_batches(partition, 0, BIG)

    # Same builder, same fields: the rebuilt bytes are the appended bytes.
    assert read.records == original
    assert {b.base_offset: b.last_offset for b in decode(read.records)} == spans
    assert records_of(read.records) == expected_raw(partition)
    by_kafka_python = decode_with_kafka_python(read.records)
    assert [r for _, _, records in by_kafka_python for r in records] == expected_raw(partition)
    assert [(base, end - 1) for base, end, _ in by_kafka_python] == sorted(spans.items())


def test_producer_fields_survive_sealing_and_the_codec_goes(store: LogStore) -> None:
    # LogAppendTime: the server stamps every batch with bit 3, as Kafka does (a batch
    # that claims it on a CreateTime topic is refused: test_kafka_topic_configs.py).
    store.create_topic("t", 1, {"message.timestamp.type": "LogAppendTime"})
    partition = store.topic("t").partitions[0]
    sent = [
        producer_batch([(b"a", b"1"), (b"b", b"2")], producer=(77, 3, 10), transactional=True),
        producer_batch([(b"c", b"3" * 100)] * 5, codec=1, producer=(77, 3, 12)),
        # A transaction marker: a control batch (commit), key and value as Kafka writes.
        producer_batch([(b"\x00\x00\x00\x01", b"\x00\x00\x00\x00\x00\x00")],
                       transactional=True, producer=(77, 3, -1), extra_attributes=0x20),
        # LogAppendTime (bit 3) and KIP-534's delete-horizon bit (6).
        producer_batch([(b"d", b"4")], extra_attributes=0x08 | 0x40),
    ]
    for batch in sent:
        partition.append_batch(bytearray(batch))
    assert len(partition.logs) == 1 and not partition.manifest.segments
    before = decode(read_batches(partition, 0, BIG).records)
    partition.roll()

    after = decode(read_batches(partition, 0, BIG).records)

    assert [b.records for b in after] == [b.records for b in before]
    assert [r for b in after for r in b.records] == expected_raw(partition)
    for old, new in zip(before, after, strict=True):
        assert (new.base_offset, new.last_offset, new.producer_id, new.producer_epoch,
                new.base_sequence) == (old.base_offset, old.last_offset, old.producer_id,
                                       old.producer_epoch, old.base_sequence)
        assert new.attributes == old.attributes & (0x08 | 0x10 | 0x20)  # no codec, no bit 6
    assert before[1].attributes & 0x07 == 1 and after[1].attributes & 0x07 == 0
    assert DefaultRecordBatch(after[2].raw).is_control_batch
    assert DefaultRecordBatch(after[0].raw).is_transactional
    assert [r.offset for r in after[1].records] == [2, 3, 4, 5, 6]


def test_a_read_inside_a_batch(store: LogStore, clock: FakeClock) -> None:
    store.create_topic("t")
    produce_batches(store, "t", [[(b"k%d" % i, b"v") for i in range(5)]] * 2, clock)
    partition = store.topic("t").partitions[0]

    # From a log segment the batch goes as it is, from its base: the client skips.
    (log_batch, log_next) = decode(read_batches(partition, 2, BIG).records)
    assert (log_batch.base_offset, log_batch.last_offset) == (0, 4)
    assert [r.offset for r in log_batch.records] == [0, 1, 2, 3, 4]

    partition.roll()
    # Rebuilt from Parquet it starts at the first record wanted, keeping base and last.
    (sealed_batch, sealed_next) = decode(read_batches(partition, 2, BIG).records)
    assert (sealed_batch.base_offset, sealed_batch.last_offset) == (0, 4)
    assert [r.offset for r in sealed_batch.records] == [2, 3, 4]
    assert sealed_batch.records == expected_raw(partition, 2)[:3]
    assert sealed_next.raw == log_next.raw
    assert consume(partition, 3, False, 1) == expected_raw(partition, 3)


def test_sealed_and_log_segments_in_one_read(
    store: LogStore, clock: FakeClock, row_groups: str
) -> None:
    store.create_topic("t", config={"segment.bytes": "1024"})
    batches = [[(b"k%d" % i, b"value-%d" % i + b"." * 50)] * (1 + i % 3) for i in range(40)]
    produce_batches(store, "t", batches[:30], clock)
    partition = store.topic("t").partitions[0]
    partition.roll()
    partition.auto_seal = False  # keep a rolled, unsealed log segment as well
    produce_batches(store, "t", batches[30:], clock)
    partition.roll()
    produce_batches(store, "t", [[(b"active", b"!")]], clock)
    assert len(partition.logs) >= 3 and partition.manifest.segments

    for offset in (0, 1, 17, partition.manifest.sealed_end_offset - 1,
                   partition.manifest.sealed_end_offset, partition.log_end_offset - 1):
        read = read_batches(partition, offset, BIG)
        batches_read = decode(read.records)
        assert batches_read[0].base_offset <= offset <= batches_read[0].last_offset
        assert [r for r in records_of(read.records) if r.offset >= offset] == expected_raw(
            partition, offset)
        offsets = [b.base_offset for b in batches_read]
        assert all(b.base_offset == a.last_offset + 1
                   for a, b in itertools.pairwise(batches_read)), offsets
        assert read.next_offset == read.high_watermark == partition.log_end_offset
    for max_bytes in (0, 100, 1000):
        assert consume(partition, 0, False, max_bytes) == expected_raw(partition)


# -- max_bytes ----------------------------------------------------------------------------


@pytest.mark.parametrize("sealed", [False, True])
def test_max_bytes_first_batch_whole_later_ones_never_cut(
    store: LogStore, clock: FakeClock, sealed: bool
) -> None:
    store.create_topic("t")
    produce_batches(store, "t", [[(b"big", b"x" * 5000)], [(b"a", b"1")], [(b"b", b"2")],
                                 [(b"c", b"y" * 3000)], [(b"d", b"3")]], clock)
    partition = store.topic("t").partitions[0]
    if sealed:
        partition.roll()
    sizes = [b.raw for b in decode(read_batches(partition, 0, BIG).records)]

    # The first batch goes out whole even far over the limit, and alone.
    for limit in (0, 1, len(sizes[0]) - 1, len(sizes[0])):
        read = read_batches(partition, 0, limit)
        assert read.records == sizes[0], limit
        assert read.next_offset == 1
    # Later batches only while they fit: never a partial batch.
    for count in range(1, len(sizes) + 1):
        exact = sum(len(raw) for raw in sizes[:count])
        assert read_batches(partition, 0, exact).records == b"".join(sizes[:count])
        assert read_batches(partition, 0, exact + 1).records == b"".join(sizes[:count])
        if count > 1:
            assert read_batches(partition, 0, exact - 1).records == b"".join(sizes[:count - 1])
    # From the second batch on, the big fourth batch stops the read before it.
    assert decode(read_batches(partition, 1, 500).records)[-1].base_offset == 2


def test_max_bytes_across_the_sealed_and_log_boundary(store: LogStore, clock: FakeClock) -> None:
    store.create_topic("t")
    produce_batches(store, "t", [[(b"a", b"1" * 100)], [(b"b", b"2" * 100)]], clock)
    partition = store.topic("t").partitions[0]
    partition.roll()
    produce_batches(store, "t", [[(b"c", b"3" * 100)], [(b"d", b"4" * 100)]], clock)
    raws = [b.raw for b in decode(read_batches(partition, 0, BIG).records)]
    for count in range(1, 5):
        limit = sum(len(raw) for raw in raws[:count])
        assert read_batches(partition, 0, limit).records == b"".join(raws[:count])
        assert read_batches(partition, 0, limit - 1).records == b"".join(raws[:max(count - 1, 1)])


# -- offsets outside the log --------------------------------------------------------------


def test_offsets_below_the_log_start_and_at_or_past_the_end(
    store: LogStore, clock: FakeClock
) -> None:
    store.create_topic("t", config={"retention.bytes": "0"})
    produce_batches(store, "t", [[(b"k", b"%d" % i)] * 2 for i in range(3)], clock)
    partition = store.topic("t").partitions[0]
    partition.roll()
    produce_batches(store, "t", [[(b"k", b"late")] * 2], clock)
    assert partition.apply_retention()
    start, end = partition.log_start_offset, partition.log_end_offset
    assert (start, end) == (6, 8)

    for offset in (0, 3, 5, 6):
        read = read_batches(partition, offset, BIG)
        assert decode(read.records)[0].base_offset == 6
        assert records_of(read.records) == expected_raw(partition, 6)
        assert (read.log_start_offset, read.high_watermark, read.next_offset) == (6, 8, 8)
    for offset in (8, 9, 1000):
        read = read_batches(partition, offset, BIG)
        assert read.records == b"" and read.next_offset == offset
        assert read_batches(partition, offset, BIG, compacted=True).records == b""
    assert view_start_offset(partition) == 6

    store.create_topic("empty")
    nothing = read_batches(store.topic("empty").partitions[0], 0, BIG)
    assert (nothing.records, nothing.next_offset, nothing.high_watermark) == (b"", 0, 0)


# -- the compacted view -------------------------------------------------------------------


def test_compacted_batches_keep_base_and_last_offsets(
    store: LogStore, clock: FakeClock, row_groups: str
) -> None:
    store.create_topic("t", config={**COMPACT, "delete.retention.ms": "86400000"})
    spans = produce_batches(store, "t", [
        [(b"k1", b"a"), (b"k2", b"a"), (b"k3", b"a"), (b"k4", b"a")],  # 0-3: head goes
        [(b"k1", b"b"), (b"k5", b"b"), (b"k2", b"b"), (b"k6", b"b")],  # 4-7: gap and tail
        [(b"k9", b"x"), (b"k9", b"y")],                                # 8-9: all go
        [(b"k5", b"c"), (b"k7", b"c"), (b"k6", None)],                 # 10-12: a tombstone
        [(b"k9", b"z"), (b"k7", b"d"), (b"k8", b"d")],                 # 13-15
    ], clock)
    partition = store.topic("t").partitions[0]
    partition.roll()
    produce_batches(store, "t", [[(b"k1", b"live"), (b"k1", b"live2")]], clock)  # 16-17
    compact(store, "t", clock)
    view = expected_compacted(partition)
    assert [r.offset for r in view] == [2, 3, 4, 6, 10, 12, 13, 14, 15, 16, 17]

    read = read_batches(partition, 0, BIG, compacted=True)
    batches = decode(read.records)
    assert [(b.base_offset, b.last_offset) for b in batches] == [
        (0, 3), (4, 7), (10, 12), (13, 15), (16, 17)
    ]
    assert all(spans.get(b.base_offset, 17) == b.last_offset for b in batches)
    assert [r for b in batches for r in b.records] == view
    assert [[r.offset for r in b.records] for b in batches] == [
        [2, 3], [4, 6], [10, 12], [13, 14, 15], [16, 17]
    ]
    assert batches[2].records[1].value is None  # the tombstone is still in the view
    assert read.next_offset == read.high_watermark == 18
    # The real clients' reader accepts sparse deltas and moves past the gaps.
    assert decode_with_kafka_python(read.records) == [
        (b.base_offset, b.next_offset, b.records) for b in batches
    ]

    for offset in range(19):
        assert consume(partition, offset, True, 1) == expected_compacted(partition, offset)
        if offset <= 15:  # in the ledger (the raw batch 16-17 goes whole, from 16)
            first = decode(read_batches(partition, offset, BIG, compacted=True).records)[0]
            assert first.records[0].offset >= offset
    # From inside a batch: its base and last offset, the records from the offset on.
    inside = decode(read_batches(partition, 5, BIG, compacted=True).records)[0]
    assert (inside.base_offset, inside.last_offset, [r.offset for r in inside.records]) == (
        4, 7, [6])
    # The raw view is untouched by compaction.
    assert records_of(read_batches(partition, 0, BIG).records) == expected_raw(partition)


def test_a_fully_compacted_tail_is_one_empty_batch(store: LogStore, clock: FakeClock) -> None:
    store.create_topic("t", config=COMPACT)
    produce_batches(store, "t", [[(b"x", b"1")], [(b"a", b"1"), (b"b", b"1")],
                                 [(b"a", None)], [(b"b", None)]], clock)
    partition = store.topic("t").partitions[0]
    partition.roll()
    compact(store, "t", clock)
    assert [r.offset for r in expected_compacted(partition)] == [0]  # tombstones dropped

    # Nothing in the ledger from 1 to the horizon (4), nothing after it yet.
    for offset in (1, 2, 4):
        read = read_batches(partition, offset, BIG, compacted=True)
        (batch,) = decode(read.records)
        assert (batch.base_offset, batch.last_offset, batch.record_count) == (offset, 4, 0)
        assert len(batch.raw) == HEADER_SIZE
        assert HEADER.unpack_from(batch.raw)[1] == HEADER_SIZE - LOG_OVERHEAD
        assert read.next_offset == read.high_watermark == 5
        assert decode_with_kafka_python(read.records) == [(offset, 5, [])]
    # After the last surviving batch the same read covers the rest of the range.
    read = read_batches(partition, 0, BIG, compacted=True)
    assert [(b.base_offset, b.last_offset, b.record_count) for b in decode(read.records)] == [
        (0, 0, 1), (1, 4, 0)]
    assert read.next_offset == 5
    # ... but not when the budget is spent on the batch before it.
    first = decode(read.records)[0].raw
    assert read_batches(partition, 0, len(first), compacted=True).records == first
    assert consume(partition, 0, True, 1) == expected_compacted(partition)

    # Once the log goes on past the horizon, the consumer jumps there: no empty batch.
    produce_batches(store, "t", [[(b"c", b"1")]], clock)
    read = read_batches(partition, 2, BIG, compacted=True)
    assert [(b.base_offset, b.record_count) for b in decode(read.records)] == [(5, 1)]
    assert consume(partition, 0, True, 1) == expected_compacted(partition)


def test_an_empty_ledger(store: LogStore, clock: FakeClock) -> None:
    store.create_topic("t", config=COMPACT)
    produce_batches(store, "t", [[(b"a", b"1"), (b"a", None)]], clock)
    partition = store.topic("t").partitions[0]
    partition.roll()
    compact(store, "t", clock)
    assert expected_compacted(partition) == []
    (batch,) = decode(read_batches(partition, 0, BIG, compacted=True).records)
    assert (batch.base_offset, batch.last_offset, batch.record_count) == (0, 1, 0)
    assert consume(partition, 0, True, 0) == []


def test_compacted_view_below_the_raw_log_start(store: LogStore, clock: FakeClock) -> None:
    # Retention deletes raw segments the horizon covers; their survivors stay readable
    # in the compacted view (as read_compacted serves them), so a compacted fetch starts
    # there, not at the moved log start.
    store.create_topic("t", config={**COMPACT, "retention.bytes": "0"})
    produce_batches(store, "t", [[(b"k%d" % (i % 3), b"v%d" % i)] for i in range(9)], clock)
    partition = store.topic("t").partitions[0]
    partition.roll()
    compact(store, "t", clock)
    assert partition.apply_retention()
    assert partition.log_start_offset == 9
    view = expected_compacted(partition)
    assert [r.offset for r in view] == [6, 7, 8]

    read = read_batches(partition, 0, BIG, compacted=True)
    assert records_of(read.records) == view and read.log_start_offset == 6
    assert view_start_offset(partition, compacted=True) == 6
    assert consume(partition, 0, True, 1) == view
    assert read_batches(partition, 0, BIG).records == b""  # the raw log is empty


def test_random_histories(tmp_path: Path, clock: FakeClock, row_groups: str) -> None:
    rng = random.Random(7)
    for run in range(4):
        with LogStore.open(tmp_path / f"data{run}", clock=clock) as store:
            store.create_topic("t", config={**COMPACT, "segment.bytes": "1024"})
            partition = store.topic("t").partitions[0]
            for _round in range(rng.randint(1, 3)):
                batches = [
                    [(b"k%d" % rng.randint(0, 12),
                      None if rng.random() < 0.15 else b"v" * rng.randint(0, 60))
                     for _ in range(rng.randint(1, 6))]
                    for _ in range(rng.randint(5, 25))
                ]
                produce_batches(store, "t", batches, clock)
                if rng.random() < 0.8:
                    partition.roll()
                if rng.random() < 0.7:
                    compact(store, "t", clock)
            end = partition.log_end_offset
            for offset in sorted({0, end, *(rng.randint(0, end) for _ in range(6))}):
                for max_bytes in (0, 150, BIG):
                    assert consume(partition, offset, True, max_bytes) == expected_compacted(
                        partition, offset), (run, offset, max_bytes)
                    assert consume(partition, offset, False, max_bytes) == expected_raw(
                        partition, offset), (run, offset, max_bytes)


# -- races and damage ---------------------------------------------------------------------


def test_a_file_deleted_under_the_read_is_retried_on_the_new_manifest(
    store: LogStore, clock: FakeClock, tmp_path: Path
) -> None:
    # No delay, and no Iceberg snapshot kept to hold them: the compaction's own sweep
    # deletes the files it retires at once.
    store.create_topic("t", config={**COMPACT, "file.delete.delay.ms": "0",
                                    "iceberg.history.expire.max-snapshot-age-ms": "0"})
    produce_batches(store, "t", [[(b"k%d" % (i % 4), b"v%d" % i)] for i in range(12)], clock)
    partition = store.topic("t").partitions[0]
    partition.roll()
    compact(store, "t", clock)
    reader = LogStore.open(tmp_path / "data", read_only=True)
    stale = reader.topic("t").partitions[0]
    stale_version = stale.manifest_version

    # A second compaction replaces the ledger files the reader's manifest lists.
    produce_batches(store, "t", [[(b"k1", b"new")]], clock)
    partition.roll()
    compact(store, "t", clock)
    assert stale.manifest_version == stale_version

    read = read_batches(stale, 0, BIG, compacted=True)
    assert stale.manifest_version > stale_version
    assert records_of(read.records) == expected_compacted(partition)
    reader.close()


def test_damage_fails_where_the_read_starts_and_not_before(
    store: LogStore, clock: FakeClock
) -> None:
    store.create_topic("t")
    produce_batches(store, "t", [[(b"a", b"1")], [(b"b", b"2")]], clock)
    partition = store.topic("t").partitions[0]
    partition.roll()
    produce_batches(store, "t", [[(b"c", b"3")], [(b"d", b"4")]], clock)
    partition.roll()
    _first, second = partition.manifest.segments
    path = partition.segment_dir / second.file
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))

    read = read_batches(partition, 0, BIG)
    assert records_of(read.records) == partition.read(0, 1000)
    assert read.next_offset == 2
    with pytest.raises(CorruptionError, match=second.file):
        read_batches(partition, 2, BIG)


def test_nothing_at_or_past_the_high_watermark_of_the_read(
    store: LogStore, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Appends that land while a read runs must not show: the read's high watermark is
    # taken with its view of the partition. Simulated by a high watermark that lags.
    store.create_topic("t")
    produce_batches(store, "t", [[(b"k", b"%d" % i)] for i in range(5)], clock)
    partition = store.topic("t").partitions[0]
    monkeypatch.setattr(Partition, "log_end_offset", property(lambda self: 3))

    read = read_batches(partition, 0, BIG)
    assert [b.base_offset for b in decode(read.records)] == [0, 1, 2]
    assert (read.high_watermark, read.next_offset) == (3, 3)
    assert read_batches(partition, 3, BIG).records == b""


def test_a_ledger_that_ends_inside_a_batch(store: LogStore, clock: FakeClock,
                                           row_groups: str) -> None:
    store.create_topic("t", config=COMPACT)
    produce_batches(store, "t", [[(b"a", b"1"), (b"b", b"1")], [(b"b", None)]], clock)
    partition = store.topic("t").partitions[0]
    partition.roll()
    compact(store, "t", clock)

    read = read_batches(partition, 0, BIG, compacted=True)
    assert [(b.base_offset, b.last_offset, [r.offset for r in b.records])
            for b in decode(read.records)] == [(0, 1, [0]), (2, 2, [])]
    assert records_of(read.records) == expected_compacted(partition)


def test_a_fully_compacted_range_before_damage_still_moves_the_consumer(
    store: LogStore, clock: FakeClock
) -> None:
    store.create_topic("t", config=COMPACT)
    produce_batches(store, "t", [[(b"a", b"1")], [(b"a", None)]], clock)
    partition = store.topic("t").partitions[0]
    partition.roll()
    compact(store, "t", clock)
    produce_batches(store, "t", [[(b"b", b"1")]], clock)
    partition.roll()
    damaged = partition.segment_dir / partition.manifest.segments[-1].file
    damaged.write_bytes(damaged.read_bytes()[:-8] + b"\x00" * 8)

    (batch,) = decode(read_batches(partition, 0, BIG, compacted=True).records)
    assert (batch.base_offset, batch.last_offset, batch.record_count) == (0, 1, 0)
    with pytest.raises(CorruptionError, match=damaged.name):
        read_batches(partition, 2, BIG, compacted=True)


@pytest.mark.parametrize("lost", ["a whole batch", "a record inside a batch"])
def test_records_missing_from_the_raw_log_stop_the_read(
    store: LogStore, clock: FakeClock, monkeypatch: pytest.MonkeyPatch, lost: str
) -> None:
    # Raw offsets are dense; rows that are not there (a range lost to damage before
    # sealing) must not be skipped silently: the read stops before them, and a read
    # that starts there fails, as Partition.read does.
    store.create_topic("t")
    produce_batches(store, "t", [[(b"k", b"%d" % i)] * 3 for i in range(4)], clock)
    partition = store.topic("t").partitions[0]
    partition.roll()
    gone = {3, 4, 5} if lost == "a whole batch" else {4}
    original = SealedSegment.iter_tables

    def lossy(self: SealedSegment, start: int, columns: Any = None) -> Iterator[Any]:
        for table in original(self, start, columns):
            offsets = table.column("offset").to_pylist()
            yield table.take([i for i, o in enumerate(offsets) if o not in gone])

    monkeypatch.setattr(SealedSegment, "iter_tables", lossy)

    read = read_batches(partition, 0, BIG)
    assert [b.base_offset for b in decode(read.records)] == [0]
    assert read.next_offset == 3
    with pytest.raises(CorruptionError, match=f"offset {min(gone)} is missing"):
        read_batches(partition, 3, BIG)


def test_a_reader_of_the_previous_manifest_reads_retired_files_until_the_delay(
    store: LogStore, clock: FakeClock, tmp_path: Path
) -> None:
    """Retired ledger files stay file.delete.delay.ms, so a reader that loaded the older
    manifest reads its whole, older view rather than failing or mixing two."""
    store.create_topic("t", config=COMPACT)
    produce_batches(store, "t", [[(b"k%d" % (i % 4), b"v%d" % i)] for i in range(12)], clock)
    partition = store.topic("t").partitions[0]
    partition.roll()
    compact(store, "t", clock)
    old_view = expected_compacted(partition)
    reader = LogStore.open(tmp_path / "data", read_only=True)
    stale = reader.topic("t").partitions[0]
    stale_version = stale.manifest_version
    produce_batches(store, "t", [[(b"k1", b"new")]], clock)
    partition.roll()
    compact(store, "t", clock)
    read = read_batches(stale, 0, BIG, compacted=True)
    assert stale.manifest_version == stale_version
    assert records_of(read.records)[: len(old_view)] == old_view
    reader.close()
