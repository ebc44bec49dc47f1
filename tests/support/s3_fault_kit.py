"""The fault scenarios of tests/support/fault_scenarios.py on a store on S3, for
tests/faults/test_fault_steps_s3.py (in process) and tests/support/s3_fault_child.py (a
child process that the test kills): where a store lives (a Place: its s3:// URL and its local
directory), copying a prepared one to a fresh prefix, and checking the contract on a
reopened one (faultkit.check_store, with the manifests' files looked up in the bucket).
"""

from __future__ import annotations

import contextlib
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compactlog.backend.s3.volume import ObjectVolume, task_cache_dir
from compactlog.compaction import verified
from compactlog.errors import CompactlogError
from compactlog.fsutil import TEMP_PREFIX
from compactlog.iceberg import avro, deletes
from compactlog.storage.partition import Partition
from compactlog.storage.records import ProducerRecord
from compactlog.storage.store import LogStore
from support.fakes import FakeClock
from support.fault_scenarios import (
    SCENARIOS,
    Report,
    Scenario,
    appended_record,
    dv_compaction,
    expect_compaction,
    prepare_dv_compaction,
)
from support.faultkit import TOPIC, Oracle, check_store, check_store_goes_on, compact

# Past the writer lease's default ttl (lease.py): a reopen after a writer that died or
# could not release its lease (its store was failing) takes the lease over.
LEASE_EXPIRED_MS = 61_000


@dataclass(frozen=True)
class Place:
    """A store on S3: its s3:// URL and the local directory of its log segments."""

    url: str
    local: Path

    def open(self, clock: FakeClock, scenario: Scenario | None = None,
             read_only: bool = False) -> LogStore:
        store = LogStore.open(self.url, read_only=read_only, clock=clock,
                              local_dir=self.local)
        if scenario is not None:
            store.auto_seal = not scenario.server_mode
        return store

    @property
    def bucket(self) -> str:
        return self.url.removeprefix("s3://").partition("/")[0]

    @property
    def prefix(self) -> str:
        return self.url.removeprefix("s3://").partition("/")[2]


def new_place(bucket: str, root: Path, name: str) -> Place:
    tag = f"{name}-{uuid.uuid4().hex[:10]}"
    return Place(f"s3://{bucket}/steps/{tag}", root / tag)


# One per test process: processes running side by side replay at homes of their own.
_PROCESS_TAG = uuid.uuid4().hex[:8]


def home_place(bucket: str, root: Path, name: str) -> Place:
    """Where scenario `name` is prepared and every replay runs: its template is put back
    there each time (`restore`), so the Iceberg table, whose metadata names absolute
    s3:// URLs, is found where it was written and the sync after a compaction builds
    on the previous snapshot (the incremental sync), as in a store never moved
    (iceberg/relocate.py). A copy under another prefix would start the table afresh."""
    return Place(f"s3://{bucket}/steps/at-{name}-{_PROCESS_TAG}", root / f"at-{name}")


def restore(client: Any, template: Place, home: Place) -> Place:
    """`home` made a fresh copy of `template` again: every object under its prefix
    deleted, its local directories (and a taken-over writer's, `-elsewhere`) removed,
    then `template` copied in. What this process keeps of files by their URL (Iceberg
    manifests read, ledger columns, positions) is forgotten too: a run must send the
    requests the recorded run sent, which it would not if it found them kept from the
    last run at the same URLs (each run at a new prefix never met this); so are the
    copies in this process's task read cache (an in-process compaction's downloads)."""
    shutil.rmtree(task_cache_dir(), ignore_errors=True)
    avro.forget_entries()
    deletes.forget_cache()
    verified.forget_all()
    paginator = client.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=home.bucket, Prefix=home.prefix + "/"):
        keys = [{"Key": item["Key"]} for item in page.get("Contents", [])]
        if keys:
            answer = client.delete_objects(Bucket=home.bucket, Delete={"Objects": keys})
            assert not answer.get("Errors"), answer["Errors"]
    for local in (home.local, home.local.with_name(home.local.name + "-elsewhere")):
        shutil.rmtree(local, ignore_errors=True)
    return copy_place(client, template, home)


def copy_place(client: Any, template: Place, target: Place,
               local: bool = True) -> Place:
    """A copy of `template` under `target`: every object copied server side, and its
    local directory (unless `local` is false: another machine, with an empty one)."""
    paginator = client.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=template.bucket, Prefix=template.prefix + "/"):
        for item in page.get("Contents", []):
            key = target.prefix + item["Key"][len(template.prefix):]
            client.copy_object(Bucket=target.bucket, Key=key,
                               CopySource={"Bucket": template.bucket, "Key": item["Key"]})
    if local:
        shutil.copytree(template.local, target.local,
                        ignore=shutil.ignore_patterns(".writer.lock", "cache"))
    else:
        target.local.mkdir(parents=True)
    return target


def object_names(partition: Partition) -> set[str]:
    """The data objects under a partition's prefix, as names relative to it."""
    volume = partition.volume
    assert isinstance(volume, ObjectVolume)
    found = set()
    for folder in ("segments", "ledger"):
        found |= {f"{folder}/{item.name}" for item in volume.listing(folder)}
    return found


def check_objects(partition: Partition, what: str) -> None:
    """No temporary file left in the local directory, and every data file that the
    manifest lists is an object in the bucket. Unlisted objects may stay: an orphan of
    a failed seal or compaction goes at a sweep once it is old enough (sweep.py)."""
    temps = list(partition.directory.rglob(f"{TEMP_PREFIX}*"))
    assert not temps, f"{what}: temporary files left after reopening: {temps}"
    missing = partition.manifest.live_files() - object_names(partition)
    assert not missing, f"{what}: listed objects missing from the bucket: {missing}"


def check_place(place: Place, scenario: Scenario, oracle: Oracle, clock: FakeClock,
                where: str, engine: str) -> None:
    """Reopen as the writer (after the lease of a writer that could not release it
    expired) and check the contract, then that the store goes on."""
    clock.advance_ms(LEASE_EXPIRED_MS)
    with place.open(clock, scenario) as store:
        if scenario.server_mode:
            # The server seals what the last writer left in its local log: rolled
            # segments in its upkeep, the active one once segment.ms or segment.bytes
            # rolls it. Until then its acknowledged (acks=1) records wait there, above the
            # durable high watermark that reads stop at (Partition.high_watermark).
            for partition in store.topic(TOPIC).partitions:
                partition.roll()
                partition.seal_rolled()
        check_store(store, oracle, where, check_objects)
        scenario.verify(store, where)
        check_store_goes_on(store, clock, where, check_objects, engine)


# -- the scenarios on S3 ----------------------------------------------------------------

def prepare_append_then_seal(store: LogStore, clock: FakeClock) -> None:
    store.create_topic(TOPIC, 1, {"segment.bytes": "1024"})


def append_then_seal(store: LogStore, oracle: Oracle, clock: FakeClock,
                     report: Report) -> None:
    """The server's way: appends acknowledged from the local log, then its upkeep seals
    the rolled segments into the bucket (a writer that closes seals all of them, so the
    rolled segments are made here, not in the prepared store)."""
    partition = store.topic(TOPIC).partition(0)
    for i in range(6):
        result = partition.append([ProducerRecord(b"k%d" % i, b"v%d" % i + b"." * 300)])
        report(0, appended_record(partition, result.base_offset))
    with contextlib.suppress(OSError, CompactlogError):
        partition.seal_rolled()


def arrow_compaction(store: LogStore, oracle: Oracle, clock: FakeClock,
                     report: Report) -> None:
    with contextlib.suppress(OSError, CompactlogError):
        compact(store, clock, engine="arrow")


def prepare_arrow_compaction(partitions: int) -> Any:
    """As fault_scenarios.prepare_compaction, the first run with the Arrow tasks."""
    def prepare(store: LogStore, clock: FakeClock) -> None:
        from support.fault_scenarios import COMPACTED, fill

        store.create_topic(TOPIC, partitions, COMPACTED)
        fill(store, 3, 12, "a")
        compact(store, clock, engine="arrow")
        fill(store, 2, 12, "b")
        store.append(TOPIC, [ProducerRecord(b"k%02d" % k, None) for k in (3, 7)])
        for partition in store.topic(TOPIC).partitions:
            partition.roll()
    return prepare


# name: (scenario, the compaction engine that goes on after it)
S3_SCENARIOS: dict[str, tuple[Scenario, str]] = {
    "append": (SCENARIOS["append"], "arrow"),
    "append-seal": (Scenario("append-seal", prepare_append_then_seal, append_then_seal,
                             server_mode=True), "arrow"),
    # Compactions with the Arrow tasks, which fetch their inputs and publish their
    # files themselves (compaction/remote_files.py), as the Spark service's executors do.
    "compact-1": (Scenario("compact-1", prepare_arrow_compaction(1), arrow_compaction,
                           expect_compaction), "arrow"),
    "compact-2": (Scenario("compact-2", prepare_arrow_compaction(2), arrow_compaction,
                           expect_compaction), "arrow"),
    "compact-dv-1": (Scenario("compact-dv-1", prepare_dv_compaction(1), dv_compaction,
                              expect_compaction), "arrow"),
    # Two small ledger files rewritten with the run's new survivors.
    "compact-merge": (SCENARIOS["compact-merge"], "arrow"),
    "retention": (SCENARIOS["retention"], "arrow"),
    "alter": (SCENARIOS["alter"], "arrow"),
    # Two merges of small sealed segments, one on each side of a compaction horizon.
    "merge": (SCENARIOS["merge"], "arrow"),
}
