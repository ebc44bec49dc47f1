"""How a store keeps its topics under an s3:// prefix (ObjectLayout), with a local
directory for what is not durable (log segments, locks, a read cache).

Invariant (the Layout invariant of compactlog.backend, on S3): a topic exists exactly
when its metadata document holds a live (not deleted) version, and creating or deleting
one is one step that readers see whole. There is no rename: a topic's partitions are
laid out under a prefix named by its topic id, which no other topic ever had, and the
topic comes into existence when its metadata document is committed (`If-None-Match: *`,
or on the deleted version of a former topic of that name); deletion commits a "deleted"
version first, then removes the partitions' objects. A crash between leaves objects
under an id that no live version names, which nothing reads.

Layout on S3 (PREFIX = the data location):
  PREFIX/topics/<topic>/meta/                 the topic's metadata document
  PREFIX/topics/<topic>/<topic id>/<n>/       partition n's manifest, segments/, ledger/
and in the local directory:
  <local>/topics/<topic>/<topic id>/<n>/      partition n's log/, locks, staging
  <local>/cache/                              downloaded copies of data files
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from compactlog.backend import (
    DELETED,
    Document,
    Location,
    PartitionMaker,
    Snapshot,
    Volume,
    clear_dead_claim,
    is_deleted,
    update_document,
)
from compactlog.backend.s3.abandoned_uploads import AbandonedUploads
from compactlog.backend.s3.bucket import Bucket
from compactlog.backend.s3.document import ObjectDocument
from compactlog.backend.s3.probe import check_conditional_writes
from compactlog.backend.s3.volume import ObjectVolume, remove_prefix, s3_client
from compactlog.errors import ConflictError, TopicExistsError, UnknownTopicError

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

log = logging.getLogger(__name__)


class ObjectLayout:
    """PREFIX/topics/<topic>/{meta,<topic id>/<n>} on S3; logs under a local directory."""

    def __init__(self, location: Location, local_dir: Path,
                 client: S3Client | None = None) -> None:
        self.location = location
        self.local_dir = local_dir
        self.client = client if client is not None else s3_client()
        self.cache_dir = local_dir / "cache"

    names_are_topics = False

    def check_readable(self) -> None:
        self.local_dir.mkdir(parents=True, exist_ok=True)  # the reader's read cache

    def prepare(self) -> None:
        # A store whose conditional writes do nothing would let two commits both land:
        # refuse it before writing anything (probe.py).
        check_conditional_writes(self.location, self.client)
        (self.local_dir / "topics").mkdir(parents=True, exist_ok=True)

    def may_hold(self, name: str) -> bool:
        return True  # only a LIST or the metadata could tell

    def meta_document(self, name: str) -> Document:
        assert self.location.bucket is not None
        return ObjectDocument(self.client, self.location.bucket,
                              self.location.key(f"topics/{name}/meta"))

    def lease_document(self) -> Document:
        """The writer lease (lease.py)."""
        return self.state_document("writer")

    def state_document(self, name: str) -> Document:
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

        def created(found: Snapshot | None) -> dict[str, Any]:
            # Another writer created (or re-created) it first: our partitions are then
            # unreferenced objects under an id no topic has. A killed committer's claim
            # on the next version is cleared on the way (update_document).
            if found is not None and not is_deleted(found.body):
                raise TopicExistsError(name)
            return meta

        update_document(document, created, loaded=current)

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

    def upload_sweeper(self, min_age_s: float) -> AbandonedUploads:
        return AbandonedUploads(Bucket(self.client, str(self.location.bucket)),
                                self.location.path + "/" if self.location.path else "",
                                min_age_s)

    def remove_leftovers(self) -> None:
        """Nothing to do: an interrupted create or delete leaves objects under a topic id
        that no live metadata names, which nothing reads."""
