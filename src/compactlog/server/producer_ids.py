"""Producer ids for InitProducerId: handed out once, never again, across restarts and
take-overs.

Invariant: the counter's stored bound is above every id handed out. Ids are allocated
from a counter in `<data dir>/producer-ids.json`, reserved in blocks of ID_BLOCK_SIZE:
the file always holds an id above every id handed out, and is replaced atomically (temp
file, fsync, rename, fsync the directory) before an id of a new block is given out.
After a crash the rest of the block is skipped, never reused. On an object store the
counter is a document beside the topics (`producer-ids/`, DocumentIdAllocator): a block
is reserved by compare-and-swap, so a server that takes over from another, or a stalled
former owner, never hands out an id the other gave.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from compactlog import fsutil
from compactlog.backend import Document, Snapshot, update_document
from compactlog.errors import CorruptionError

ID_FILE = "producer-ids.json"
ID_BLOCK_SIZE = 1000
ID_FILE_FORMAT = 1
ID_DOCUMENT = "producer-ids"  # on an object store, under the data location
ID_RESERVE_ATTEMPTS = 8


class ProducerIdAllocator:
    """Monotonic producer ids, never reused across restarts (see the module doc)."""

    def __init__(self, data_dir: Path, block_size: int = ID_BLOCK_SIZE) -> None:
        self.path = data_dir / ID_FILE
        self.block_size = block_size
        self._lock = threading.Lock()
        for temp in data_dir.glob(f"{fsutil.TEMP_PREFIX}{ID_FILE}-*"):
            temp.unlink(missing_ok=True)  # left by a crash while reserving a block
        self._next = self._limit = self._load()

    def _load(self) -> int:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return 0
        try:
            body = json.loads(text)
            value = int(body["next_unreserved"])
            if body.get("format") != ID_FILE_FORMAT or value < 0:
                raise ValueError(f"format {body.get('format')!r}, next id {value}")
        except (ValueError, KeyError, TypeError) as error:
            # Guessing could hand out an id again and merge two producers' sequences.
            raise CorruptionError(
                self.path, f"the producer id counter is unreadable ({error})") from None
        return value

    def allocate(self) -> int:
        with self._lock:
            if self._next >= self._limit:
                self._reserve(self._next + self.block_size)
            producer_id = self._next
            self._next += 1
            return producer_id

    def was_issued(self, producer_id: int) -> bool:
        """Whether `producer_id` may have been handed out (now or before a restart)."""
        with self._lock:
            # After a restart _next is the saved bound, above every id given out before.
            return 0 <= producer_id < self._next

    def _reserve(self, limit: int) -> None:
        data = json.dumps({"format": ID_FILE_FORMAT, "next_unreserved": limit}).encode()
        temp = fsutil.temp_path(self.path.parent, ID_FILE)
        try:
            fsutil.write_file_durably(temp, data + b"\n")
            fsutil.publish_replace(temp, self.path)
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        self._limit = limit


class DocumentIdAllocator(ProducerIdAllocator):
    """The counter as a committed document (on S3: with the topics); reserving a block
    is a compare-and-swap, retried on the version another allocator committed."""

    def __init__(self, document: Document, block_size: int = ID_BLOCK_SIZE) -> None:
        self.document = document
        self.block_size = block_size
        self._lock = threading.Lock()
        self._snapshot: Snapshot | None = None
        self._next = self._limit = self._load()

    def _load(self) -> int:
        self._snapshot = self.document.load()
        return self._stored(self._snapshot)

    def _stored(self, snapshot: Snapshot | None) -> int:
        if snapshot is None:
            return 0
        try:
            value = int(snapshot.body["next_unreserved"])
            if value < 0:
                raise ValueError(f"next id {value}")
        except (ValueError, KeyError, TypeError) as error:
            raise CorruptionError(f"{self.document.where}/current.json",
                                  f"the producer id counter is unreadable ({error})") from None
        return value

    def _reserve(self, limit: int) -> None:
        def reserved(snapshot: Snapshot | None) -> dict[str, Any]:
            # Another allocator (a server that took over) reserved a block since: go on
            # above it. A killed one's claim is cleared by update_document.
            self._next = max(self._next, self._stored(snapshot))
            return {"format": ID_FILE_FORMAT,
                    "next_unreserved": max(limit, self._next + self.block_size)}

        snapshot = update_document(self.document, reserved, ID_RESERVE_ATTEMPTS)
        assert snapshot is not None  # `reserved` always has a body to commit
        self._snapshot = snapshot
        self._limit = int(snapshot.body["next_unreserved"])
