"""Planning a read on the driver: which files and offset ranges each Spark task reads.

The plan is taken from one snapshot of each partition: its manifest (sealed segments,
and the (horizon, ledger) pair) and its upper bound, the high watermark. Which files,
offsets and rows are in the view is storage/view_rows.py's to say, the definition every
read path shares, evaluated once here on the driver (its time rules at the planning
instant, the store's clock's), and carried by each task:

- raw view: one task per sealed segment, from the log start offset; then one task per
  partition for the unsealed tail, [sealed end, high watermark).
- compacted view: one task per ledger file with rows in the view (deletion vectors,
  DeleteRecords, retention.ms on compact,delete and tombstone retention applied by the
  task's row condition); one task per sealed segment above the horizon, from
  horizon + 1; then the tail, [max(sealed end, horizon + 1), high watermark).

This is exactly what `Reader(..., read_compacted=True)` (or a raw Reader) returns from
the earliest position: see storage/compacted.py and storage/partition.py. File tasks
read Parquet directly on the executors; tail tasks go through the store's read API,
because the active log is in Kafka's batch format, and because by the time a task runs
the tail may have been sealed into Parquet (the read API finds it wherever it is).

Tasks carry the manifest's size and CRC32C of their file, so an executor proves the
file whole before the Parquet reader parses it (as SealedSegment does).

A file task names its file by the partition volume's `spec` and the file's relative
name (`segments/<file>`, `ledger/<file>`), never by a path of the driver: the executor
opens it with `volume_from_spec(spec).fetch(relative)`, which is the file itself in a
local data directory and a copy downloaded into the executor's read cache on S3. A spec
holds a directory or an s3:// URL and nothing else: no credential travels in a task;
an executor reads the AWS settings from its own environment (backend/s3/settings.py).

On an s3:// location the plan covers the sealed part only: the unsealed log segments
are on the writer's local disk, which other machines do not have. The driver plans from
the manifests in the bucket, with an empty local directory of its own, so the log end
it sees is the sealed end, wherever it runs.

A streaming micro-batch (stream.py) plans the same tasks for a range of offsets,
[start, end) of each partition, through `plan_range`: a batch read is the range from
offset 0 to the log end.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql.datasource import InputPartition

from compactlog.backend import Location, Volume, volume_from_spec
from compactlog.config import TopicConfig
from compactlog.errors import CorruptionError
from compactlog.spark.options import ReadOptions
from compactlog.storage import (
    FileRows,
    LogStore,
    Partition,
    RowCondition,
    SegmentInfo,
    TimeRules,
    partition_rows,
    upper_bound,
)

Clock = Callable[[], float]


@dataclass(frozen=True)
class FilePart(InputPartition):
    """A task reading the rows of one Parquet file (sealed segment or ledger file) that
    are in the view: `rows` (view_rows.py) names the file, where reading starts and the
    condition on its rows; `group_condition` is the condition before it was trimmed to
    this file, the same for every file of the partition and kind (fast.py filters them
    together)."""

    topic: str
    partition: int
    volume: tuple[tuple[str, str], ...]  # the partition volume's spec, as items
    where: str  # the file as a user should see it in a message
    rows: FileRows
    group_condition: RowCondition

    @property
    def relative(self) -> str:
        """The file in the volume: segments/<file> or ledger/<file>."""
        return self.rows.relative

    @property
    def info(self) -> SegmentInfo:
        return self.rows.info

    @property
    def start_offset(self) -> int:
        return self.rows.first_offset

    @property
    def end_offset(self) -> int | None:
        """Exclusive; None: to the end of the file."""
        return self.rows.condition.end_offset

    @property
    def is_ledger(self) -> bool:
        return self.rows.is_ledger

    @property
    def local_path(self) -> str | None:
        """The file's path when the volume is a local directory (no download needed)."""
        spec = dict(self.volume)
        return str(Path(spec["root"]) / self.relative) if spec["kind"] == "local" else None

    def open_volume(self) -> Volume:
        """The partition's volume, in this process (an executor's)."""
        return volume_from_spec(dict(self.volume))

    def sibling(self, name: str) -> str:
        """The relative name of file `name` in this file's folder (a deletion vector)."""
        return self.relative.rsplit("/", 1)[0] + "/" + name


@dataclass(frozen=True)
class TailPart(InputPartition):
    """A task reading offsets [start_offset, end_offset) of one partition's raw log."""

    topic: str
    partition: int
    directory: str
    config: TopicConfig
    start_offset: int
    end_offset: int


def plan_read(options: ReadOptions, clock: Clock = time.time) -> list[InputPartition]:
    """The tasks of one read, partition by partition, each in offset order (on S3, of
    the sealed part: see the module's docstring), with the view's time rules evaluated
    at `clock()`."""
    if not Location.parse(options.path).is_s3:
        return _plan_store(options, None, clock)
    with tempfile.TemporaryDirectory(prefix="compactlog-plan-") as local_dir:
        return _plan_store(options, local_dir, clock)


def _plan_store(options: ReadOptions, local_dir: str | None,
                clock: Clock) -> list[InputPartition]:
    with LogStore.open(options.path, read_only=True, local_dir=local_dir,
                       clock=clock) as store:
        topic = store.topic(options.topic)  # UnknownTopicError names the topic
        chosen = options.partitions
        indexes = range(len(topic.partitions)) if chosen is None else chosen
        parts: list[InputPartition] = []
        for index in indexes:
            partition = topic.partition(index)  # UnknownPartitionError names the range
            parts.extend(_plan_partition(partition, topic.config, options.view))
        return parts


def _plan_partition(partition: Partition, config: TopicConfig, view: str) -> Iterator[
    InputPartition
]:
    # A read-only partition loaded its manifest and scanned its logs when it was opened,
    # just now: that is the snapshot. Sealing may move the tail into Parquet before the
    # tail task runs; that task reads through the store API, which follows it there.
    return plan_range(partition, config, view, 0, upper_bound(partition.view()))


def plan_range(partition: Partition, config: TopicConfig, view: str, start: int,
               end: int) -> Iterator[InputPartition]:
    """The tasks reading the records of `view` whose offsets are in [start, end), from
    the partition's current manifest, the time rules at the partition's clock's now.
    Offsets below the log start are not read (the caller decides whether that lost
    anything: see stream.py)."""
    rows = partition_rows(partition.manifest, TimeRules.of(config, partition.now_ms()),
                          view == "compacted", end, start)
    for file in rows.ledger():
        yield _file_part(partition, file, rows.ledger_condition)
    for file in rows.segments():
        yield _file_part(partition, file, rows.segment_condition)
    if rows.tail_start < end:
        yield TailPart(partition.topic, partition.index, str(partition.directory), config,
                       rows.tail_start, end)


def _file_part(partition: Partition, file: FileRows, group: RowCondition) -> FilePart:
    info = file.info
    where = partition.volume.describe(file.relative)
    start, end = file.first_offset, file.condition.end_offset
    end = info.last_offset + 1 if end is None else end
    # A hole's last offset is -1 when the damage hid where it ended.
    holes = [(first, last) for first, last in info.missing
             if (last < 0 or last >= start) and first < end]
    if holes:
        # The Reader fails on these offsets too; a table must not silently lack them.
        first, last = holes[0]
        raise CorruptionError(
            where,
            f"offsets {first}..{last} of {partition.name} were lost to a corrupt range in "
            "the log before this segment was sealed; read the other partitions with "
            "option 'partitions'",
        )
    return FilePart(partition.topic, partition.index, tuple(sorted(partition.volume.spec.items())),
                    where, file, group)
