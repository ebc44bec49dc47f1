"""Fail-over on an object store, one interleaving at a time, in process against moto: a
writer that lost its lease, a restart after a take-over, a compaction's sweep racing
the owner's commit. Clocks are the tests' own (FakeClock): a lease's expiry is when a
take-over may happen, the epoch stamped in each manifest decides who may commit, and
the high watermark (Partition.high_watermark) is what the bucket holds by the writer's
own commits. Each test failed before the change it is named for (issue 21)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from compactlog import LogStore, ProducerRecord
from compactlog.backend import Location
from compactlog.backend.lease import LeaseLostError
from compactlog.compaction.runner import _sweep
from compactlog.errors import FencedError
from compactlog.server.uploads import Uploads
from compactlog.storage.partition import Partition
from compactlog.storage.recovery import LOCAL_EPOCH_FILE
from support.fakes import FakeClock
from support.s3_support import (
    S3Server,
)

TTL_S = 10.0


@pytest.fixture
def where(s3_env: S3Server) -> Location:
    return s3_env.location("failover-steps")


def writer(where: Location, local: Path, clock: FakeClock, auto_seal: bool = True) -> LogStore:
    store = LogStore.open(where, local_dir=local, clock=clock, lease_ttl_s=TTL_S)
    store.auto_seal = auto_seal
    return store


def records(count: int, tag: str) -> list[ProducerRecord]:
    return [ProducerRecord(b"k%d" % i, f"{tag}{i}".encode()) for i in range(count)]


def values(partition: Partition) -> list[bytes | None]:
    return [record.value for record in partition.read(0, 10_000, 1 << 24)]


def abandon(store: LogStore) -> None:
    """What SIGKILL leaves: the lease neither renewed nor released, nothing sealed."""
    store.lease = None
    for partition in store.open_partitions():
        partition.failed = RuntimeError("killed")  # its close flushes nothing
    store.close()


def test_the_high_watermark_is_what_the_writer_itself_put_in_the_bucket(
        where: Location, tmp_path: Path) -> None:
    """Issue 21, item 1: a consumer is served only records that are durable. On an
    object store that is the sealed end of the manifests this writer committed: an
    append on the local disk is not below it until its upload commits."""
    clock = FakeClock()
    store = writer(where, tmp_path / "a", clock, auto_seal=False)
    try:
        store.create_topic("t", 1)
        partition = store.topic("t").partitions[0]
        partition.append(records(3, "a"))
        assert partition.log_end_offset == 3
        assert partition.high_watermark == 0
        assert values(partition) == []  # nothing durable to serve yet
        assert partition.read_compacted(0) == []
        partition.roll()
        partition.seal_rolled()
        assert partition.high_watermark == 3
        assert values(partition) == [b"a0", b"a1", b"a2"]
        partition.append(records(1, "b"))
        assert values(partition) == [b"a0", b"a1", b"a2"]
    finally:
        store.close()


def test_a_fenced_writer_acknowledges_nothing(where: Location, tmp_path: Path) -> None:
    """Issue 21, item 2: A's lease ran out while it stalled and B took over and sealed
    its own record at offset 3. A's upload of its record at offset 3 fails (fenced), but
    on the way A loaded B's manifest, whose sealed end covers offset 3: the wait for the
    upload must still say no, since A's record is not in the bucket."""
    clock = FakeClock()
    first = writer(where, tmp_path / "a", clock, auto_seal=False)
    first.create_topic("t", 1)
    stale = first.topic("t").partitions[0]
    stale.append(records(3, "a"))
    stale.roll()
    stale.seal_rolled()
    stale.append([ProducerRecord(b"k", b"R_A")])  # offset 3, on A's disk only
    clock.advance(TTL_S + 1)
    second = writer(where, tmp_path / "b", clock)
    try:
        owner = second.topic("t").partitions[0]
        owner.append([ProducerRecord(b"k", b"R_B")])  # offset 3 again, B's
        owner.roll()
        assert owner.high_watermark == 4
        with pytest.raises(FencedError):
            stale.roll()
            stale.seal_rolled()
        assert stale.manifest.sealed_end_offset == 4  # B's manifest, loaded on the way
        assert stale.high_watermark == 3
        uploaded = asyncio.run(Uploads(0.01, acks_all_waits=True).wait(stale, 3, 0.2))
        assert not uploaded
        assert values(owner)[3] == b"R_B"
    finally:
        second.close()
        abandon(first)


def test_a_writer_that_loads_a_newer_writers_manifest_stops(where: Location,
                                                            tmp_path: Path) -> None:
    """A refresh that finds a newer writer's epoch stamped in the manifest fences this
    writer at once, before any commit of its own conflicts: it serves and acknowledges
    nothing (require_owner)."""
    clock = FakeClock()
    first = writer(where, tmp_path / "a", clock)
    first.create_topic("t", 1)
    stale = first.topic("t").partitions[0]
    clock.advance(TTL_S + 1)
    second = writer(where, tmp_path / "b", clock)
    try:
        second.topic("t")
        stale.refresh()
        with pytest.raises(FencedError):
            stale.require_owner()
        with pytest.raises(FencedError):
            stale.append(records(1, "x"))
    finally:
        second.close()
        abandon(first)


def test_a_holder_past_its_expiry_serves_nothing_until_it_renews(
        where: Location, tmp_path: Path) -> None:
    """lease.py step 4: a holder paused past the expiry it committed (SIGSTOP, a slow
    renewal request) may have been replaced already: it acknowledges and serves nothing
    until a renewal succeeds; if the lease was taken meanwhile, the renewal fails and
    it never serves again."""
    clock = FakeClock()
    store = writer(where, tmp_path / "a", clock)
    try:
        store.require_serving()
        clock.advance(TTL_S * 0.85)  # inside the ttl, past the safety margin
        with pytest.raises(LeaseLostError, match="ran out"):
            store.require_serving()
        store.renew_lease()  # due: little of the lease is left
        store.require_serving()
        clock.advance(TTL_S + 1)
        taker = writer(where, tmp_path / "b", clock)
        try:
            with pytest.raises(LeaseLostError):
                store.require_serving()
            store.renew_lease()
            assert store.lease_lost is not None
            with pytest.raises(LeaseLostError, match="took the writer lease"):
                store.require_serving()
        finally:
            taker.close()
    finally:
        store.close()


def test_a_restart_after_a_take_over_sets_aside_the_whole_local_suffix(
        where: Location, tmp_path: Path) -> None:
    """Issue 21, item 4: A has offsets 0..9 in the bucket, a rolled local file at 10
    (10..14) and an active one at 15 (15..19), none uploaded, when it is killed. B takes
    over and seals 10..12 of its own. A, restarted on its old directory once B is gone,
    must set aside both local files (not only the one that starts below the bucket's
    sealed end): else the bucket lists 0..9, 10..12, 15..19 and offsets 13-14 never
    exist, and records nobody acknowledged follow B's history."""
    clock = FakeClock()
    first = writer(where, tmp_path / "a", clock, auto_seal=False)
    first.create_topic("t", 1)
    partition = first.topic("t").partitions[0]
    partition.append(records(10, "a"))
    partition.roll()
    partition.seal_rolled()
    partition.append(records(5, "rolled"))
    partition.roll()  # log/10.log, rolled, not sealed
    partition.append(records(5, "active"))  # log/15.log
    abandon(first)
    clock.advance(TTL_S + 1)
    second = writer(where, tmp_path / "b", clock)
    second.topic("t").partitions[0].append(records(3, "b"))
    second.close()  # seals 10..12 and releases the lease
    again = writer(where, tmp_path / "a", clock)
    try:
        restarted = again.topic("t").partitions[0]
        assert restarted.log_end_offset == 13
        restarted.append(records(1, "c"))
        restarted.roll()
        got = values(restarted)
        assert len(got) == 14
        assert got[10:] == [b"b0", b"b1", b"b2", b"c0"]
        aside = sorted(path.name.split(".")[0]
                       for path in (restarted.directory / "superseded").iterdir())
        assert aside == [f"{10:020d}", f"{15:020d}"]
    finally:
        again.close()


def test_a_restart_without_a_take_over_keeps_what_the_local_disk_acknowledged(
        where: Location, tmp_path: Path) -> None:
    """The other side of step 0b: a writer killed and restarted on its own directory,
    with nobody writing meanwhile, keeps its local records (acks=1 acknowledged them
    from this disk) and uploads them."""
    clock = FakeClock()
    first = writer(where, tmp_path / "a", clock, auto_seal=False)
    first.create_topic("t", 1)
    partition = first.topic("t").partitions[0]
    partition.append(records(4, "a"))
    partition.roll()
    partition.seal_rolled()
    partition.append(records(2, "local"))
    abandon(first)
    clock.advance(TTL_S + 1)
    again = writer(where, tmp_path / "a", clock)
    try:
        restarted = again.topic("t").partitions[0]
        assert (restarted.directory / LOCAL_EPOCH_FILE).read_text().strip() == "2"
        restarted.roll()
        assert values(restarted) == [b"a0", b"a1", b"a2", b"a3", b"local0", b"local1"]
        assert not (restarted.directory / "superseded").exists()
    finally:
        again.close()


def test_a_non_owner_never_removes_an_audit_copy(where: Location, tmp_path: Path) -> None:
    """Issue 21, read from the code: a process that does not own a partition's manifest
    (a compaction's sweep, a fenced writer's clean-up) must not remove audit copies of
    versions not yet committed: on S3 a stalled owner's commit between its audit copy
    and its current.json looks like a dead one's, and may still land. It finds the
    version unproven and deletes no orphan instead."""
    clock = FakeClock()
    store = writer(where, tmp_path / "a", clock)
    try:
        store.create_topic("t", 1)
        owner = store.topic("t").partitions[0]
        document = owner.document
        snapshot = document.load()
        assert snapshot is not None
        claimed = document.audit_key(snapshot.version + 1)  # type: ignore[attr-defined]
        document.client.put_object(  # type: ignore[attr-defined]
            Bucket=where.bucket, Key=claimed, Body=b"{}")  # the owner's commit, in flight
        with LogStore.open(where, read_only=True, local_dir=tmp_path / "reader",
                           clock=clock) as reader:
            other = reader.topic("t").partitions[0]
            assert not other.prove_manifest()
            _sweep(other)  # the compaction runner's sweep of ledger/
        listed = document.client.list_objects_v2(  # type: ignore[attr-defined]
            Bucket=where.bucket, Prefix=claimed)
        assert listed.get("KeyCount", 0) == 1
        assert owner.prove_manifest()  # the owner may remove it
    finally:
        store.close()

