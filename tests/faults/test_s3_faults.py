"""Faults of an S3-compatible store, injected by the proxy of tests/support/s3_faults.py in front
of the moto server: throttling (503 SlowDown), 500 InternalError, stalls beyond the
request timeout, answers lost after the write landed, and bodies cut short. Each hits
one step: a data file's GET or PUT through pyarrow's S3FileSystem, or one step of
ObjectDocument.commit (backend/s3/document.py) through boto3.

What they show: a transient fault is retried with backoff (S3Settings, backend/s3/settings.py) and
the operation succeeds; a persistent one ends in a one-line StorageError naming the
operation and the key, and the document still loads its old version or the new one,
never a mix, with its audit copies intact; a stalled commit PUT ends in
CommitOutcomeUnknown, which resolve() settles. Settings are small (timeouts of a second,
backoff of milliseconds) to keep the tests fast; nothing asserts on timing."""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from compactlog.backend import Location
from compactlog.backend.envelope import CURRENT
from compactlog.backend.s3.abandoned_uploads import abort_incomplete_uploads
from compactlog.backend.s3.document import ObjectCommitOutcomeUnknown, ObjectDocument
from compactlog.backend.s3.error_mapping import arrow_errors
from compactlog.backend.s3.settings import S3Settings
from compactlog.errors import StorageError
from compactlog.server.upkeep import Upkeep
from compactlog.storage import LogStore
from support.s3_faults import (
    ATTEMPTS,
    Rule,
    S3Proxy,
    fast,
    internal_error,
    lost_answer,
    slow_down,
    stall,
    truncate,
)
from support.s3_support import (
    ACCESS_KEY_ID,
    SECRET_ACCESS_KEY,
    SESSION_TOKEN,
    S3Server,
)


def fault(kind: str, **where: Any) -> Rule:
    return slow_down(**where) if kind == "503" else internal_error(**where)


# -- data files through pyarrow ---------------------------------------------------------

TABLE = pa.table({"key": [b"a", b"b", b"a"] * 100, "offset": list(range(300))})


def data_path(proxy: S3Proxy) -> tuple[Location, str]:
    location = proxy.server.location("segments")
    return location, location.join("00000000000000000000.parquet").fs_path


@pytest.mark.parametrize("kind", ["503", "500"])
@pytest.mark.parametrize("method", ["GET", "PUT"])
def test_a_transient_fault_on_a_data_file_is_retried(
    s3_proxy: S3Proxy, kind: str, method: str
) -> None:
    """Two 503 SlowDown or 500 InternalError answers to the GET of a Parquet file (or
    the PUT of its upload part), then the store answers: pyarrow's retry strategy
    (max_attempts from S3Settings) retries, and the file is written and read whole."""
    filesystem = fast(s3_proxy.env).pyarrow_filesystem()
    _, path = data_path(s3_proxy)
    if method == "PUT":
        (rule,) = s3_proxy.add(fault(kind, method="PUT", key=r"\.parquet$", count=2))
        pq.write_table(TABLE, path, filesystem=filesystem)
    else:
        pq.write_table(TABLE, path, filesystem=filesystem)
        (rule,) = s3_proxy.add(fault(kind, method="GET", key=r"\.parquet$", count=2))
    assert pq.read_table(path, filesystem=filesystem).equals(TABLE)
    assert rule.fired == 2
    assert len(s3_proxy.requests(method, r"\.parquet$")) > rule.fired


@pytest.mark.parametrize("kind", ["503", "500"])
def test_a_persistent_fault_on_a_data_file_read_names_the_key(
    s3_proxy: S3Proxy, kind: str
) -> None:
    filesystem = fast(s3_proxy.env).pyarrow_filesystem()
    _, path = data_path(s3_proxy)
    pq.write_table(TABLE, path, filesystem=filesystem)
    s3_proxy.add(fault(kind, method="GET", key=r"\.parquet$", count=None))
    url = f"s3://{path}"
    with pytest.raises(StorageError) as error, arrow_errors("GET", url,
                                                            s3_proxy.endpoint_url):
        pq.read_table(path, filesystem=filesystem)
    message = str(error.value)
    assert message.startswith(f"{url}: GET failed: ")
    # pyarrow names a 503 SlowDown by its code, or under load (its own request timing)
    # by the status as SERVICE_UNAVAILABLE: either says throttling, which is the point.
    expected = ("SLOW_DOWN", "SERVICE_UNAVAILABLE") if kind == "503" else ("INTERNAL_FAILURE",)
    assert any(name in message for name in expected), message
    assert "\n" not in message and SECRET_ACCESS_KEY not in message
    assert len(s3_proxy.requests("GET", r"\.parquet$")) == ATTEMPTS


def test_a_failed_multipart_upload_leaves_no_object(s3_proxy: S3Proxy, s3: S3Server) -> None:
    """A persistent 500 on the upload of a part (pyarrow writes through a multipart
    upload): the write fails with a StorageError naming the key, and no object, whole
    or partial, appears under that name: readers never see a half-written file. The
    incomplete upload stays until abort_incomplete_uploads removes it (if it is old
    enough: an upload in progress looks the same)."""
    filesystem = fast(s3_proxy.env).pyarrow_filesystem()
    location, path = data_path(s3_proxy)
    s3_proxy.add(internal_error(method="PUT", key=r"\.parquet$", count=None))
    url = f"s3://{path}"
    with pytest.raises(StorageError, match=r"PUT failed: .*INTERNAL_FAILURE"), \
            arrow_errors("PUT", url, s3_proxy.endpoint_url):
        pq.write_table(TABLE, path, filesystem=filesystem)
    assert len(s3_proxy.requests("PUT", r"\.parquet$")) == ATTEMPTS
    client = s3.client()
    listed = client.list_objects_v2(Bucket=s3.bucket, Prefix=location.path + "/")
    assert listed.get("KeyCount", 0) == 0
    # pyarrow did not abort its upload: the parts stay until abort_incomplete_uploads
    # (backend/s3/abandoned_uploads.py) or a lifecycle rule removes them. moto dates every upload
    # 2010-11-10, so "now" is set from it to show that a young upload is left alone.
    uploads = client.list_multipart_uploads(Bucket=s3.bucket, Prefix=location.path + "/")
    (upload,) = uploads["Uploads"]
    young = upload["Initiated"] + timedelta(seconds=60)
    assert abort_incomplete_uploads(client, location, older_than_s=3600, now=young) == []
    assert abort_incomplete_uploads(client, location, older_than_s=30, now=young) == [
        location.key("00000000000000000000.parquet")]
    uploads = client.list_multipart_uploads(Bucket=s3.bucket, Prefix=location.path + "/")
    assert not uploads.get("Uploads")


def test_the_server_upkeep_aborts_uploads_abandoned_for_a_day(
        s3: S3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The writer's upkeep aborts a multipart upload once it has itself seen it
    incomplete for the age (by its own clock: moto dates every upload in 2010, which by
    the store's dates alone would make an upload in progress look abandoned), and
    leaves younger ones and uploads elsewhere in the bucket alone. A local directory
    has nothing to sweep."""
    for name, value in s3.env.items():
        monkeypatch.setenv(name, value)
    location = s3.location("abandoned")
    client = s3.client()
    now = [0.0]
    with LogStore.open(str(location), local_dir=tmp_path / "writer") as store:
        upkeep = Upkeep(store, abandoned_upload_age_s=600, upload_sweep_interval_s=60,
                        clock=lambda: now[0])
        old = client.create_multipart_upload(Bucket=s3.bucket, Key=location.key("old"))
        elsewhere = s3.location("another-store").key("x")
        client.create_multipart_upload(Bucket=s3.bucket, Key=elsewhere)
        upkeep.run_once()  # first seen at 0

        def incomplete() -> set[str]:
            listed = client.list_multipart_uploads(Bucket=s3.bucket)
            return {upload["Key"] for upload in listed.get("Uploads", [])
                    if upload["Key"] in (old["Key"], young["Key"], elsewhere)}

        now[0] = 300.0
        young = client.create_multipart_upload(Bucket=s3.bucket, Key=location.key("young"))
        upkeep.run_once()  # first seen at 300
        now[0] = 630.0
        upkeep.run_once()
        assert incomplete() == {young["Key"], elsewhere}
        assert old["Key"] not in incomplete()
        now[0] = 680.0
        upkeep.run_once()  # within the interval since the last look: no look
        assert young["Key"] in incomplete()
        now[0] = 1000.0
        upkeep.run_once()
        assert incomplete() == {elsewhere}
    with LogStore.open(str(tmp_path / "local")) as local:
        assert local.layout.upload_sweeper(0) is None


def test_a_stalled_data_file_read_is_retried_after_the_timeout(s3_proxy: S3Proxy) -> None:
    """The GET of a Parquet file stalls past the request timeout once: pyarrow gives it
    up and retries (its request_timeout bounds a stalled read on Linux too). Stalled on
    every attempt: a StorageError naming the key."""
    filesystem = fast(s3_proxy.env, request_timeout_s=1.0).pyarrow_filesystem()
    _, path = data_path(s3_proxy)
    pq.write_table(TABLE, path, filesystem=filesystem)
    (once,) = s3_proxy.add(stall(method="GET", key=r"\.parquet$"))
    assert pq.read_table(path, filesystem=filesystem).equals(TABLE)
    assert once.fired == 1
    s3_proxy.clear()
    s3_proxy.add(stall(method="GET", key=r"\.parquet$", count=None))
    url = f"s3://{path}"
    with pytest.raises(StorageError, match="GET failed") as error, \
            arrow_errors("GET", url, s3_proxy.endpoint_url):
        pq.read_table(path, filesystem=filesystem)
    assert str(error.value).startswith(url)


def test_a_data_file_body_cut_short_is_read_again(s3_proxy: S3Proxy) -> None:
    filesystem = fast(s3_proxy.env).pyarrow_filesystem()
    _, path = data_path(s3_proxy)
    pq.write_table(TABLE, path, filesystem=filesystem)
    (rule,) = s3_proxy.add(truncate(method="GET", key=r"\.parquet$"))
    assert pq.read_table(path, filesystem=filesystem).equals(TABLE)
    assert rule.fired == 1


# -- ObjectDocument's commit, step by step --------------------------------------------


def open_doc(proxy: S3Proxy, settings: S3Settings, keep: int = 2) -> ObjectDocument:
    location = proxy.server.location("meta")
    assert location.bucket is not None
    return ObjectDocument(settings.boto3_client(), location.bucket, location.path, keep=keep)


def stored(proxy: S3Proxy, doc: ObjectDocument) -> dict[str, bytes]:
    """Every object under the document's prefix, read past the proxy."""
    client = proxy.server.client()
    prefix = doc.key_of("")
    listed = client.list_objects_v2(Bucket=doc.bucket, Prefix=prefix)
    return {item["Key"][len(prefix):]: client.get_object(
        Bucket=doc.bucket, Key=item["Key"])["Body"].read()
        for item in listed.get("Contents", [])}


def check_invariants(proxy: S3Proxy, doc: ObjectDocument, allowed: set[int]) -> int:
    """The document loads one of the `allowed` versions, whole (its body is that
    version's), and its audit copies hold: each decodes to its own version, and the
    newest is not older than current.json's. The current version."""
    files = stored(proxy, doc)
    fresh = ObjectDocument(proxy.server.client(), doc.bucket, doc.prefix, keep=doc.keep)
    snapshot = fresh.load()
    assert snapshot is not None and snapshot.version in allowed
    assert snapshot.body == {"v": snapshot.version}
    current = json.loads(files[CURRENT])
    copies = {name: json.loads(raw) for name, raw in files.items() if name != CURRENT}
    for name, copy in copies.items():
        assert name == f"{copy['version']:020d}.json"
        assert copy["body"] == {"v": copy["version"]}
    assert max(copy["version"] for copy in copies.values()) >= current["version"]
    assert copies[f"{current['version']:020d}.json"] == current
    return snapshot.version


# (method, key pattern, what it is): one request of each step of the commit protocol.
STEPS = [
    ("GET", r"/current\.json$", "step 2: read current.json"),
    ("PUT", r"/0+2\.json$", "step 3: create the audit copy"),
    ("PUT", r"/current\.json$", "step 4: replace current.json"),
    ("DELETE", r"/0+1\.json$", "step 5: prune an old audit copy"),
]


@pytest.mark.parametrize("kind", ["503", "500"])
@pytest.mark.parametrize(("method", "key", "step"), STEPS, ids=[s[2][:6] for s in STEPS])
def test_a_transient_fault_at_each_commit_step_is_retried(
    s3_proxy: S3Proxy, kind: str, method: str, key: str, step: str
) -> None:
    """Two throttling or 500 answers at one step of ObjectDocument.commit, then the
    store answers: botocore retries with backoff and the commit lands, once."""
    doc = open_doc(s3_proxy, fast(s3_proxy.env), keep=1)
    doc.commit(0, {"v": 1})
    (rule,) = s3_proxy.add(fault(kind, method=method, key=key, count=2))
    assert doc.commit(1, {"v": 2}).version == 2
    assert rule.fired == 2, step
    assert check_invariants(s3_proxy, doc, {2}) == 2
    assert doc.history() == [2]


@pytest.mark.parametrize("kind", ["503", "500"])
@pytest.mark.parametrize(("method", "key", "step"), STEPS[:2], ids=["step 2", "step 3"])
def test_a_persistent_fault_before_the_commit_point_changes_nothing(
    s3_proxy: S3Proxy, kind: str, method: str, key: str, step: str
) -> None:
    """A fault that outlasts the retries at step 2 or 3: a one-line StorageError that
    names the operation and the key, and nothing stored changed."""
    doc = open_doc(s3_proxy, fast(s3_proxy.env))
    doc.commit(0, {"v": 1})
    before = stored(s3_proxy, doc)
    s3_proxy.add(fault(kind, method=method, key=key, count=None))
    with pytest.raises(StorageError) as error:
        doc.commit(1, {"v": 2})
    message = str(error.value)
    name = CURRENT if "current" in key else f"{2:020d}.json"
    assert message.startswith(f"{doc.url_of(doc.key_of(name))}: {method} failed after "
                              f"{ATTEMPTS} attempts: "), message
    assert ("SlowDown" if kind == "503" else "InternalError") in message
    assert "\n" not in message
    assert len(s3_proxy.requests(method, key)) >= ATTEMPTS
    s3_proxy.clear()
    assert stored(s3_proxy, doc) == before
    assert check_invariants(s3_proxy, doc, {1}) == 1
    assert doc.commit(1, {"v": 2}).version == 2


@pytest.mark.parametrize("kind", ["503", "500"])
def test_a_persistent_fault_at_the_commit_point_is_settled_by_resolve(
    s3_proxy: S3Proxy, kind: str
) -> None:
    """Step 4 answered 5xx on every attempt: the store may or may not have written it,
    so the commit says CommitOutcomeUnknown (a StorageError naming current.json) and the
    document loads the old version meanwhile. resolve() re-sends the same conditional
    PUT once the store answers, and lands exactly that version."""
    doc = open_doc(s3_proxy, fast(s3_proxy.env))
    doc.commit(0, {"v": 1})
    s3_proxy.add(fault(kind, method="PUT", key=r"/current\.json$", count=None))
    with pytest.raises(ObjectCommitOutcomeUnknown) as unknown:
        doc.commit(1, {"v": 2})
    assert isinstance(unknown.value, StorageError)
    assert str(unknown.value).startswith(doc.url_of(doc.current_key))
    assert check_invariants(s3_proxy, doc, {1}) == 1
    s3_proxy.clear()
    resolved = doc.resolve(unknown.value)
    assert resolved is not None and resolved.version == 2
    assert check_invariants(s3_proxy, doc, {2}) == 2


def test_a_persistent_fault_when_pruning_leaves_the_commit_standing(
    s3_proxy: S3Proxy, caplog: pytest.LogCaptureFixture
) -> None:
    doc = open_doc(s3_proxy, fast(s3_proxy.env), keep=1)
    doc.commit(0, {"v": 1})
    s3_proxy.add(slow_down(method="DELETE", count=None))
    assert doc.commit(1, {"v": 2}).version == 2
    assert "pruning old audit copies failed" in caplog.text
    assert check_invariants(s3_proxy, doc, {2}) == 2
    assert doc.history() == [1, 2]
    s3_proxy.clear()
    assert doc.commit(2, {"v": 3}).version == 3
    assert doc.history() == [3]


@pytest.mark.parametrize("then", ["drop", "forward"])
def test_a_stalled_commit_put_is_unknown_until_resolved(s3_proxy: S3Proxy, then: str) -> None:
    """Step 4 stalls past the request timeout on every attempt. The commit says
    CommitOutcomeUnknown. "drop": the stalled PUTs never reach the store, and resolve()
    re-sends and lands the version. "forward": they reach it after the client gave up
    (the test releases them), one lands and the others are refused (412: the proxy
    forwards conditional PUTs one at a time, as S3 decides them atomically and moto
    does not), and resolve() finds that version is its own: landed once either way."""
    doc = open_doc(s3_proxy, fast(s3_proxy.env, request_timeout_s=1.0))
    doc.commit(0, {"v": 1})
    since = s3_proxy.mark()
    (rule,) = s3_proxy.add(stall(then, method="PUT", key=r"/current\.json$", count=None))
    with pytest.raises(ObjectCommitOutcomeUnknown) as unknown:
        doc.commit(1, {"v": 2})
    assert rule.fired == ATTEMPTS
    assert check_invariants(s3_proxy, doc, {1}) == 1
    s3_proxy.clear()
    s3_proxy.release()
    s3_proxy.wait_idle()
    landed = [s.status for s in s3_proxy.requests("PUT", r"/current\.json$", since)]
    if then == "forward":
        assert sorted(landed) == [200] + [412] * (ATTEMPTS - 1)
    resolved = doc.resolve(unknown.value)
    assert resolved is not None and resolved.version == 2
    assert check_invariants(s3_proxy, doc, {2}) == 2
    assert doc.resolve(unknown.value) == resolved


def test_a_stalled_read_ends_in_a_clear_error(s3_proxy: S3Proxy) -> None:
    """Step 2's GET stalls past the request timeout on every attempt: a StorageError
    that names the key and the timeout setting; nothing changed."""
    doc = open_doc(s3_proxy, fast(s3_proxy.env, request_timeout_s=1.0))
    doc.commit(0, {"v": 1})
    s3_proxy.add(stall("drop", method="GET", key=r"/current\.json$", count=None))
    with pytest.raises(StorageError) as error:
        doc.commit(1, {"v": 2})
    assert str(error.value) == (
        f"{doc.url_of(doc.current_key)}: GET failed after {ATTEMPTS} attempts: no answer "
        f"from {s3_proxy.endpoint_url} within the request timeout "
        "(S3Settings.request_timeout_s)")
    s3_proxy.clear()
    assert check_invariants(s3_proxy, doc, {1}) == 1


@pytest.mark.parametrize("step", ["audit", "current"])
def test_a_lost_answer_to_a_commit_put_is_retried_and_settled(
    s3_proxy: S3Proxy, step: str
) -> None:
    """The PUT of step 3 or 4 lands but its answer is lost (the connection drops).
    botocore retries it; the retry is refused with 412 because the first one landed;
    the commit reads the object back, finds its own commit_id, and succeeds: one
    version, landed once."""
    doc = open_doc(s3_proxy, fast(s3_proxy.env))
    doc.commit(0, {"v": 1})
    key = r"/0+2\.json$" if step == "audit" else r"/current\.json$"
    since = s3_proxy.mark()
    (rule,) = s3_proxy.add(lost_answer(method="PUT", key=key))
    assert doc.commit(1, {"v": 2}).version == 2
    assert rule.fired == 1
    assert [s.status for s in s3_proxy.requests("PUT", key, since)] == [200, 412]
    assert check_invariants(s3_proxy, doc, {2}) == 2
    assert doc.history() == [1, 2]


def test_a_document_body_cut_short_is_read_again(s3_proxy: S3Proxy) -> None:
    """current.json's body cut short: botocore does not retry a body it already began to
    read, so ObjectDocument's GET does; the load and the commit succeed."""
    doc = open_doc(s3_proxy, fast(s3_proxy.env))
    doc.commit(0, {"v": 1})
    (rule,) = s3_proxy.add(truncate(method="GET", key=r"/current\.json$", count=2))
    snapshot = doc.load()
    assert snapshot is not None and snapshot.version == 1
    assert rule.fired == 2
    s3_proxy.add(truncate(method="GET", key=r"/current\.json$", count=ATTEMPTS))
    with pytest.raises(StorageError, match="GET failed after 3 attempts"):
        doc.load()
    s3_proxy.clear()
    assert doc.commit(1, {"v": 2}).version == 2


def test_retry_logs_hold_no_secret(s3_proxy: S3Proxy, caplog: pytest.LogCaptureFixture) -> None:
    """Retries, failures and every log record (botocore's and urllib3's included, at
    DEBUG, which log request headers and the strings they sign) show no credential:
    backend/s3/settings.py's filter masks the token and the access key id there."""
    caplog.set_level(logging.DEBUG)
    # The CLI, run in this process by other tests, raises these loggers to INFO for good
    # (quiet_secret_loggers); this test needs their DEBUG records.
    for name in ("botocore", "urllib3"):
        caplog.set_level(logging.DEBUG, logger=name)
    doc = open_doc(s3_proxy, fast(s3_proxy.env))
    s3_proxy.add(slow_down(method="PUT", count=None))
    with pytest.raises(StorageError) as error:
        doc.commit(0, {"v": 1})
    # Every record but the store's own (moto runs in this process and logs what it got).
    logged = "\n".join(r.getMessage() for r in caplog.records
                       if not r.name.startswith(("moto", "werkzeug")))
    assert "X-Amz-Security-Token': b'***'" in logged, "botocore logged its request"
    for secret in (SECRET_ACCESS_KEY, SESSION_TOKEN, ACCESS_KEY_ID):
        assert secret not in logged
        assert secret not in str(error.value)


def test_the_proxy_passes_everything_through_without_rules(s3_proxy: S3Proxy) -> None:
    """With no rule the proxy is transparent: a commit and a Parquet round trip behave
    as against moto directly (signatures included)."""
    settings = fast(s3_proxy.env)
    doc = open_doc(s3_proxy, settings)
    assert doc.commit(0, {"v": 1}).version == 1
    _, path = data_path(s3_proxy)
    filesystem = settings.pyarrow_filesystem()
    pq.write_table(TABLE, path, filesystem=filesystem)
    assert pq.read_table(path, filesystem=filesystem).equals(TABLE)
    assert all(s.action == "forward" for s in s3_proxy.seen)
    assert all(s.status is not None and (s.status < 300 or s.status == 404)
               for s in s3_proxy.seen)


def test_the_proxy_stops_every_thread_it_started(s3: S3Server) -> None:
    """stop() joins its server thread and every connection's handler thread, idle
    keep-alive connections and stalled requests included."""
    before = set(threading.enumerate())
    host, _, port = s3.endpoint_url.removeprefix("http://").partition(":")
    proxy = S3Proxy((host, int(port)), s3).start()
    client = fast(proxy.env, request_timeout_s=1.0).boto3_client()
    client.list_objects_v2(Bucket=s3.bucket, MaxKeys=1)  # leaves a keep-alive connection
    proxy.add(stall(method="GET", count=None))
    with pytest.raises(StorageError):
        ObjectDocument(client, s3.bucket, "stalled").load()
    proxy.stop()
    # moto's own handler threads of the proxy's upstream connections end once those
    # connections close, a moment after stop(): wait for them, not for the proxy's.
    deadline = time.monotonic() + 10
    while not set(threading.enumerate()) <= before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert set(threading.enumerate()) <= before


@pytest.mark.parametrize("kind", ["503", "500"])
def test_boto3_backs_off_with_the_settings_bases(
    s3_proxy: S3Proxy, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """The delays botocore sleeps between attempts are the settings' (backend/s3/settings.py):
    with the jitter pinned to its maximum, base * 2 ** (i - 1) capped at max_backoff_s,
    the base being throttle_backoff_s after a 503 SlowDown and retry_backoff_s after a
    500. (The delays are read, not timed.)"""
    import botocore.endpoint

    delays: list[float] = []
    real_sleep = time.sleep
    caller = threading.current_thread()

    def sleep(seconds: float) -> None:  # botocore's, in this thread; others really sleep
        if threading.current_thread() is caller:
            delays.append(seconds)
        else:
            real_sleep(seconds)

    monkeypatch.setattr("random.random", lambda: 1.0)
    monkeypatch.setattr(botocore.endpoint.time, "sleep", sleep)
    settings = dataclasses.replace(fast(s3_proxy.env), max_attempts=4,
                                   throttle_backoff_s=0.004, retry_backoff_s=0.001,
                                   max_backoff_s=0.006)
    doc = open_doc(s3_proxy, settings)
    s3_proxy.add(fault(kind, method="GET", key=r"/current\.json$", count=3))
    assert doc.load() is None
    assert delays == ([0.004, 0.006, 0.006] if kind == "503" else [0.001, 0.002, 0.004])
