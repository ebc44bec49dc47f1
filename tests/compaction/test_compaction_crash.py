"""Crash and race tests of compaction: the compactor is killed with SIGKILL at each step
of its protocol. Afterwards the partition must show the old (horizon, ledger) pair or
the new one, never a mix; readers must read a whole view; the status must say the run
died; and the next run must succeed, leave no stray files and give the new view. Two
compactors race for one commit; and the writer's actors (seal, retention, DeleteRecords,
a config change) land between a run's plan and its commit, which goes through or
conflicts as runner.py's step 5 says (its merges: tests/storage/test_merging.py).
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from compactlog.compaction import load_factory
from compactlog.compaction.runner import run_compaction
from compactlog.compaction.status import read_status
from compactlog.errors import ConflictError
from compactlog.storage.partition import Partition
from compactlog.storage.records import ProducerRecord, Record
from compactlog.storage.store import LogStore
from support.crash_compactor import KILL_POINTS
from support.engines import CommitHookEngine
from support.fakes import FakeClock
from support.paths import SUPPORT_DIR, TESTS_DIR

TESTS = TESTS_DIR

# Retired ledger files go at the run's final sweep, so "no stray files" can be checked.
# No Iceberg snapshot outlives the next run: each run's replaced ledger files go at once
# (a retained snapshot would keep them: tests/iceberg/test_iceberg_expiry.py).
CONFIG = {"cleanup.policy": "compact", "segment.bytes": "4096", "min.compaction.lag.ms": "0",
          "file.delete.delay.ms": "0", "iceberg.history.expire.max-snapshot-age-ms": "0"}


def view(partition: Partition) -> list[Record]:
    records: list[Record] = []
    offset = 0
    while batch := partition.read_compacted(offset, 100):
        records += batch
        offset = batch[-1].offset + 1
    return records


def compact_in_store(store: LogStore, clock: FakeClock) -> None:
    factory = load_factory("local_engine:LocalCompactionServiceFactory")
    factory.new_service(store, "t", {"clock": clock}).compact()


def compact_in_process(data: Path) -> None:
    with LogStore.open(data) as store:
        factory = load_factory("local_engine:LocalCompactionServiceFactory")
        factory.new_service(store, "t", {}).compact()


def prepare(data: Path) -> None:
    with LogStore.open(data) as store:
        store.create_topic("t", partitions=2, config=CONFIG)
        for i in range(300):
            store.append("t", [ProducerRecord(b"k%d" % (i % 30), b"first-%d" % i)])
        for partition in store.topic("t").partitions:
            partition.roll()
    compact_in_process(data)
    with LogStore.open(data) as store:
        for i in range(300):
            value = None if i % 29 == 0 else b"second-%d" % i
            store.append("t", [ProducerRecord(b"k%d" % (i % 40), value)])
        for partition in store.topic("t").partitions:
            partition.roll()


def views(data: Path) -> list[list[Record]]:
    with LogStore.open(data, read_only=True) as store:
        return [view(p) for p in store.topic("t").partitions]


def ledger_files(data: Path) -> list[list[str]]:
    return [
        sorted(p.name for p in (data / "topics" / "t" / str(i) / "ledger").glob("*"))
        for i in range(2)
    ]


@pytest.mark.parametrize("point", sorted(KILL_POINTS))
def test_compactor_killed_at_each_step(tmp_path: Path, point: str) -> None:
    data = tmp_path / "data"
    prepare(data)
    old = views(data)
    reference = tmp_path / "reference"
    shutil.copytree(data, reference)
    compact_in_process(reference)
    new = views(reference)
    assert old != new

    child = subprocess.run(
        [sys.executable, str(SUPPORT_DIR / "crash_compactor.py"), str(data), "t", point],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert child.returncode == -signal.SIGKILL, (child.returncode, child.stdout, child.stderr)

    after_kill = views(data)
    for index, got in enumerate(after_kill):
        assert got in (old[index], new[index]), f"partition {index}: a mix of two runs"
    with LogStore.open(data, read_only=True) as store:
        for partition in store.topic("t").partitions:
            status = read_status(partition.directory)
            if status.state != "SUCCESS":
                assert status.state == "ERROR" and "interrupted" in (status.error or "")

    compact_in_process(data)  # the next run recovers and completes
    assert views(data) == new
    with LogStore.open(data, read_only=True) as store:
        for partition in store.topic("t").partitions:
            listed = {info.file for info in partition.manifest.ledger}
            on_disk = {p.name for p in (partition.directory / "ledger").iterdir()}
            assert on_disk == listed, "stray ledger files after recovery"
            assert read_status(partition.directory).state == "SUCCESS"


# A compactor that, in mode "hold", waits inside phase 1 (holding the partition lock)
# until the release file exists. Arguments: MODE TESTS_DIR PAUSED RELEASE DATA_DIR.
HELD_COMPACTOR = """
import pathlib, sys, time
mode, tests, paused, release, data = sys.argv[1:]
sys.path.insert(0, tests)
import local_engine
from compactlog.compaction import load_factory
from compactlog.compaction.status import CompactionRunningError
from compactlog.storage.store import LogStore
if mode == "hold":
    real = local_engine.LocalEngine._survivors
    def held(*args, **kwargs):
        pathlib.Path(paused).touch()
        while not pathlib.Path(release).exists():
            time.sleep(0.01)
        return real(*args, **kwargs)
    local_engine.LocalEngine._survivors = held
with LogStore.open(data, read_only=True) as store:
    try:
        load_factory("local_engine:LocalCompactionServiceFactory").new_service(
            store, "t", {}).compact()
    except CompactionRunningError as error:
        print(error)
        sys.exit(3)
"""


def test_two_compactions_of_one_partition_one_wins(tmp_path: Path) -> None:
    """Two compactor processes at once: the first is held inside phase 1, holding the
    partition lock; the second fails with a conflict before it writes anything; the
    first then finishes and its result is the one a lone run gives."""
    data = tmp_path / "data"
    prepare(data)
    reference = tmp_path / "reference"
    shutil.copytree(data, reference)
    paused, release = tmp_path / "paused", tmp_path / "release"
    arguments = [str(TESTS), str(paused), str(release), str(data)]
    first = subprocess.Popen([sys.executable, "-c", HELD_COMPACTOR, "hold", *arguments])
    try:
        deadline = time.monotonic() + 120
        while not paused.exists():
            assert first.poll() is None, "the first compactor exited before phase 1"
            assert time.monotonic() < deadline, "the first compactor never reached phase 1"
            time.sleep(0.01)
        before_second = ledger_files(data)
        second = subprocess.run([sys.executable, "-c", HELD_COMPACTOR, "go", *arguments],
                                capture_output=True,
                                text=True, timeout=300, check=False)
        assert second.returncode == 3, (second.stdout, second.stderr)
        assert "already running" in second.stdout
        assert ledger_files(data) == before_second, "the loser wrote ledger files"
    finally:
        release.touch()
    assert first.wait(timeout=300) == 0
    compact_in_process(reference)
    assert views(data) == views(reference)
    for listed, on_disk in zip(_listed(data), ledger_files(data), strict=True):
        assert sorted(listed) == on_disk


def _listed(data: Path) -> list[list[str]]:
    with LogStore.open(data, read_only=True) as store:
        return [[info.file for info in p.manifest.ledger] for p in store.topic("t").partitions]


def test_a_compactor_that_loses_the_commit_race_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the lock cannot help (two machines on a shared filesystem without working
    flock), the manifest commit decides: a run planned from a pair that another run has
    replaced fails with ConflictError, and its files are removed."""
    import contextlib

    from compactlog.compaction import runner
    from local_engine import LocalEngine

    data = tmp_path / "data"
    prepare(data)
    reference = tmp_path / "reference"
    shutil.copytree(data, reference)
    monkeypatch.setattr(runner, "compaction_lock", lambda *args: contextlib.nullcontext())

    class RacingEngine(LocalEngine):
        def write_ledgers(self, plans, run_id):  # type: ignore[no-untyped-def]
            written = super().write_ledgers(plans, run_id)
            compact_in_process(data)  # another compactor commits first
            return written

    with LogStore.open(data, read_only=True) as store, pytest.raises(
        ConflictError, match="another compaction"
    ):
        runner.run_compaction(store, "t", RacingEngine(), [0])
    winner = views(data)
    listed = _listed(data)
    assert ledger_files(data)[0] == sorted(listed[0]), "the loser left files behind"
    compact_in_process(reference)
    assert winner == views(reference)


# -- the writer's actors between a compaction's plan and its commit (runner.py, step 5) ---

COMPACTED = {**CONFIG, "delete.retention.ms": str(10**9)}


def fill_and_seal(store: LogStore, count: int, keys: int, tag: str) -> None:
    """`count` records over `keys` keys, one sealed segment per 4 records."""
    partition = store.topic("t").partition(0)
    for i in range(count):
        store.append("t", [ProducerRecord(b"k%d" % (i % keys), b"%s-%d" % (tag.encode(), i))],
                     partition=0)
        if i % 4 == 3:
            partition.roll()
    partition.roll()


def latest_view(partition: Partition) -> list[Record]:
    """What the compacted view holds once everything sealed is compacted (latest)."""
    latest = {record.key: record for record in raw(partition)}
    return sorted(latest.values(), key=lambda record: record.offset)


def raw(partition: Partition) -> list[Record]:
    records: list[Record] = []
    while batch := partition.read(records[-1].offset + 1 if records else 0, 100):
        records += batch
    return records


def run_with(store: LogStore, clock: FakeClock, before_commit: Callable[[], object]) -> None:
    run_compaction(store, "t", CommitHookEngine(before_commit), clock=clock)


def test_segments_sealed_under_a_compaction_stay_dirty_for_the_next_run(
        store: LogStore, clock: FakeClock) -> None:
    """Step 5b: the commit goes through at the planned horizon; the next run covers the
    segments sealed meanwhile."""
    store.create_topic("t", 1, COMPACTED)
    partition = store.topic("t").partition(0)
    fill_and_seal(store, 12, 5, "a")
    run_with(store, clock, lambda: fill_and_seal(store, 8, 7, "b"))
    assert partition.manifest.horizon == 11
    assert partition.manifest.sealed_end_offset == 20
    compact_in_store(store, clock)
    assert partition.manifest.horizon == 19
    assert view(partition) == latest_view(partition)


def test_retention_under_a_compaction_lets_it_commit(store: LogStore, clock: FakeClock) -> None:
    """Step 5d: on a compacted topic retention removes only segments the old ledger
    covers; the commit goes through and the view keeps every key."""
    store.create_topic("t", 1, {**COMPACTED, "retention.bytes": "0"})
    partition = store.topic("t").partition(0)
    fill_and_seal(store, 12, 5, "a")
    compact_in_store(store, clock)
    fill_and_seal(store, 8, 7, "b")
    removed: list[object] = []
    run_with(store, clock, lambda: removed.extend(partition.apply_retention()))
    assert len(removed) == 3  # the segments of offsets 0..11
    assert partition.manifest.horizon == 19
    assert view(partition) == latest_view(partition)  # every key of b: k0..k6
    assert len(view(partition)) == 7


def test_retention_of_a_planned_segment_after_a_switch_to_delete_makes_the_commit_conflict(
        store: LogStore, clock: FakeClock) -> None:
    """Step 5d: after a switch to cleanup.policy=delete retention removes segments this
    run read: the commit conflicts and the old pair stays."""
    store.create_topic("t", 1, COMPACTED)
    partition = store.topic("t").partition(0)
    fill_and_seal(store, 12, 5, "a")
    compact_in_store(store, clock)
    before = partition.manifest.compaction
    fill_and_seal(store, 8, 7, "b")

    def switch_and_retain() -> None:
        store.alter_topic("t", {"cleanup.policy": "delete", "retention.bytes": "0"})
        assert partition.apply_retention()

    with pytest.raises(ConflictError, match="no longer listed"):
        run_with(store, clock, switch_and_retain)
    assert partition.manifest.compaction == before


def test_delete_records_under_a_compaction_makes_its_commit_conflict(
        store: LogStore, clock: FakeClock) -> None:
    """Step 5e: under `first` the run chose k0@0; DeleteRecords(1) lands before its
    commit. Had it committed, the ledger would hold k0@0 (hidden by the cut) and not
    k0@1, and k0 would be gone for good; it conflicts, and the next run keeps k0@1."""
    store.create_topic("t", 1, {**COMPACTED, "compaction.strategy": "first"})
    partition = store.topic("t").partition(0)
    for value in (b"a", b"b"):
        store.append("t", [ProducerRecord(b"k0", value)])
    partition.roll()
    with pytest.raises(ConflictError, match="DeleteRecords"):
        run_with(store, clock, lambda: partition.delete_records(1))
    assert partition.manifest.compaction is None
    compact_in_store(store, clock)
    assert [(r.offset, r.value) for r in view(partition)] == [(1, b"b")]


def test_a_config_change_under_a_compaction_applies_from_the_next_run(
        store: LogStore, clock: FakeClock) -> None:
    """Step 5f: the run commits what it planned with `latest`, and says so; the switch
    to `first` made meanwhile decides from the next run on."""
    store.create_topic("t", 1, COMPACTED)
    partition = store.topic("t").partition(0)
    fill_and_seal(store, 12, 5, "a")
    run_with(store, clock, lambda: store.alter_topic("t", {"compaction.strategy": "first"}))
    compaction = partition.manifest.compaction
    assert compaction is not None and compaction.strategy == "latest"
    assert view(partition) == latest_view(partition)
    kept = {r.key: r.value for r in view(partition)}
    fill_and_seal(store, 8, 7, "b")
    compact_in_store(store, clock)
    values = {r.key: r.value for r in view(partition)}
    assert values == {**{b"k5": b"b-5", b"k6": b"b-6"}, **kept}
