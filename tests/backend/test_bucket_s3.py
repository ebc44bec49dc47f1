"""The one bucket client (backend/s3/bucket.py) against moto's S3 server on loopback: each
request's outcomes (absent, precondition failed, may have landed, refused) and its
errors, which name the operation and the object and never a credential."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ReadTimeoutError

from compactlog.backend.s3.bucket import Bucket, PreconditionFailed, PutOutcomeUnknown, answered
from compactlog.backend.s3.error_mapping import ObjectStoreSetupError
from compactlog.errors import ConflictError, StorageError
from support.s3_support import (
    SECRET_ACCESS_KEY,
    SESSION_TOKEN,
    FaultyClient,
    S3Server,
    client_error,
)


def prefix_in(s3: S3Server) -> str:
    return s3.location().path + "/"


def test_get_head_put_and_delete_an_object(s3: S3Server) -> None:
    bucket = Bucket(s3.client(), s3.bucket)
    key = prefix_in(s3) + "a.json"
    assert bucket.get(key) is None and bucket.head(key) is None
    etag = bucket.put(key, b"one", if_none_match=True, metadata={"token": "t1"})
    assert bucket.get(key) == (b"one", etag)
    head = bucket.head(key)
    assert head is not None and (head.etag, head.size, head.metadata) == (etag, 3,
                                                                          {"token": "t1"})
    assert bucket.delete(key) is True
    assert bucket.get(key) is None


def test_a_failed_precondition_is_a_conflict(s3: S3Server) -> None:
    bucket = Bucket(s3.client(), s3.bucket)
    key = prefix_in(s3) + "current.json"
    first = bucket.put(key, b"1", if_none_match=True)
    with pytest.raises(PreconditionFailed, match=f"s3://{s3.bucket}/{key}: PUT refused"):
        bucket.put(key, b"2", if_none_match=True)
    second = bucket.put(key, io.BytesIO(b"2"), if_match=first)
    with pytest.raises(ConflictError, match="412"):
        bucket.put(key, b"3", if_match=first)
    assert bucket.get(key) == (b"2", second)
    assert bucket.delete(key, if_match=first) is False  # no longer that version
    assert bucket.get(key) is not None


def test_a_put_that_may_have_landed_is_told_from_one_that_did_not(s3: S3Server) -> None:
    faults: list[Exception] = []

    def fail(operation: str, kwargs: dict[str, Any]) -> None:
        if faults:
            raise faults.pop()

    bucket = Bucket(FaultyClient(s3.client(), before=fail), s3.bucket)
    key = prefix_in(s3) + "x"
    faults.append(client_error(503, "SlowDown"))
    with pytest.raises(PutOutcomeUnknown, match=f"{key}: PUT failed"):
        bucket.put(key, b"x")
    faults.append(ReadTimeoutError(endpoint_url=s3.endpoint_url))
    with pytest.raises(PutOutcomeUnknown):
        bucket.put(key, b"x")
    faults.append(client_error(403, "AccessDenied"))
    with pytest.raises(ObjectStoreSetupError) as refused:
        bucket.put(key, b"x")
    assert answered(refused.value)


def test_listing_pages_folders_and_deleting_a_prefix(s3: S3Server) -> None:
    bucket = Bucket(s3.client(), s3.bucket)
    prefix = prefix_in(s3)
    keys = [f"{prefix}top-{n}" for n in range(3)] + [f"{prefix}d{n}/x" for n in range(2)]
    for key in keys:
        bucket.put(key, b"")
    assert [entry.key for entry in bucket.list(prefix, delimiter=True)] == keys[:3]
    assert sorted(entry.key for entry in bucket.list(prefix)) == sorted(keys)
    assert all(entry.modified_ms > 0 for entry in bucket.list(prefix))
    assert bucket.folders(prefix) == ["d0", "d1"]
    assert bucket.delete_all(prefix, f"s3://{s3.bucket}/{prefix}") == 5
    assert bucket.list(prefix) == []


class RefusingDeletes:
    """A client whose multi-object DELETE answers that it left the first key (as S3
    does with a 200 and an Errors entry, e.g. AccessDenied for one key)."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def delete_objects(self, **kwargs: Any) -> dict[str, Any]:
        objects = kwargs["Delete"]["Objects"]
        kept, *rest = objects
        answer: dict[str, Any] = self._client.delete_objects(
            Bucket=kwargs["Bucket"], Delete={"Objects": rest})
        answer["Errors"] = [{"Key": kept["Key"], "Code": "AccessDenied"}]
        return answer


def test_delete_all_fails_when_the_store_kept_some_keys(s3: S3Server) -> None:
    prefix = prefix_in(s3)
    writer = Bucket(s3.client(), s3.bucket)
    for number in range(3):
        writer.put(f"{prefix}k{number}", b"")
    bucket = Bucket(RefusingDeletes(s3.client()), s3.bucket)  # type: ignore[arg-type]
    url = f"s3://{s3.bucket}/{prefix}"
    with pytest.raises(StorageError, match=rf"^{url}: DELETE left 1 of 3 objects: "
                                           rf"s3://{s3.bucket}/{prefix}k0 \(AccessDenied\)"):
        bucket.delete_all(prefix, url)
    assert [entry.key for entry in writer.list(prefix)] == [f"{prefix}k0"]


def test_a_download_cut_short_is_read_again(s3: S3Server, tmp_path: Path) -> None:
    bucket = Bucket(s3.client(), s3.bucket)
    key = prefix_in(s3) + "data"
    bucket.put(key, b"D" * 100)
    assert bucket.download(key, tmp_path / "copy", body_attempts=2) == 100
    assert (tmp_path / "copy").read_bytes() == b"D" * 100
    assert bucket.download(key + "-none", tmp_path / "none", body_attempts=2) is None


def test_errors_name_the_request_and_never_a_credential(s3: S3Server) -> None:
    bucket = Bucket(s3.client(), "no-such-bucket-b1")
    for request in (lambda: bucket.get("k"), lambda: bucket.put("k", b""),
                    lambda: bucket.list("p/"), lambda: bucket.delete("k")):
        with pytest.raises((StorageError, ObjectStoreSetupError)) as failed:
            request()
        message = str(failed.value)
        assert message.startswith("s3://no-such-bucket-b1/")
        assert "failed" in message and "\n" not in message
        assert SECRET_ACCESS_KEY not in message and SESSION_TOKEN not in message


def test_create_tells_its_own_retried_put_from_a_taken_name(s3: S3Server) -> None:
    client = s3.client()
    landed: list[str] = []

    def land_first(operation: str, kwargs: dict[str, Any]) -> None:
        # The first attempt landed and its answer was lost: the client's retry meets it.
        if operation == "put_object" and not landed:
            landed.append(operation)
            client.put_object(**kwargs)

    bucket = Bucket(FaultyClient(client, before=land_first), s3.bucket)
    key = prefix_in(s3) + "segments/a.parquet"
    assert bucket.create(key, b"mine") is True and landed
    assert Bucket(client, s3.bucket).create(key, io.BytesIO(b"other")) is False
    assert bucket.get(key) == (b"mine", bucket.head(key).etag)  # type: ignore[union-attr]
