"""Where the group coordinator keeps committed offsets: one document per group, in the
store's local data directory or, on an object store, beside the topics.

Invariant: a write returns only once the group's whole offset document is durable, and
a document is replaced whole or not at all. On an object store, in addition, only the
writer of the newest epoch (backend/lease.py) can replace a group's document: a server
that took over, or a stalled former owner, never overwrites the other's offsets unseen.

Locally (LocalOffsetFiles): `<data dir>/groups/<quoted group id>.json`, replaced by a
temporary file, fsync, rename and an fsync of the directory; a deleted group's file is
unlinked. A leading '.' is quoted too, so that no group's file has the name of a
temporary file (which the next start deletes), and an id too long for a file name gets
a prefix of it and a hash (`local_file_name`). One directory has one writer (the
store's lock), so nothing needs fencing.

On an object store (ObjectOffsetFiles): `PREFIX/groups/<quoted group id>.json`, each
body stamped with the writer's epoch. One PUT per write, conditional on the ETag this
writer last saw (`If-None-Match: *` for a group it never saw). Protocol (tests in
tests/server/test_offset_files_s3.py):
  1. load (when the writer opens, after it took the lease): LIST the prefix, GET each
     document; one stamped with a newer epoch means a newer owner: FencedError;
     test_a_newer_owner_fences_an_older_one_at_load. Each document of an older epoch is
     written back stamped with ours (PUT If-Match its ETag, re-read and redone on a
     412), so from here on a former owner's conditional PUT fails even for a group this
     writer has not written yet; test_a_former_owner_cannot_write_after_a_takeover
  2. write: PUT If-Match the last ETag this writer saw. The first PUT of a group this
     writer has not seen (If-None-Match: *) is fenced by nothing, so the lease document
     is checked first (WriterLease.check: one HEAD); a lost lease is FencedError;
     test_a_former_owner_cannot_create_a_group_after_a_takeover. A 412 or 409: re-read;
     - the document is byte for byte this write (an earlier attempt landed and its
       answer was lost; botocore's retry met our own ETag): it stands;
       test_a_lost_answer_to_a_write_is_settled_by_rereading;
     - it carries this writer's epoch or a newer one: FencedError, and the coordinator
       answers NOT_COORDINATOR; test_a_former_owner_cannot_write_after_a_takeover;
     - it carries an older epoch (a former owner wrote in the moment between its check
       and its PUT): this write replaces it, If-Match its ETag;
       test_a_former_owners_late_write_is_replaced.
     Any other failure, after botocore's retries: StorageError (the write may or may not
     have landed); the coordinator answers COORDINATOR_NOT_AVAILABLE and the consumer
     commits again.
  3. delete: a deleted group is written (as 2) as a tombstone `{"deleted": true}`, not
     removed, so that it keeps its epoch stamp and a former owner's PUT still fails;
     load skips tombstones; test_a_deleted_group_stays_deleted_after_a_takeover.
"""

from __future__ import annotations

import hashlib
import json
import logging
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from compactlog import fsutil
from compactlog.backend import Location
from compactlog.backend.lease import EPOCH_KEY, LeaseLostError, WriterLease
from compactlog.backend.s3.bucket import Bucket, PreconditionFailed
from compactlog.errors import FencedError, StorageError

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

log = logging.getLogger("compactlog.server.groups")

DIRECTORY = "groups"
DELETED = "deleted"
_PUT_ATTEMPTS = 8


def file_name(group_id: str) -> str:
    """The object name of a group's document on an object store."""
    return urllib.parse.quote(group_id, safe="") + ".json"


# A local file name holds at most this many bytes, so that the temporary name it is
# written under (fsutil.temp_path: 18 more) stays within the 255 of every file system.
MAX_LOCAL_NAME = 207
_HASHED = "%~"  # never in quote()'s output, whose '%' is always followed by hex digits


def local_file_name(group_id: str) -> str:
    """The local file of a group: the quoted id, never starting with '.' (so that no
    group id can have the name of a temporary file, fsutil.TEMP_PREFIX, which the next
    start deletes), and, when that would be too long for a file name, a prefix of it
    and a hash of the whole id (the document holds the id itself)."""
    quoted = urllib.parse.quote(group_id, safe="")
    if quoted.startswith("."):
        quoted = "%2E" + quoted[1:]
    if len(quoted) + len(".json") <= MAX_LOCAL_NAME:
        return quoted + ".json"
    digest = hashlib.sha256(group_id.encode()).hexdigest()[:40]
    keep = MAX_LOCAL_NAME - len(_HASHED) - len(digest) - len(".json")
    return quoted[:keep] + _HASHED + digest + ".json"


class OffsetFiles(Protocol):
    """The committed-offset documents of every group (see the module's invariant)."""

    def load(self) -> list[dict[str, Any]]:
        """Every live group's document (damaged ones are logged and left out)."""
        ...

    def write(self, group_id: str, body: dict[str, Any]) -> None:
        """Replace `group_id`'s document, durably (OSError or StorageError if not)."""
        ...

    def delete(self, group_ids: list[str]) -> None:
        """Remove these groups' documents, durably."""
        ...

    def where(self, group_id: str) -> str:
        """The file or object of `group_id`, for messages."""
        ...


class LocalOffsetFiles:
    """<data dir>/groups/<quoted group id>.json, each replaced atomically."""

    def __init__(self, data_dir: Path) -> None:
        self.directory = data_dir / DIRECTORY
        self.directory.mkdir(parents=True, exist_ok=True)

    def where(self, group_id: str) -> str:
        return str(self.directory / local_file_name(group_id))

    def load(self) -> list[dict[str, Any]]:
        fsutil.remove_temp_files(self.directory)
        bodies: list[dict[str, Any]] = []
        for path in sorted(self.directory.glob("*.json")):
            try:
                bodies.append(json.loads(path.read_text()))
            except ValueError as error:
                log.error("ignoring damaged committed offsets in %s: %s", path, error)
        return bodies

    def write(self, group_id: str, body: dict[str, Any]) -> None:
        final = self.directory / local_file_name(group_id)
        temp = fsutil.temp_path(self.directory, final.name)
        fsutil.write_file_durably(temp, json.dumps(body).encode())
        fsutil.publish_replace(temp, final)
        self._remove_legacy(group_id)

    def delete(self, group_ids: list[str]) -> None:
        for group_id in group_ids:
            fsutil.remove(self.directory / local_file_name(group_id))
            self._remove_legacy(group_id)
        fsutil.fsync_dir(self.directory)

    def _remove_legacy(self, group_id: str) -> None:
        """A group id starting with '.' was once written under its plain quoted name;
        that file goes once the new one is in place, so that no restart loads both."""
        legacy = file_name(group_id)
        if (group_id.startswith(".") and len(legacy.encode()) <= 255
                and (self.directory / legacy).exists()):
            fsutil.remove(self.directory / legacy)
            fsutil.fsync_dir(self.directory)


class ObjectOffsetFiles:
    """PREFIX/groups/<quoted group id>.json on S3, fenced by the writer's epoch."""

    def __init__(self, location: Location, epoch: int, client: S3Client | None = None,
                 check_owner: Callable[[], None] | None = None) -> None:
        """`check_owner` raises LeaseLostError unless this writer still holds the lease
        (WriterLease.check); it is asked before the first PUT of a group."""
        from compactlog.backend.s3.volume import s3_client

        assert location.bucket is not None, f"{location} is not an s3:// location"
        self.bucket = location.bucket
        self.location = location
        self.epoch = epoch
        self.check_owner = check_owner
        self.objects = Bucket(client if client is not None else s3_client(), self.bucket)
        self.prefix = location.key(DIRECTORY) + "/"
        self._etags: dict[str, str] = {}  # by object key: the ETag this writer last saw

    def _key(self, group_id: str) -> str:
        return self.prefix + file_name(group_id)

    def where(self, group_id: str) -> str:
        return f"s3://{self.bucket}/{self._key(group_id)}"

    def _get(self, key: str) -> tuple[bytes, str] | None:
        return self.objects.get(key)

    def _keys(self) -> list[str]:
        return sorted(entry.key for entry in self.objects.list(self.prefix)
                      if entry.key.endswith(".json"))

    # 1. load
    def load(self) -> list[dict[str, Any]]:
        bodies: list[dict[str, Any]] = []
        for key in self._keys():
            body = self._take_over(key)
            if body is not None and not body.get(DELETED):
                bodies.append(body)
        return bodies

    def _take_over(self, key: str) -> dict[str, Any] | None:
        """Read `key` and stamp it with this writer's epoch (None: gone or damaged)."""
        while True:
            found = self._get(key)
            if found is None:
                return None
            raw, etag = found
            try:
                body: dict[str, Any] = json.loads(raw)
                epoch = int(body.get(EPOCH_KEY, 0))
            except (ValueError, TypeError, AttributeError) as error:  # not a JSON object
                log.error("ignoring damaged committed offsets in s3://%s/%s: %s",
                          self.bucket, key, error)
                return None
            if epoch > self.epoch:
                raise FencedError(f"s3://{self.bucket}/{key}: written by writer epoch "
                                  f"{epoch}, newer than this writer's {self.epoch}")
            if epoch == self.epoch:
                self._etags[key] = etag
                return body
            try:
                self._put(key, {**body, EPOCH_KEY: self.epoch}, etag, replace_older=False)
                return body
            except _Changed:
                continue  # the former owner wrote meanwhile: read its write and redo

    # 2. write
    def write(self, group_id: str, body: dict[str, Any]) -> None:
        key = self._key(group_id)
        self._put(key, {**body, EPOCH_KEY: self.epoch}, self._etags.get(key))

    def _put(self, key: str, body: dict[str, Any], based_on: str | None,
             replace_older: bool = True) -> None:
        """PUT `body` on the version `based_on` (step 2); with `replace_older` off, a
        version of an older epoch met instead is not replaced but reported (_Changed)."""
        data = json.dumps(body).encode()
        if based_on is None and self.check_owner is not None:
            try:
                self.check_owner()  # nothing fences the first PUT of a new group
            except LeaseLostError as error:
                raise FencedError(str(error)) from None
        for _ in range(_PUT_ATTEMPTS):
            try:
                self._etags[key] = self.objects.put(key, data, if_match=based_on,
                                                    if_none_match=based_on is None)
                return
            except PreconditionFailed:
                pass  # another write, or an earlier attempt of this one: read it
            found = self._get(key)
            if found is None:
                based_on = None  # removed from outside: write it anew
                continue
            if found[0] == data:
                self._etags[key] = found[1]  # our own earlier attempt landed
                return
            epoch = _epoch_of(found[0])
            if epoch is not None and epoch >= self.epoch:
                raise FencedError(
                    f"s3://{self.bucket}/{key}: writer epoch {epoch} replaced these "
                    f"committed offsets (this writer's epoch is {self.epoch})")
            if not replace_older:
                raise _Changed
            # A former owner wrote it after this writer took over (before it learnt that
            # it lost the lease): this writer's state is the owner's.
            based_on = found[1]
        raise FencedError(f"s3://{self.bucket}/{key}: the committed offsets kept changing "
                          f"under {_PUT_ATTEMPTS} attempts to write them")

    # 3. delete
    def delete(self, group_ids: list[str]) -> None:
        for group_id in group_ids:
            self.write(group_id, {"group_id": group_id, DELETED: True})


class _Changed(Exception):
    """A document changed by a writer of an older epoch between its read and its PUT."""


def _epoch_of(raw: bytes) -> int | None:
    try:
        return int(json.loads(raw).get(EPOCH_KEY, 0))
    except (ValueError, TypeError, AttributeError):
        return None


def offset_files_of(location: Location, data_dir: Path,
                    lease: WriterLease | None) -> OffsetFiles:
    """The offset documents of the store at `location` (its local `data_dir`), written
    under the store's writer `lease` (None for a local store)."""
    if not location.is_s3:
        return LocalOffsetFiles(data_dir)
    if lease is None:
        raise StorageError(f"{location}: committed offsets on an object store need the "
                           "writer lease (the store was opened read-only?)")
    return ObjectOffsetFiles(location, lease.epoch, check_owner=lease.check)
