"""How a store keeps its topics in its local data directory (LocalLayout).

Invariant (the Layout invariant of compactlog.backend, locally): a topic exists exactly
when its metadata document holds a live version, and creating or deleting one is one
step that readers see whole: a topic is built under staging/ and renamed into topics/,
and deleted by a rename into staging/ (the directory is the existence).

  <data dir>/topics/<topic>/meta/        the topic's metadata document
  <data dir>/topics/<topic>/<n>/         partition n
  <data dir>/staging/                    topics being created or deleted
"""

from __future__ import annotations

import logging
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from compactlog import faults, fsutil
from compactlog.backend import Document, PartitionMaker, Snapshot, Volume
from compactlog.backend.local.document import LocalDocument
from compactlog.backend.local.volume import LocalVolume
from compactlog.errors import TopicExistsError, UnknownTopicError, UserError

log = logging.getLogger(__name__)

CREATING = "creating-"
DELETING = "deleting-"


class LocalLayout:
    """<data dir>/topics/<topic>/{meta,<n>}, built under <data dir>/staging/."""

    names_are_topics = True

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.topics_dir = data_dir / "topics"
        self.staging_dir = data_dir / "staging"

    def check_readable(self) -> None:
        if not self.topics_dir.is_dir():
            raise UserError(f"no compactlog data directory at {self.data_dir}")

    def prepare(self) -> None:
        self.topics_dir.mkdir(parents=True, exist_ok=True)
        self.staging_dir.mkdir(exist_ok=True)

    def lease_document(self) -> None:
        return None  # the data directory's lock file excludes every other writer

    def may_hold(self, name: str) -> bool:
        return (self.topics_dir / name).is_dir()

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

    def upload_sweeper(self, min_age_s: float) -> None:
        return None  # files are written whole or not at all: no parts are left behind

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
