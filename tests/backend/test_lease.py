"""The writer lease of a store on S3 (backend/lease.py), against moto on loopback: one
writer at a time; an expired lease is taken over with a higher epoch; the new writer
stamps its epoch into the manifests it opens, so a stalled former writer's next commit
is fenced (FencedError) and it takes no more writes; a taken lease is lost at renewal;
a released one is taken at once. Clocks are the tests' own (expiry only decides when a
takeover may happen; the epoch decides who may commit)."""

from __future__ import annotations

from pathlib import Path

import pytest

from compactlog import LogStore, ProducerRecord
from compactlog.backend import Location
from compactlog.backend.lease import EPOCH_KEY, LeaseLostError
from compactlog.errors import DataDirLockedError, FencedError
from support.fakes import FakeClock
from support.s3_support import (
    S3Server,
)

TTL_S = 10.0


@pytest.fixture
def where(s3_env: S3Server) -> Location:
    return s3_env.location("lease")


def writer(where: Location, local: Path, clock: FakeClock) -> LogStore:
    return LogStore.open(where, local_dir=local, clock=clock, lease_ttl_s=TTL_S)


def records(count: int, tag: str) -> list[ProducerRecord]:
    return [ProducerRecord(b"k%d" % i, f"{tag}{i}".encode()) for i in range(count)]


def test_a_second_writer_is_refused_while_the_lease_lives(where: Location,
                                                          tmp_path: Path) -> None:
    clock = FakeClock()
    first = writer(where, tmp_path / "a", clock)
    try:
        with pytest.raises(DataDirLockedError, match="writer lease is live"):
            writer(where, tmp_path / "b", clock)
        assert first.lease is not None and first.lease.epoch == 1
    finally:
        first.close()


def test_a_released_lease_is_taken_at_once(where: Location, tmp_path: Path) -> None:
    clock = FakeClock()
    writer(where, tmp_path / "a", clock).close()
    second = writer(where, tmp_path / "b", clock)
    try:
        assert second.lease is not None and second.lease.epoch == 2
    finally:
        second.close()


def test_an_expired_lease_is_taken_over_and_the_former_writer_is_fenced(
        where: Location, tmp_path: Path) -> None:
    clock = FakeClock()
    first = writer(where, tmp_path / "a", clock)  # then it stalls: no renewal, no close
    first.create_topic("t", 1)
    first.append("t", records(5, "a"))
    first.topic("t").partitions[0].roll()  # sealed: offsets 0..4 are in the bucket
    first.append("t", records(3, "late"))  # acknowledged locally only, never sealed
    clock.advance(TTL_S + 1)
    second = writer(where, tmp_path / "b", clock)
    try:
        assert second.lease is not None and second.lease.epoch == 2
        partition = second.topic("t").partitions[0]
        assert partition.manifest.extra[EPOCH_KEY] == 2  # stamped at open
        assert partition.log_end_offset == 5
        second.append("t", records(2, "b"))  # offsets 5, 6 on the new writer
        # The former writer wakes up and seals its 5..7: its commit finds epoch 2.
        stale = first.topic("t").partitions[0]
        with pytest.raises(FencedError, match="newer writer"):
            stale.roll()
        with pytest.raises(FencedError):
            stale.append(records(1, "x"))
        partition.roll()
        got = [r.value for r in partition.read(0, 100, 1 << 20)]
        assert got == [b"a0", b"a1", b"a2", b"a3", b"a4", b"b0", b"b1"]
    finally:
        second.close()
        first.lease = None  # it lost the lease; its close must not seal or release
        first.close()


def test_a_taken_lease_is_lost_at_renewal(where: Location, tmp_path: Path) -> None:
    clock = FakeClock()
    first = writer(where, tmp_path / "a", clock)
    first.create_topic("t", 1)
    first.topic("t")
    clock.advance(TTL_S + 1)
    second = writer(where, tmp_path / "b", clock)
    try:
        assert first.lease is not None
        first.lease._renewed_at -= TTL_S  # its renewal is due
        first.tick()
        assert first.lease is None
        with pytest.raises(LeaseLostError, match="took the writer lease"):
            first.append("t", records(1, "x"))
        first.tick()  # upkeep does nothing more: no reopen of the failed partitions
        with pytest.raises(LeaseLostError):
            first.topic("t").partitions[0].append(records(1, "x"))
    finally:
        second.close()
        first.close()


def test_renewal_keeps_the_lease(where: Location, tmp_path: Path) -> None:
    clock = FakeClock()
    first = writer(where, tmp_path / "a", clock)
    try:
        assert first.lease is not None
        for _ in range(3):
            clock.advance(TTL_S / 2)
            first.lease._renewed_at -= TTL_S
            first.tick()
        assert first.lease is not None
        with pytest.raises(DataDirLockedError):
            writer(where, tmp_path / "b", clock)
    finally:
        first.close()


def test_a_holder_killed_inside_a_renewal_does_not_block_the_next_taker(
        where: Location, tmp_path: Path) -> None:
    """A holder killed between its renewal's audit copy and its PUT of current.json
    (backend/s3/document.py steps 3 and 4) leaves an audit copy of a version never committed,
    on which every commit of that version conflicts. Once the lease has expired, the
    taker removes it (the document has no owner then) and takes the lease."""
    clock = FakeClock()
    first = writer(where, tmp_path / "a", clock)
    assert first.lease is not None
    document = first.lease.document
    snapshot = document.load()
    assert snapshot is not None
    # What the killed renewal left: the audit copy of the next version, nothing more.
    claimed = snapshot.version + 1
    key = document.audit_key(claimed)  # type: ignore[attr-defined]
    document.client.put_object(Bucket=where.bucket, Key=key,  # type: ignore[attr-defined]
                               Body=b"{}")
    first.lease = None  # killed: it neither renews nor releases
    first.close()
    clock.advance(TTL_S + 1)
    second = writer(where, tmp_path / "b", clock)
    try:
        assert second.lease is not None and second.lease.epoch == 2
    finally:
        second.close()
