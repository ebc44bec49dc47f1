"""A read-only reader (another process: `LogStore.open(..., read_only=True)`) follows a
writer that seals under it, without a false "offset ... is missing" (issue 21, item 7).

A reader learns the writer's state in two steps, the manifest (sealed segments) and the
listing of log/ (unsealed records); the writer seals a log file by committing a manifest
that lists its Parquet form, then deletes the file. A seal landing between the two steps
must not leave offsets in neither place. The deterministic test lands a seal right after
the reader's first step, whichever it is, on a refresh and on an open (Spark's tail
tasks open partitions that way); the stress test runs a reader process scanning the
compacted view while this process appends, rolls, merges and compacts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from compactlog.storage import recovery
from compactlog.storage.merging import merge_small_segments
from compactlog.storage.partition import Partition
from compactlog.storage.records import ProducerRecord
from compactlog.storage.store import LogStore
from local_engine import LocalCompactionService
from support.paths import SUPPORT_DIR, TESTS_DIR

CONFIG = {"cleanup.policy": "compact", "min.compaction.lag.ms": "0",
          "segment.bytes": str(1 << 20)}


def append(store: LogStore, start: int, count: int) -> None:
    store.append("t", [ProducerRecord(b"k%d" % i, b"v%d" % i) for i in range(start, start + count)])


def offsets_of(partition: Partition) -> list[int]:
    found: list[int] = []
    while batch := partition.read_compacted(len(found) and found[-1] + 1, 1000):
        found += [record.offset for record in batch]
    return found


@pytest.fixture
def writer(tmp_path: Path) -> Iterator[LogStore]:
    with LogStore.open(tmp_path / "data") as store:
        store.create_topic("t", 1, CONFIG)
        append(store, 0, 10)
        yield store


def seal_under_the_reader(writer: LogStore) -> Callable[[], None]:
    """The writer's move: the records 10..19 it appended are rolled and sealed (their
    log file deleted), and 20..24 go into a new active file."""

    def move() -> None:
        writer.topic("t").partition(0).roll()
        append(writer, 20, 5)

    return move


def hooked(reader: Partition, step: str, move: Callable[[], None],
           monkeypatch: pytest.MonkeyPatch) -> None:
    """Run `move` once, right after the reader's `step` ("manifest": a manifest load;
    "listing": a listing of log/) is done, the first time it is."""
    fired = False

    def after(result: Any) -> Any:
        nonlocal fired
        if not fired:
            fired = True
            move()
        return result

    if step == "manifest":
        load = reader.load_manifest
        monkeypatch.setattr(reader, "load_manifest", lambda: after(load()))
    else:
        listing = recovery.log_files
        monkeypatch.setattr(recovery, "log_files",
                            lambda log_dir: after(listing(log_dir))
                            if log_dir == reader.log_dir else listing(log_dir))


@pytest.mark.parametrize("step", ["manifest", "listing"])
def test_a_seal_between_a_refreshs_two_steps_loses_no_offset(
    writer: LogStore, step: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    partition = writer.topic("t").partition(0)
    with LogStore.open(partition.directory.parent.parent.parent, read_only=True) as store:
        reader = store.topic("t").partition(0)
        assert offsets_of(reader) == list(range(10))
        partition.roll()  # 0..9 sealed; the reader still holds their (deleted) log file
        append(writer, 10, 10)  # into a log file the reader has not seen yet
        hooked(reader, step, seal_under_the_reader(writer), monkeypatch)
        reader.refresh()
        found = offsets_of(reader)
        assert found == list(range(len(found))) and len(found) >= 10
        reader.refresh()
        assert offsets_of(reader) == list(range(25))


@pytest.mark.parametrize("step", ["manifest", "listing"])
def test_a_seal_between_an_opens_two_steps_loses_no_offset(
    writer: LogStore, step: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As Spark's tail tasks open a partition: a fresh read-only Partition."""
    partition = writer.topic("t").partition(0)
    partition.roll()
    append(writer, 10, 10)
    config = partition.config
    reader = Partition(partition.directory, "t", 0, lambda: config, writable=False)
    hooked(reader, step, seal_under_the_reader(writer), monkeypatch)
    reader.open()
    try:
        found = offsets_of(reader)
        assert found == list(range(len(found))) and len(found) >= 10
        reader.refresh()
        assert offsets_of(reader) == list(range(25))
    finally:
        reader.close()


def test_a_reader_process_scanning_while_the_writer_rolls_merges_and_compacts(
    tmp_path: Path,
) -> None:
    """No error in a reader process scanning the compacted view again and again while
    this process appends, rolls (and seals), merges small segments and compacts."""
    seconds = 5.0
    with LogStore.open(tmp_path / "data") as store:
        store.create_topic("t", 4, CONFIG)
        compactor = LocalCompactionService(store, "t", {"engine": "arrow"})
        append(store, 0, 20)
        for step in range(60):
            # Many sealed segments: a manifest that takes a while to parse, as a busy
            # partition's does, so the reader's two steps are far enough apart for seals
            # to land between them.
            append(store, step % 50, 2)
            for partition in store.topic("t").partitions:
                partition.roll()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(TESTS_DIR), os.environ.get("PYTHONPATH", "")])}
        child = subprocess.Popen(
            [sys.executable, str(SUPPORT_DIR / "refresh_scanner.py"), str(tmp_path / "data"),
             "t", str(seconds)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        try:
            step = 0
            deadline = time.monotonic() + seconds + 1
            while child.poll() is None and time.monotonic() < deadline:
                step += 1
                # Short-lived log files: each one appended to, rolled and sealed (and
                # deleted) at once, so that seals keep landing while the reader looks.
                append(store, step * 7 % 50, 3)
                for partition in store.topic("t").partitions:
                    partition.roll()
                    if step % 10 == 0:
                        merge_small_segments(partition, 2, 1 << 15)
                if step % 25 == 0:
                    compactor.compact()
            out, err = child.communicate(timeout=60)
        finally:
            if child.poll() is None:
                child.kill()
    assert child.returncode == 0, err.decode()
    report = json.loads(out.decode().strip().splitlines()[-1])
    print(report["scans"], "scans", report["records"], "records", len(report["errors"]), "errors")
    assert report["scans"] >= 50, report
    assert report["errors"] == [], f"{len(report['errors'])} errors in {report['scans']} " \
                                   f"scans: {report['errors'][:3]}"
