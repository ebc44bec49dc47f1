"""Data locations (compactlog.backend Location; backend/s3/settings.py S3Settings): local
paths and s3:// URLs, the settings read
from the standard AWS environment, no secret in anything shown, and Parquet written and
read through an s3:// location's pyarrow filesystem on a real S3 API server (moto)."""

from __future__ import annotations

import logging
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from compactlog.backend import Location, LocationError
from compactlog.backend.s3.settings import S3Settings
from compactlog.errors import UserError
from support.s3_support import (
    ACCESS_KEY_ID,
    SECRET_ACCESS_KEY,
    SESSION_TOKEN,
    S3Server,
)


def test_local_paths(tmp_path: Path) -> None:
    location = Location.parse(tmp_path / "data")
    assert not location.is_s3
    assert location.path == str(tmp_path / "data")
    assert str(location) == str(tmp_path / "data")
    assert Location.parse(f"file://{tmp_path}/data") == location
    assert Location.parse("relative/dir").path == str(Path("relative/dir").absolute())
    assert location.join("topics", "t/0").path == str(tmp_path / "data" / "topics" / "t" / "0")
    assert location.fs_path == str(tmp_path / "data")
    assert type(location.filesystem()).__name__ == "LocalFileSystem"


@pytest.mark.parametrize(
    ("url", "bucket", "prefix"),
    [
        ("s3://my-bucket", "my-bucket", ""),
        ("s3://my-bucket/", "my-bucket", ""),
        ("s3://my-bucket/data", "my-bucket", "data"),
        ("s3://my.bucket-1/a/b/c/", "my.bucket-1", "a/b/c"),
        ("S3://abc/x", "abc", "x"),
    ],
)
def test_s3_urls(url: str, bucket: str, prefix: str) -> None:
    location = Location.parse(url)
    assert location.is_s3
    assert (location.bucket, location.path) == (bucket, prefix)
    assert str(location) == f"s3://{bucket}" + (f"/{prefix}" if prefix else "")
    assert Location.parse(str(location)) == location
    child = location.join("topics/t", "0")
    assert child.bucket == bucket
    assert child.path == "/".join(p for p in (prefix, "topics", "t", "0") if p)
    assert location.key("current.json") == (f"{prefix}/current.json" if prefix
                                            else "current.json")
    assert location.fs_path == (f"{bucket}/{prefix}" if prefix else bucket)


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("", "empty data location"),
        ("   ", "empty data location"),
        ("s3://", "no bucket name"),
        ("s3:///prefix", "no bucket name"),
        ("s3://ab/x", "invalid bucket name 'ab'"),
        ("s3://My_Bucket/x", "invalid bucket name 'My_Bucket'"),
        ("s3://-bucket/x", "invalid bucket name"),
        ("s3://bucket..x/y", "invalid bucket name"),
        ("s3://bucket:9000/x", "port or endpoint goes in AWS_ENDPOINT_URL"),
        ("s3://bucket/a//b", "segment 2 of the prefix is ''"),
        ("s3://bucket/a/../b", "segment 2 of the prefix is '..'"),
        ("s3://bucket/a?versionId=1", "no query or fragment"),
        ("s3a://bucket/x", "s3a:// is a Hadoop connector name"),
        ("gs://bucket/x", "unsupported data location scheme 'gs://'"),
        ("file://host/x", "names no host"),
    ],
)
def test_bad_locations_say_what_and_where(url: str, says: str) -> None:
    with pytest.raises(LocationError, match=None) as error:
        Location.parse(url)
    assert isinstance(error.value, UserError)
    assert says in str(error.value)
    if url.strip():
        assert url.split("://")[0].lower() in str(error.value).lower() or "://" not in url


def test_credentials_in_a_url_are_refused_without_echoing_them() -> None:
    with pytest.raises(LocationError) as error:
        Location.parse(f"s3://{ACCESS_KEY_ID}:{SECRET_ACCESS_KEY}@bucket/x")
    message = str(error.value)
    assert "credentials do not belong in the URL" in message
    assert SECRET_ACCESS_KEY not in message and ACCESS_KEY_ID not in message
    assert "***@bucket" in message


def test_join_refuses_escapes() -> None:
    for bad in ("..", "a/../b", "", "a//b"):
        with pytest.raises(LocationError):
            Location.parse("s3://bucket/p").join(bad)
    with pytest.raises(LocationError, match="local directory"):
        Location.parse("/tmp/x").key("a")


def test_settings_from_the_standard_environment() -> None:
    env = {
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
        "AWS_ACCESS_KEY_ID": ACCESS_KEY_ID,
        "AWS_SECRET_ACCESS_KEY": SECRET_ACCESS_KEY,
        "AWS_SESSION_TOKEN": SESSION_TOKEN,
        "AWS_DEFAULT_REGION": "eu-west-1",
    }
    settings = S3Settings.from_env(env)
    assert settings.endpoint_url == "http://127.0.0.1:9000"
    assert settings.region == "eu-west-1"
    # The S3-specific endpoint and AWS_REGION win, as in the AWS SDKs.
    settings = S3Settings.from_env({**env, "AWS_ENDPOINT_URL_S3": "https://s3.example:443",
                                    "AWS_REGION": "us-west-2"})
    assert (settings.endpoint_url, settings.region) == ("https://s3.example:443", "us-west-2")
    client = settings.boto3_client()
    assert client.meta.region_name == "us-west-2"
    assert client.meta.endpoint_url == "https://s3.example:443"
    assert S3Settings.from_env({}) == S3Settings()
    assert S3Settings.from_env({"AWS_PROFILE": "dev"}).profile == "dev"
    with pytest.raises(LocationError, match="not an http:// or https:// URL"):
        S3Settings.from_env({"AWS_ENDPOINT_URL": "127.0.0.1:9000"})
    with pytest.raises(LocationError, match="its pair is not"):
        S3Settings.from_env({"AWS_ACCESS_KEY_ID": ACCESS_KEY_ID})


def test_nothing_shown_contains_a_secret(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": ACCESS_KEY_ID,
           "AWS_SECRET_ACCESS_KEY": SECRET_ACCESS_KEY, "AWS_SESSION_TOKEN": SESSION_TOKEN}
    settings = S3Settings.from_env(env)
    location = Location.parse("s3://bucket/prefix")
    filesystem = location.filesystem(env)
    logging.getLogger("compactlog.test").info("settings %s %r at %s %r", settings, settings,
                                              location, location)
    shown = [repr(settings), str(settings), repr(location), str(location), repr(filesystem),
             f"{settings}", caplog.text]
    for text in shown:
        for secret in (SECRET_ACCESS_KEY, SESSION_TOKEN, ACCESS_KEY_ID):
            assert secret not in text
    assert "credentials='environment'" in repr(settings)


def test_parquet_through_the_s3_locations_filesystem(s3: S3Server) -> None:
    location = s3.location("topics")
    filesystem = location.filesystem(s3.env)
    table = pa.table({"key": [b"a", b"b", b"a"], "offset": [0, 1, 2],
                      "value": ["x", None, "z"]})
    path = location.join("t", "0", "segments", "00000000000000000000.parquet").fs_path
    pq.write_table(table, path, filesystem=filesystem, row_group_size=2)
    assert pq.read_table(path, filesystem=filesystem).equals(table)
    metadata = pq.read_metadata(path, filesystem=filesystem)
    assert metadata.num_row_groups == 2 and metadata.num_rows == 3
    # The object is there for boto3 too, under the location's key.
    key = location.key("t/0/segments/00000000000000000000.parquet")
    head = s3.client().head_object(Bucket=s3.bucket, Key=key)
    assert head["ContentLength"] > 0


def test_retry_settings_their_defaults_and_bounds() -> None:
    """The retry and timeout settings (backend/s3/settings.py's docstring): defaults, the standard
    AWS_MAX_ATTEMPTS, refusal of values outside their bounds, and both clients built
    with them."""
    settings = S3Settings.from_env({})
    assert (settings.max_attempts, settings.connect_timeout_s, settings.request_timeout_s,
            settings.throttle_backoff_s, settings.retry_backoff_s,
            settings.max_backoff_s) == (5, 5.0, 30.0, 1.0, 0.05, 20.0)
    assert S3Settings.from_env({"AWS_MAX_ATTEMPTS": "2"}).max_attempts == 2
    for bad in ("0", "21", "x", "-1"):
        with pytest.raises(LocationError, match="AWS_MAX_ATTEMPTS"):
            S3Settings.from_env({"AWS_MAX_ATTEMPTS": bad})
    for name, value in (("connect_timeout_s", 0.0), ("request_timeout_s", -1.0),
                        ("max_backoff_s", 4000.0), ("retry_backoff_s", -0.1)):
        with pytest.raises(LocationError, match=name):
            S3Settings(**{name: value})  # type: ignore[arg-type]
    tuned = S3Settings(endpoint_url="http://127.0.0.1:9", region="us-east-1",
                       max_attempts=4, connect_timeout_s=2.0, request_timeout_s=3.0)
    client = tuned.boto3_client()
    assert client.meta.config.retries == {"mode": "standard", "total_max_attempts": 4}
    assert (client.meta.config.connect_timeout, client.meta.config.read_timeout) == (2.0, 3.0)
    assert "max_attempts=4" in repr(tuned) and "request_timeout_s=3" in repr(tuned)
    assert type(tuned.pyarrow_filesystem()).__name__ == "S3FileSystem"


def test_request_logs_of_unknown_credentials_are_masked(
    caplog: pytest.LogCaptureFixture
) -> None:
    """Credentials the settings do not hold (found by botocore's chain in a profile or
    instance metadata) are masked by their header forms in botocore's request logs."""
    caplog.set_level(logging.DEBUG)
    # The CLI raises botocore's level to INFO (cli.quiet_secret_loggers); a CLI test run
    # in this process before leaves it so: this test is of the filter under it.
    caplog.set_level(logging.DEBUG, logger="botocore")
    S3Settings(region="us-east-1").boto3_client()  # installs the filter
    token, key_id = "IQoJb3JpZ2luX2VjEXAMPLETOKEN+/=", "ASIAEXAMPLEKEYID0002"
    logging.getLogger("botocore.endpoint").debug(
        "Sending http request: headers={'X-Amz-Security-Token': b'%s', 'Authorization': "
        "b'AWS4-HMAC-SHA256 Credential=%s/20261124/us-east-1/s3/aws4_request'}",
        token, key_id)
    logging.getLogger("botocore.auth").debug("CanonicalRequest:\nx-amz-security-token:%s\n",
                                            token)
    assert caplog.records and token not in caplog.text and key_id not in caplog.text
    assert "X-Amz-Security-Token': b'***'" in caplog.text and "Credential=***/" in caplog.text
