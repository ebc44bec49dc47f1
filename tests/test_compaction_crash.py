"""Crash tests of compaction: the compactor is killed with SIGKILL at each step of its
protocol. Afterwards the partition must show the old (horizon, ledger) pair or the new
one, never a mix; readers must read a whole view; the status must say the run died;
and the next run must succeed, leave no stray files and give the new view.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from compactlog.compaction import load_factory
from compactlog.compaction.status import read_status
from compactlog.storage.partition import Partition
from compactlog.storage.records import ProducerRecord, Record
from compactlog.storage.store import LogStore

TESTS = Path(__file__).parent
sys.path.insert(0, str(TESTS))
from crash_compactor import KILL_POINTS  # noqa: E402

# Retired ledger files go at the run's final sweep, so "no stray files" can be checked.
CONFIG = {"cleanup.policy": "compact", "segment.bytes": "4096", "min.compaction.lag.ms": "0",
          "file.delete.delay.ms": "0"}


def view(partition: Partition) -> list[Record]:
    records: list[Record] = []
    offset = 0
    while batch := partition.read_compacted(offset, 100):
        records += batch
        offset = batch[-1].offset + 1
    return records


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
        [sys.executable, str(TESTS / "crash_compactor.py"), str(data), "t", point],
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
    from compactlog.errors import ConflictError
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
