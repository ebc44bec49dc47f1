"""Compaction I/O throttling, as Kafka's `log.cleaner.io.max.bytes.per.second`.

Invariant: a task that runs with an `IoThrottle` of rate R never runs more than one
check interval (0.3 s, as Kafka's cleaner) ahead of R: after each block of bytes it
reads or writes, once a check interval has passed since the period began, or once the
period's bytes would need more than a check interval at R, the task sleeps until the
period's bytes / R have passed, then starts a new period. So over a task, bytes / wall
time stays within R plus at most R x 0.3 s of bytes left unpaid at its end. Under a
cap, what a task writes reaches the disk as it is counted (an fdatasync per row group
written), not in one burst at its file's closing fsync.

Kafka's semantics (core/src/main/scala/kafka/utils/Throttler.scala, and LogCleaner
making one Throttler of `maxIoBytesPerSecond` with a 300 ms check interval, shared by
its cleaner threads): bytes read and bytes written both count, the rate is checked per
interval, and the default is unlimited. Here a compaction run's tasks run in separate
processes (Spark's Python workers) or threads, so they cannot share one object: the
run's cap is split evenly, each of N tasks running at once gets cap / N (`per_task`).
A run whose tasks are uneven therefore stays below the cap once the short ones end.

The task code reports its I/O with `observe_read` / `observe_growth`; outside a
`throttled(...)` block they do nothing. The throttle in force is a context variable,
so each thread (and each Spark Python worker) has its own.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq

# Kafka's LogCleaner checks its Throttler's rate every 300 ms.
CHECK_INTERVAL_S = 0.3
# The Spark setting that carries a run's cap to the compaction service, under Kafka's
# name (the server's cleaner sets it from its `io_max_bytes_per_s`).
IO_CAP_SPARK_CONF = "spark.compactlog.log.cleaner.io.max.bytes.per.second"


@dataclass
class IoThrottle:
    """Counts a task's I/O bytes and sleeps to keep them at `max_bytes_per_s`
    (0 or infinite: count only). `clock` and `sleep` are injectable for tests."""

    max_bytes_per_s: float = 0.0
    check_interval_s: float = CHECK_INTERVAL_S
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    read_bytes: int = 0
    written_bytes: int = 0
    throttled_s: float = 0.0
    _period_start: float = field(init=False)
    _period_bytes: int = field(init=False, default=0)
    _lock: threading.Lock = field(init=False, default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._period_start = self.clock()

    @property
    def limited(self) -> bool:
        return 0 < self.max_bytes_per_s < float("inf")

    def observe(self, nbytes: int, written: bool = False) -> None:
        """`nbytes` were just read (or written): count them, and sleep if the period's
        rate is above the cap (see the module's invariant)."""
        with self._lock:
            if written:
                self.written_bytes += nbytes
            else:
                self.read_bytes += nbytes
            if not self.limited or nbytes <= 0:
                return
            self._period_bytes += nbytes
            elapsed = self.clock() - self._period_start
            due = self._period_bytes / self.max_bytes_per_s  # seconds these bytes need
            if elapsed < self.check_interval_s and due - elapsed < self.check_interval_s:
                return
            if due > elapsed:
                self.sleep(due - elapsed)
                self.throttled_s += due - elapsed
            self._period_start = self.clock()
            self._period_bytes = 0

    def counters(self) -> dict[str, float]:
        return {"read_bytes": self.read_bytes, "written_bytes": self.written_bytes,
                "throttled_s": self.throttled_s}


def per_task(max_bytes_per_s: float, concurrent_tasks: int) -> float:
    """Each of `concurrent_tasks` tasks' share of a run's cap (0: unlimited)."""
    if max_bytes_per_s <= 0:
        return 0.0
    return max_bytes_per_s / max(1, concurrent_tasks)


_current: ContextVar[IoThrottle | None] = ContextVar("compaction_io_throttle", default=None)


@contextlib.contextmanager
def throttled(throttle: IoThrottle) -> Iterator[IoThrottle]:
    """Make `throttle` the one this thread's task code reports its I/O to."""
    token = _current.set(throttle)
    try:
        yield throttle
    finally:
        _current.reset(token)


def observe_read(nbytes: int) -> None:
    if (throttle := _current.get()) is not None:
        throttle.observe(nbytes)


def observe_growth(path: Path, before: int) -> int:
    """Report the bytes a writer added to `path` since it held `before`, and return its
    size. Under a cap, also push them to the disk now (fdatasync): else they would wait
    in the page cache and reach the disk in one burst at the file's closing fsync, which
    is the very contention with producers' fsyncs that the cap is for."""
    throttle = _current.get()
    if throttle is None:
        return before  # nobody counts: spare the stat
    size = path.stat().st_size
    if size > before:
        if throttle.limited:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fdatasync(fd)
            finally:
                os.close(fd)
        throttle.observe(size - before, written=True)
    return size


def chunk_bytes(metadata: pq.FileMetaData, row_group: int,
                columns: Sequence[str] | None = None) -> int:
    """The bytes on disk of `row_group`'s column chunks (of `columns` only, when given):
    what reading it takes from the file."""
    group = metadata.row_group(row_group)
    wanted = None if columns is None else set(columns)
    total = 0
    for index in range(group.num_columns):
        chunk = group.column(index)
        # A nested column's chunks are named by their path ("headers.list.element...").
        if wanted is None or chunk.path_in_schema.split(".")[0] in wanted:
            total += chunk.total_compressed_size
    return total


def observe_row_group(metadata: pq.FileMetaData, row_group: int,
                      columns: Sequence[str] | None = None) -> None:
    """Report the read of `row_group` (its `columns`, or all of them)."""
    if _current.get() is not None:
        observe_read(chunk_bytes(metadata, row_group, columns))
