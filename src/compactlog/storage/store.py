"""The log store: a data directory of topics, each with N partitions.

Layout:
  <data dir>/.writer.lock            held (flock) by the one process that may write
  <data dir>/topics/<topic>/meta/    versioned topic document: id, partitions, config
  <data dir>/topics/<topic>/<n>/     partition n (see partition.py)
  <data dir>/staging/                topics being created or deleted

Topic creation builds the whole topic under staging/ and renames it into place, so a
crash never leaves half a topic. Deletion renames the topic into staging/ first, so it
disappears at once, then removes the files; leftovers of either are removed on open.
Staging lives outside topics/ so that no topic name can be taken for a leftover.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import shutil
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compactlog.config import TopicConfig
from compactlog.errors import (
    CorruptionError,
    DataDirLockedError,
    InvalidTopicNameError,
    ReadOnlyStoreError,
    TopicExistsError,
    UnknownPartitionError,
    UnknownTopicError,
    UserError,
)
from compactlog.storage import faults, fsutil
from compactlog.storage.commit import LocalDocument, Snapshot
from compactlog.storage.filecache import OpenFiles
from compactlog.storage.partition import AppendResult, Clock, Partition, RecoveryReport
from compactlog.storage.partitioner import NullKeyPartitioner, partitions_for_keys
from compactlog.storage.records import ProducerRecord

log = logging.getLogger(__name__)

TOPIC_NAME = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")
MAX_PARTITIONS = 10_000
DEFAULT_MAX_OPEN_FILES = 128
CREATING = "creating-"
DELETING = "deleting-"


def is_topic_name(name: str) -> bool:
    return name not in (".", "..") and TOPIC_NAME.match(name) is not None


def validate_topic_name(name: str) -> None:
    if not is_topic_name(name):
        raise InvalidTopicNameError(
            f"invalid topic name {name!r}: use 1 to 249 characters from "
            "a-z, A-Z, 0-9, '.', '_' and '-', and not '.' or '..'"
        )


@dataclass(frozen=True)
class TopicMeta:
    name: str
    topic_id: str
    partitions: int
    config: TopicConfig
    created_ms: int

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "topic_id": self.topic_id,
            "partitions": self.partitions,
            "config": dict(self.config.overrides),
            "created_ms": self.created_ms,
        }

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> TopicMeta:
        return cls(
            name=str(body["name"]),
            topic_id=str(body["topic_id"]),
            partitions=int(body["partitions"]),
            config=TopicConfig.from_strings(body.get("config") or {}),
            created_ms=int(body["created_ms"]),
        )


class Topic:
    def __init__(self, store: LogStore, directory: Path, meta: TopicMeta,
                 snapshot: Snapshot) -> None:
        self.store = store
        self.directory = directory
        self.document = LocalDocument(directory / "meta")
        self.meta = meta
        self.meta_snapshot = snapshot
        self.partitions: list[Partition] = []

    @property
    def meta_version(self) -> int:
        return self.meta_snapshot.version

    @property
    def name(self) -> str:
        return self.meta.name

    @property
    def config(self) -> TopicConfig:
        return self.meta.config

    def partition(self, index: int) -> Partition:
        if not 0 <= index < len(self.partitions):
            raise UnknownPartitionError(self.name, index, len(self.partitions))
        return self.partitions[index]

    def open_partitions(self) -> None:
        try:
            for index in range(self.meta.partitions):
                partition = Partition(
                    self.directory / str(index),
                    self.name,
                    index,
                    lambda: self.meta.config,
                    writable=not self.store.read_only,
                    clock=self.store.clock,
                    files=self.store.files,
                )
                partition.auto_seal = self.store.auto_seal
                self.partitions.append(partition.open())
        except BaseException:
            self.close()  # a damaged partition must not leave the others' files open
            raise

    def close(self) -> None:
        for partition in self.partitions:
            partition.close()
        self.partitions = []


class LogStore:
    """Topics in a data directory. One writer process at a time; any number of readers."""

    def __init__(self, data_dir: Path, read_only: bool, clock: Clock,
                 max_open_files: int = DEFAULT_MAX_OPEN_FILES) -> None:
        self.data_dir = data_dir
        # Parquet files open at once, for every partition of the store (filecache.py).
        self.files = OpenFiles(max_open_files)
        self.topics_dir = data_dir / "topics"
        self.staging_dir = data_dir / "staging"
        self.read_only = read_only
        self.clock = clock
        self._topics: dict[str, Topic] = {}
        self._lock = threading.RLock()
        self._lock_fd: int | None = None
        self._null_keys = NullKeyPartitioner()
        # Upkeep: failed partitions' next reopen, and when each failure was last logged.
        self._reopen_at: dict[str, float] = {}
        self._reopen_delay: dict[str, float] = {}
        self._reported: dict[tuple[str, str], float] = {}
        # True: a rolled segment is sealed into Parquet at once, by the append that
        # rolled it. A server sets False so that appends never wait for a seal, and
        # seals in tick() instead.
        self.auto_seal = True

    @classmethod
    def open(
        cls, data_dir: str | os.PathLike[str], read_only: bool = False, clock: Clock = time.time,
        max_open_files: int = DEFAULT_MAX_OPEN_FILES,
    ) -> LogStore:
        path = Path(data_dir)
        store = cls(path, read_only, clock, max_open_files)
        if read_only:
            if not store.topics_dir.is_dir():
                raise UserError(f"no compactlog data directory at {path}")
        else:
            store.topics_dir.mkdir(parents=True, exist_ok=True)
            store.staging_dir.mkdir(exist_ok=True)
            store._take_writer_lock()
            store._remove_leftovers()
        return store

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

    def _remove_leftovers(self) -> None:
        for entry in self.staging_dir.iterdir():
            shutil.rmtree(entry, ignore_errors=True)
            log.info("removed %s, left by an interrupted create or delete", entry.name)
        for entry in self.topics_dir.iterdir():
            if entry.is_dir():
                for temp in LocalDocument(entry / "meta").recover():
                    log.info("removed %s, left by an interrupted topic change", temp)

    def close(self) -> None:
        with self._lock:
            for topic in self._topics.values():
                topic.close()
            self._topics.clear()
            self.files.close_all()
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None

    def _require_writable(self) -> None:
        if self.read_only:
            raise ReadOnlyStoreError(f"data directory {self.data_dir} is open read-only")

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
            final = self.topics_dir / name
            if final.exists():
                raise TopicExistsError(name)
            meta = TopicMeta(
                name, uuid.uuid4().hex, partitions, topic_config, int(self.clock() * 1000)
            )
            staging = self.staging_dir / f"{CREATING}{uuid.uuid4().hex}"
            staging.mkdir()
            for index in range(partitions):
                Partition.create(staging / str(index), name, index, lambda: topic_config)
            LocalDocument(staging / "meta").commit(0, meta.to_json())
            try:
                faults.point("rename", final)
                os.rename(staging, final)
            except OSError:
                shutil.rmtree(staging, ignore_errors=True)
                if final.exists():
                    raise TopicExistsError(name) from None
                raise
            fsutil.fsync_dir(self.topics_dir)
            fsutil.fsync_dir(self.staging_dir)
            log.info("created topic %s with %d partitions", name, partitions)
            return self.topic(name)

    def list_topics(self) -> list[str]:
        if not self.topics_dir.is_dir():
            return []
        return sorted(entry.name for entry in self.topics_dir.iterdir() if entry.is_dir())

    def topic(self, name: str) -> Topic:
        with self._lock:
            topic = self._topics.get(name)
            if topic is not None:
                if self.read_only:
                    self._refresh_meta(topic)
                return topic
            directory = self.topics_dir / name
            if not is_topic_name(name) or not directory.is_dir():
                raise UnknownTopicError(name)
            loaded = LocalDocument(directory / "meta").load()
            if loaded is None:
                # create renames a complete topic into place, so no crash leaves this.
                raise CorruptionError(
                    directory / "meta", f"topic {name!r} exists but its metadata is missing"
                )
            topic = Topic(self, directory, TopicMeta.from_json(loaded.body), loaded)
            topic.open_partitions()
            self._topics[name] = topic
            return topic

    def _refresh_meta(self, topic: Topic) -> None:
        if topic.document.changed_since(topic.meta_snapshot):
            loaded = topic.document.load()
            if loaded is None:
                raise UnknownTopicError(topic.name)
            topic.meta_snapshot = loaded
            topic.meta = TopicMeta.from_json(loaded.body)

    def alter_topic(
        self, name: str, set_values: Mapping[str, object], delete: Iterable[str] = ()
    ) -> TopicConfig:
        self._require_writable()
        with self._lock:
            topic = self.topic(name)
            new_config = topic.meta.config.altered(set_values, delete)
            meta = TopicMeta(
                topic.meta.name, topic.meta.topic_id, topic.meta.partitions, new_config,
                topic.meta.created_ms,
            )
            topic.meta_snapshot = topic.document.commit(topic.meta_version, meta.to_json())
            topic.meta = meta
            log.info("altered topic %s: set %s, deleted %s", name, dict(set_values), list(delete))
            return new_config

    def delete_topic(self, name: str) -> None:
        self._require_writable()
        with self._lock:
            directory = self.topics_dir / name
            if not is_topic_name(name) or not directory.is_dir():
                raise UnknownTopicError(name)
            topic = self._topics.pop(name, None)
            if topic is not None:
                topic.close()
            doomed = self.staging_dir / f"{DELETING}{uuid.uuid4().hex}"
            faults.point("rename", doomed)
            os.rename(directory, doomed)
            fsutil.fsync_dir(self.topics_dir)
            fsutil.fsync_dir(self.staging_dir)
            shutil.rmtree(doomed, ignore_errors=True)
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

    def flush(self) -> None:
        with self._lock:
            for topic in self._topics.values():
                for partition in topic.partitions:
                    partition.flush()

    def tick(self) -> None:
        """Periodic upkeep for a long-running writer (`upkeep_steps` for every
        partition). One step's failure is logged and never stops the other steps or
        partitions."""
        self._require_writable()
        for name in self.list_topics():
            try:
                partitions = self.topic(name).partitions
            except Exception as error:  # a topic deleted meanwhile, or damaged metadata
                self._report(name, error)
                continue
            for partition in partitions:
                for step, call in self.upkeep_steps(partition):
                    try:
                        call()
                    except Exception as error:  # logged; the next tick tries again
                        self._report(f"{partition.name} ({step})", error)

    def upkeep_steps(self, partition: Partition) -> Iterator[tuple[str, Callable[[], object]]]:
        """The named steps of one partition's upkeep: reopen it if it failed (with a
        backoff), else flush by flush.ms, roll by segment.ms, seal rolled segments,
        apply retention, sweep unreachable files when due, and pick up manifests that
        other processes (compaction) committed. Callers run each step on its own."""
        if partition.failed is not None:
            yield "reopen", lambda: self._reopen_if_due(partition)
            return
        yield "flush", partition.flush_if_due
        yield "roll", partition.roll_if_due
        if not partition.auto_seal:
            yield "seal", partition.seal_rolled
        yield "retention", partition.apply_retention
        if partition.sweep_due:
            yield "sweep", partition.sweep
        yield "refresh", partition.refresh

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
        key = (where, str(error))
        now = time.monotonic()
        if now - self._reported.get(key, -1e9) >= 60.0:
            self._reported[key] = now
            log.warning("upkeep of %s failed (retried every tick): %s", where, error)
        if len(self._reported) > 10_000:
            self._reported.clear()
