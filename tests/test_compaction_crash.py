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

CONFIG = {"cleanup.policy": "compact", "segment.bytes": "4096", "min.compaction.lag.ms": "0"}


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
            listed = {i["file"] for i in (partition.manifest.compaction or {})["ledger"]}
            on_disk = {p.name for p in (partition.directory / "ledger").iterdir()}
            assert on_disk == listed, "stray ledger files after recovery"
            assert read_status(partition.directory).state == "SUCCESS"
