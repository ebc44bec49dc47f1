"""Streaming reads: `spark.readStream.format("compactlog")`, micro-batch by micro-batch.

    spark.readStream.format("compactlog").option("path", DIR).option("topic", T)
         .option("view", "raw" | "compacted").option("startingOffsets", "earliest")
         .option("maxOffsetsPerTrigger", "10000").load()

An offset of the stream is a position per partition, as in Kafka's Spark source:
{"<partition>": next offset to read}. Spark checkpoints the offsets of each
micro-batch, so a restarted query resumes at the end of the last one it planned, and
reads every record after it exactly once. A micro-batch reads, in each partition, the
view's records whose offsets are in [start, end): the same tasks as a batch read
(plan.plan_range), one per Parquet file the range touches and one for the unsealed tail.

- raw view: offsets are dense, so a range of n offsets is n records.
- compacted view: at planning, records at or below the partition's horizon come from
  the ledger, the others from the raw log. Offsets are the original ones in both, so a
  position stays valid when a compaction commits between micro-batches: the next batch
  reads from the new ledger the survivors at or after its position (records there that
  the compaction removed are not read, as a Kafka consumer that lags behind the log
  cleaner does not get them), then the raw log after the new horizon. Nothing before the
  position is read again. A micro-batch that reruns after such a compaction (a failed
  batch, on restart) may so read fewer records than its first run.
- "earliest" is the log start offset (raw view), or 0 once the partition has a ledger
  (compacted view); "latest" is the log end offset when the query starts.

Retention may delete raw records before a query reads them (its position is below the
log start). By default (`failOnDataLoss` true, as in Kafka's source) the micro-batch
fails with an error naming the partition and the lost offsets; with `failOnDataLoss`
false it logs a warning and reads on from the log start. The compacted view below the
horizon is never deleted by retention (its ledger is read instead).

`maxOffsetsPerTrigger` (Kafka's Spark source's name; `maxRecordsPerTrigger` is its
deprecated alias) caps the offsets a micro-batch covers (Spark's ReadMaxRows),
shared between the partitions in proportion to their backlog. Under
`trigger(availableNow=True)` the cap still applies: the query reads up to the log end
offsets seen when it started, in as many micro-batches as the cap needs.

The driver keeps one read-only store open for the query (refreshed at each trigger);
executors read files and tails as the batch source does (read.py). On an s3:// location
that store has an empty local directory of the query's own, so the stream's log end is
each partition's sealed end in the bucket: new records arrive as they are sealed.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from compactlog.backend import Location
from compactlog.errors import UserError
from compactlog.spark.options import EARLIEST, LATEST, StreamOptions, parse_stream_options
from compactlog.spark.read import read_part
from compactlog.spark.read_plan import FilePart, TailPart, plan_range
from compactlog.storage import LogStore, Partition, Topic, upper_bound

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

Offsets = dict[str, int]


class DataLossError(UserError):
    """Retention deleted records that a streaming query had not read yet."""


class CompactlogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: dict[str, str]) -> None:
        # Parsed here, on the driver, so that a bad option fails the query at start.
        self.options: StreamOptions = parse_stream_options(options)
        self._store: LogStore | None = None
        self._local_dir: tempfile.TemporaryDirectory[str] | None = None  # on S3
        self._target: Offsets | None = None  # the end of a trigger(availableNow=True) run

    def __getstate__(self) -> dict[str, Any]:
        # Spark pickles the reader to run read() on executors: without the open store.
        return {**self.__dict__, "_store": None, "_local_dir": None}

    # -- the driver --------------------------------------------------------------------

    def initialOffset(self) -> Offsets:
        starting = self.options.starting
        partitions = self._partitions()
        if isinstance(starting, dict):
            known = sorted(p.index for p in partitions)
            extra = sorted(set(starting) - set(known))
            if extra:
                raise UserError(
                    f"startingOffsets names partition {extra[0]}, which this query does not "
                    f"read: {self.options.read.topic} has partitions {known}"
                )
        offsets: Offsets = {}
        for partition in partitions:
            if isinstance(starting, dict):
                wanted = starting.get(partition.index, EARLIEST)
            else:
                wanted = EARLIEST if starting == "earliest" else LATEST
            end = upper_bound(partition.view())
            if wanted > end:
                raise UserError(
                    f"startingOffsets: offset {wanted} of {partition.name} is past its log "
                    f"end offset {end}"
                )
            offsets[str(partition.index)] = (
                self._earliest(partition) if wanted == EARLIEST
                else end if wanted == LATEST else wanted
            )
        return offsets

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_records_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._log_ends()

    def latestOffset(self, start: Offsets, limit: ReadLimit) -> Offsets:
        ends = self._target if self._target is not None else self._log_ends()
        begins = {name: start.get(name, self._earliest_of(name)) for name in ends}
        ends = {name: max(end, begins[name]) for name, end in ends.items()}
        if isinstance(limit, ReadMaxRows):
            return _capped(begins, ends, limit.max_rows)
        return ends

    def partitions(self, start: Offsets, end: Offsets) -> list[InputPartition]:
        config = self._topic().config
        view = self.options.read.view
        parts: list[InputPartition] = []
        for partition in self._partitions():
            name = str(partition.index)
            begin, stop = start.get(name, self._earliest(partition)), end.get(name)
            if stop is None or begin >= stop:
                continue
            self._check_data_loss(partition, begin, stop)
            parts.extend(plan_range(partition, config, view, begin, stop))
        return parts

    def commit(self, end: Offsets) -> None:
        """Nothing to do: the store keeps records by its own retention, not by readers."""

    def stop(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None
        if self._local_dir is not None:
            self._local_dir.cleanup()
            self._local_dir = None

    # -- executors ---------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, FilePart | TailPart):
            return iter(())
        return read_part(partition)

    # -- internals ---------------------------------------------------------------------

    def _topic(self) -> Topic:
        if self._store is None:
            path = self.options.read.path
            if Location.parse(path).is_s3:
                # The sealed part, as a batch read on S3 (read_plan.py): a local directory of
                # the query's own, without any writer's logs.
                self._local_dir = tempfile.TemporaryDirectory(prefix="compactlog-stream-")
                self._store = LogStore.open(path, read_only=True,
                                            local_dir=self._local_dir.name)
            else:
                self._store = LogStore.open(path, read_only=True)
        return self._store.topic(self.options.read.topic)  # UnknownTopicError names it

    def _partitions(self) -> list[Partition]:
        """The partitions this query reads, each refreshed to what is on disk now."""
        topic = self._topic()
        chosen = self.options.read.partitions
        indexes = range(len(topic.partitions)) if chosen is None else chosen
        partitions = [topic.partition(index) for index in indexes]
        for partition in partitions:
            partition.refresh()
        return partitions

    def _log_ends(self) -> Offsets:
        return {str(p.index): upper_bound(p.view()) for p in self._partitions()}

    def _earliest(self, partition: Partition) -> int:
        if self.options.read.view == "compacted" and partition.manifest.horizon is not None:
            return 0  # the ledger holds the view below the horizon, whatever retention did
        return partition.log_start_offset

    def _earliest_of(self, name: str) -> int:
        return self._earliest(self._topic().partition(int(name)))

    def _check_data_loss(self, partition: Partition, begin: int, stop: int) -> None:
        """Fail (or warn, with failOnDataLoss false) when retention deleted raw records
        of [begin, stop) before they were read. plan_range reads on from the log start."""
        first_raw = begin
        horizon = partition.manifest.horizon
        if self.options.read.view == "compacted" and horizon is not None:
            first_raw = max(begin, horizon + 1)
        log_start = partition.log_start_offset
        if first_raw >= log_start or first_raw >= stop:
            return
        lost = f"offsets {first_raw}..{min(log_start, stop) - 1}"
        if self.options.fail_on_data_loss:
            raise DataLossError(
                f"{partition.name}: {lost} were deleted by retention before this streaming "
                f"query read them (the log now starts at offset {log_start}); set option "
                "failOnDataLoss to false to skip them, or start the query again with a new "
                "checkpoint"
            )
        log.warning("%s: %s were deleted by retention before they were read; skipped",
                    partition.name, lost)

def _capped(begins: Offsets, ends: Offsets, max_rows: int) -> Offsets:
    """End offsets covering at most `max_rows` offsets in all, each partition's share in
    proportion to its backlog (as Kafka's source does), remainders to the largest."""
    backlog = {name: ends[name] - begins[name] for name in ends}
    total = sum(backlog.values())
    if total <= max_rows:
        return dict(ends)
    share = {name: max_rows * size // total for name, size in backlog.items()}
    left = max_rows - sum(share.values())
    for name in sorted(backlog, key=lambda n: backlog[n] - share[n], reverse=True)[:left]:
        share[name] += 1
    return {name: begins[name] + share[name] for name in ends}
