"""A randomized fault loop: appends, seals, compactions, retention, config changes and
restarts, with faults chosen at random (slow suite).

Each action may carry a fault at a random fault point (compactlog/faults.py): ENOSPC or EIO
raised there, or a stall while another committer (a second store on the same data
directory, as a compaction process is) commits to the same manifests. Every CHECK_EVERY
actions (a fault's effects stay on disk, so a later check finds them), the store is
reopened and checked
against the oracle of what was acknowledged: every acknowledged record is there with
its bytes, exactly once; no append that reported failure is visible; each compacted
view equals the latest record per key of the raw records up to its horizon, then the
raw log; every file a manifest lists exists. The test prints the faults injected by
kind and the records checked, and needs at least MIN_FAULTS faults.

COMPACTLOG_FAULT_LOOP_SEED replays a run; COMPACTLOG_FAULT_LOOP_ACTIONS makes it longer.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import threading
from collections import Counter
from pathlib import Path

import pytest

from compactlog import faults
from compactlog.compaction import load_factory
from compactlog.errors import CompactlogError
from compactlog.storage.partition import Partition
from compactlog.storage.records import ProducerRecord, Record
from compactlog.storage.store import LogStore
from support.fakes import FakeClock
from support.faultkit import ERRORS, expected_view, read_all

ACTIONS = int(os.environ.get("COMPACTLOG_FAULT_LOOP_ACTIONS", "4000"))
MIN_FAULTS = 1000
CHECK_EVERY = 50
TOPICS = {
    "c": {"cleanup.policy": "compact", "min.compaction.lag.ms": "0", "segment.bytes": "2048",
          "file.delete.delay.ms": "30000", "retention.ms": "-1"},
    "d": {"segment.bytes": "1024", "retention.bytes": "6000", "retention.ms": "-1",
          "file.delete.delay.ms": "10000"},
}


class Loop:
    def __init__(self, data: Path, rng: random.Random) -> None:
        self.data = data
        self.rng = rng
        self.clock = FakeClock()
        self.store = LogStore.open(data, clock=self.clock)
        for name, config in TOPICS.items():
            self.store.create_topic(name, 2, config)
        # Acknowledged records per (topic, partition), by offset; and refused values.
        self.acked: dict[tuple[str, int], dict[int, Record]] = {
            (name, index): {} for name in TOPICS for index in range(2)}
        self.refused: set[bytes] = set()
        self.serial = 0
        self.faults: Counter[str] = Counter()
        self.records_checked = 0
        self.markers: set[str] = set()

    # -- actions ------------------------------------------------------------------------

    def append(self) -> None:
        name = self.rng.choice(list(TOPICS))
        index = self.rng.randrange(2)
        records = []
        for _ in range(self.rng.randint(1, 4)):
            self.serial += 1
            key = b"k%d" % self.rng.randrange(12)
            value = None if name == "c" and self.rng.random() < 0.1 else \
                b"v%06d-" % self.serial + bytes(self.rng.randrange(250))
            records.append(ProducerRecord(key, value))
        try:
            partition = self.store.topic(name).partition(index)
            result = partition.append(records)
        except (OSError, CompactlogError):
            self.refused.update(r.value for r in records if r.value is not None)
            return
        got = partition.read(result.base_offset, len(records))
        assert [(r.key, r.value) for r in got] == [(r.key, r.value) for r in records]
        for record in got:
            self.acked[(name, index)][record.offset] = record

    def roll(self) -> None:
        with contextlib.suppress(OSError, CompactlogError):
            self.pick().roll()

    def compact(self) -> None:
        partitions = self.rng.choice([[0], [1], [0, 1]])
        factory = load_factory("local_engine:LocalCompactionServiceFactory")
        with contextlib.suppress(OSError, CompactlogError):
            factory.new_service(self.store, "c", {"clock": self.clock}).compact(partitions)

    def retention(self) -> None:
        with contextlib.suppress(OSError, CompactlogError):
            self.store.topic("d").partition(self.rng.randrange(2)).apply_retention()

    def sweep(self) -> None:
        self.clock.advance_ms(self.rng.choice([1000, 20_000, 40_000]))
        with contextlib.suppress(OSError, CompactlogError):
            self.pick().sweep()

    def alter(self) -> None:
        with contextlib.suppress(OSError, CompactlogError):
            self.store.alter_topic("d", {"retention.bytes": str(self.rng.choice([4000, 6000,
                                                                                 9000]))})

    def restart(self) -> None:
        self.store.close()
        self.store = LogStore.open(self.data, clock=self.clock)
        # Topics open lazily; a fault while opening one fails that action only.
        for name in TOPICS:
            with contextlib.suppress(OSError, CompactlogError):
                self.store.topic(name)

    def pick(self) -> Partition:
        return self.store.topic(self.rng.choice(list(TOPICS))).partition(self.rng.randrange(2))

    ACTIONS = (("append", 10), ("roll", 3), ("compact", 2), ("retention", 2), ("sweep", 1),
               ("alter", 1), ("restart", 1))

    # -- faults -------------------------------------------------------------------------

    def run_action(self, action: str) -> bool:
        """Run `action`, maybe with a fault; True when a fault was injected."""
        kind = self.rng.choice(["enospc", "eio", "stall", None])
        # Early steps often (an append passes few points), late ones too (a compaction
        # of two partitions passes about 45).
        at = self.rng.randrange(6) if self.rng.random() < 0.5 else self.rng.randrange(45)
        fired: list[str] = []
        stalled: list[threading.Thread] = []

        def injector(point: str, path: str) -> None:
            nonlocal at
            if kind is None or fired:
                return
            if at > 0:
                at -= 1
                return
            fired.append(f"{kind} at {point} {path}")
            if kind == "stall":
                thread = threading.Thread(target=self.concurrent_commit)
                thread.start()
                thread.join(timeout=1.0)
                stalled.append(thread)
            else:
                raise OSError(ERRORS[kind], os.strerror(ERRORS[kind]), path)

        with faults.injected(injector):
            getattr(self, action)()
        for thread in stalled:
            thread.join(timeout=60)
        if fired:
            assert kind is not None
            self.faults[kind] += 1
        return bool(fired)

    def concurrent_commit(self) -> None:
        marker = f"m{len(self.markers)}"
        with contextlib.suppress(OSError, CompactlogError), \
                LogStore.open(self.data, read_only=True, clock=self.clock) as other:
            partition = other.topic("c").partition(self.rng.randrange(2))
            partition.commit_manifest(lambda m: m.__class__(
                log_start_offset=m.log_start_offset, segments=m.segments,
                compaction=m.compaction, retired=m.retired, extra={**m.extra, marker: 1}))
            self.markers.add(f"{partition.index}:{marker}")

    # -- the check ----------------------------------------------------------------------

    def check(self, where: str) -> None:
        self.restart()
        for (name, index), acked in self.acked.items():
            partition = self.store.topic(name).partition(index)
            what = f"{where}: {name}/{index}"
            start = partition.log_start_offset
            raw = read_all(partition)
            offsets = [r.offset for r in raw]
            assert offsets == sorted(set(offsets)), f"{what}: offsets repeat or go back"
            by_offset = {r.offset: r for r in raw}
            for offset, record in acked.items():
                if offset >= start:
                    assert by_offset.get(offset) == record, f"{what}: acked {offset} lost"
                    self.records_checked += 1
            assert not {r.value for r in raw} & self.refused, f"{what}: refused is visible"
            values = [r.value for r in raw if r.value is not None]
            assert len(values) == len(set(values)), f"{what}: a record is stored twice"
            horizon = partition.manifest.horizon
            everything = {**{o: r for o, r in acked.items() if o < start}, **by_offset}
            if horizon is None:
                everything = by_offset
            assert read_all(partition, compacted=True) == expected_view(everything, horizon), \
                f"{what}: compacted view"
            for relative in partition.manifest.live_files():
                assert (partition.directory / relative).exists(), f"{what}: {relative} missing"
        for entry in self.markers:
            index, marker = entry.split(":")
            assert self.store.topic("c").partition(int(index)).manifest.extra.get(marker), \
                f"{where}: a concurrent commit that succeeded was lost"


@pytest.mark.slow
def test_random_faults_lose_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    seed = int(os.environ.get("COMPACTLOG_FAULT_LOOP_SEED", random.randrange(2**32)))
    rng = random.Random(seed)
    loop = Loop(tmp_path / "data", rng)
    names, weights = zip(*Loop.ACTIONS, strict=True)
    try:
        for step in range(ACTIONS):
            action = rng.choices(names, weights)[0]
            loop.run_action(action)
            if step % CHECK_EVERY == CHECK_EVERY - 1:
                loop.check(f"seed {seed}, action {step} ({action})")
        loop.check(f"seed {seed}, at the end")
    finally:
        loop.store.close()
    with capsys.disabled():
        print(f"\nfault loop (seed {seed}): {ACTIONS} actions, faults injected "
              f"{dict(sorted(loop.faults.items()))} ({sum(loop.faults.values())} in all), "
              f"{loop.records_checked} acknowledged records checked, "
              f"{len(loop.refused)} refused appends never seen")
    assert sum(loop.faults.values()) >= MIN_FAULTS, f"seed {seed}: too few faults fired"
    shutil.rmtree(tmp_path / "data", ignore_errors=True)
