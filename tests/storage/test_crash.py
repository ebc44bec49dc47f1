"""Crash test: a writer process is SIGKILLed at random points during append and seal.

The writer (tests/support/crash_writer.py) appends records whose content is a function of their
(partition, offset) and acknowledges each append on stdout once it has returned. The
segments are tiny, so the active segment rolls and is sealed into Parquet every few
appends and many kills land in the middle of sealing. After each kill this test

- looks at the files the kill left, to tell where it landed (mid-seal: at which step of
  the sealing protocol in partition.py) and to predict what recovery must remove;
- opens the store read-only, as a reader would while the writer is down, and checks it;
- opens it writable, which recovers, and checks: every acknowledged record is there, at
  its offset, in order, with its content; every offset from 0 to the log end holds a
  whole, correct record (no half-written record appears); nothing seen before is lost;
  no temporary or unlisted files remain; the recovery report lists exactly what the
  kill left behind, and no corruption;

then the next writer continues on the same directory, so state accumulates across kills.
One kill in five is checked read-only only, leaving recovery to the next writer (which
may itself be killed during start-up and recovery). Every fifth check, and the last,
reads every record; the others read from the first sealed segment not yet verified
(sealed files are immutable, and every check sees that they are all still there, whole).

Kills are timed at random; the seed is printed, and COMPACTLOG_CRASH_SEED=<seed>
replays the same schedule (timing still varies, so a replay is likely, not certain, to
kill at the same points). COMPACTLOG_CRASH_ITERATIONS overrides the iteration count.
Run with `pytest -s` to see where the kills landed.
"""

from __future__ import annotations

import functools
import itertools
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from compactlog.backend.local.document import LocalDocument
from compactlog.backend.local.layout import CREATING, DELETING
from compactlog.fsutil import TEMP_PREFIX
from compactlog.storage.logfile import base_offset_of
from compactlog.storage.manifest import PartitionManifest
from compactlog.storage.partition import Partition
from compactlog.storage.records import Record
from compactlog.storage.store import LogStore
from support.crash_writer import KILL_POINTS, PARTITIONS, TOPIC, expected_record
from support.paths import SUPPORT_DIR

WRITER = SUPPORT_DIR / "crash_writer.py"
READY_TIMEOUT = 60.0
READ_CHUNK = 2000
FULL_CHECK_EVERY = 5  # other checks re-read only what was not verified before


# -- the writer process ---------------------------------------------------------------


@dataclass
class WriterRun:
    """One writer process, from start to SIGKILL, and what it printed."""

    ready: bool = False
    acks: list[tuple[int, int, int]] = field(default_factory=list)
    stderr: str = ""
    exit_code: int | None = None
    alive_at_kill: bool = False
    ready_seconds: float | None = None  # from start to READY


def run_writer_until_killed(
    data_dir: Path,
    writer_seed: int,
    segment_bytes: int,
    warm: bool,
    after_ready: bool,
    delay: float,
    kill_point: str | None = None,
) -> WriterRun:
    """Start a writer; SIGKILL it `delay` seconds after READY (or after start).

    With a kill point the writer kills itself there; this waits for it to do so.
    """
    run = WriterRun()
    ready = threading.Event()
    stdout_lines: list[str] = []
    stderr_parts: list[str] = []
    started = time.monotonic()
    proc = subprocess.Popen(
        [
            sys.executable, str(WRITER), str(data_dir), str(writer_seed), str(segment_bytes),
            "warm" if warm else "cold",
            *([kill_point] if kill_point else []),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    stdout, stderr = proc.stdout, proc.stderr

    def drain_stdout() -> None:
        for line in stdout:
            stdout_lines.append(line)
            if line == "READY\n":
                run.ready_seconds = time.monotonic() - started
                ready.set()
        ready.set()  # EOF: the writer died; stop waiting for READY

    def drain_stderr() -> None:
        stderr_parts.append(stderr.read())

    threads = [threading.Thread(target=drain_stdout), threading.Thread(target=drain_stderr)]
    for thread in threads:
        thread.start()
    try:
        if after_ready:
            ready.wait(READY_TIMEOUT)
        if kill_point:
            proc.wait(READY_TIMEOUT)
        else:
            time.sleep(delay)
            run.alive_at_kill = proc.poll() is None
            if run.alive_at_kill:
                os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for thread in threads:
            thread.join()
        stdout.close()
        stderr.close()
    run.exit_code = proc.returncode
    run.stderr = "".join(stderr_parts)
    for line in stdout_lines:
        if line == "READY\n":
            run.ready = True
        elif line.startswith("ACK ") and line.endswith("\n"):
            _, partition, base, last = line.split()
            run.acks.append((int(partition), int(base), int(last)))
        else:
            # Only whole lines are written (one write each, below PIPE_BUF), so anything
            # else is the writer misbehaving.
            raise AssertionError(f"unexpected writer output {line!r}; stderr:\n{run.stderr}")
    return run


# -- what a kill left behind ----------------------------------------------------------


@dataclass
class Leftovers:
    """Files a kill left in one partition, read straight from disk before recovery."""

    temp_files: set[Path]
    unlisted_parquet: set[Path]
    sealed_logs: set[Path]  # log files wholly covered by the committed manifest
    log_files: list[Path]  # every log file, by base offset

    @property
    def expected_removals(self) -> set[Path]:
        return self.temp_files | self.unlisted_parquet | self.sealed_logs


def inspect_partition(directory: Path) -> Leftovers:
    temp_files = {
        path
        for sub in ("log", "segments", "manifest")
        if (directory / sub).is_dir()
        for path in (directory / sub).iterdir()
        if path.name.startswith(TEMP_PREFIX)
    }
    loaded = LocalDocument(directory / "manifest").load()
    assert loaded is not None, f"{directory}: no manifest"
    manifest = PartitionManifest.from_json(loaded.body, directory / "manifest")
    listed = {segment.file for segment in manifest.segments}
    unlisted = {p for p in (directory / "segments").glob("*.parquet") if p.name not in listed}
    logs = sorted(
        ((base, p) for p in (directory / "log").glob("*.log")
         if (base := base_offset_of(p)) is not None),
    )
    sealed_end = manifest.sealed_end_offset
    sealed_logs = {
        path for (_, path), (next_base, _) in itertools.pairwise(logs)
        if next_base <= sealed_end
    }
    return Leftovers(temp_files, unlisted, sealed_logs, [p for _, p in logs])


def classify(leftovers: Leftovers) -> list[str]:
    """Where in the sealing protocol (partition.py) a kill landed, by what it left."""
    found = []
    if any(p.parent.name == "segments" for p in leftovers.temp_files):
        found.append("seal step 1: Parquet temp file being written")
    if leftovers.unlisted_parquet:
        found.append("seal step 2-3: Parquet published, manifest not committed")
    if any(p.parent.name == "manifest" for p in leftovers.temp_files):
        found.append("seal step 3: manifest commit in progress")
    if leftovers.sealed_logs:
        found.append("seal step 3-4: manifest committed, log file not deleted")
    if len(leftovers.log_files) - len(leftovers.sealed_logs) > 1:
        found.append("rolled log segment waiting to be sealed")
    return found


# -- checking the store ---------------------------------------------------------------


@functools.cache
def expected(partition: int, offset: int) -> Record:
    record = expected_record(partition, offset)
    assert record.timestamp is not None
    return Record(offset, record.timestamp, record.key, record.value, record.headers)


def normalized(record: Record) -> Record:
    headers = tuple((str(key), value) for key, value in record.headers)
    return Record(record.offset, record.timestamp, record.key, record.value, headers)


def verified_prefix_end(manifest: PartitionManifest, verified: set[str]) -> int:
    """One past the last offset of the leading sealed segments already read and checked."""
    end = manifest.log_start_offset
    for info in manifest.segments:
        if info.file not in verified:
            break
        end = info.last_offset + 1
    return end


def check_partition_records(
    partition: Partition, must_reach: int, where: str, start: int = 0
) -> int:
    """Check offsets start..log_end-1 are there, in order, whole and correct; return log end.

    `must_reach`: one past the highest offset that must be present (acknowledged or
    seen by an earlier check).
    """
    end = partition.log_end_offset
    assert partition.log_start_offset == 0, where
    assert end >= must_reach, (
        f"{where}: log end {end}, but offsets up to {must_reach - 1} were acknowledged "
        "or seen before"
    )
    offset = start
    while offset < end:
        records = partition.read(offset, READ_CHUNK, 1 << 24)
        assert records, f"{where}: read at {offset} returned nothing, log end is {end}"
        for record in records:
            assert record.offset == offset, (
                f"{where}: expected offset {offset}, read offset {record.offset}"
            )
            assert normalized(record) == expected(partition.index, offset), (
                f"{where}: record at offset {offset} is wrong: {record!r}"
            )
            offset += 1
    assert offset == end, f"{where}: read up to {offset}, past log end {end}"
    assert partition.read(end, READ_CHUNK, 1 << 24) == [], f"{where}: records past log end"
    return end


def check_columnar(partition: Partition, end: int, where: str, start: int = 0) -> None:
    """The columnar read path serves the same offsets and values."""
    offset = start
    while offset < end:
        table = partition.read_table(offset, 50_000, 1 << 26)
        assert table.num_rows, f"{where}: read_table at {offset} returned nothing"
        offsets = table.column("offset").to_pylist()
        assert offsets == list(range(offset, offset + len(offsets))), where
        values = table.column("value").to_pylist()
        for at, value in zip(offsets, values, strict=True):
            assert value == expected(partition.index, at).value, (
                f"{where}: read_table value at offset {at} is wrong: {value!r}"
            )
        offset += len(offsets)


def check_files(partition: Partition, where: str) -> None:
    """After recovery: nothing temporary or unlisted; one active log file after the seals."""
    manifest = partition.manifest
    next_base = manifest.log_start_offset
    for info in manifest.segments:
        assert info.base_offset == next_base, f"{where}: sealed segments not contiguous"
        assert info.record_count == info.last_offset - info.base_offset + 1, where
        path = partition.segment_dir / info.file
        assert path.is_file(), f"{where}: {info.file} missing"
        assert path.stat().st_size == info.size_bytes, f"{where}: {info.file} changed size"
        next_base = info.last_offset + 1
    on_disk = {p.name for p in partition.segment_dir.iterdir()}
    assert on_disk == {info.file for info in manifest.segments}, (
        f"{where}: segments/ holds {sorted(on_disk)}, the manifest lists "
        f"{[info.file for info in manifest.segments]}"
    )
    log_files = sorted(p.name for p in partition.log_dir.iterdir())
    assert len(log_files) == 1, f"{where}: log files left after recovery: {log_files}"
    assert base_offset_of(partition.log_dir / log_files[0]) == manifest.sealed_end_offset, (
        f"{where}: active log {log_files[0]} does not start at the sealed end "
        f"{manifest.sealed_end_offset}"
    )
    assert len(partition.logs) == 1, f"{where}: rolled segments left unsealed after open"
    manifest_temps = [
        p.name for p in partition.document.directory.iterdir()
        if p.name.startswith(TEMP_PREFIX)
    ]
    assert not manifest_temps, f"{where}: temp files left in manifest/: {manifest_temps}"


def temp_files_under(root: Path) -> list[Path]:
    return list(root.rglob(f"{TEMP_PREFIX}*"))


@dataclass
class CrashLoopState:
    ends: list[int] = field(default_factory=lambda: [0] * PARTITIONS)
    topic_exists: bool = False
    kills: Counter[str] = field(default_factory=Counter)
    landed: Counter[str] = field(default_factory=Counter)
    removed: Counter[str] = field(default_factory=Counter)
    torn_tails: int = 0
    acks: int = 0
    ready_seconds: float = 0.6  # how long the last writer took to become ready
    # Per partition, the sealed segment files whose records a check has read and found
    # correct: sealed files never change (check_files sees that they stay, whole), so
    # most checks read only from the first unverified segment on.
    verified: list[set[str]] = field(default_factory=lambda: [set() for _ in range(PARTITIONS)])
    writer_seconds: float = 0.0  # spent running writers, and checking after them
    check_seconds: float = 0.0


def check_acks(run: WriterRun, state: CrashLoopState, where: str) -> list[int]:
    """Check the acks are contiguous from the last known log ends; return acked ends."""
    acked_end = list(state.ends)
    for partition, base, last in run.acks:
        # The writer's first append continues exactly where the store was last found to
        # end, and each later one where the previous ended.
        assert base == acked_end[partition] and last >= base, (
            f"{where}: ack {partition} {base} {last}, but partition {partition} "
            f"ended at {acked_end[partition]}"
        )
        acked_end[partition] = last + 1
    state.acks += len(run.acks)
    return acked_end


def check_after_kill(
    data_dir: Path,
    run: WriterRun,
    state: CrashLoopState,
    recover: bool,
    full: bool,
    where: str,
) -> list[str]:
    """Check the store as the kill left it; with `recover`, also recover it and check.

    With `full`, every record is read; otherwise from the first unverified segment on.
    Returns what the kill left behind (see `classify`).
    """
    acked_end = check_acks(run, state, where)
    topic_dir = data_dir / "topics" / TOPIC
    if not topic_dir.is_dir():
        assert not run.acks and not state.topic_exists, f"{where}: topic directory vanished"
        state.kills["before the topic was created"] += 1
        with LogStore.open(data_dir) as store:
            assert store.list_topics() == [], where
        assert not any(
            e.name.startswith((CREATING, DELETING)) for e in (data_dir / "staging").iterdir()
        ), f"{where}: an interrupted topic creation was not cleaned up"
        return []
    state.topic_exists = True

    leftovers = [inspect_partition(topic_dir / str(i)) for i in range(PARTITIONS)]
    landed = sorted({what for found in leftovers for what in classify(found)})
    if not run.ready:
        state.kills["before READY (start-up, recovery, topic creation)"] += 1
    else:
        state.kills["mid-seal" if landed else "between seals (append path)"] += 1
        for what in landed:
            state.landed[what] += 1

    # A reader opening the directory while the writer is down sees whole records only.
    with LogStore.open(data_dir, read_only=True) as reader:
        for partition in reader.topic(TOPIC).partitions:
            index = partition.index
            start = 0 if full else verified_prefix_end(partition.manifest, state.verified[index])
            state.ends[index] = check_partition_records(
                partition,
                max(acked_end[index], state.ends[index]),
                f"{where} read-only before recovery, partition {index}",
                start,
            )
    if not recover:
        return landed

    with LogStore.open(data_dir) as store:
        topics_entries = sorted(e.name for e in (data_dir / "topics").iterdir())
        assert topics_entries == [TOPIC], f"{where}: topics/ holds {topics_entries}"
        reports = store.recovery_reports(TOPIC)
        for partition, report, found in zip(
            store.topic(TOPIC).partitions, reports, leftovers, strict=True
        ):
            pwhere = f"{where} partition {partition.index}"
            assert not report.corrupt_ranges, (
                f"{pwhere}: a crash cannot corrupt data, yet {report.corrupt_ranges}"
            )
            assert set(report.removed_files) == found.expected_removals, (
                f"{pwhere}: recovery removed {sorted(map(str, report.removed_files))}, "
                f"the kill left {sorted(map(str, found.expected_removals))}"
            )
            for tail in report.torn_tails:
                # Only the active (last) log file is ever written to.
                assert tail.path == found.log_files[-1], f"{pwhere}: torn tail in {tail.path}"
                state.torn_tails += 1
            for path in report.removed_files:
                kind = (
                    "temp file" if path.name.startswith(TEMP_PREFIX)
                    else f"{path.suffix[1:]} file"
                )
                state.removed[f"{kind} in {path.parent.name}/"] += 1
            check_files(partition, pwhere)
            index = partition.index
            start = 0 if full else verified_prefix_end(partition.manifest, state.verified[index])
            end = check_partition_records(
                partition, max(acked_end[index], state.ends[index]), pwhere, start
            )
            assert end == state.ends[index], (
                f"{pwhere}: log end {end} after recovery, {state.ends[index]} before"
            )
            check_columnar(partition, end, pwhere, start)
            state.verified[index] = {info.file for info in partition.manifest.segments}
    assert not temp_files_under(data_dir), (
        f"{where}: temporary files left after recovery: {temp_files_under(data_dir)}"
    )
    return landed


def crash_loop(data_dir: Path, iterations: int, segment_bytes: int) -> CrashLoopState:
    seed = int(os.environ.get("COMPACTLOG_CRASH_SEED", random.randrange(2**32)))
    iterations = int(os.environ.get("COMPACTLOG_CRASH_ITERATIONS", iterations))
    print(
        f"crash loop: seed {seed}, {iterations} iterations, segment.bytes={segment_bytes} "
        f"(replay with COMPACTLOG_CRASH_SEED={seed})"
    )
    rng = random.Random(seed)
    state = CrashLoopState()
    started = time.monotonic()
    recovered = True
    for iteration in range(iterations):
        # Mostly kill a running writer. Sometimes time the kill from the start instead, so
        # that it may land in start-up, topic creation (first time round) or the writer's
        # own recovery, which has work to do when the last check left recovery to it.
        after_ready = rng.random() < (0.85 if recovered else 0.3)
        if after_ready:
            delay = rng.uniform(0.02, 0.5)
        else:
            delay = rng.uniform(0.7, 1.3) * state.ready_seconds
        # Usually recover and check right after the kill; sometimes only check read-only
        # and leave recovery to the next writer. The last kill is always recovered.
        last = iteration == iterations - 1
        recover = rng.random() < 0.8 or last
        full = iteration % FULL_CHECK_EVERY == 0 or last
        # A cold writer is likely to die in its first, slow seal (see crash_writer.py).
        warm = rng.random() < 0.5
        writer_seed = rng.randrange(2**32)
        where = (
            f"iteration {iteration} (seed {seed}, {'warm' if warm else 'cold'} writer killed "
            f"{delay:.3f}s after {'READY' if after_ready else 'start'})"
        )
        run_started = time.monotonic()
        run = run_writer_until_killed(
            data_dir, writer_seed, segment_bytes, warm, after_ready, delay
        )
        check_started = time.monotonic()
        state.writer_seconds += check_started - run_started
        if after_ready:
            assert run.ready, f"{where}: writer never became ready; stderr:\n{run.stderr}"
        assert run.alive_at_kill, (
            f"{where}: writer exited by itself with {run.exit_code}; stderr:\n{run.stderr}"
        )
        assert run.exit_code == -signal.SIGKILL, where
        if run.ready_seconds is not None:
            state.ready_seconds = run.ready_seconds
        check_after_kill(data_dir, run, state, recover, full, where)
        state.check_seconds += time.monotonic() - check_started
        recovered = recover
    elapsed = time.monotonic() - started
    print(
        f"crash loop done in {elapsed:.1f}s: {iterations} kills, {state.acks} acked appends, "
        f"log ends {state.ends}; {state.writer_seconds:.1f}s in writers, "
        f"{state.check_seconds:.1f}s checking"
    )
    print("  where the kills landed:")
    for what, count in sorted(state.kills.items()):
        print(f"    {count:4d}  {what}")
    print("  what mid-seal kills left:")
    for what, count in sorted(state.landed.items()):
        print(f"    {count:4d}  {what}")
    print(f"  recovery removed: {dict(state.removed)}; torn tails cut: {state.torn_tails}")
    return state


# -- the tests ------------------------------------------------------------------------


def test_crash_loop(tmp_path: Path) -> None:
    state = crash_loop(tmp_path / "data", iterations=14, segment_bytes=4096)
    assert state.topic_exists and sum(state.ends) > 0


def test_crash_loop_tiny_segments(tmp_path: Path) -> None:
    """segment.bytes at its minimum: nearly every append rolls and seals."""
    state = crash_loop(tmp_path / "data", iterations=6, segment_bytes=1024)
    assert state.topic_exists and sum(state.ends) > 0


@pytest.mark.slow
def test_crash_loop_long(tmp_path: Path) -> None:
    state = crash_loop(tmp_path / "data", iterations=200, segment_bytes=4096)
    assert state.topic_exists and sum(state.ends) > 0


@pytest.mark.slow
def test_crash_loop_tiny_segments_long(tmp_path: Path) -> None:
    state = crash_loop(tmp_path / "data", iterations=100, segment_bytes=1024)
    assert state.topic_exists and sum(state.ends) > 0



# Each kill point of crash_writer.KILL_POINTS, and what it must leave for recovery
# (None: not fixed; the torn append may or may not follow a roll).
KILL_POINT_LEFTOVERS: dict[str, list[str] | None] = {
    "create-topic": [],
    "torn-append": None,
    "roll": ["rolled log segment waiting to be sealed"],
    "seal-parquet-written": [
        "rolled log segment waiting to be sealed",
        "seal step 1: Parquet temp file being written",
    ],
    "seal-published": [
        "rolled log segment waiting to be sealed",
        "seal step 2-3: Parquet published, manifest not committed",
    ],
    "seal-manifest-temp": [
        "rolled log segment waiting to be sealed",
        "seal step 2-3: Parquet published, manifest not committed",
        "seal step 3: manifest commit in progress",
    ],
    "seal-committed": ["seal step 3-4: manifest committed, log file not deleted"],
    "seal-log-unlinked": [],
    "alter-topic": [],
}


def run_kill_point(data_dir: Path, kill_point: str, state: CrashLoopState) -> None:
    where = f"kill point {kill_point} ({KILL_POINTS[kill_point]})"
    run = run_writer_until_killed(data_dir, 2, 4096, False, False, 0.0, kill_point)
    assert run.exit_code == -signal.SIGKILL, f"{where}: exit {run.exit_code}:\n{run.stderr}"
    assert run.ready == (kill_point != "create-topic"), where
    torn_tails = state.torn_tails
    landed = check_after_kill(data_dir, run, state, True, True, where)
    expected_leftovers = KILL_POINT_LEFTOVERS[kill_point]
    if expected_leftovers is not None:
        assert landed == expected_leftovers, where
    if kill_point == "create-topic":
        assert not state.topic_exists, f"{where}: the half-created topic exists"
    if kill_point == "torn-append":
        assert state.torn_tails == torn_tails + 1, f"{where}: recovery cut no torn tail"


def test_kill_points(tmp_path: Path) -> None:
    """The writer kills itself at each exact point in turn, on one directory.

    Each kill is recovered and checked as in the crash loop, and the kill points of
    sealing must leave just what the protocol in partition.py says. A last writer is
    killed at random, to see the store carry on.
    """
    data_dir = tmp_path / "data"
    state = CrashLoopState()
    for kill_point in KILL_POINTS:
        if kill_point != "alter-topic":  # see test_kill_during_alter_topic
            run_kill_point(data_dir, kill_point, state)
    run = run_writer_until_killed(data_dir, 3, 4096, True, True, 0.1)
    assert run.alive_at_kill, f"after the kill points: writer died:\n{run.stderr}"
    check_after_kill(data_dir, run, state, True, True, "after the kill points")
    assert state.topic_exists and sum(state.ends) > 0


def test_kill_during_alter_topic(tmp_path: Path) -> None:
    """A writer killed while committing a topic config change leaves nothing behind.

    The topic document is committed as partition manifests are (manifest.py), and a
    kill before publishing leaves its temporary file, which the next open must remove.
    """
    data_dir = tmp_path / "data"
    state = CrashLoopState()
    run = run_writer_until_killed(data_dir, 1, 4096, False, True, 0.05)
    check_after_kill(data_dir, run, state, True, True, "first run")
    run_kill_point(data_dir, "alter-topic", state)
