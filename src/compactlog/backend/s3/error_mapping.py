"""What a failed request to an S3-compatible store means, in one line a user can act on.

Invariant: every error raised here names the operation, the object's s3:// URL (or the
endpoint, when the store was never reached) and what to do, on one line, and never holds
a credential: messages are built from the error's code, status and a few fixed texts,
never from request headers or signed URLs, and a server's own message is shown only for
errors that are not about credentials.

A failure the request's retries did not cure (they are in S3Settings: throttling, 5xx,
timeouts and dropped connections are retried with backoff first) becomes:
- ObjectStoreSetupError (a UserError: fix the setup, retrying will not help): the bucket
  does not exist, the credentials were refused (InvalidAccessKeyId,
  SignatureDoesNotMatch, expired tokens), access was denied, or no credentials were found;
  ConditionalWritesUnsupportedError (backend/s3/probe.py) is one of these.
- StorageError (retryable): the endpoint cannot be reached (connection refused, connect
  timeout), a request timed out or lost its connection, or the store kept answering
  with throttling or 5xx errors; any other failure of a request.
`s3_error` maps botocore's exceptions (boto3), `request_error` with what a client knows
(its endpoint, its attempts); `arrow_error` maps the OSError pyarrow's
S3FileSystem raises, and `arrow_errors` is a context manager that applies it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    PartialCredentialsError,
    ReadTimeoutError,
)

from compactlog.errors import CompactlogError, StorageError, UserError

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


class ObjectStoreSetupError(UserError):
    """The object store refused the setup: a missing bucket, refused credentials, no
    permission, no credentials, or a missing feature. Fix it; retrying does not help."""


CREDENTIALS_HINT = ("check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN "
                    "or AWS_PROFILE")
# S3 error codes that say the credentials were refused: (what was wrong).
_REFUSED = {
    "InvalidAccessKeyId": "the access key id is unknown to the store (InvalidAccessKeyId)",
    "SignatureDoesNotMatch": "the secret access key does not match the access key id "
                             "(SignatureDoesNotMatch)",
    "InvalidToken": "the session token is malformed or invalid (InvalidToken)",
    "ExpiredToken": "the session token has expired (ExpiredToken)",
    "TokenRefreshRequired": "the session token must be refreshed (TokenRefreshRequired)",
    "AuthorizationHeaderMalformed": "the request's credentials are malformed for this "
                                    "store or region (AuthorizationHeaderMalformed)",
    "InvalidSecurity": "the provided security credentials are not valid (InvalidSecurity)",
}
_THROTTLING = {"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded",
               "TooManyRequests", "RequestThrottled", "ServiceUnavailable"}


def http_status(error: ClientError) -> int:
    """The HTTP status of a store's error answer (0 if there was none)."""
    return int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))


def no_such_key(error: ClientError) -> bool:
    """Whether the answer says the object is not there (not a missing bucket, which is
    a 404 as well, and a setup error)."""
    return error.response.get("Error", {}).get("Code") in ("NoSuchKey", "404")


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _bucket_of(url: str) -> str:
    return url.removeprefix("s3://").split("/", 1)[0]


def s3_error(operation: str, url: str, error: Exception, endpoint: str | None = None,
             attempts: int | None = None) -> CompactlogError:
    """The compactlog error for `error`, raised by boto3 doing `operation` (GET, PUT,
    HEAD, DELETE, LIST) on `url` (s3://BUCKET/KEY) at `endpoint` after `attempts`."""
    where = f"{url}: {operation} failed"
    tries = f" after {attempts} attempts" if attempts and attempts > 1 else ""
    shown_endpoint = endpoint or "the default AWS endpoint"
    if isinstance(error, ClientError):
        info = error.response.get("Error", {})
        code = str(info.get("Code", ""))
        status = int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))
        if code == "NoSuchBucket":
            return ObjectStoreSetupError(
                f"{where}: bucket {_bucket_of(url)!r} does not exist at {shown_endpoint}: "
                "create it, or correct the bucket in the data location or AWS_ENDPOINT_URL")
        if code in _REFUSED:
            return ObjectStoreSetupError(
                f"{where}: the store at {shown_endpoint} refused the credentials: "
                f"{_REFUSED[code]}; {CREDENTIALS_HINT}")
        if code == "AccessDenied" or status == 403:
            return ObjectStoreSetupError(
                f"{where}: access denied ({code or status}): the credentials lack "
                f"permission for this {operation} on bucket {_bucket_of(url)!r}; grant it "
                f"or use other credentials ({CREDENTIALS_HINT})")
        message = _one_line(str(info.get("Message", "")))
        kind = "throttled by the store" if code in _THROTTLING else "the store answered"
        return StorageError(f"{where}{tries}: {kind} {status} {code}"
                            + (f" ({message})" if message else ""))
    if isinstance(error, EndpointConnectionError | ConnectTimeoutError):
        return StorageError(
            f"{where}{tries}: cannot connect to the S3 endpoint {shown_endpoint} "
            f"({type(error).__name__}): is it running, and is AWS_ENDPOINT_URL right?")
    if isinstance(error, NoCredentialsError | PartialCredentialsError):
        return ObjectStoreSetupError(f"{where}: no usable credentials were found; set "
                                     "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and "
                                     "AWS_SESSION_TOKEN) or AWS_PROFILE")
    if isinstance(error, ReadTimeoutError):
        return StorageError(f"{where}{tries}: no answer from {shown_endpoint} within the "
                            "request timeout (S3Settings.request_timeout_s)")
    if isinstance(error, BotoCoreError):
        return StorageError(f"{where}{tries}: {type(error).__name__}: "
                            f"{_one_line(str(error))}")
    return StorageError(f"{where}: {type(error).__name__}: {_one_line(str(error))}")


def request_error(client: S3Client, operation: str, url: str,
                  error: Exception) -> StorageError | ObjectStoreSetupError:
    """`s3_error` for a request made by `client`: its endpoint, and how many attempts
    were made (the answer's RetryAttempts, else the client's max attempts)."""
    retries: dict[str, Any] = getattr(client.meta.config, "retries", None) or {}
    attempts = int(retries.get("total_max_attempts") or retries.get("max_attempts") or 1)
    if isinstance(error, ClientError):
        attempts = int(error.response.get("ResponseMetadata", {}).get(
            "RetryAttempts", 0)) + 1
    failed = s3_error(operation, url, error, client.meta.endpoint_url, attempts)
    assert isinstance(failed, StorageError | ObjectStoreSetupError)
    return failed


# pyarrow's S3 errors carry the AWS SDK's error names (and the server's code in
# "(Error code: ...)" or its message); setup errors by what they say.
_ARROW_SETUP = (
    ("NoSuchBucket", "bucket {bucket!r} does not exist at {endpoint}: create it, or "
                     "correct the bucket in the data location or AWS_ENDPOINT_URL"),
    ("NO_SUCH_BUCKET", "bucket {bucket!r} does not exist at {endpoint}: create it, or "
                       "correct the bucket in the data location or AWS_ENDPOINT_URL"),
    ("The specified bucket does not exist", "bucket {bucket!r} does not exist at "
     "{endpoint}: create it, or correct the bucket in the data location or "
     "AWS_ENDPOINT_URL"),
    ("INVALID_ACCESS_KEY_ID", "the store at {endpoint} refused the credentials: "
     + _REFUSED["InvalidAccessKeyId"] + "; " + CREDENTIALS_HINT),
    ("InvalidAccessKeyId", "the store at {endpoint} refused the credentials: "
     + _REFUSED["InvalidAccessKeyId"] + "; " + CREDENTIALS_HINT),
    ("SIGNATURE_DOES_NOT_MATCH", "the store at {endpoint} refused the credentials: "
     + _REFUSED["SignatureDoesNotMatch"] + "; " + CREDENTIALS_HINT),
    ("SignatureDoesNotMatch", "the store at {endpoint} refused the credentials: "
     + _REFUSED["SignatureDoesNotMatch"] + "; " + CREDENTIALS_HINT),
    ("ACCESS_DENIED", "access denied: the credentials lack permission for this "
     "operation on bucket {bucket!r} (" + CREDENTIALS_HINT + ")"),
    ("HTTP response code: 403", "access denied (403): the credentials lack permission "
     "for this operation on bucket {bucket!r} (" + CREDENTIALS_HINT + ")"),
)
_ARROW_UNREACHABLE = ("NETWORK_CONNECTION", "curlCode: 7", "Couldn't connect to server",
                      "curlCode: 28")


def arrow_error(operation: str, url: str, error: OSError,
                endpoint: str | None = None) -> CompactlogError:
    """The compactlog error for an OSError from pyarrow's S3FileSystem doing `operation`
    on `url` at `endpoint`. (Its retries are done by then: S3Settings.max_attempts.)"""
    text = _one_line(str(error))
    where = f"{url}: {operation} failed"
    shown_endpoint = endpoint or "the default AWS endpoint"
    for marker, advice in _ARROW_SETUP:
        if marker in text:
            return ObjectStoreSetupError(
                f"{where}: " + advice.format(bucket=_bucket_of(url), endpoint=shown_endpoint))
    if any(marker in text for marker in _ARROW_UNREACHABLE):
        return StorageError(f"{where}: cannot connect to the S3 endpoint {shown_endpoint} "
                            "(or it stopped answering): is it running, and is "
                            "AWS_ENDPOINT_URL right?")
    return StorageError(f"{where}: {text}")


@contextmanager
def arrow_errors(operation: str, url: str, endpoint: str | None = None) -> Iterator[None]:
    """Raise pyarrow's S3 failures inside the block as `arrow_error` says; a missing
    object (FileNotFoundError) is not a failure of the store and passes unchanged."""
    try:
        yield
    except FileNotFoundError:
        raise
    except OSError as error:
        raise arrow_error(operation, url, error, endpoint) from error
