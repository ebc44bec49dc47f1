"""Deterministic fault injection for the store's commit protocols.

Every disk step of the store passes a named fault point (compactlog/faults.py). A scenario
is an operation on a prepared data directory (a seal, an append, a compaction of one or
two partitions, retention, a config change) and an oracle of what was acknowledged. The
tests first record the points the operation passes, then run it again on a fresh copy
once per step and fault kind:

- `enospc` / `eio`: the step raises OSError (a failed write, fsync, rename or unlink);
- `stall`: the step waits while another committer (a second process's view of the same
  partition, as a compaction process has) commits to the same manifest;
- `kill`: the process is killed with SIGKILL at the step (in a child process,
  tests/support/fault_child.py).

Afterwards the store is reopened and the contract is checked against the oracle: every
acknowledged record is there as it was written, nothing refused is visible, the
compacted view is the old (horizon, ledger) pair or the new one and matches the records
it covers, every listed file exists, nothing is left that no manifest reaches, and the
store goes on working (append, seal, compact).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from compactlog import faults
from compactlog.compaction import load_factory
from compactlog.errors import CompactlogError
from compactlog.fsutil import TEMP_PREFIX
from compactlog.storage.partition import Partition
from compactlog.storage.records import ProducerRecord, Record
from compactlog.storage.store import LogStore
from support.fakes import FakeClock

TOPIC = "t"
ERRORS = {"enospc": errno.ENOSPC, "eio": errno.EIO}
DELAY_MS = 60_000


@dataclass(frozen=True)
class Step:
    index: int
    point: str
    path: str

    def describe(self) -> str:
        return f"step {self.index} ({self.point} {Path(self.path).parent.name}/" \
               f"{Path(self.path).name})"


# -- the oracle ----------------------------------------------------------------------

@dataclass
class Oracle:
    """What was acknowledged: each partition's records by offset, and the horizons the
    compacted view may be at (before and after the operation)."""

    records: list[dict[int, Record]]
    horizons: list[set[int | None]] = field(default_factory=list)
    # Values of appends that reported failure: never visible (values are unique).
    refused_values: set[bytes] = field(default_factory=set)
    # Retention may have moved the log start to any of these.
    log_starts: list[set[int]] = field(default_factory=list)
    markers: set[str] = field(default_factory=set)  # stall committers that succeeded

    @classmethod
    def of(cls, store: LogStore) -> Oracle:
        partitions = store.topic(TOPIC).partitions
        oracle = cls([{r.offset: r for r in read_all(p)} for p in partitions])
        oracle.horizons = [{p.manifest.horizon} for p in partitions]
        oracle.log_starts = [{p.log_start_offset} for p in partitions]
        return oracle

    def acknowledge(self, partition: int, record: Record) -> None:
        self.records[partition][record.offset] = record


def read_all(partition: Partition, compacted: bool = False) -> list[Record]:
    records: list[Record] = []
    offset = 0
    read = partition.read_compacted if compacted else partition.read
    while batch := read(offset, 10_000):
        records += batch
        offset = batch[-1].offset + 1
    return records


def expected_view(records: dict[int, Record], horizon: int | None) -> list[Record]:
    """The compacted view of `records` at `horizon` (latest wins; tombstones are kept,
    as delete.retention.ms has not passed in these scenarios)."""
    if horizon is None:
        return [records[o] for o in sorted(records)]
    latest: dict[bytes | None, Record] = {}
    for offset in sorted(records):
        if offset <= horizon:
            latest[records[offset].key] = records[offset]
    kept = sorted(latest.values(), key=lambda r: r.offset)
    return kept + [records[o] for o in sorted(records) if o > horizon]


# -- checking the contract -------------------------------------------------------------

def check_contract(data: Path, oracle: Oracle, clock: FakeClock, where: str) -> None:
    with LogStore.open(data, clock=clock) as store:
        check_store(store, oracle, where)


FileCheck = Callable[[Partition, str], None]


def check_store(store: LogStore, oracle: Oracle, where: str,
                files: FileCheck | None = None) -> None:
    """The contract on a reopened store (local or on S3: `files` checks what the
    manifests list is there, check_files by default)."""
    files = files if files is not None else check_files
    for index, partition in enumerate(store.topic(TOPIC).partitions):
        what = f"{where}, partition {index}"
        start = partition.log_start_offset
        assert start in oracle.log_starts[index], f"{what}: log start {start}"
        raw = {r.offset: r for r in read_all(partition)}
        wanted = {o: r for o, r in oracle.records[index].items() if o >= start}
        for offset, record in wanted.items():
            assert raw.get(offset) == record, f"{what}: acknowledged offset {offset} " \
                                              f"reads {raw.get(offset)}"
        assert not {r.value for r in raw.values()} & oracle.refused_values, \
            f"{what}: an append that reported failure is visible"
        extra = set(raw) - set(wanted)
        # Records that an operation wrote but did not acknowledge (a kill after the
        # write) may be there; they must then be whole and in offset order.
        assert all(o > max(wanted, default=-1) for o in extra), f"{what}: {extra}"
        horizon = partition.manifest.horizon
        assert horizon in oracle.horizons[index], \
            f"{what}: horizon {horizon}, expected one of {oracle.horizons[index]}"
        view = read_all(partition, compacted=True)
        # Below the log start the ledger still holds what retention removed from
        # the raw log; without a ledger the view is the raw log from its start.
        everything = raw if horizon is None else {
            **raw, **{o: r for o, r in oracle.records[index].items() if o < start}}
        assert view == expected_view(everything, horizon), f"{what}: compacted view"
        files(partition, what)
        for marker in oracle.markers:
            assert partition.manifest.extra.get(marker), f"{what}: lost commit {marker}"


def check_files(partition: Partition, what: str) -> None:
    directory = partition.directory
    temps = [p for p in directory.rglob(f"{TEMP_PREFIX}*")]
    assert not temps, f"{what}: temporary files left after reopening: {temps}"
    manifest = partition.manifest
    for relative in manifest.live_files():
        assert (directory / relative).exists(), f"{what}: listed file {relative} is missing"
    reachable = manifest.live_files() | {item.path for item in manifest.retired}
    on_disk = {f"{sub}/{p.name}" for sub in ("segments", "ledger")
               if (directory / sub).is_dir() for p in (directory / sub).glob("*.parquet")}
    stray = on_disk - reachable
    # Ledger orphans of a failed run go at the next run's sweep; segment orphans at open.
    assert all(path.startswith("ledger/") for path in stray), f"{what}: stray {stray}"


def check_goes_on(data: Path, clock: FakeClock, where: str) -> None:
    with LogStore.open(data, clock=clock) as store:
        check_store_goes_on(store, clock, where)


def check_store_goes_on(store: LogStore, clock: FakeClock, where: str,
                        files: FileCheck | None = None, engine: str | None = None) -> None:
    """The store keeps working: append, seal, compact, and every view stays whole
    (`files` and `engine` as for check_store; the engine by default "arrow" with
    deletion vectors, else "local")."""
    before = [read_all(p) for p in store.topic(TOPIC).partitions]
    store.append(TOPIC, [ProducerRecord(b"after-%d" % i, b"v") for i in range(8)])
    for partition in store.topic(TOPIC).partitions:
        partition.roll()
    config = store.topic(TOPIC).config
    if config.compacted:
        compact(store, clock, engine=engine or (
            "arrow" if config["compaction.deletion.vectors"] else "local"))
    for index, partition in enumerate(store.topic(TOPIC).partitions):
        raw = read_all(partition)
        assert raw[: len(before[index])] == before[index], f"{where}: after going on"
        horizon = partition.manifest.horizon
        start = partition.log_start_offset
        view = read_all(partition, compacted=True)
        assert [r for r in view if r.offset >= start] == [
            r for r in expected_view({r.offset: r for r in raw}, horizon)
            if r.offset >= start], f"{where}: compacted view after going on"
    clock.advance_ms(DELAY_MS)
    for partition in store.topic(TOPIC).partitions:
        partition.sweep()
        if files is not None:
            files(partition, f"{where}, after going on")
            continue
        check_files(partition, f"{where}, after going on")
        on_disk = {p.name for p in partition.ledger_dir.glob("*.parquet")} \
            if partition.ledger_dir.is_dir() else set()
        listed = {Path(path).name for path in partition.manifest.live_files()}
        assert on_disk <= listed | {
            Path(item.path).name for item in partition.manifest.retired}


def compact(store: LogStore, clock: FakeClock, partitions: list[int] | None = None,
            engine: str = "local") -> Any:
    factory = load_factory("local_engine:LocalCompactionServiceFactory")
    return factory.new_service(store, TOPIC, {"clock": clock, "engine": engine}).compact(
        partitions)


# -- running an operation with a fault ----------------------------------------------------

Operation = Callable[[LogStore, Oracle, FakeClock], None]


def record_steps(data: Path, operation: Operation, clock: FakeClock) -> list[Step]:
    steps: list[Step] = []

    def recorder(point: str, path: str) -> None:
        steps.append(Step(len(steps), point, path))

    with LogStore.open(data, clock=clock) as store:
        oracle = Oracle.of(store)
        with faults.injected(recorder):
            operation(store, oracle, clock)
    return steps


@contextlib.contextmanager
def fault_at(index: int, kind: str, on_stall: Callable[[], None] | None = None,
             counts: dict[str, int] | None = None) -> Iterator[list[Step]]:
    """Fail (or stall) the `index`th fault point passed inside the block."""
    seen: list[Step] = []
    hit: list[Step] = []

    def injector(point: str, path: str) -> None:
        position = len(seen)
        seen.append(Step(position, point, path))
        if position != index:
            return
        hit.append(seen[-1])
        if counts is not None:
            counts[kind] = counts.get(kind, 0) + 1
        if kind == "stall":
            assert on_stall is not None
            on_stall()
        else:
            raise OSError(ERRORS[kind], os.strerror(ERRORS[kind]), path)

    with faults.injected(injector):
        yield hit


def stall_with_a_concurrent_commit(data: Path, clock: FakeClock,
                                   oracle: Oracle) -> Callable[[], None]:
    """A committer in the role of a compaction process: a read-only view of the same
    partitions commits a marker to each manifest from another thread, while the stalled
    step waits up to STALL_S for it (it may have to wait for the commit lock the step
    holds: then it lands after the step, which is an interleaving worth checking too;
    unblocked, it takes well under STALL_S)."""
    marker = f"stall-{len(oracle.markers)}"

    def commit_marker() -> None:
        with LogStore.open(data, read_only=True, clock=clock) as other:
            for partition in other.topic(TOPIC).partitions:
                partition.commit_manifest(lambda m: m.__class__(
                    log_start_offset=m.log_start_offset, segments=m.segments,
                    compaction=m.compaction, retired=m.retired,
                    extra={**m.extra, marker: True}))
        oracle.markers.add(marker)

    def stall() -> None:
        thread = threading.Thread(target=_quietly(commit_marker))
        thread.start()
        thread.join(timeout=STALL_S)
        STALLED.append(thread)

    return stall


STALLED: list[threading.Thread] = []
STALL_S = 0.4


def _quietly(call: Callable[[], None]) -> Callable[[], None]:
    def run() -> None:
        with contextlib.suppress(CompactlogError, OSError):
            call()
    return run


def join_stalled() -> None:
    while STALLED:
        STALLED.pop().join(timeout=60)


def fresh_copy(template: Path, target: Path) -> Path:
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(template, target)
    return target
