"""Bad input: damaged files, unknown names, bad config values, garbage record batches.

The contract (errors.py, logfile.py): bad input gets a clear error that names what was
wrong and where, and the rest of the data stays readable. Each test damages one thing,
checks the error class and the message (file, offsets, key), and then checks that
everything that was readable before the damage still reads back identically.

- A torn tail (invalid bytes with nothing valid after them) is what a crash leaves; the
  writer cuts it on open, a read-only open leaves the file alone.
- A corrupt range (invalid bytes followed by valid batches) cannot come from a crash;
  reads that need it raise CorruptionError, the batches on both sides stay readable.
- A damaged or missing sealed segment or manifest raises CorruptionError naming the file.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import textwrap
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import crc32c
import pytest

from compactlog.errors import (
    CompactlogError,
    CorruptionError,
    InvalidConfigError,
    InvalidRecordError,
    InvalidTopicNameError,
    UnknownConfigError,
    UnknownPartitionError,
    UnknownTopicError,
    UserError,
)
from compactlog.storage.manifest import SegmentInfo
from compactlog.storage.partition import Partition
from compactlog.storage.records import (
    CRC_START,
    HEADER_SIZE,
    ProducerRecord,
    Record,
    encode_batch,
)
from compactlog.storage.store import MAX_PARTITIONS, LogStore

T0 = 1_700_000_000.0  # seconds, as time.time() returns
SMALL_SEGMENTS = {"segment.bytes": "4096"}  # the minimum is 1024; 4096 seals every ~28 batches


def fixed_clock() -> float:
    return T0


def open_store(data: Path, read_only: bool = False) -> LogStore:
    return LogStore.open(data, read_only=read_only, clock=fixed_clock)


def batch_of(batch: int, count: int = 3) -> list[ProducerRecord]:
    """`count` records, distinct per batch, with keys, values and a header."""
    return [
        ProducerRecord(b"key-%d" % i, b"value-%04d-%d" % (batch, i) * 3, (("b", b"%d" % batch),))
        for i in range(count)
    ]


def read_all(partition: Partition, offset: int = 0) -> list[Record]:
    return partition.read(offset, max_records=1_000_000, max_bytes=1 << 40)


def fill(partition: Partition, batches: range) -> None:
    for batch in batches:
        partition.append(batch_of(batch))


def flip_byte(path: Path, position: int, mask: int = 0xFF) -> None:
    raw = bytearray(path.read_bytes())
    raw[position] ^= mask
    path.write_bytes(bytes(raw))


def tree(directory: Path) -> dict[str, bytes | None]:
    """Every path under `directory` with its content (None for directories)."""
    return {
        str(path.relative_to(directory)): None if path.is_dir() else path.read_bytes()
        for path in sorted(directory.rglob("*"))
        if path.name != ".writer.lock"
    }


def with_crc(batch: bytearray) -> bytearray:
    """Recompute the CRC32C of a batch that a test edited on purpose."""
    struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[CRC_START:])))
    return batch


# -- the active segment: five batches of three records, offsets 0..14 ----------------


@dataclass
class ActiveLog:
    data: Path
    log: Path  # the active log file of t/0
    positions: list[int]  # byte position of each batch
    ends: list[int]
    records: list[Record]  # everything that was readable before the damage


def make_active_log(tmp_path: Path, batches: int = 5) -> ActiveLog:
    data = tmp_path / "data"
    with open_store(data) as store:
        store.create_topic("t")
        partition = store.topic("t").partitions[0]
        fill(partition, range(batches))
        segment = partition.active
        state = ActiveLog(
            data, segment.path, list(segment.positions), list(segment.ends), read_all(partition)
        )
    assert [r.offset for r in state.records] == list(range(3 * batches))
    assert state.log.parent.name == "log" and state.log.stat().st_size == state.ends[-1]
    return state


def check_appends_continue(partition: Partition, expected: list[Record]) -> list[Record]:
    """A new batch gets the next offset and reads back after what was there."""
    result = partition.append(batch_of(99))
    assert result.base_offset == expected[-1].offset + 1
    new = read_all(partition, result.base_offset)
    assert [r.offset for r in new] == list(range(result.base_offset, result.last_offset + 1))
    assert [r.value for r in new] == [r.value for r in batch_of(99)]
    return [*expected, *new]


# -- torn tails ---------------------------------------------------------------------


def _half_of_next_batch(state: ActiveLog) -> bytes:
    batch = encode_batch(batch_of(5), base_offset=15, now_ms=int(T0 * 1000))
    return bytes(batch[: len(batch) // 2])


TORN_TAILS: dict[str, Callable[[ActiveLog], tuple[int, bytes]]] = {
    # name: damage -> (number of whole batches left, bytes appended after them)
    "truncated-mid-batch": lambda s: (4, s.log.read_bytes()[s.positions[4] : s.ends[4] - 20]),
    "truncated-mid-header": lambda s: (4, s.log.read_bytes()[s.positions[4] : s.positions[4] + 30]),
    "half-a-new-batch": lambda s: (5, _half_of_next_batch(s)),
    "garbage-bytes": lambda s: (5, b"\xde\xad\xbe\xef" * 40),
    "zero-fill": lambda s: (5, bytes(4096)),
    "one-stray-byte": lambda s: (5, b"\x02"),
}


@pytest.mark.parametrize("damage", sorted(TORN_TAILS))
def test_torn_tail_is_cut_back_to_the_last_whole_batch(tmp_path: Path, damage: str) -> None:
    state = make_active_log(tmp_path)
    whole, tail = TORN_TAILS[damage](state)
    valid_bytes = state.ends[whole - 1]
    with open(state.log, "r+b") as handle:
        handle.truncate(valid_bytes)
        handle.seek(valid_bytes)
        handle.write(tail)
    damaged_size = state.log.stat().st_size
    assert damaged_size == valid_bytes + len(tail)
    kept = state.records[: 3 * whole]

    with open_store(state.data) as store:
        partition = store.topic("t").partitions[0]
        report = partition.recovery
        assert len(report.torn_tails) == 1, report
        torn = report.torn_tails[0]
        assert torn.path == state.log
        assert torn.valid_bytes == valid_bytes
        assert torn.dropped_bytes == len(tail)
        assert torn.reason  # says what failed (truncated header, CRC, magic ...)
        assert report.corrupt_ranges == []
        assert state.log.stat().st_size == valid_bytes
        assert partition.log_end_offset == 3 * whole
        assert read_all(partition) == kept
        expected = check_appends_continue(partition, kept)

    with open_store(state.data) as store:
        partition = store.topic("t").partitions[0]
        assert partition.recovery.clean, partition.recovery
        assert read_all(partition) == expected


def test_read_only_open_of_a_torn_tail_leaves_the_file_alone(tmp_path: Path) -> None:
    state = make_active_log(tmp_path)
    with open(state.log, "r+b") as handle:
        handle.truncate(state.ends[4] - 25)  # the last batch is cut short
        handle.seek(0, os.SEEK_END)
        handle.write(b"\xff" * 7)
    damaged = state.log.read_bytes()

    with open_store(state.data, read_only=True) as store:
        partition = store.topic("t").partitions[0]
        assert read_all(partition) == state.records[:12]
        assert partition.log_end_offset == 12
        assert state.log.read_bytes() == damaged
        partition.refresh()
        assert read_all(partition, 6) == state.records[6:12]
    assert state.log.read_bytes() == damaged

    # The writer is the one that cuts it.
    with open_store(state.data) as store:
        partition = store.topic("t").partitions[0]
        assert [t.valid_bytes for t in partition.recovery.torn_tails] == [state.ends[3]]
        assert read_all(partition) == state.records[:12]


# -- flipped bytes in the active segment --------------------------------------------

# Where in batch 2 (offsets 6..8) to flip a byte; all but the base offset field are
# covered by the CRC32C or make the batch structurally invalid.
FLIPS_IN_MIDDLE_BATCH = {
    "record-payload": lambda size: size - 20,
    "first-record": lambda size: HEADER_SIZE + 2,
    "last-byte": lambda size: size - 1,
    "batch-length": lambda size: 11,
    "magic": lambda size: 16,
    "crc": lambda size: 18,
    "attributes": lambda size: 22,
    "record-count": lambda size: 60,
}


@pytest.mark.parametrize("where", sorted(FLIPS_IN_MIDDLE_BATCH))
def test_flipped_byte_in_a_middle_batch_is_a_corrupt_range(tmp_path: Path, where: str) -> None:
    state = make_active_log(tmp_path)
    size = state.ends[2] - state.positions[2]
    flip_byte(state.log, state.positions[2] + FLIPS_IN_MIDDLE_BATCH[where](size))
    damaged_size = state.log.stat().st_size

    for attempt in range(2):  # the damage is found again on every open; nothing is cut
        with open_store(state.data) as store:
            partition = store.topic("t").partitions[0]
            report = partition.recovery
            assert report.torn_tails == []
            assert len(report.corrupt_ranges) == 1, report
            assert "offsets 6..8" in report.corrupt_ranges[0]
            assert state.log.stat().st_size >= damaged_size

            for offset in (6, 7, 8):
                with pytest.raises(CorruptionError) as error:
                    partition.read(offset)
                assert error.value.path == state.log
                message = str(error.value)
                assert str(state.log) in message
                assert "offsets 6..8" in message
                assert f"bytes {state.positions[2]}..{state.ends[2]}" in message
                with pytest.raises(CorruptionError):
                    partition.read_table(offset)

            # Before the damage: everything up to it; a read stops there.
            assert read_all(partition) == state.records[:6]
            assert read_all(partition, 4) == state.records[4:6]
            # After the damage: readable as before.
            assert read_all(partition, 9)[:6] == state.records[9:]
            if attempt == 0:
                expected = check_appends_continue(partition, state.records)
            assert read_all(partition, 9) == expected[9:]
            assert partition.log_end_offset == expected[-1].offset + 1


@pytest.mark.parametrize(
    ("byte", "mask"),
    [(1, 0x01), (7, 0x10), (7, 0x04), (0, 0x80)],
    ids=["high-byte-up", "low-byte-up", "low-byte-down", "sign-bit"],
)
def test_flipped_bit_in_the_base_offset_of_a_middle_batch(
    tmp_path: Path, byte: int, mask: int
) -> None:
    """The base offset is the one header field the CRC32C does not cover (the broker sets
    it). A flipped bit there must not make the writer cut the valid batches after it as a
    "torn tail", nor give records offsets that were never assigned."""
    state = make_active_log(tmp_path)
    flip_byte(state.log, state.positions[2] + byte, mask)
    size = state.log.stat().st_size

    with open_store(state.data) as store:
        partition = store.topic("t").partitions[0]
        assert partition.recovery.torn_tails == [], (
            "valid batches after the damaged one were cut as a torn tail: "
            f"{partition.recovery.torn_tails}"
        )
        assert state.log.stat().st_size == size
        assert partition.log_end_offset == 15
        assert read_all(partition, 9) == state.records[9:]
        got = read_all(partition)
        assert {r.offset for r in got} <= set(range(15)), "offsets that were never assigned"
        assert got == state.records[:6]
        with pytest.raises(CorruptionError, match=r"offsets 6\.\.8"):
            partition.read(6)


def test_flipped_byte_in_the_last_batch_is_cut_as_a_torn_tail(tmp_path: Path) -> None:
    state = make_active_log(tmp_path)
    flip_byte(state.log, state.ends[4] - 20)

    with open_store(state.data) as store:
        partition = store.topic("t").partitions[0]
        report = partition.recovery
        assert report.corrupt_ranges == []
        assert [(t.path, t.valid_bytes) for t in report.torn_tails] == [
            (state.log, state.positions[4])
        ]
        assert "CRC" in report.torn_tails[0].reason
        assert state.log.stat().st_size == state.positions[4]
        assert read_all(partition) == state.records[:12]
        expected = check_appends_continue(partition, state.records[:12])
        assert expected[-1].offset == 14  # offsets 12..14 are given again: they were cut

    with open_store(state.data) as store:
        partition = store.topic("t").partitions[0]
        assert partition.recovery.clean
        assert read_all(partition) == expected


def test_read_only_store_reports_a_corrupt_range_the_same_way(tmp_path: Path) -> None:
    state = make_active_log(tmp_path)
    flip_byte(state.log, (state.positions[1] + state.ends[1]) // 2)
    damaged = state.log.read_bytes()
    with open_store(state.data, read_only=True) as store:
        partition = store.topic("t").partitions[0]
        with pytest.raises(CorruptionError, match=r"offsets 3\.\.5") as error:
            partition.read(4)
        assert error.value.path == state.log
        assert read_all(partition) == state.records[:3]
        assert read_all(partition, 6) == state.records[6:]
    assert state.log.read_bytes() == damaged


# -- flipped bytes in an active segment that follows sealed segments ----------------


@dataclass
class SealedThenActive:
    data: Path
    log: Path
    base: int  # first offset of the active segment
    positions: list[int]
    ends: list[int]
    records: list[Record]


def make_sealed_then_active(tmp_path: Path) -> SealedThenActive:
    data = tmp_path / "data"
    with open_store(data) as store:
        store.create_topic("t", config=SMALL_SEGMENTS)
        partition = store.topic("t").partitions[0]
        batch = 0
        while len(partition.manifest.segments) < 2 or len(partition.active.positions) < 4:
            partition.append(batch_of(batch))
            batch += 1
        active = partition.active
        state = SealedThenActive(
            data, active.path, active.base_offset, list(active.positions), list(active.ends),
            read_all(partition),
        )
    assert state.base > 0
    return state


def test_flipped_byte_in_the_first_batch_after_sealed_data(tmp_path: Path) -> None:
    state = make_sealed_then_active(tmp_path)
    flip_byte(state.log, (state.positions[0] + state.ends[0]) // 2)
    base = state.base
    with open_store(state.data) as store:
        partition = store.topic("t").partitions[0]
        assert [f"offsets {base}..{base + 2}" in c for c in partition.recovery.corrupt_ranges] == [
            True
        ]
        for offset in (base, base + 2):
            with pytest.raises(CorruptionError) as error:
                partition.read(offset)
            assert error.value.path == state.log
            assert f"offsets {base}..{base + 2}" in str(error.value)
        assert read_all(partition, base + 3) == state.records[base + 3 :]
        # The sealed data before it reads back, in reads that end before the damage.
        assert partition.read(0, max_records=base, max_bytes=1 << 40) == state.records[:base]
        assert partition.read(base - 2, max_records=2) == state.records[base - 2 : base]


def test_read_across_sealed_data_stops_before_a_damaged_first_log_batch(tmp_path: Path) -> None:
    """As inside one log file (test_flipped_byte_in_a_middle_batch_is_a_corrupt_range), a
    read that starts before a corrupt range returns the records before it; it does not
    fail because the range lies within its max_records."""
    state = make_sealed_then_active(tmp_path)
    flip_byte(state.log, (state.positions[0] + state.ends[0]) // 2)
    with open_store(state.data) as store:
        partition = store.topic("t").partitions[0]
        assert read_all(partition, state.base - 5) == state.records[state.base - 5 : state.base]
        assert read_all(partition) == state.records[: state.base]


def test_corrupt_range_still_fails_reads_after_its_segment_is_sealed(tmp_path: Path) -> None:
    """Sealing a log file that holds a corrupt range must not turn the damage into a
    silent gap: a read of the damaged offsets still raises CorruptionError."""
    state = make_active_log(tmp_path)
    flip_byte(state.log, (state.positions[2] + state.ends[2]) // 2)
    with open_store(state.data) as store:
        partition = store.topic("t").partitions[0]
        assert len(partition.recovery.corrupt_ranges) == 1
        assert partition.roll()  # seals the damaged file
        assert read_all(partition, 9) == state.records[9:]
        with pytest.raises(CorruptionError, match=r"offsets 6\.\.8"):
            partition.read(6)
        assert read_all(partition) == state.records[:6]
    with open_store(state.data) as store:
        partition = store.topic("t").partitions[0]
        with pytest.raises(CorruptionError, match=r"offsets 6\.\.8"):
            partition.read(7)


# -- sealed Parquet segments ---------------------------------------------------------


@dataclass
class SealedStore:
    data: Path
    segments: list[SegmentInfo]  # of t/0, oldest first; at least three
    segment_dir: Path
    records: dict[tuple[str, int], list[Record]]  # (topic, partition) -> all records


def make_sealed_store(tmp_path: Path) -> SealedStore:
    data = tmp_path / "data"
    with open_store(data) as store:
        store.create_topic("t", partitions=2, config=SMALL_SEGMENTS)
        store.create_topic("other", config=SMALL_SEGMENTS)
        target = store.topic("t").partitions[0]
        batch = 0
        while len(target.manifest.segments) < 3 or target.active.is_empty:
            target.append(batch_of(batch))
            batch += 1
        fill(store.topic("t").partitions[1], range(40))
        fill(store.topic("other").partitions[0], range(40))
        records = {
            (name, p.index): read_all(p)
            for name in ("t", "other")
            for p in store.topic(name).partitions
        }
        state = SealedStore(data, list(target.manifest.segments), target.segment_dir, records)
    assert state.segment_dir.name == "segments"
    assert all(len(rs) > 0 for rs in state.records.values())
    return state


def check_everything_but(store: LogStore, state: SealedStore, bad: SegmentInfo) -> None:
    """All data outside the damaged segment reads back as before."""
    records = state.records[("t", 0)]
    before = [r for r in records if r.offset < bad.base_offset]
    after = [r for r in records if r.offset > bad.last_offset]
    partition = store.topic("t").partitions[0]
    assert partition.read(0, max_records=len(before), max_bytes=1 << 40) == before
    assert read_all(partition, bad.last_offset + 1) == after
    assert read_all(partition, partition.active.base_offset) == [
        r for r in records if r.offset >= partition.active.base_offset
    ]
    assert read_all(store.topic("t").partitions[1]) == state.records[("t", 1)]
    assert read_all(store.topic("other").partitions[0]) == state.records[("other", 0)]


TRUNCATIONS: dict[str, Callable[[int], int]] = {
    "half": lambda size: size // 2,
    "footer-cut": lambda size: size - 10,
    "one-byte-short": lambda size: size - 1,
    "empty": lambda size: 0,
}


@pytest.mark.parametrize("read_only", [False, True], ids=["writer", "read-only"])
@pytest.mark.parametrize("cut", sorted(TRUNCATIONS))
def test_truncated_parquet_segment(tmp_path: Path, cut: str, read_only: bool) -> None:
    state = make_sealed_store(tmp_path)
    bad = state.segments[1]
    path = state.segment_dir / bad.file
    with open(path, "r+b") as handle:
        handle.truncate(TRUNCATIONS[cut](bad.size_bytes))
    before = tree(state.data)

    with open_store(state.data, read_only=read_only) as store:  # the store still opens
        partition = store.topic("t").partitions[0]
        assert [s.file for s in partition.manifest.segments] == [s.file for s in state.segments]
        for offset in (bad.base_offset, (bad.base_offset + bad.last_offset) // 2, bad.last_offset):
            with pytest.raises(CorruptionError) as error:
                partition.read(offset)
            assert error.value.path == path
            message = str(error.value)
            assert str(path) in message
            assert f"offsets {bad.base_offset}..{bad.last_offset}" in message
            with pytest.raises(CorruptionError, match=bad.file):
                partition.read_table(offset)
        check_everything_but(store, state, bad)
        if not read_only:
            result = partition.append(batch_of(999))
            assert read_all(partition, result.base_offset)[0].value == batch_of(999)[0].value
    if read_only:
        assert tree(state.data) == before
    # Nothing was "repaired" away: the damaged file is still there for an operator.
    assert path.exists()


def test_deleted_parquet_segment_listed_by_the_manifest(tmp_path: Path) -> None:
    state = make_sealed_store(tmp_path)
    bad = state.segments[1]
    path = state.segment_dir / bad.file
    path.unlink()

    with open_store(state.data) as store:
        partition = store.topic("t").partitions[0]
        assert bad.file in [s.file for s in partition.manifest.segments]
        with pytest.raises(CorruptionError) as error:
            partition.read(bad.base_offset + 1)
        assert error.value.path == path
        message = str(error.value)
        assert bad.file in message
        assert "missing" in message
        assert f"offsets {bad.base_offset}..{bad.last_offset}" in message
        check_everything_but(store, state, bad)
        # The other sealed files are untouched.
        for info in state.segments:
            if info is not bad:
                assert (state.segment_dir / info.file).stat().st_size == info.size_bytes


def test_read_across_sealed_data_stops_before_a_damaged_segment(tmp_path: Path) -> None:
    """A read from offset 0 with room for more records than the first segment holds must
    return the first segment's records and stop before the damaged one, as a log read
    stops before a corrupt range; otherwise a consumer at offset 0 can never get past
    the intact data before the damage with its usual fetch size."""
    state = make_sealed_store(tmp_path)
    bad = state.segments[1]
    (state.segment_dir / bad.file).unlink()
    with open_store(state.data) as store:
        partition = store.topic("t").partitions[0]
        before = [r for r in state.records[("t", 0)] if r.offset < bad.base_offset]
        assert partition.read(0) == before  # default max_records=500
        assert read_all(partition) == before


_FLIP_SCAN = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    import pyarrow.parquet as pq
    from compactlog.errors import CorruptionError
    from compactlog.storage.manifest import SegmentInfo
    from compactlog.storage.sealed import RECORD_COLUMNS, SealedSegment, table_to_records

    original, scratch = Path(sys.argv[1]), Path(sys.argv[2])
    start, stride = int(sys.argv[3]), int(sys.argv[4])
    info = SegmentInfo(**json.loads(sys.argv[5]))
    expected = table_to_records(pq.read_table(original, columns=RECORD_COLUMNS))
    raw = original.read_bytes()
    for position in range(start, len(raw), stride):
        print(position, "start", flush=True)
        damaged = bytearray(raw)
        damaged[position] ^= 0x01
        scratch.write_bytes(bytes(damaged))
        try:
            got = []
            for table in SealedSegment(scratch, info).iter_tables(info.base_offset, RECORD_COLUMNS):
                got += table_to_records(table)
            outcome = "same" if got == expected else "wrong-data"
        except CorruptionError:
            outcome = "corruption-error"
        except Exception as error:
            outcome = "other-error:" + type(error).__name__
        print(position, outcome, flush=True)
    """
)


def test_flipped_bit_in_a_sealed_segment_never_reads_back_wrong_data(tmp_path: Path) -> None:
    """A single flipped bit anywhere in a sealed Parquet file must give either the same
    records or a CorruptionError naming the file: never other records, another exception
    class, or a crash of the process. Run in a child process, which may abort."""
    state = make_sealed_store(tmp_path)
    info = state.segments[0]
    original = state.segment_dir / info.file
    scratch = tmp_path / info.file
    stride = 3
    outcomes: dict[str, list[int]] = defaultdict(list)
    start = 0
    while start < info.size_bytes:
        child = subprocess.run(
            [sys.executable, "-c", _FLIP_SCAN, str(original), str(scratch), str(start),
             str(stride), json_of(info)],
            capture_output=True, text=True, timeout=600, check=False,
        )
        started = -1
        for line in child.stdout.splitlines():
            position, outcome = line.split()
            if outcome == "start":
                started = int(position)
            else:
                outcomes[outcome].append(int(position))
        if child.returncode == 0:
            break
        if started < 0:
            pytest.fail(f"the scan did not start: {child.stderr}")
        outcomes[f"process-died({child.returncode})"].append(started)
        start = started + stride
    assert outcomes["corruption-error"], dict(outcomes)
    bad = {k: v for k, v in outcomes.items() if k not in ("same", "corruption-error")}
    assert not bad, f"bit flips at these byte positions of {info.size_bytes}: {bad}"


def json_of(info: SegmentInfo) -> str:
    return json.dumps(asdict(info))


# -- manifests -----------------------------------------------------------------------


def _garbage_byte(path: Path) -> None:
    flip_byte(path, path.stat().st_size // 2, 0x55)


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-9])


def _edit_value(path: Path) -> None:
    raw = path.read_bytes()
    assert b'"log_start_offset": 0' in raw
    path.write_bytes(raw.replace(b'"log_start_offset": 0', b'"log_start_offset": 7', 1))


def _empty(path: Path) -> None:
    path.write_bytes(b"")


def _not_an_envelope(path: Path) -> None:
    path.write_bytes(b"[1, 2, 3]")


MANIFEST_DAMAGE: dict[str, Callable[[Path], None]] = {
    "garbage-byte": _garbage_byte,
    "truncated": _truncate,
    "edited-value": _edit_value,  # still valid JSON: only the checksum notices
    "empty": _empty,
    "not-an-envelope": _not_an_envelope,
}


@pytest.mark.parametrize("read_only", [False, True], ids=["writer", "read-only"])
@pytest.mark.parametrize("damage", sorted(MANIFEST_DAMAGE))
def test_damaged_partition_manifest(tmp_path: Path, damage: str, read_only: bool) -> None:
    """Every copy of the manifest damaged (current.json and its audit copies; one damaged
    copy alone falls back to another, test_durability_regressions.py)."""
    state = make_sealed_store(tmp_path)
    directory = state.data / "topics" / "t" / "1" / "manifest"
    manifest = directory / "current.json"
    for path in directory.glob("*.json"):
        MANIFEST_DAMAGE[damage](path)
    before = tree(state.data / "topics" / "t")

    with open_store(state.data, read_only=read_only) as store:
        for _ in range(2):  # and again: a failed open is not cached as a good one
            with pytest.raises(CorruptionError) as error:
                store.topic("t")
            assert error.value.path == manifest
            assert str(manifest) in str(error.value)
        # Other topics in the same data directory open and read as before.
        assert store.list_topics() == ["other", "t"]
        assert read_all(store.topic("other").partitions[0]) == state.records[("other", 0)]
        if not read_only:
            store.append("other", [ProducerRecord(b"k", b"v")])
    # Nothing of the damaged topic was changed or "repaired" away (its Parquet files, logs,
    # and the damaged manifest are all still there for an operator).
    assert tree(state.data / "topics" / "t") == before


@pytest.mark.parametrize("what", ["files", "directory"])
@pytest.mark.parametrize("data", ["sealed", "log-only"])
def test_missing_partition_manifest(tmp_path: Path, what: str, data: str) -> None:
    if data == "sealed":
        state = make_sealed_store(tmp_path)
        root = state.data
    else:
        active = make_active_log(tmp_path)
        root = active.data
        with open_store(root) as store:
            store.create_topic("other")
            store.append("other", [ProducerRecord(b"k", b"v")])
    directory = root / "topics" / "t" / "0" / "manifest"
    if what == "directory":
        shutil.rmtree(directory)
    else:
        for path in directory.iterdir():
            path.unlink()
    before = tree(root / "topics" / "t")

    for read_only in (False, True):
        with open_store(root, read_only=read_only) as store:
            with pytest.raises(CorruptionError) as error:
                store.topic("t")
            assert error.value.path == directory
            message = str(error.value)
            assert str(directory) in message
            assert "manifest is missing" in message
            assert "t/0" in message
            assert read_all(store.topic("other").partitions[0])
    # No empty manifest was committed in its place, and no data file was removed as
    # "unlisted" by one.
    assert tree(root / "topics" / "t") == before


def test_damaged_topic_metadata(tmp_path: Path) -> None:
    state = make_sealed_store(tmp_path)
    meta = state.data / "topics" / "t" / "meta" / "current.json"
    for path in meta.parent.glob("*.json"):
        _garbage_byte(path)
    with open_store(state.data) as store:
        with pytest.raises(CorruptionError) as error:
            store.topic("t")
        assert error.value.path == meta
        assert str(meta) in str(error.value)
        assert read_all(store.topic("other").partitions[0]) == state.records[("other", 0)]


def test_missing_topic_metadata_is_corruption_not_an_unknown_topic(tmp_path: Path) -> None:
    """A topic directory with partitions but no metadata cannot come from a crash (create
    renames a complete topic into place). Saying "unknown topic" there, while list_topics
    lists it and create_topic says it exists, hides the damage."""
    state = make_sealed_store(tmp_path)
    meta_dir = state.data / "topics" / "t" / "meta"
    for path in meta_dir.iterdir():
        path.unlink()
    with open_store(state.data) as store:
        assert "t" in store.list_topics()
        with pytest.raises(CorruptionError) as error:
            store.topic("t")
        assert str(meta_dir) in str(error.value)
        assert read_all(store.topic("other").partitions[0]) == state.records[("other", 0)]


# -- unknown topics and partitions ---------------------------------------------------


@pytest.fixture
def populated(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    with open_store(data) as store:
        store.create_topic("orders", partitions=3, config={"retention.ms": "1000000"})
        store.append("orders", [ProducerRecord(b"k%d" % i, b"v%d" % i) for i in range(20)])
    return data


def snapshot(store: LogStore) -> tuple[list[str], dict[str, bytes | None], list[list[Record]]]:
    return (
        store.list_topics(),
        tree(store.topics_dir),
        [read_all(p) for p in store.topic("orders").partitions],
    )


@pytest.mark.parametrize("name", ["nope", "Orders", "orders ", "../orders", "", "orders/0"])
def test_unknown_topic_names_it(populated: Path, name: str) -> None:
    with open_store(populated) as store:
        before = snapshot(store)
        calls: list[Callable[[], object]] = [
            lambda: store.topic(name),
            lambda: store.append(name, [ProducerRecord(b"k", b"v")]),
            lambda: store.alter_topic(name, {"retention.ms": "1"}),
            lambda: store.delete_topic(name),
            lambda: store.recovery_reports(name),
        ]
        for call in calls:
            with pytest.raises(UnknownTopicError) as error:
                call()
            assert error.value.topic == name
            assert str(error.value) == f"unknown topic {name!r}"
        assert snapshot(store) == before
    with open_store(populated, read_only=True) as store, pytest.raises(UnknownTopicError):
        store.topic(name)


def test_unknown_partition_names_topic_and_range(populated: Path) -> None:
    with open_store(populated) as store:
        before = snapshot(store)
        topic = store.topic("orders")
        for index in (-1, 3, 99):
            with pytest.raises(UnknownPartitionError) as error:
                topic.partition(index)
            assert str(error.value) == (
                f"topic 'orders' has no partition {index} (it has partitions 0..2)"
            )
            with pytest.raises(UnknownPartitionError, match=f"no partition {index}"):
                store.append("orders", [ProducerRecord(b"k", b"v")], partition=index)
        assert snapshot(store) == before


# -- bad config values ---------------------------------------------------------------

BAD_VALUES: list[tuple[str, object, str]] = [
    # key, value, what the message says is allowed
    ("segment.bytes", "1", "an int in [1024, 2147483647]"),
    ("segment.bytes", "abc", "an int in [1024, 2147483647]"),
    ("segment.bytes", "", "an int"),
    ("segment.bytes", "4096.5", "an int"),
    ("segment.bytes", True, "an int"),
    ("segment.bytes", str(2**31), "in [1024, 2147483647]"),
    ("segment.ms", "0", "a long in [1, 9223372036854775807]"),
    ("retention.ms", "-2", "or -1 for unlimited"),
    ("retention.bytes", "10GB", "a long"),
    ("flush.messages", "0", "in [1, "),
    ("max.message.bytes", "-5", "in [0, 2147483647]"),
    ("parquet.row.group.bytes", "1024", "in [65536, 1073741824]"),
    ("min.cleanable.dirty.ratio", "1.5", "a double in [0, 1]"),
    ("min.cleanable.dirty.ratio", "-0.1", "a double in [0, 1]"),
    ("min.cleanable.dirty.ratio", "inf", "a double in [0, 1]"),
    ("min.cleanable.dirty.ratio", "nan", "a double in [0, 1]"),
    ("min.cleanable.dirty.ratio", "half", "a double in [0, 1]"),
    ("cleanup.policy", "bogus", "one of 'delete', 'compact', 'compact,delete'"),
    ("cleanup.policy", "", "one of 'delete', 'compact', 'compact,delete'"),
    ("cleanup.policy", "delete,archive", "one of 'delete', 'compact', 'compact,delete'"),
    ("null.key.policy", "ignore", "one of 'reject', 'drop', 'keep'"),
    ("parquet.compression", "brotli", "one of 'none', 'snappy', 'zstd', 'lz4', 'gzip'"),
    ("empty.value.is.tombstone", "yes", "true or false"),
    ("empty.value.is.tombstone", "1", "true or false"),
]


def _value_id(value: object) -> str:
    return repr(value).replace(" ", "_")


@pytest.mark.parametrize(
    ("key", "value", "allowed"), BAD_VALUES, ids=[f"{k}={_value_id(v)}" for k, v, _ in BAD_VALUES]
)
def test_bad_config_value_on_create(populated: Path, key: str, value: object, allowed: str) -> None:
    with open_store(populated) as store:
        before = snapshot(store)
        with pytest.raises(InvalidConfigError) as error:
            store.create_topic("fresh", partitions=2, config={"retention.ms": "5", key: value})
        assert (error.value.key, error.value.value) == (key, value)
        message = str(error.value)
        assert repr(key) in message
        assert repr(value) in message
        assert allowed in message
        assert snapshot(store) == before  # no topic, no staging directory left behind
        assert not (store.topics_dir / "fresh").exists()


@pytest.mark.parametrize(
    ("key", "value", "allowed"), BAD_VALUES, ids=[f"{k}={_value_id(v)}" for k, v, _ in BAD_VALUES]
)
def test_bad_config_value_on_alter(populated: Path, key: str, value: object, allowed: str) -> None:
    with open_store(populated) as store:
        before = snapshot(store)
        version = store.topic("orders").meta_version
        with pytest.raises(InvalidConfigError) as error:
            # A good value first: the bad one must stop the whole change.
            store.alter_topic("orders", {"retention.ms": "5", key: value})
        message = str(error.value)
        assert repr(key) in message and repr(value) in message and allowed in message
        assert store.topic("orders").config.overrides == {"retention.ms": 1000000}
        assert store.topic("orders").meta_version == version
        assert snapshot(store) == before
    with open_store(populated) as store:
        assert store.topic("orders").config.overrides == {"retention.ms": 1000000}


def test_unknown_config_keys(populated: Path) -> None:
    with open_store(populated) as store:
        before = snapshot(store)
        attempts: list[Callable[[], object]] = [
            lambda: store.create_topic("fresh", config={"segment.byte": "4096"}),
            lambda: store.alter_topic("orders", {"segment.byte": "4096"}),
            lambda: store.alter_topic("orders", {"retention.ms": "5"}, delete=["segment.byte"]),
        ]
        for attempt in attempts:
            with pytest.raises(UnknownConfigError) as error:
                attempt()
            message = str(error.value)
            assert "unknown config key 'segment.byte'" in message
            assert "segment.bytes" in message  # lists the known keys
            assert snapshot(store) == before
        assert store.topic("orders").config.overrides == {"retention.ms": 1000000}


@pytest.mark.parametrize(
    "name", ["", ".", "..", "a/b", "a b", "x" * 250, "ünïcode", "tab\t", "../escape", "a\x00b"]
)
def test_invalid_topic_name_changes_nothing(populated: Path, name: str) -> None:
    with open_store(populated) as store:
        before = snapshot(store)
        with pytest.raises(InvalidTopicNameError) as error:
            store.create_topic(name, config={"segment.bytes": "4096"})
        message = str(error.value)
        assert repr(name) in message
        assert "1 to 249 characters" in message
        assert snapshot(store) == before


@pytest.mark.parametrize("count", [0, -1, MAX_PARTITIONS + 1])
def test_bad_partition_count_changes_nothing(populated: Path, count: int) -> None:
    with open_store(populated) as store:
        before = snapshot(store)
        with pytest.raises(UserError) as error:
            store.create_topic("fresh", partitions=count)
        assert f"partitions must be in [1, {MAX_PARTITIONS}], got {count}" in str(error.value)
        assert snapshot(store) == before


# -- garbage record batches from a producer -------------------------------------------


def _good_batch() -> bytearray:
    return encode_batch(batch_of(7, count=2), base_offset=0, now_ms=int(T0 * 1000))


def _bad_crc() -> bytearray:
    batch = _good_batch()
    batch[len(batch) - 3] ^= 0x40
    return batch


def _truncated() -> bytearray:
    return _good_batch()[:-5]


def _truncated_header() -> bytearray:
    return _good_batch()[:30]


def _trailing_bytes() -> bytearray:
    return _good_batch() + bytearray(b"\x00\x01\x02")


def _wrong_magic() -> bytearray:
    batch = _good_batch()
    batch[16] = 1
    return batch


def _empty_batch() -> bytearray:
    return bytearray()


def _length_below_header() -> bytearray:
    batch = _good_batch()
    struct.pack_into(">i", batch, 8, 10)
    return batch


def _negative_record_count() -> bytearray:
    batch = _good_batch()
    struct.pack_into(">i", batch, 57, -1)
    return with_crc(batch)


GARBAGE_BATCHES: dict[str, tuple[Callable[[], bytearray], str]] = {
    "bad-crc": (_bad_crc, "CRC32C mismatch"),
    "truncated": (_truncated, "truncated batch:"),
    "truncated-header": (_truncated_header, f"truncated batch header (30 of {HEADER_SIZE} bytes)"),
    "trailing-bytes": (_trailing_bytes, "3 trailing bytes"),
    "wrong-magic": (_wrong_magic, "unsupported magic 1"),
    "empty": (_empty_batch, "truncated batch header (0 of"),
    "length-below-header": (_length_below_header, "smaller than a batch header"),
    "negative-record-count": (_negative_record_count, "bad record count -1"),
}


@pytest.fixture
def producer_store(tmp_path: Path) -> Iterator[LogStore]:
    with open_store(tmp_path / "data") as store:
        store.create_topic("t")
        store.create_topic("c", config={"cleanup.policy": "compact"})
        store.append("t", batch_of(0))
        yield store


def check_rejected(store: LogStore, topic: str, batch: bytearray, expected: str) -> None:
    """append_batch refuses `batch` saying `expected`, and appends nothing."""
    partition = store.topic(topic).partitions[0]
    before = read_all(partition)
    end, size = partition.log_end_offset, partition.active.path.stat().st_size
    with pytest.raises(InvalidRecordError) as error:
        partition.append_batch(batch)
    message = str(error.value)
    assert f"{topic}/0" in message
    assert expected in message
    assert partition.log_end_offset == end
    assert partition.active.path.stat().st_size == size
    assert read_all(partition) == before
    # A good batch still goes in, at the next offset.
    result = partition.append_batch(_good_batch())
    assert result.base_offset == end
    assert [r.value for r in read_all(partition, end)] == [r.value for r in batch_of(7, 2)]


@pytest.mark.parametrize("garbage", sorted(GARBAGE_BATCHES))
def test_garbage_batch_is_rejected(producer_store: LogStore, garbage: str) -> None:
    make, expected = GARBAGE_BATCHES[garbage]
    check_rejected(producer_store, "t", make(), expected)


def test_batch_whose_offset_delta_disagrees_with_its_record_count(producer_store: LogStore) -> None:
    """Kafka refuses a v2 batch whose lastOffsetDelta + 1 differs from its record count
    (LogValidator: "Header-level offset delta ... inconsistent with record count"):
    taking it would assign offsets no record has."""
    batch = _good_batch()
    struct.pack_into(">i", batch, 23, 5)  # lastOffsetDelta 5, but 2 records
    check_rejected(producer_store, "t", with_crc(batch), "record count")


def test_batch_with_a_valid_crc_over_garbage_records(producer_store: LogStore) -> None:
    """A producer's CRC only proves the bytes were not changed on the way; records that
    do not decode must be refused at append, not stored to fail every later read (and
    the sealing of their segment)."""
    batch = _good_batch()
    batch[HEADER_SIZE:] = b"\xff" * (len(batch) - HEADER_SIZE)
    partition = producer_store.topic("t").partitions[0]
    try:
        partition.append_batch(with_crc(batch))
    except InvalidRecordError:
        check_rejected(producer_store, "t", with_crc(batch), "t/0")
        return
    try:
        read_all(partition)
    except Exception as error:
        kind = "" if isinstance(error, CompactlogError) else " (not a CompactlogError)"
        pytest.fail(
            "append_batch accepted a batch whose records do not decode; reading t/0 from "
            f"offset 0 now raises {type(error).__name__}{kind}: {error}"
        )
    pytest.fail("append_batch accepted a batch whose records do not decode")


def test_batch_with_null_keys_on_a_compacted_topic(producer_store: LogStore) -> None:
    """null.key.policy=reject "refuses them at produce, as Kafka does": a Kafka producer's
    batch goes through append_batch, which must apply the same check as append."""
    batch = encode_batch([ProducerRecord(None, b"orphan")], 0, int(T0 * 1000))
    with pytest.raises(InvalidRecordError, match="reject"):
        producer_store.topic("c").partitions[0].append([ProducerRecord(None, b"orphan")])
    check_rejected(producer_store, "c", batch, "null.key.policy=reject")
