"""Bad setup of an s3:// location, each with a one-line error that says what was wrong and
where, and never a secret (s3_support's fake secrets, and the secret moto's IAM made, are
looked for in every message and log): a missing bucket, refused credentials, an endpoint
that is down, and a store without conditional writes (backend/s3/probe.py's protocol; the
steps' tests are named there).

Credentials: moto checks signatures only when its auth is switched on. Its server takes
that switch over HTTP (POST /moto-api/reset-auth with the number of requests to let
through unchecked: 0 to check every one, "inf" to stop), which is what moto's
INITIAL_NO_AUTH_ACTION_COUNT setting does at start-up. With it on, an access key id moto's
IAM does not know gets 403 InvalidAccessKeyId and a wrong secret 403
SignatureDoesNotMatch, so no emulation in the proxy is needed. The switch is global to
the moto server the test run shares, so the fixture turns it off again whatever happens.
"""

from __future__ import annotations

import json
import logging
import socket
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from compactlog.backend import Location
from compactlog.backend.s3.document import ObjectDocument
from compactlog.backend.s3.error_mapping import ObjectStoreSetupError, arrow_errors
from compactlog.backend.s3.probe import (
    PROBE_PREFIX,
    ConditionalWritesUnsupportedError,
    check_conditional_writes,
)
from compactlog.errors import StorageError, UserError
from support.s3_faults import (
    S3Proxy,
    error,
    fast,
    strip_conditions,
)
from support.s3_support import (
    ACCESS_KEY_ID,
    SECRET_ACCESS_KEY,
    SESSION_TOKEN,
    S3Server,
)

SECRETS = (SECRET_ACCESS_KEY, SESSION_TOKEN)
TABLE = pa.table({"key": [b"a"], "offset": [0]})


def assert_clear(message: str, *secrets: str) -> None:
    assert "\n" not in message
    for secret in (*SECRETS, ACCESS_KEY_ID, *secrets):
        assert secret not in message


def left_under(s3: S3Server, location: Location) -> list[str]:
    listed = s3.client().list_objects_v2(Bucket=s3.bucket, Prefix=location.path + "/")
    return [item["Key"] for item in listed.get("Contents", [])]


# -- a missing bucket ------------------------------------------------------------------


def test_a_missing_bucket_is_named(s3: S3Server, caplog: pytest.LogCaptureFixture) -> None:
    """Probe step 1, a document's read and a data file's write each say which bucket
    does not exist at which endpoint, and what to do."""
    caplog.set_level(logging.DEBUG)
    location = Location.parse("s3://no-such-bucket-7d1/data")
    says = f"bucket 'no-such-bucket-7d1' does not exist at {s3.endpoint_url}: create it"
    with pytest.raises(ObjectStoreSetupError) as probe:
        ObjectDocument.at(location, settings=fast(s3.env))
    assert str(probe.value).startswith(f"s3://no-such-bucket-7d1/data/{PROBE_PREFIX}")
    assert f"PUT failed: {says}" in str(probe.value)
    doc = ObjectDocument(fast(s3.env).boto3_client(), "no-such-bucket-7d1", "data")
    with pytest.raises(ObjectStoreSetupError) as load:
        doc.load()
    assert str(load.value).startswith("s3://no-such-bucket-7d1/data/current.json: GET failed")
    assert says in str(load.value)
    path = location.join("segment.parquet").fs_path
    with pytest.raises(ObjectStoreSetupError) as write, \
            arrow_errors("PUT", f"s3://{path}", s3.endpoint_url):
        pq.write_table(TABLE, path, filesystem=location.filesystem(settings=fast(s3.env)))
    assert says in str(write.value)
    for raised in (probe, load, write):
        assert isinstance(raised.value, UserError)
        assert_clear(str(raised.value))
    assert SECRET_ACCESS_KEY not in caplog.text


# -- refused credentials (moto's auth on) ----------------------------------------------


@dataclass
class IamKey:
    access_key_id: str
    secret_access_key: str


def _moto_auth(s3: S3Server, count: str) -> None:
    request = urllib.request.Request(f"{s3.endpoint_url}/moto-api/reset-auth",
                                     data=count.encode(), method="POST",
                                     headers={"Content-Type": "text/plain"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert json.loads(answer.read())["status"] == "ok"


@pytest.fixture
def moto_auth(s3: S3Server) -> Iterator[IamKey]:
    """moto checking every request's signature, and an IAM user allowed s3:* whose key
    is good; switched off again at the end."""
    iam = boto3.client("iam", endpoint_url=s3.endpoint_url, region_name="us-east-1",
                       aws_access_key_id=ACCESS_KEY_ID,
                       aws_secret_access_key=SECRET_ACCESS_KEY)
    user = f"compactlog-{uuid.uuid4().hex[:8]}"
    iam.create_user(UserName=user)
    iam.put_user_policy(UserName=user, PolicyName="s3", PolicyDocument=json.dumps({
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
    key = iam.create_access_key(UserName=user)["AccessKey"]
    _moto_auth(s3, "0")
    try:
        yield IamKey(key["AccessKeyId"], key["SecretAccessKey"])
    finally:
        _moto_auth(s3, "inf")


def with_key(s3: S3Server, access_key_id: str, secret: str) -> dict[str, str]:
    env = {k: v for k, v in s3.env.items() if k != "AWS_SESSION_TOKEN"}
    return {**env, "AWS_ACCESS_KEY_ID": access_key_id, "AWS_SECRET_ACCESS_KEY": secret}


@pytest.mark.parametrize("wrong", ["access key id", "secret"])
def test_refused_credentials_are_named(
    s3: S3Server, moto_auth: IamKey, caplog: pytest.LogCaptureFixture, wrong: str
) -> None:
    """An unknown access key id (InvalidAccessKeyId) or a wrong secret
    (SignatureDoesNotMatch), from moto checking signatures: the probe (boto3) and a data
    file's write (pyarrow) each name the cause and the variables to check, and show no
    secret. The good key works, so it is the credentials that were refused."""
    caplog.set_level(logging.DEBUG)
    location = s3.location("data")
    good = with_key(s3, moto_auth.access_key_id, moto_auth.secret_access_key)
    check_conditional_writes(location, fast(good).boto3_client(), force=True)
    if wrong == "secret":
        env = with_key(s3, moto_auth.access_key_id, "not-the-secret-" + uuid.uuid4().hex)
        says = "(SignatureDoesNotMatch)"
    else:
        env = with_key(s3, ACCESS_KEY_ID, SECRET_ACCESS_KEY)
        says = "(InvalidAccessKeyId)"
    with pytest.raises(ObjectStoreSetupError) as probe:
        check_conditional_writes(location, fast(env).boto3_client(), force=True)
    path = location.join("segment.parquet").fs_path
    with pytest.raises(ObjectStoreSetupError) as write, \
            arrow_errors("PUT", f"s3://{path}", s3.endpoint_url):
        pq.write_table(TABLE, path, filesystem=location.filesystem(settings=fast(env)))
    for raised in (probe, write):
        message = str(raised.value)
        assert f"the store at {s3.endpoint_url} refused the credentials" in message
        assert says in message and "check AWS_ACCESS_KEY_ID" in message
        assert_clear(message, moto_auth.secret_access_key, env["AWS_SECRET_ACCESS_KEY"])
    assert str(probe.value).startswith(f"{location}/{PROBE_PREFIX}")
    assert str(write.value).startswith(f"s3://{path}: PUT failed: ")
    # Every record but the store's own (moto runs in this process and logs what it got).
    logged = "\n".join(r.getMessage() for r in caplog.records
                       if not r.name.startswith(("moto", "werkzeug")))
    for secret in (SECRET_ACCESS_KEY, moto_auth.secret_access_key,
                   env["AWS_SECRET_ACCESS_KEY"], moto_auth.access_key_id, ACCESS_KEY_ID):
        assert secret not in logged


def test_access_denied_is_named(s3_proxy: S3Proxy) -> None:
    """A 403 AccessDenied (emulated by the proxy: moto's IAM policies are not what this
    checks) on a data file's read and on a document's read."""
    settings = fast(s3_proxy.env)
    location = s3_proxy.server.location("data")
    path = location.join("segment.parquet").fs_path
    filesystem = settings.pyarrow_filesystem()
    pq.write_table(TABLE, path, filesystem=filesystem)
    s3_proxy.add(error(403, "AccessDenied", method="GET", count=None))
    with pytest.raises(ObjectStoreSetupError, match="access denied") as read, \
            arrow_errors("GET", f"s3://{path}", s3_proxy.endpoint_url):
        pq.read_table(path, filesystem=filesystem)
    doc = ObjectDocument(settings.boto3_client(), location.bucket or "", location.path)
    with pytest.raises(ObjectStoreSetupError) as load:
        doc.load()
    assert str(load.value) == (
        f"{location}/current.json: GET failed: access denied (AccessDenied): the "
        f"credentials lack permission for this GET on bucket '{location.bucket}'; grant it "
        "or use other credentials (check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / "
        "AWS_SESSION_TOKEN or AWS_PROFILE)")
    assert_clear(str(read.value))


# -- an endpoint that is down -----------------------------------------------------------


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_a_down_endpoint_is_named(s3: S3Server) -> None:
    """Connection refused on every attempt: a StorageError (retryable: the endpoint may
    come back) that names the endpoint and the variable to check."""
    endpoint = f"http://127.0.0.1:{closed_port()}"
    settings = fast({**s3.env, "AWS_ENDPOINT_URL": endpoint})
    location = s3.location("data")
    with pytest.raises(StorageError) as probe:
        ObjectDocument.at(location, settings=settings)
    assert str(probe.value).startswith(f"{location}/{PROBE_PREFIX}")
    assert str(probe.value).endswith(
        f": PUT failed after 3 attempts: cannot connect to the S3 endpoint {endpoint} "
        "(EndpointConnectionError): is it running, and is AWS_ENDPOINT_URL right?")
    path = location.join("segment.parquet").fs_path
    with pytest.raises(StorageError) as write, arrow_errors("PUT", f"s3://{path}", endpoint):
        pq.write_table(TABLE, path, filesystem=location.filesystem(settings=settings))
    assert f"cannot connect to the S3 endpoint {endpoint}" in str(write.value)
    for raised in (probe, write):
        assert not isinstance(raised.value, UserError)
        assert_clear(str(raised.value))


# -- a store without conditional writes ------------------------------------------------


def test_a_store_that_ignores_conditions_is_refused(s3_proxy: S3Proxy) -> None:
    """Probe step 2: the proxy drops If-None-Match and If-Match on the way, as a store
    that ignores them would: the second create-only PUT succeeds, and the location is
    refused with a message naming the missing feature. The probe object is removed."""
    s3_proxy.add(strip_conditions())
    location = s3_proxy.server.location("data")
    with pytest.raises(ConditionalWritesUnsupportedError) as refused:
        ObjectDocument.at(location, settings=fast(s3_proxy.env))
    message = str(refused.value)
    assert message.startswith(f"{location}/{PROBE_PREFIX}")
    assert f"the object store at {s3_proxy.endpoint_url} ignores If-None-Match: *" in message
    assert "compactlog commits manifests with conditional writes" in message
    assert isinstance(refused.value, UserError)
    assert_clear(message)
    assert left_under(s3_proxy.server, location) == []


def test_a_store_that_ignores_if_match_only_is_refused(s3_proxy: S3Proxy) -> None:
    """Probe step 3: a store that honours If-None-Match but ignores If-Match."""
    s3_proxy.add(strip_conditions(strip=("if-match",)))
    location = s3_proxy.server.location("data")
    with pytest.raises(ConditionalWritesUnsupportedError, match="ignores If-Match"):
        check_conditional_writes(location, fast(s3_proxy.env).boto3_client())
    assert left_under(s3_proxy.server, location) == []


def test_a_store_that_rejects_conditional_headers_is_refused(s3_proxy: S3Proxy) -> None:
    """Probe step 1: a store that answers 501 NotImplemented to a conditional PUT."""
    s3_proxy.add(error(501, "NotImplemented", method="PUT", count=None))
    location = s3_proxy.server.location("data")
    with pytest.raises(ConditionalWritesUnsupportedError,
                       match=r"refuses conditional PUTs \(501 NotImplemented\)"):
        check_conditional_writes(location, fast(s3_proxy.env).boto3_client())


def test_moto_passes_the_probe_once_per_bucket(s3_proxy: S3Proxy) -> None:
    """moto enforces both conditions: the probe passes with three PUTs (the last two
    refused with 412) and a DELETE, leaves nothing, and is not repeated for the same
    endpoint and bucket unless forced."""
    location = s3_proxy.server.location("data")
    client = fast(s3_proxy.env).boto3_client()
    check_conditional_writes(location, client)
    probe = rf"{PROBE_PREFIX}[0-9a-f]+$"
    assert [(s.method, s.status) for s in s3_proxy.requests(key=probe)] == [
        ("PUT", 200), ("PUT", 412), ("PUT", 412), ("DELETE", 204)]
    assert [s.headers.get("If-None-Match") for s in s3_proxy.requests("PUT", probe)][:2] \
        == ["*", "*"]
    assert left_under(s3_proxy.server, location) == []
    check_conditional_writes(location.join("other"), client)
    ObjectDocument.at(location, settings=fast(s3_proxy.env))
    assert len(s3_proxy.requests(key=probe)) == 4
    check_conditional_writes(location, client, force=True)
    assert len(s3_proxy.requests(key=probe)) == 8


def test_the_probe_refuses_a_local_directory() -> None:
    with pytest.raises(UserError, match="not an s3:// location"):
        check_conditional_writes(Location.parse("/tmp/x"))


def test_no_credentials_are_named(s3: S3Server, monkeypatch: pytest.MonkeyPatch,
                                  tmp_path: Path) -> None:
    """No credentials anywhere (no variables, no shared files, no instance metadata):
    the probe says so and names the variables to set."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                 "AWS_PROFILE", "AWS_DEFAULT_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    env = {"AWS_ENDPOINT_URL": s3.endpoint_url, "AWS_REGION": "us-east-1"}
    location = s3.location("data")
    with pytest.raises(ObjectStoreSetupError) as error:
        check_conditional_writes(location, fast(env).boto3_client(), force=True)
    assert str(error.value).startswith(f"{location}/{PROBE_PREFIX}")
    assert str(error.value).endswith(
        ": PUT failed: no usable credentials were found; set AWS_ACCESS_KEY_ID and "
        "AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN) or AWS_PROFILE")
