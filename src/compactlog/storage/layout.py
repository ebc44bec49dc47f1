"""Where a store keeps its topics: in its local data directory, or under an s3:// prefix
with a local directory for what is not durable (log segments, locks, a read cache).

Invariant: a topic exists exactly when its metadata document holds a live (not deleted)
version, and creating or deleting one is one step that readers see whole:
- locally, a topic is built under staging/ and renamed into topics/, and deleted by a
  rename into staging/ (the directory is the existence);
- on S3 there is no rename: a topic's partitions are laid out under a prefix named by
  its topic id, which no other topic ever had, and the topic comes into existence when
  its metadata document is committed (`If-None-Match: *`, or on the deleted version of
  a former topic of that name); deletion commits a "deleted" version first, then removes
  the partitions' objects. A crash between leaves objects under an id that no live
  version names, which nothing reads.

Layout on S3 (PREFIX = the data location):
  PREFIX/topics/<topic>/meta/                 the topic's metadata document
  PREFIX/topics/<topic>/<topic id>/<n>/       partition n's manifest, segments/, ledger/
and in the local directory:
  <local>/topics/<topic>/<topic id>/<n>/      partition n's log/, locks, staging
  <local>/cache/                              downloaded copies of data files
"""

from __future__ import annotations

import logging
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from compactlog import faults, fsutil
from compactlog.errors import ConflictError, TopicExistsError, UnknownTopicError
from compactlog.storage.bucket import Bucket
from compactlog.storage.commit import LocalDocument, Snapshot
from compactlog.storage.document import Document, clear_dead_claim
from compactlog.storage.location import Location
from compactlog.storage.volume import LocalVolume, ObjectVolume, Volume, remove_prefix, s3_client

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

log = logging.getLogger(__name__)

CREATING = "creating-"
DELETING = "deleting-"
DELETED = "deleted"

# Lays out an empty partition: (local directory, volume) -> None.
PartitionMaker = Callable[[Path, Volume], None]


def is_deleted(body: dict[str, Any]) -> bool:
    return bool(body.get(DELETED))


class Layout(Protocol):
    """How a store finds, creates and deletes its topics (see the module's invariant)."""

    def meta_document(self, name: str) -> Document: ...

    def names(self) -> list[str]:
        """Names that may be topics (the caller loads their metadata to be sure)."""
        ...

    def partition_dir(self, name: str, topic_id: str, index: int) -> Path: ...

    def partition_volume(self, name: str, topic_id: str, index: int) -> Volume: ...

    def create(self, name: str, topic_id: str, partitions: int, meta: dict[str, Any],
               make_partition: PartitionMaker) -> None: ...

    def delete(self, name: str, snapshot: Snapshot | None) -> None:
        """Delete topic `name` (`snapshot`: its metadata as the caller last loaded it)."""
        ...

    def remove_leftovers(self) -> None: ...

    def state_document(self, name: str) -> Document:
        """A document of the server's own state (credentials, ACLs, the producer-id
        counter, the cluster id) kept with the topics, so that whoever opens the same
        location finds it: `name` is its path under the data location."""
        ...


def state_document(location: Location, local_dir: Path, name: str) -> Document:
    """`state_document` of the store at `location` without opening it (no writer lease:
    the CLI's `users` and `acls` change the documents beside a running server)."""
    if location.is_s3:
        return ObjectLayout(location, local_dir).state_document(name)
    return LocalDocument(local_dir / name)


class LocalLayout:
    """<data dir>/topics/<topic>/{meta,<n>}, built under <data dir>/staging/."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.topics_dir = data_dir / "topics"
        self.staging_dir = data_dir / "staging"

    def prepare(self) -> None:
        self.topics_dir.mkdir(parents=True, exist_ok=True)
        self.staging_dir.mkdir(exist_ok=True)

    def meta_document(self, name: str) -> Document:
        return LocalDocument(self.topics_dir / name / "meta")

    def names(self) -> list[str]:
        if not self.topics_dir.is_dir():
            return []
        return sorted(entry.name for entry in self.topics_dir.iterdir() if entry.is_dir())

    def partition_dir(self, name: str, topic_id: str, index: int) -> Path:
        return self.topics_dir / name / str(index)

    def partition_volume(self, name: str, topic_id: str, index: int) -> Volume:
        return LocalVolume(self.partition_dir(name, topic_id, index))

    def create(self, name: str, topic_id: str, partitions: int, meta: dict[str, Any],
               make_partition: PartitionMaker) -> None:
        final = self.topics_dir / name
        if final.exists():
            raise TopicExistsError(name)
        staging = self.staging_dir / f"{CREATING}{uuid.uuid4().hex}"
        staging.mkdir()
        for index in range(partitions):
            directory = staging / str(index)
            (directory / "manifest").mkdir(parents=True)
            make_partition(directory, LocalVolume(directory))
        LocalDocument(staging / "meta").commit(0, meta)
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

    def delete(self, name: str, snapshot: Snapshot | None) -> None:
        directory = self.topics_dir / name
        if not directory.is_dir():
            raise UnknownTopicError(name)
        doomed = self.staging_dir / f"{DELETING}{uuid.uuid4().hex}"
        faults.point("rename", doomed)
        os.rename(directory, doomed)
        fsutil.fsync_dir(self.topics_dir)
        fsutil.fsync_dir(self.staging_dir)
        shutil.rmtree(doomed, ignore_errors=True)

    def remove_leftovers(self) -> None:
        for entry in self.staging_dir.iterdir():
            shutil.rmtree(entry, ignore_errors=True)
            log.info("removed %s, left by an interrupted create or delete", entry.name)
        for entry in self.topics_dir.iterdir():
            if entry.is_dir():
                for temp in LocalDocument(entry / "meta").recover():
                    log.info("removed %s, left by an interrupted topic change", temp)

    def state_document(self, name: str) -> Document:
        return LocalDocument(self.data_dir / name)


class ObjectLayout:
    """PREFIX/topics/<topic>/{meta,<topic id>/<n>} on S3; logs under a local directory."""

    def __init__(self, location: Location, local_dir: Path,
                 client: S3Client | None = None) -> None:
        self.location = location
        self.local_dir = local_dir
        self.client = client if client is not None else s3_client()
        self.cache_dir = local_dir / "cache"

    def prepare(self) -> None:
        (self.local_dir / "topics").mkdir(parents=True, exist_ok=True)

    def meta_document(self, name: str) -> Document:
        from compactlog.storage.object_commit import ObjectDocument

        assert self.location.bucket is not None
        return ObjectDocument(self.client, self.location.bucket,
                              self.location.key(f"topics/{name}/meta"))

    def lease_document(self) -> Document:
        """The writer lease (lease.py)."""
        return self.state_document("writer")

    def state_document(self, name: str) -> Document:
        from compactlog.storage.object_commit import ObjectDocument

        assert self.location.bucket is not None
        return ObjectDocument(self.client, self.location.bucket, self.location.key(name))

    def names(self) -> list[str]:
        assert self.location.bucket is not None
        bucket = Bucket(self.client, self.location.bucket)
        return sorted(bucket.folders(self.location.key("topics") + "/"))

    def partition_dir(self, name: str, topic_id: str, index: int) -> Path:
        return self.local_dir / "topics" / name / topic_id / str(index)

    def partition_volume(self, name: str, topic_id: str, index: int) -> Volume:
        return ObjectVolume(self.location.join("topics", name, topic_id, str(index)),
                            self.cache_dir, self.client)

    def create(self, name: str, topic_id: str, partitions: int, meta: dict[str, Any],
               make_partition: PartitionMaker) -> None:
        document = self.meta_document(name)
        current = document.load()
        if current is not None and not is_deleted(current.body):
            raise TopicExistsError(name)
        for index in range(partitions):
            make_partition(self.partition_dir(name, topic_id, index),
                           self.partition_volume(name, topic_id, index))
        based_on = 0 if current is None else current.version
        for attempt in range(2):
            try:
                document.commit(based_on, meta)
                return
            except ConflictError:
                # A killed committer's claim on the next version is cleared and the
                # commit tried again; otherwise another writer created (or re-created)
                # it first, and our partitions are unreferenced objects under an id no
                # topic has.
                if attempt or not clear_dead_claim(document, based_on):
                    raise TopicExistsError(name) from None

    def delete(self, name: str, snapshot: Snapshot | None) -> None:
        document = self.meta_document(name)
        if snapshot is None:
            snapshot = document.load()
        if snapshot is None or is_deleted(snapshot.body):
            raise UnknownTopicError(name)
        topic_id = str(snapshot.body["topic_id"])
        try:
            document.commit(snapshot.version, {DELETED: True, "name": name,
                                               "topic_id": topic_id})
        except ConflictError:
            clear_dead_claim(document, snapshot.version)  # the caller's retry lands
            raise
        shutil.rmtree(self.local_dir / "topics" / name / topic_id, ignore_errors=True)
        removed = remove_prefix(self.location.join("topics", name, topic_id), self.client)
        log.info("deleted topic %s: %d objects removed", name, removed)

    def remove_leftovers(self) -> None:
        """Nothing to do: an interrupted create or delete leaves objects under a topic id
        that no live metadata names, which nothing reads."""
