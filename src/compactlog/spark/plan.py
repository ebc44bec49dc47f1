"""Planning a read on the driver: which files and offset ranges each Spark task reads.

The plan is taken from one snapshot of each partition: its manifest (sealed segments,
and the (horizon, ledger) pair) and its log end offset. From it:

- raw view: one task per sealed segment, from the log start offset; then one task per
  partition for the unsealed tail, [sealed end, log end).
- compacted view: one task per ledger file (every record they hold is at or below the
  horizon); one task per sealed segment above the horizon, from horizon + 1; then the
  tail, [max(sealed end, horizon + 1), log end).

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
an executor reads the AWS settings from its own environment (storage/location.py).

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
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql.datasource import InputPartition

from compactlog.config import TopicConfig
from compactlog.errors import CorruptionError
from compactlog.spark.options import ReadOptions
from compactlog.storage.location import Location
from compactlog.storage.manifest import LEDGER_DIR, SEGMENT_DIR, SegmentInfo
from compactlog.storage.partition import Partition
from compactlog.storage.store import LogStore
from compactlog.storage.volume import Volume, volume_from_spec


@dataclass(frozen=True)
class FilePart(InputPartition):
    """A task reading one Parquet file (sealed segment or ledger file) from `start_offset`,
    up to `end_offset` (exclusive) when one is set, else to the end of the file."""

    topic: str
    partition: int
    volume: tuple[tuple[str, str], ...]  # the partition volume's spec, as items
    relative: str  # the file in the volume: segments/<file> or ledger/<file>
    where: str  # the file as a user should see it in a message
    info: SegmentInfo
    start_offset: int
    end_offset: int | None = None

    @property
    def is_ledger(self) -> bool:
        return self.relative.startswith(LEDGER_DIR + "/")

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


def plan_read(options: ReadOptions) -> list[InputPartition]:
    """The tasks of one read, partition by partition, each in offset order (on S3, of
    the sealed part: see the module's docstring)."""
    if not Location.parse(options.path).is_s3:
        return _plan_store(options, None)
    with tempfile.TemporaryDirectory(prefix="compactlog-plan-") as local_dir:
        return _plan_store(options, local_dir)


def _plan_store(options: ReadOptions, local_dir: str | None) -> list[InputPartition]:
    with LogStore.open(options.path, read_only=True, local_dir=local_dir) as store:
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
    return plan_range(partition, config, view, 0, partition.high_watermark)


def plan_range(partition: Partition, config: TopicConfig, view: str, start: int,
               end: int) -> Iterator[InputPartition]:
    """The tasks reading the records of `view` whose offsets are in [start, end), from
    the partition's current manifest. Offsets below the log start are not read (the
    caller decides whether that lost anything: see stream.py)."""
    manifest = partition.manifest
    raw_start = max(start, manifest.log_start_offset)
    if view == "compacted":
        horizon = manifest.horizon
        if horizon is not None:
            for info in manifest.ledger:
                if info.last_offset >= start and info.base_offset < end:
                    yield _file_part(partition, LEDGER_DIR, info, start, end)
            raw_start = max(raw_start, horizon + 1)
    for info in manifest.segments:
        if info.last_offset >= raw_start and info.base_offset < end:
            yield _file_part(partition, SEGMENT_DIR, info, raw_start, end)
    tail_start = max(raw_start, manifest.sealed_end_offset)
    if tail_start < end:
        yield TailPart(partition.topic, partition.index, str(partition.directory), config,
                       tail_start, end)


def _file_part(partition: Partition, folder: str, info: SegmentInfo, start: int,
               end: int) -> FilePart:
    relative = f"{folder}/{info.file}"
    where = partition.volume.describe(relative)
    start = max(start, info.base_offset)
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
                    relative, where, info, start, end if end <= info.last_offset else None)
