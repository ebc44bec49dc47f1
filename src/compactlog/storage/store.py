"""The log store: a data location of topics, each with N partitions.

Layout of a local data directory:
  <data dir>/.writer.lock            held (flock) by the one process that may write
  <data dir>/topics/<topic>/meta/    versioned topic document: id, partitions, config
  <data dir>/topics/<topic>/<n>/     partition n (see partition.py)
  <data dir>/staging/                topics being created or deleted

Topic creation builds the whole topic under staging/ and renames it into place, so a
crash never leaves half a topic. Deletion renames the topic into staging/ first, so it
disappears at once, then removes the files; leftovers of either are removed on open.
Staging lives outside topics/ so that no topic name can be taken for a leftover.

A data location may also be an s3:// URL: then the durable files (metadata, manifests,
sealed segments, ledgers) are objects, and a local directory holds the log segments,
the writer lock and a read cache (backend/local/layout.py, backend/s3/layout.py). `data_dir` is
always the local directory.

One concept past 500 lines: the store is the one owner of the topics map and the writer
lock, and every method is a step under them (open, create, delete, a multi-partition
append, the upkeep of each partition); a topic's own rules are in topic.py.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from compactlog.backend import (
    Layout,
    Location,
    Snapshot,
    Volume,
    is_deleted,
    layout_for,
    update_document,
)
from compactlog.backend.lease import DEFAULT_TTL_S, LeaseLostError, WriterLease
from compactlog.config import TopicConfig
from compactlog.errors import (
    CompactlogError,
    CorruptionError,
    DataDirLockedError,
    ReadOnlyStoreError,
    StorageError,
    UnknownTopicError,
    UserError,
)
from compactlog.log_throttle import Throttle
from compactlog.storage.filecache import OpenFiles
from compactlog.storage.merging import merge_small_segments
from compactlog.storage.partition import AppendResult, Clock, Partition
from compactlog.storage.partitioner import NullKeyPartitioner, partitions_for_keys
from compactlog.storage.records import MAX_UNCOMPRESSED_BATCH_BYTES, ProducerRecord
from compactlog.storage.recovery import RecoveryReport
from compactlog.storage.topic import Topic, TopicMeta, is_topic_name, validate_topic_name
from compactlog.storage.upkeep_round import run_round

log = logging.getLogger(__name__)

MAX_PARTITIONS = 10_000
DEFAULT_MAX_OPEN_FILES = 128
# On an object store, how often the writer's upkeep looks for manifests that another
# process (a compaction) committed.
REMOTE_REFRESH_S = 5.0


class PartitionBudgetError(StorageError):
    """Opening (or creating) a topic would hold more partitions open than the store's
    `max_open_partitions`: each keeps its active log file open, and the open-file limit
    would run out."""


class LogStore:
    """Topics in a data directory. One writer process at a time; any number of readers."""

    def __init__(self, data_dir: Path, read_only: bool, clock: Clock,
                 max_open_files: int = DEFAULT_MAX_OPEN_FILES,
                 location: Location | None = None) -> None:
        self.data_dir = data_dir
        # Where the durable files are: data_dir itself, or an s3:// prefix.
        self.location = location if location is not None else Location(str(data_dir))
        self.layout: Layout = layout_for(self.location, data_dir)
        # Parquet files open at once, for every partition of the store (filecache.py).
        self.files = OpenFiles(max_open_files)
        self.topics_dir = data_dir / "topics"
        self.read_only = read_only
        self.clock = clock
        self._topics: dict[str, Topic] = {}
        self._lock = threading.RLock()
        self._lock_fd: int | None = None
        self._null_keys = NullKeyPartitioner()
        # Upkeep: failed partitions' next reopen, and each failure logged once a minute.
        self._reopen_at: dict[str, float] = {}
        self._reopen_delay: dict[str, float] = {}
        self._failure_log = Throttle(60.0)
        self._refreshed_at: dict[str, float] = {}  # object stores: last manifest pickup
        # True: a rolled segment is sealed into Parquet at once, by the append that
        # rolled it. A server sets False so that appends never wait for a seal, and
        # seals in tick() instead.
        self.auto_seal = True
        # The most a producer's compressed batch may decompress to; larger ones are
        # refused while decompressing (storage/inflate.py). A server sets its setting.
        self.max_uncompressed_batch_bytes = MAX_UNCOMPRESSED_BATCH_BYTES
        # The most partitions held open at once, each with its active log file open; None:
        # no bound. A server sets what its open-file limit allows: a create or an open
        # past it fails with PartitionBudgetError before anything is written or opened.
        self.max_open_partitions: int | None = None
        # On an object store, the writer's lease (lease.py); None for a local store.
        self.lease: WriterLease | None = None
        self.lease_lost: LeaseLostError | None = None

    @classmethod
    def open(
        cls, data_dir: str | os.PathLike[str] | Location, read_only: bool = False,
        clock: Clock = time.time, max_open_files: int = DEFAULT_MAX_OPEN_FILES,
        local_dir: str | os.PathLike[str] | None = None,
        lease_ttl_s: float = DEFAULT_TTL_S,
        keep_lease: bool = False,
    ) -> LogStore:
        """Open the store at `data_dir`: a local directory, or an s3:// URL whose log
        segments, writer lock and read cache go in `local_dir` (default: a directory
        under ~/.cache/compactlog named after the URL; see `default_local_dir`).
        `keep_lease`: on an s3:// URL, renew the writer lease on a thread of its own
        (a server); else only `tick` renews it (lease.py step 2)."""
        location = data_dir if isinstance(data_dir, Location) else Location.parse(data_dir)
        if location.is_s3:
            path = Path(local_dir) if local_dir is not None else default_local_dir(location)
        else:
            # As given (relative stays relative, so messages show what the user typed).
            path = Path(data_dir) if not isinstance(data_dir, Location) else Path(location.path)
        store = cls(path, read_only, clock, max_open_files, location)
        layout = store.layout
        if read_only:
            layout.check_readable()
        else:
            layout.prepare()
            store._take_writer_lock()
            lease_document = layout.lease_document()
            if lease_document is not None:
                store.lease = WriterLease(lease_document, str(location), lease_ttl_s, clock)
                try:
                    store.lease.acquire()
                except BaseException:
                    store.close()
                    raise
                if keep_lease:
                    store.lease.keep(store._lose_lease,
                                     lambda error: store._report("the writer lease", error))
            layout.remove_leftovers()
        return store

    @property
    def target(self) -> str | Path:
        """What opens this store again, in this or another process (with
        local_dir=data_dir): the data directory, or the s3:// URL."""
        return str(self.location) if self.location.is_s3 else self.data_dir

    def __enter__(self) -> LogStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _take_writer_lock(self) -> None:
        path = self.data_dir / ".writer.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown process"
            os.close(fd)
            raise DataDirLockedError(self.data_dir, holder) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}".encode(), 0)
        self._lock_fd = fd

    def close(self) -> None:
        lease = self.lease
        if lease is not None:
            # Before the store's lock: a keeper that finds the lease lost takes it.
            lease.stop_keeping()
        with self._lock:
            if self.location.is_s3 and not self.read_only and self.lease is not None:
                self._seal_everything()
            for topic in self._topics.values():
                topic.close()
            if self.lease is not None:
                try:
                    self.lease.release()
                except Exception as error:  # it expires by itself
                    log.warning("releasing the writer lease failed: %s", error)
                self.lease = None
            self._topics.clear()
            self.files.close_all()
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None

    def _seal_everything(self) -> None:
        """On an object store, a writer that closes seals its active segments, so that
        everything it acknowledged is in the bucket, not only on this machine's disk
        (a crash instead leaves them for the next writer on this local directory)."""
        for topic in self._topics.values():
            for partition in topic.partitions:
                if partition.failed is not None or not partition.logs:
                    continue
                try:
                    partition.flush()
                    if not partition.active.is_empty:
                        partition.roll()
                    partition.seal_rolled()
                except Exception as error:  # logged; the log files stay for the next open
                    log.error("%s: sealing at close failed; its records stay in %s until "
                              "the next writer on this directory seals them: %s",
                              partition.name, partition.log_dir, error)

    def require_serving(self) -> None:
        """LeaseLostError unless this process may acknowledge and serve now: on an object
        store, while it holds a valid writer lease (lease.py step 4); a local store and a
        read-only one always may."""
        if self.lease_lost is not None:
            raise self.lease_lost
        if self.lease is not None:
            self.lease.require_valid()

    def _require_writable(self) -> None:
        if self.read_only:
            raise ReadOnlyStoreError(f"data directory {self.location} is open read-only")
        if self.lease_lost is not None:
            raise self.lease_lost

    # -- topics ---------------------------------------------------------------------

    def create_topic(
        self, name: str, partitions: int = 1, config: Mapping[str, object] | None = None
    ) -> Topic:
        self._require_writable()
        validate_topic_name(name)
        if not 1 <= partitions <= MAX_PARTITIONS:
            raise UserError(f"partitions must be in [1, {MAX_PARTITIONS}], got {partitions}")
        topic_config = TopicConfig.from_strings(config or {})
        with self._lock:
            if name not in self._topics:  # else TopicExistsError, as before
                self.check_partition_budget(partitions, creating=name)
            meta = TopicMeta(
                name, uuid.uuid4().hex, partitions, topic_config, int(self.clock() * 1000)
            )

            def make_partition(directory: Path, volume: Volume) -> None:
                Partition.create(directory, name, index=0, config=lambda: topic_config,
                                 volume=volume)

            self.layout.create(name, meta.topic_id, partitions, meta.to_json(),
                               make_partition)
            log.info("created topic %s with %d partitions", name, partitions)
            return self.topic(name)

    def list_topics(self) -> list[str]:
        names = self.layout.names()
        if self.layout.names_are_topics:
            return names
        # On S3 a name is a key prefix: a deleted topic's (or a failed create's) stays
        # until its metadata is gone, so ask the metadata of names not open here.
        return [name for name in names if name in self._topics or self._is_live(name)]

    def partition_count(self, names: list[str] | None = None) -> int:
        """Partitions of every topic, open here or not (the others' metadata is read)."""
        total = 0
        for name in self.list_topics() if names is None else names:
            with self._lock:
                topic = self._topics.get(name)
            if topic is not None:
                total += topic.meta.partitions
                continue
            try:
                loaded = self.layout.meta_document(name).load() if is_topic_name(name) else None
            except (OSError, CompactlogError):
                continue
            if loaded is not None and not is_deleted(loaded.body):
                total += int(loaded.body.get("partitions", 0))
        return total

    def check_partition_budget(self, more: int, creating: str | None = None) -> None:
        """PartitionBudgetError if `more` new partitions would take the store past
        `max_open_partitions` (checked before a create writes anything; not when the
        topic being created exists, which the create refuses as such)."""
        limit = self.max_open_partitions
        if limit is None:
            return
        names = self.list_topics()
        if creating in names:
            return
        held = self.partition_count(names)
        if held + more > limit:
            raise PartitionBudgetError(
                f"{more} more partition(s) would make {held + more}, more than the "
                f"{limit} this server can keep open under its open-file limit "
                f"(RLIMIT_NOFILE; each partition keeps its log file open): raise the "
                f"limit (ulimit -n, LimitNOFILE=) or use fewer partitions")

    def topic_ids(self) -> dict[str, str]:
        """Every topic's id (hex) -> its name: the ids of the topics open here, and the
        metadata of the others, read without opening their partitions. One listing per
        call, so that a request naming many ids resolves them all through one map,
        never by scanning the topics per id."""
        found: dict[str, str] = {}
        for name in self.list_topics():
            with self._lock:
                topic = self._topics.get(name)
            if topic is not None:
                found[topic.meta.topic_id] = name
                continue
            try:
                loaded = self.layout.meta_document(name).load() if is_topic_name(name) else None
            except (OSError, CompactlogError):
                continue  # unreadable: no id resolves to it (opening it would fail too)
            if loaded is not None and not is_deleted(loaded.body):
                found[str(loaded.body.get("topic_id"))] = name
        return found

    def _is_live(self, name: str) -> bool:
        if not is_topic_name(name):
            return False
        loaded = self.layout.meta_document(name).load()
        return loaded is not None and not is_deleted(loaded.body)

    def topic(self, name: str) -> Topic:
        with self._lock:
            topic = self._topics.get(name)
            if topic is not None:
                if self.read_only:
                    self._refresh_meta(topic)
                return topic
            if not is_topic_name(name) or not self.layout.may_hold(name):
                raise UnknownTopicError(name)
            document = self.layout.meta_document(name)
            loaded = document.load()
            if loaded is None and self.layout.names_are_topics:
                # create renames a complete topic into place, so no crash leaves this.
                raise CorruptionError(
                    self.topics_dir / name / "meta",
                    f"topic {name!r} exists but its metadata is missing"
                )
            if loaded is None or is_deleted(loaded.body):
                raise UnknownTopicError(name)
            topic = Topic(self, TopicMeta.from_json(loaded.body), loaded)
            self._check_open_budget(topic)
            topic.open_partitions()
            self._topics[name] = topic
            return topic

    def _check_open_budget(self, topic: Topic) -> None:
        limit = self.max_open_partitions
        if limit is None:
            return
        held = sum(len(other.partitions) for other in self._topics.values())
        if held + topic.meta.partitions > limit:
            raise PartitionBudgetError(
                f"topic {topic.name!r} cannot be opened: its {topic.meta.partitions} "
                f"partition(s) and the {held} open would be more than the {limit} this "
                f"server can keep open under its open-file limit (RLIMIT_NOFILE); raise "
                f"the limit (ulimit -n, LimitNOFILE=)")

    def _refresh_meta(self, topic: Topic) -> None:
        if topic.document.changed_since(topic.meta_snapshot):
            loaded = topic.document.load()
            if loaded is None or is_deleted(loaded.body):
                raise UnknownTopicError(topic.name)
            topic.meta_snapshot = loaded
            topic.meta = TopicMeta.from_json(loaded.body)

    def alter_topic(
        self, name: str, set_values: Mapping[str, object], delete: Iterable[str] = ()
    ) -> TopicConfig:
        self._require_writable()
        with self._lock:
            topic = self.topic(name)

            def altered(snapshot: Snapshot | None) -> dict[str, Any]:
                # Applied to the committed version (update_document: a killed
                # committer's claim on the next one is cleared on the way). A topic
                # deleted or re-created meanwhile is not this one.
                if snapshot is None or is_deleted(snapshot.body) \
                        or snapshot.body.get("topic_id") != topic.meta.topic_id:
                    raise UnknownTopicError(name)
                current = TopicMeta.from_json(snapshot.body)
                return replace(current, config=current.config.altered(set_values, delete)
                               ).to_json()

            committed = update_document(topic.document, altered, loaded=topic.meta_snapshot)
            assert committed is not None  # `altered` always has a body to commit
            topic.meta_snapshot = committed
            topic.meta = TopicMeta.from_json(committed.body)
            new_config = topic.meta.config
            log.info("altered topic %s: set %s, deleted %s", name, dict(set_values), list(delete))
            return new_config

    def delete_topic(self, name: str) -> None:
        self._require_writable()
        with self._lock:
            if not is_topic_name(name):
                raise UnknownTopicError(name)
            topic = self._topics.pop(name, None)
            if topic is not None:
                topic.close()
            self.layout.delete(name, None if topic is None else topic.meta_snapshot)
            log.info("deleted topic %s", name)

    def recovery_reports(self, name: str) -> list[RecoveryReport]:
        return [partition.recovery for partition in self.topic(name).partitions]

    # -- records --------------------------------------------------------------------

    def append(
        self,
        topic_name: str,
        records: Sequence[ProducerRecord],
        partition: int | None = None,
    ) -> list[AppendResult]:
        """Append records, each to its key's partition (or to `partition` when given).

        Records for one partition go in as one batch, in the order given; the results list
        one (partition, base offset, last offset) per partition touched.
        """
        self._require_writable()
        topic = self.topic(topic_name)
        count = len(topic.partitions)
        # Check the whole request first, so that a refused record leaves nothing appended.
        topic.partitions[0].check_keys(records)
        if partition is not None:
            return [topic.partition(partition).append(records)]
        if count == 1:
            return [topic.partitions[0].append(records)]
        groups: dict[int, list[ProducerRecord]] = defaultdict(list)
        keyless = self._null_keys.next(count)
        for record, target in zip(
            records, partitions_for_keys([r.key for r in records], count, keyless), strict=True
        ):
            groups[target].append(record)
        prepared = [
            (topic.partitions[index], topic.partitions[index].prepare(group))
            for index, group in sorted(groups.items())
        ]
        return [target.append_prepared(batch) for target, batch in prepared]

    def open_partitions(self) -> list[Partition]:
        """The partitions of the topics opened so far (no request to the store)."""
        with self._lock:
            return [partition for topic in self._topics.values()
                    for partition in topic.partitions]

    def flush(self) -> None:
        with self._lock:
            for topic in self._topics.values():
                for partition in topic.partitions:
                    partition.flush()

    def tick(self) -> None:
        """Periodic upkeep for a long-running writer: one round of storage/upkeep_round.py
        (`upkeep_steps` for every partition), each failure logged once a minute."""
        if self.lease_lost is not None:
            return  # nothing to keep up: the partitions belong to the newer writer
        self._require_writable()
        run_round(self, lambda where, step, error: self._report(f"{where} ({step})", error))

    def renew_lease(self) -> None:
        """Renew the writer lease when due (lease.py); a lost lease stops every
        partition's writes (a newer writer owns them; it fences this one anyway)."""
        lease = self.lease
        if lease is None or not lease.renewal_due:
            return
        try:
            lease.renew_if_due()
        except LeaseLostError as error:
            self._lose_lease(error)
        except Exception as error:  # the store was unreachable: retried next tick
            self._report("the writer lease", error)

    def _lose_lease(self, error: LeaseLostError) -> None:
        """A newer writer owns the partitions: every one stops taking writes (it fences
        this writer's commits anyway) and the store serves nothing (`require_serving`)."""
        self.lease = None
        self.lease_lost = error
        with self._lock:
            partitions = [partition for topic in self._topics.values()
                          for partition in topic.partitions]
        for partition in partitions:
            partition.fail(error)
        log.error("%s", error)

    def upkeep_steps(self, partition: Partition) -> Iterator[tuple[str, Callable[[], object]]]:
        """The named steps of one partition's upkeep: reopen it if it failed (with a
        backoff), else flush by flush.ms, roll by segment.ms, seal rolled segments,
        merge runs of small sealed segments (merging.py), apply retention, sweep
        unreachable files when due, and pick up manifests that other processes
        (compaction) committed. Callers run each step on its own."""
        if partition.failed is not None:
            yield "reopen", lambda: self._reopen_if_due(partition)
            return
        yield "flush", partition.flush_if_due
        yield "roll", partition.roll_if_due
        if not partition.auto_seal:
            yield "seal", partition.seal_rolled
        yield "merge", lambda: merge_small_segments(partition)
        yield "retention", partition.apply_retention
        if partition.sweeps.due:
            yield "sweep", partition.sweep
        if partition.volume.is_local or self._remote_refresh_due(partition):
            # On an object store each look at the manifest is a request, and only
            # compactions commit besides this writer: every few seconds is enough.
            yield "refresh", partition.refresh

    def _remote_refresh_due(self, partition: Partition) -> bool:
        now = time.monotonic()
        if now - self._refreshed_at.get(partition.name, -1e9) < REMOTE_REFRESH_S:
            return False
        self._refreshed_at[partition.name] = now
        return True

    def _reopen_if_due(self, partition: Partition) -> None:
        now = time.monotonic()
        if now < self._reopen_at.get(partition.name, 0.0):
            return
        delay = min(2 * self._reopen_delay.get(partition.name, 2.5), 300.0)
        self._reopen_delay[partition.name] = delay
        self._reopen_at[partition.name] = now + delay
        partition.reopen()
        if partition.failed is None:
            log.info("%s: reopened after a failure; it takes writes again", partition.name)
            self._reopen_delay.pop(partition.name, None)
            self._reopen_at.pop(partition.name, None)
        else:
            raise partition.failed if isinstance(partition.failed, Exception) else \
                RuntimeError(str(partition.failed))

    def _report(self, where: str, error: Exception) -> None:
        """Log an upkeep failure once a minute per place and message, not every tick."""
        if self._failure_log.allow((where, str(error))) is not None:
            log.warning("upkeep of %s failed (retried every tick): %s", where, error)


def default_local_dir(location: Location) -> Path:
    """The local directory of an s3:// store when none is given: COMPACTLOG_LOCAL_DIR,
    else ~/.cache/compactlog/s3/<bucket>/<prefix> (one per URL, so two stores on one
    machine never share log segments)."""
    configured = os.environ.get("COMPACTLOG_LOCAL_DIR")
    if configured:
        return Path(configured)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    assert location.bucket is not None
    return cache / "compactlog" / "s3" / location.bucket / (location.path or "_root")
