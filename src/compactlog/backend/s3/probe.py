"""The check, made once when a store opens an s3:// location, that the object store can
hold a store at all: the bucket exists, the credentials work there, and conditional
writes are enforced.

Invariant: a location whose store does not enforce `If-None-Match: *` and `If-Match`
is refused before anything is written there (ConditionalWritesUnsupportedError, naming
the missing feature), because ObjectDocument's compare-and-swap (backend/s3/document.py)
rests on them: on a store that ignores them two commits based on one version would both
land and one would be lost silently. The probe leaves nothing behind but, if it dies
midway, one small object under the location's prefix whose name starts with
`.compactlog-probe-` (never read by the store).

Probe protocol (check_conditional_writes; the test of each step in
tests/backend/test_s3_setup.py):
  1. PUT a fresh probe object with `If-None-Match: *`: it must succeed. A missing
     bucket, refused credentials or a down endpoint fail here with backend/s3/error_mapping.py's
     message; test_a_missing_bucket_is_named, test_refused_credentials_are_named,
     test_a_down_endpoint_is_named. A 501 NotImplemented (or a 400 naming the header)
     means the store does not take conditional writes at all;
     test_a_store_that_rejects_conditional_headers_is_refused. A 412 here can only be
     botocore's retry of this same PUT whose first answer was lost: the probe reads the
     object back and goes on if it is its own.
  2. PUT it again with `If-None-Match: *`: the store must answer 412 (or 409). A 2xx
     means it ignores If-None-Match; test_a_store_that_ignores_conditions_is_refused.
  3. PUT it with `If-Match: <an ETag it does not have>`: 412 again. A 2xx means it
     ignores If-Match; test_a_store_that_ignores_if_match_only_is_refused.
  4. DELETE the probe object (also when a step failed; a failure to delete is logged).
  test_moto_passes_the_probe_once_per_bucket: a conforming store passes, and the probe
  runs once per endpoint and bucket in a process.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING

from botocore.exceptions import BotoCoreError, ClientError

from compactlog.backend import Location, LocationError
from compactlog.backend.s3.error_mapping import ObjectStoreSetupError, request_error
from compactlog.backend.s3.settings import S3Settings

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

log = logging.getLogger(__name__)

PROBE_PREFIX = ".compactlog-probe-"
_CONFLICT_STATUS = (409, 412)
_checked: set[tuple[str, str]] = set()
_checked_lock = threading.Lock()


class ConditionalWritesUnsupportedError(ObjectStoreSetupError):
    """The object store does not enforce conditional writes, which commits rely on."""


def _status(error: ClientError) -> int:
    return int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))


def check_conditional_writes(location: Location, client: S3Client | None = None,
                             env: Mapping[str, str] | None = None,
                             force: bool = False) -> None:
    """Run the probe at `location` unless it passed already for its endpoint and bucket
    in this process (`force`: run it anyway). Raises ObjectStoreSetupError (a
    ConditionalWritesUnsupportedError for a store without conditional writes) or
    StorageError (the store could not be reached) with a one-line message."""
    if location.bucket is None:
        raise LocationError(f"{location} is a local directory, not an s3:// location")
    if client is None:
        client = S3Settings.from_env(env).boto3_client()
    endpoint = client.meta.endpoint_url
    done = (endpoint, location.bucket)
    with _checked_lock:
        if done in _checked and not force:
            return
    _Probe(client, location).run()
    with _checked_lock:
        _checked.add(done)


class _Probe:
    def __init__(self, client: S3Client, location: Location) -> None:
        assert location.bucket is not None
        self.client = client
        self.bucket = location.bucket
        self.key = location.key(f"{PROBE_PREFIX}{uuid.uuid4().hex}")
        self.url = f"s3://{self.bucket}/{self.key}"
        self.endpoint = client.meta.endpoint_url
        self.token = uuid.uuid4().hex.encode()

    def _unsupported(self, what: str) -> ConditionalWritesUnsupportedError:
        return ConditionalWritesUnsupportedError(
            f"{self.url}: the object store at {self.endpoint} {what}; compactlog commits "
            "manifests with conditional writes (If-None-Match: * to create, If-Match: "
            "<ETag> to replace) and cannot keep a store on it safely: use a store that "
            "enforces both (AWS S3 does; see docs/object-storage.md)")

    def _refused_header(self, error: ClientError) -> bool:
        code = str(error.response.get("Error", {}).get("Code", ""))
        return _status(error) == 501 or code in ("NotImplemented", "InvalidArgument") or (
            _status(error) == 400 and "If-" in str(error))

    def run(self) -> None:
        etag = self._create()  # 1. (when it fails, nothing was created, or its answer
        # was lost and the probe object stays: a name the store never reads)
        try:
            self._expect_refusal("If-None-Match: *", "ignores If-None-Match: * (a second "
                                 "create-only PUT of one object succeeded)",
                                 IfNoneMatch="*")  # 2.
            wrong = '"00000000000000000000000000000000"' if etag != \
                '"00000000000000000000000000000000"' else '"11111111111111111111111111111111"'
            self._expect_refusal("If-Match", "ignores If-Match (a PUT with an ETag the "
                                 "object does not have succeeded)", IfMatch=wrong)  # 3.
        finally:
            self._delete()  # 4.

    def _create(self) -> str:
        try:
            return self.client.put_object(Bucket=self.bucket, Key=self.key, Body=self.token,
                                          IfNoneMatch="*")["ETag"]
        except ClientError as error:
            if _status(error) in _CONFLICT_STATUS and self._mine():
                return self.client.head_object(Bucket=self.bucket, Key=self.key)["ETag"]
            if self._refused_header(error):
                code = error.response.get("Error", {}).get("Code", "")
                raise self._unsupported(f"refuses conditional PUTs ({_status(error)} "
                                        f"{code})") from error
            raise request_error(self.client, "PUT", self.url, error) from error
        except BotoCoreError as error:
            raise request_error(self.client, "PUT", self.url, error) from error

    def _mine(self) -> bool:
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=self.key)["Body"].read()
        except (ClientError, BotoCoreError):
            return False
        return body == self.token

    def _expect_refusal(self, condition: str, ignored: str, **conditions: str) -> None:
        try:
            self.client.put_object(Bucket=self.bucket, Key=self.key, Body=self.token,
                                   **conditions)  # type: ignore[arg-type]
        except ClientError as error:
            if _status(error) in _CONFLICT_STATUS:
                return
            if self._refused_header(error):
                raise self._unsupported(f"refuses {condition} ({_status(error)})") from error
            raise request_error(self.client, "PUT", self.url, error) from error
        except BotoCoreError as error:
            raise request_error(self.client, "PUT", self.url, error) from error
        raise self._unsupported(ignored)

    def _delete(self) -> None:
        try:
            self.client.delete_object(Bucket=self.bucket, Key=self.key)
        except (ClientError, BotoCoreError) as error:
            log.warning("%s", request_error(self.client, "DELETE", self.url, error))
