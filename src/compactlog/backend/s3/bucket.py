"""One S3 bucket as the rest of compactlog speaks to it: get, head, conditional put,
copy, delete, list, and the few transfers the callers need, each one request (or one listing)
with one error mapping.

Invariant: every request to the store that compactlog makes through boto3 goes through a
`Bucket` (but backend/s3/probe.py's, which reads a store's raw refusal of a conditional
header to tell an unsupported store from a failure), and every failure of one leaves it
as the one-line error backend/s3/error_mapping.py makes (`request_error`: the operation, the s3://
URL, what to do, never a credential), except the answers that are outcomes rather than
failures, which come back as values or as their own exceptions:
- an object that is not there: `get`, `head` and `download` return None;
- a failed precondition: to a conditional DELETE (412), `delete` returns False; to a
  conditional PUT (409 or 412), PreconditionFailed, a ConflictError. moto answers a
  failed If-Match or If-None-Match with 412 PreconditionFailed; S3 answers a race of two
  conditional writes with 409 ConditionalRequestConflict, the same to a committer;
- a PUT that may have landed (a 5xx answer, or no answer after it was sent): the
  PutOutcomeUnknown subclass of StorageError, so a committer knows to read back.
boto3's client retries each request with backoff first (S3Settings in backend/s3/settings.py), and
the client is taken as given, so a test's wrapped client (tests/support/s3_support.py
FaultyClient) sees every request; requests are made with keyword arguments only.

With error_mapping.py, probe.py and settings.py, it is one of the modules of compactlog.backend.s3,
the only package that imports boto3 or botocore (the import-linter contract in
pyproject.toml).
"""

from __future__ import annotations

import builtins
import logging
import shutil
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, TypeVar

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
)

from compactlog.backend.s3.error_mapping import (
    ObjectStoreSetupError,
    http_status,
    no_such_key,
    request_error,
)
from compactlog.errors import ConflictError, StorageError

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

log = logging.getLogger(__name__)

_CONFLICT_STATUS = (409, 412)  # 409: S3's ConditionalRequestConflict under a race
_CHUNK = 8 * 1024 * 1024
T = TypeVar("T")
# User metadata on every object `create` makes: a random token of that call.
TOKEN = "compactlog-put"


class PreconditionFailed(ConflictError):
    """A conditional PUT or DELETE was refused: the object's ETag is not the one
    named (If-Match), or an object exists (If-None-Match: *)."""


class PutOutcomeUnknown(StorageError):
    """A PUT whose answer was a 5xx or was lost after it was sent: it may have landed."""


def answered(error: BaseException) -> bool:
    """Whether a failure raised here was the store's answer (not a request that never
    got one): what a committer needs to know of a refused PUT."""
    return isinstance(error.__cause__, ClientError)


def _never_sent(error: Exception) -> bool:
    """The request certainly never reached the store."""
    return isinstance(error, EndpointConnectionError | ConnectTimeoutError)


@dataclass(frozen=True)
class Head:
    """What a HEAD tells of an object."""

    etag: str
    size: int
    metadata: dict[str, str]


@dataclass(frozen=True)
class Entry:
    """An object found by a listing: its key and when it was last written."""

    key: str
    modified_ms: int


@dataclass(frozen=True)
class Upload:
    """A multipart upload not yet completed or aborted."""

    key: str
    upload_id: str
    initiated: datetime


class Bucket:
    """The objects of one bucket, through one boto3 client (see the module's invariant)."""

    def __init__(self, client: S3Client, name: str) -> None:
        self.client = client
        self.name = name

    def __repr__(self) -> str:
        return f"Bucket({self.name!r})"

    def url(self, key: str) -> str:
        return f"s3://{self.name}/{key}"

    @property
    def attempts(self) -> int:
        """How many times the client sends a request before it gives up."""
        retries: dict[str, Any] = getattr(self.client.meta.config, "retries", None) or {}
        return int(retries.get("total_max_attempts") or retries.get("max_attempts") or 1)

    def failed(self, operation: str, key: str,
               error: Exception) -> StorageError | ObjectStoreSetupError:
        """`error`, raised by `operation` on `key`, as backend/s3/error_mapping.py says."""
        return request_error(self.client, operation, self.url(key), error)

    @contextmanager
    def _request(self, operation: str, key: str) -> Iterator[None]:
        try:
            yield
        except (ClientError, BotoCoreError) as error:
            raise self.failed(operation, key, error) from error

    # -- reading ----------------------------------------------------------------------

    def get(self, key: str, *, body_attempts: int = 1) -> tuple[bytes, str] | None:
        """The object's bytes and ETag; None if there is none. A body cut short or
        stalled while it is read is read again, up to `body_attempts` GETs in all (the
        client's own retries end with its answer's headers)."""
        return self._read(key, body_attempts,
                          lambda response: (response["Body"].read(), response["ETag"]))

    def download(self, key: str, path: Path, *, body_attempts: int) -> int | None:
        """GET the object into the file `path`, in chunks; its size, or None if there is
        no such object. A body cut short is downloaded again, as `get` says."""
        def copy(response: Any) -> int:
            with open(path, "wb") as out:
                shutil.copyfileobj(response["Body"], out, _CHUNK)
            return path.stat().st_size

        return self._read(key, body_attempts, copy)

    def _read(self, key: str, body_attempts: int, read: Callable[[Any], T]) -> T | None:
        """GET `key` and `read` its answer; None if there is no such object."""
        for attempt in range(1, body_attempts + 1):
            try:
                response = self.client.get_object(Bucket=self.name, Key=key)
            except ClientError as error:
                if no_such_key(error):
                    return None
                raise self.failed("GET", key, error) from error
            except BotoCoreError as error:
                raise self.failed("GET", key, error) from error
            try:
                return read(response)
            except BotoCoreError as error:
                if attempt == body_attempts:
                    raise self.failed("GET", key, error) from error
                log.info("%s: GET's body was cut short (%s); retrying", self.url(key),
                         type(error).__name__)
        raise AssertionError("unreachable")

    def head(self, key: str) -> Head | None:
        """The object's ETag, size and user metadata; None if there is none (a HEAD's
        404 has no body, so a missing bucket looks the same here; the GET or PUT that
        follows names it)."""
        try:
            found = self.client.head_object(Bucket=self.name, Key=key)
        except ClientError as error:
            if http_status(error) == 404 or no_such_key(error):
                return None
            raise self.failed("HEAD", key, error) from error
        except BotoCoreError as error:
            raise self.failed("HEAD", key, error) from error
        return Head(found["ETag"], int(found["ContentLength"]), dict(found.get("Metadata", {})))

    # -- writing ----------------------------------------------------------------------

    def put(self, key: str, body: bytes | IO[bytes], *, if_match: str | None = None,
            if_none_match: bool = False, metadata: dict[str, str] | None = None) -> str:
        """Write the object whole; its ETag. With `if_match` only over the object with
        that ETag, with `if_none_match` only where there is none: PreconditionFailed
        otherwise. PutOutcomeUnknown when it may have landed; any other failure was
        not written."""
        conditions: dict[str, Any] = {}
        if if_match is not None:
            conditions["IfMatch"] = if_match
        if if_none_match:
            conditions["IfNoneMatch"] = "*"
        if metadata is not None:
            conditions["Metadata"] = metadata
        try:
            return self.client.put_object(Bucket=self.name, Key=key, Body=body,
                                          **conditions)["ETag"]
        except ClientError as error:
            status = http_status(error)
            if status in _CONFLICT_STATUS:
                code = error.response.get("Error", {}).get("Code", "")
                raise PreconditionFailed(f"{self.url(key)}: PUT refused: its condition "
                                         f"failed ({status} {code})") from error
            failed = self.failed("PUT", key, error)
            if status >= 500:
                raise PutOutcomeUnknown(str(failed)) from error
            raise failed from error
        except BotoCoreError as error:
            failed = self.failed("PUT", key, error)
            if not _never_sent(error) and isinstance(failed, StorageError):
                raise PutOutcomeUnknown(str(failed)) from error
            raise failed from error

    def create(self, key: str, body: bytes | IO[bytes]) -> bool:
        """Create the object where there is none (`If-None-Match: *`); False if another
        writer has that name. The PUT is tagged with a token of this call (TOKEN), so
        that when its answer was lost and the client's retry met the object it had
        created after all (a 412), a HEAD tells that the name holds these bytes."""
        token = uuid.uuid4().hex
        try:
            self.put(key, body, if_none_match=True, metadata={TOKEN: token})
            return True
        except PreconditionFailed:
            pass
        try:
            head = self.head(key)
        except (StorageError, ObjectStoreSetupError):
            return False  # not told: taken, as far as this writer can know
        return head is not None and head.metadata.get(TOKEN) == token

    def copy(self, source_key: str, key: str) -> None:
        """Give `key` the bytes of the object `source_key` of this bucket, copied by the
        store where they are (CopyObject: nothing is sent but the request). Not
        conditional: CopyObject's If-None-Match is recent in S3 and missing from other
        stores, so the caller copies only under a name that no other writer uses for
        other bytes."""
        with self._request("COPY", key):
            self.client.copy_object(Bucket=self.name, Key=key,
                                    CopySource={"Bucket": self.name, "Key": source_key})

    def delete(self, key: str, *, if_match: str | None = None,
               missing_ok: bool = False) -> bool:
        """Delete the object; False when it is not there (a 404, with `missing_ok`; S3
        itself answers 204) or no longer has the ETag `if_match` (a 412)."""
        try:
            if if_match is None:
                self.client.delete_object(Bucket=self.name, Key=key)
            else:
                self.client.delete_object(Bucket=self.name, Key=key, IfMatch=if_match)
        except ClientError as error:
            status = http_status(error)
            if status == 412 or (status == 404 and missing_ok):
                return False
            raise self.failed("DELETE", key, error) from error
        except BotoCoreError as error:
            raise self.failed("DELETE", key, error) from error
        return True

    def delete_all(self, prefix: str, url: str) -> int:
        """Delete every object under `prefix` (one DELETE of many keys per page listed);
        how many there were. A failure names `url`, the prefix as the caller knows it.
        S3 answers a multi-object DELETE 200 even when some keys were not deleted, and
        lists those under Errors: they fail the call (StorageError naming the first
        key and its code) once the rest of the page is gone, so a caller never reports
        as removed what is still there."""
        removed = 0
        try:
            for page in self._pages(prefix, delimiter=False):
                keys = [item["Key"] for item in page.get("Contents", [])]
                if not keys:
                    continue
                answer = self.client.delete_objects(
                    Bucket=self.name, Delete={"Objects": [{"Key": key} for key in keys]})
                refused = answer.get("Errors") or []
                if refused:
                    first = refused[0]
                    raise StorageError(
                        f"{url}: DELETE left {len(refused)} of {len(keys)} objects: "
                        f"{self.url(first.get('Key', '?'))} "
                        f"({first.get('Code', 'no code')}); try again")
                removed += len(keys)
        except (ClientError, BotoCoreError) as error:
            raise request_error(self.client, "DELETE", url, error) from error
        return removed

    # -- listing ----------------------------------------------------------------------

    def _pages(self, prefix: str, delimiter: bool) -> Iterator[Any]:
        """The pages of LIST `prefix` (with `delimiter`: one level, '/'-separated)."""
        paginator = self.client.get_paginator("list_objects_v2")
        if delimiter:
            yield from paginator.paginate(Bucket=self.name, Prefix=prefix, Delimiter="/")
        else:
            yield from paginator.paginate(Bucket=self.name, Prefix=prefix)

    def list(self, prefix: str, *, delimiter: bool = False) -> builtins.list[Entry]:
        """The objects whose keys start with `prefix`, in key order (with `delimiter`,
        only those with no further '/' after it)."""
        with self._request("LIST", prefix):
            return [Entry(item["Key"], int(item["LastModified"].timestamp() * 1000))
                    for page in self._pages(prefix, delimiter)
                    for item in page.get("Contents", [])]

    def folders(self, prefix: str) -> builtins.list[str]:
        """The names one level below `prefix` that hold objects (its common prefixes,
        without `prefix` and the trailing '/')."""
        with self._request("LIST", prefix):
            return [item["Prefix"][len(prefix):].rstrip("/")
                    for page in self._pages(prefix, True)
                    for item in page.get("CommonPrefixes", [])]

    # -- multipart uploads ------------------------------------------------------------

    def uploads(self, prefix: str) -> builtins.list[Upload]:
        """The multipart uploads under `prefix` not yet completed or aborted."""
        with self._request("LIST uploads", prefix):
            paginator = self.client.get_paginator("list_multipart_uploads")
            return [Upload(item["Key"], item["UploadId"], item["Initiated"])
                    for page in paginator.paginate(Bucket=self.name, Prefix=prefix)
                    for item in page.get("Uploads", [])]

    def abort_upload(self, upload: Upload) -> bool:
        """Abort `upload`; False if it was completed or aborted meanwhile."""
        try:
            self.client.abort_multipart_upload(Bucket=self.name, Key=upload.key,
                                               UploadId=upload.upload_id)
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") == "NoSuchUpload":
                return False
            raise self.failed("ABORT upload", upload.key, error) from error
        except BotoCoreError as error:
            raise self.failed("ABORT upload", upload.key, error) from error
        return True
