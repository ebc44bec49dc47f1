"""Multipart uploads that never completed under an s3:// location: invisible, but kept
(and billed) by the store until they are aborted.

Invariant: aborting never touches an object or an upload younger than `older_than_s`.
An incomplete multipart upload is never an object (S3 shows one only once its
CompleteMultipartUpload lands), so readers never see a half-written data file; what a
failed upload leaves is its parts, which only an abort (or a bucket lifecycle rule,
AbortIncompleteMultipartUpload) removes. An upload still in progress looks the same as
an abandoned one, so only those started more than `older_than_s` ago are aborted: set it
well above the longest upload a writer makes.

The server's upkeep sweeps with `AbandonedUploads`: it aborts an upload only once it has
itself seen that upload (the same upload id) incomplete for `min_age_s` by its own
clock, never by the store's dates alone: a store's clock may be off from ours (moto
dates every upload 2010-11-10), and an upload in progress must never be aborted.

Measured with pyarrow 26: when the upload of a part fails for good, S3FileSystem's
output stream raises but does not abort its multipart upload
(tests/faults/test_s3_faults.py::test_a_failed_multipart_upload_leaves_no_object).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from compactlog.backend import Location, LocationError
from compactlog.backend.s3.bucket import Bucket

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

log = logging.getLogger(__name__)

DEFAULT_OLDER_THAN_S = 24 * 3600.0


def abort_incomplete_uploads(client: S3Client, location: Location,
                             older_than_s: float = DEFAULT_OLDER_THAN_S,
                             now: datetime | None = None) -> list[str]:
    """Abort the multipart uploads under `location` started more than `older_than_s`
    before `now`; the keys whose uploads were aborted."""
    if location.bucket is None:
        raise LocationError(f"{location} is a local directory, not an s3:// location")
    bucket = Bucket(client, location.bucket)
    cutoff = (now or datetime.now(UTC)) - timedelta(seconds=older_than_s)
    aborted: list[str] = []
    for upload in bucket.uploads(location.path + "/" if location.path else ""):
        if upload.initiated > cutoff:
            continue
        if not bucket.abort_upload(upload):
            continue  # completed or aborted meanwhile
        log.info("%s: aborted a multipart upload started at %s and never completed",
                 bucket.url(upload.key), upload.initiated.isoformat())
        aborted.append(upload.key)
    return aborted


class AbandonedUploads:
    """The uploads under one prefix of a bucket, watched across looks (see the module's
    invariant): an upload first seen incomplete at time t is aborted at the first look
    at or after t + `min_age_s`, if it is still incomplete then."""

    def __init__(self, bucket: Bucket, prefix: str,
                 min_age_s: float = DEFAULT_OLDER_THAN_S) -> None:
        self.bucket = bucket
        self.prefix = prefix
        self.min_age_s = min_age_s
        self._first_seen: dict[tuple[str, str], float] = {}  # (key, upload id) -> when

    def sweep(self, now: float) -> list[str]:
        incomplete = self.bucket.uploads(self.prefix)
        current = {(upload.key, upload.upload_id) for upload in incomplete}
        # Uploads completed or aborted since the last look are forgotten.
        self._first_seen = {seen: at for seen, at in self._first_seen.items()
                            if seen in current}
        aborted: list[str] = []
        for upload in incomplete:
            first = self._first_seen.setdefault((upload.key, upload.upload_id), now)
            if now - first < self.min_age_s:
                continue
            del self._first_seen[(upload.key, upload.upload_id)]
            if not self.bucket.abort_upload(upload):
                continue  # completed or aborted meanwhile
            log.info("%s: aborted a multipart upload incomplete for more than %.0f s "
                     "(started at %s by the store's clock)", self.bucket.url(upload.key),
                     self.min_age_s, upload.initiated.isoformat())
            aborted.append(upload.key)
        return aborted
