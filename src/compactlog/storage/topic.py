"""A topic of the store: its metadata document's body (TopicMeta), its name rules, and
its open partitions (Topic).

Invariant: a Topic holds the partitions its metadata names, all open or none: a
partition that fails to open closes the ones opened before it, so a damaged partition
never leaves the others' files open (Topic.open_partitions).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from compactlog.backend import Snapshot
from compactlog.config import TopicConfig
from compactlog.errors import InvalidTopicNameError, UnknownPartitionError
from compactlog.storage.partition import Partition

if TYPE_CHECKING:
    from compactlog.storage.store import LogStore

# Matched whole (fullmatch): `$` would also match before a final newline.
TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]{1,249}")


def is_topic_name(name: str) -> bool:
    return name not in (".", "..") and TOPIC_NAME.fullmatch(name) is not None


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
            config=TopicConfig.from_stored(body.get("config") or {}),
            created_ms=int(body["created_ms"]),
        )


class Topic:
    def __init__(self, store: LogStore, meta: TopicMeta, snapshot: Snapshot) -> None:
        self.store = store
        self.document = store.layout.meta_document(meta.name)
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
            layout, topic_id = self.store.layout, self.meta.topic_id
            for index in range(self.meta.partitions):
                partition = Partition(
                    layout.partition_dir(self.name, topic_id, index),
                    self.name,
                    index,
                    lambda: self.meta.config,
                    writable=not self.store.read_only,
                    clock=self.store.clock,
                    files=self.store.files,
                    volume=layout.partition_volume(self.name, topic_id, index),
                )
                if self.store.lease is not None:
                    partition.writer_epoch = self.store.lease.epoch
                partition.auto_seal = self.store.auto_seal
                partition.max_uncompressed_batch_bytes = (
                    self.store.max_uncompressed_batch_bytes)
                self.partitions.append(partition.open())
        except BaseException:
            self.close()  # a damaged partition must not leave the others' files open
            raise

    def close(self) -> None:
        for partition in self.partitions:
            partition.close()
        self.partitions = []
