"""The pluggable compaction service (Pulsar's PIP-278).

A `TopicCompactionService` compacts one topic and reads its compacted ledger. A
`CompactionServiceFactory` makes services; which factory is used is named by an import
path, `module:attribute` (setting `compaction.service.factory`, or the CLI's
`--service`), as PIP-278 names a Java class. The default is the Spark factory.

Implementations live in sibling modules (spark_service.py is the default); this module
holds only the interface and the loader, so that importing it stays cheap.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from compactlog.errors import UserError

if TYPE_CHECKING:
    from compactlog.compaction.rolled import RollThrough
    from compactlog.storage import LogStore, Record

DEFAULT_FACTORY = "compactlog.compaction.spark_service:SparkCompactionServiceFactory"


@dataclass
class PartitionSummary:
    """What one run did to one partition."""

    partition: int
    records_in: int = 0
    bytes_in: int = 0
    records_out: int = 0
    bytes_out: int = 0
    keys: int = 0
    tombstones_kept: int = 0
    tombstones_removed: int = 0
    null_keys_removed: int = 0
    expired_removed: int = 0
    old_horizon: int | None = None
    horizon: int | None = None
    dirty_segments: int = 0
    # Of those, joined the ledger as they are (compaction/adoption.py).
    segments_adopted: int = 0
    # The ledger's files before and after the run (small ones merge: incremental.py).
    ledger_files_in: int = 0
    ledger_files_out: int = 0
    skipped: str | None = None  # why nothing was done, when nothing was
    # Rolled segments the writer had not sealed when the run gave up waiting: the next
    # run covers them (compaction/rolled.py).
    rolled_unsealed: bool = False
    # A manual run (trigger) that could not roll the active segment: another process
    # writes the partition and could not be asked to (compaction/rolled.py).
    active_not_rolled: bool = False

    @property
    def records_removed(self) -> int:
        return self.records_in - self.records_out


@dataclass
class CompactionReport:
    topic: str
    run_id: str
    duration_s: float  # the whole run, engine start-up included
    partitions: list[PartitionSummary] = field(default_factory=list)
    # Seconds per step of the run, in order ("plan", "phase 1", "phase 2", "commit"),
    # plus the engine's start-up (for Spark: the JVM and the session) when it had one.
    stages: dict[str, float] = field(default_factory=dict)
    startup_s: float = 0.0
    # What ran the run's tasks, as the engine says: for Spark, the master and the run's
    # job ids with their stage and task counts, or that they ran in this process.
    engine: str = ""
    # The run's Arrow tasks' I/O (compaction/io_throttle.py): bytes read from and written
    # to their files, and the seconds they slept to stay within the I/O cap, summed over
    # the tasks (0 without a cap). The SQL pipeline's tasks are not counted.
    io_read_bytes: int = 0
    io_written_bytes: int = 0
    throttled_s: float = 0.0

    def total(self, name: str) -> int:
        return sum(getattr(p, name) for p in self.partitions)

    @property
    def mb_per_s(self) -> float:
        """Input MB/s of the work itself: engine start-up is a fixed cost, paid once per
        run, which says nothing of how fast the data went through."""
        work_s = self.duration_s - self.startup_s
        return self.total("bytes_in") / 1e6 / work_s if work_s > 0 else 0.0


class TopicCompactionService(ABC):
    """Compacts one topic, and reads the compacted ledger of its partitions.

    `compact` follows Kafka's cleaner: it covers every segment but the active one (the
    server's automatic compaction runs it). `trigger` is a compaction asked for by
    hand, as Pulsar's: it rolls the active segments first, so that it covers every
    record appended until it was asked for (min.compaction.lag.ms still applies).
    An implementation has the store and the topic it compacts as `store` and `topic`."""

    store: LogStore
    topic: str

    @abstractmethod
    def compact(self, partitions: Sequence[int] | None = None) -> CompactionReport:
        """Compact the given partitions (all when None) in one run; commit each one's
        new (horizon, ledger) pair atomically, or leave its old pair in force."""

    def trigger(self, partitions: Sequence[int] | None = None,
                roll_through: RollThrough | None = None) -> CompactionReport:
        """A manual compaction: roll the active segment of each partition, then
        `compact`. When another process writes the store, `roll_through(topic,
        partitions)` asks it to roll (the CLI asks a server through its admin API);
        without one, or when it answers False, those partitions' active segments stay,
        and their summaries say so (`active_not_rolled`)."""
        from compactlog.compaction.rolled import roll_active_segments

        kept = roll_active_segments(self.store, self.topic, partitions, roll_through)
        report = self.compact(partitions)
        for summary in report.partitions:
            summary.active_not_rolled = summary.partition in kept
        return report

    @abstractmethod
    def read_compacted_entries(self, partition: int, start: int, count: int) -> list[Record]:
        """Up to `count` ledger records at offsets >= `start` (the ledger only)."""

    @abstractmethod
    def read_last_compacted_entry(self, partition: int) -> Record | None:
        """The ledger's last record (which may be a tombstone), or None."""

    @abstractmethod
    def get_last_compacted_position(self, partition: int) -> int | None:
        """The horizon: the last offset the ledger covers, or None before any run."""


class CompactionServiceFactory(Protocol):
    def new_service(
        self, store: LogStore, topic: str, settings: Mapping[str, Any]
    ) -> TopicCompactionService: ...


def load_factory(import_path: str | None = None) -> CompactionServiceFactory:
    """The factory named by `module:attribute` (a class is instantiated with no args)."""
    path = import_path or DEFAULT_FACTORY
    module_name, sep, attribute = path.partition(":")
    if not sep or not module_name or not attribute:
        raise UserError(f"compaction service factory must be MODULE:NAME, got {path!r}")
    try:
        found = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as error:
        raise UserError(f"cannot load compaction service factory {path!r}: {error}") from None
    factory = found() if isinstance(found, type) else found
    if not callable(getattr(factory, "new_service", None)):
        raise UserError(f"compaction service factory {path!r} has no new_service method")
    return factory  # type: ignore[no-any-return]
