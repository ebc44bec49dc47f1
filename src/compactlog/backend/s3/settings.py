"""The S3 connection settings (S3Settings) from the standard AWS environment, the boto3
client and pyarrow filesystem made from them, and the filter that keeps credentials out
of the logs of the libraries under boto3.

Invariant: no credential is ever shown. A Location (compactlog.backend) never holds one;
credentials and the endpoint come only from the standard AWS settings (environment
variables and profiles), read when a client or filesystem is made (`S3Settings.from_env`),
and `S3Settings` never shows a secret either. botocore and urllib3 log requests at DEBUG
with their headers (the session token, the access key id) and the strings they sign: a
filter installed on those loggers when a boto3 client is made masks them
(`_RedactCredentials`).

What the libraries read by themselves (measured with pyarrow 26.0.1 and boto3 1.44.5):
- boto3 reads AWS_ENDPOINT_URL and AWS_ENDPOINT_URL_S3, the credentials
  (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN), AWS_PROFILE and the
  shared config files, and the region from AWS_DEFAULT_REGION, but not AWS_REGION.
- pyarrow's S3FileSystem() constructor reads the credentials, profiles and AWS_REGION,
  but neither AWS_ENDPOINT_URL nor AWS_ENDPOINT_URL_S3 (it goes to amazonaws.com; only
  `pyarrow.fs.FileSystem.from_uri("s3://...")` reads them), and it takes the endpoint's
  scheme (http or https) as a separate setting from the host.
So the gaps filled here are the endpoint (both variables, scheme split off for pyarrow)
and the region (AWS_REGION, then AWS_DEFAULT_REGION, for both). Explicit credentials in
the environment are passed to both, so the two clients never disagree; without them each
library's own chain (profiles, instance metadata) applies.

Retries and timeouts (S3Settings' fields, the same for both clients; the limits are
bounded by construction: `max_attempts` requests per operation, each at most
`connect_timeout_s` + `request_timeout_s` plus a backoff of at most `max_backoff_s`):
- boto3 uses botocore's "standard" retry mode (throttling such as 503 SlowDown, 5xx,
  connection errors and timeouts are retried, up to `max_attempts` attempts in all,
  `AWS_MAX_ATTEMPTS` overriding the default), with its backoff's base delays taken from
  here: before retry i (1-based) it sleeps rand(0, 1) * min(base * 2 ** (i - 1),
  max_backoff_s), base being `throttle_backoff_s` after a throttling answer and
  `retry_backoff_s` after any other (botocore's own 1 s and 0.05 s by default).
- pyarrow uses the AWS SDK's standard strategy (`AwsStandardS3RetryStrategy`) with the
  same `max_attempts` and the SDK's own backoff (not settable from Python), and the same
  connect and request timeouts. Measured here with pyarrow 26 on Linux, whatever its
  docstring says, request_timeout does bound a stalled read (tests/faults/test_s3_faults.py).
"""

from __future__ import annotations

import logging
import os
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from compactlog.backend import LocationError

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from pyarrow.fs import FileSystem

DEFAULT_MAX_ATTEMPTS = 5  # boto3's own default is 3; S3 advises retrying SlowDown
MAX_ATTEMPTS_LIMIT = 20
TIMEOUT_LIMIT_S = 3600.0

@dataclass(frozen=True)
class S3Settings:
    """The S3 connection settings from the standard AWS environment. Secrets are kept
    out of repr (and there is no __str__ that shows them)."""

    endpoint_url: str | None = None
    region: str | None = None
    access_key_id: str | None = field(default=None, repr=False)
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    profile: str | None = None
    # Retries and timeouts, for boto3 and pyarrow alike (see the module docstring).
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    connect_timeout_s: float = 5.0
    request_timeout_s: float = 30.0
    throttle_backoff_s: float = 1.0
    retry_backoff_s: float = 0.05
    max_backoff_s: float = 20.0

    def __post_init__(self) -> None:
        if not 1 <= self.max_attempts <= MAX_ATTEMPTS_LIMIT:
            raise LocationError(f"S3 max_attempts {self.max_attempts} (AWS_MAX_ATTEMPTS) is "
                                f"outside 1..{MAX_ATTEMPTS_LIMIT}")
        for name in ("connect_timeout_s", "request_timeout_s", "throttle_backoff_s",
                     "retry_backoff_s", "max_backoff_s"):
            value = getattr(self, name)
            if not 0 <= value <= TIMEOUT_LIMIT_S or (name.endswith("timeout_s") and
                                                      value == 0):
                raise LocationError(f"S3 setting {name}={value!r} is outside "
                                    f"{'(0' if name.endswith('timeout_s') else '[0'}, "
                                    f"{TIMEOUT_LIMIT_S:g}] seconds")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> S3Settings:
        env = os.environ if env is None else env
        endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None
        if endpoint is not None:
            parts = urlsplit(endpoint)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise LocationError(
                    f"AWS_ENDPOINT_URL {endpoint!r} is not an http:// or https:// URL")
            if parts.username or parts.password:
                raise LocationError("AWS_ENDPOINT_URL must not contain credentials")
        access = env.get("AWS_ACCESS_KEY_ID") or None
        secret = env.get("AWS_SECRET_ACCESS_KEY") or None
        if (access is None) != (secret is None):
            present = "AWS_ACCESS_KEY_ID" if access else "AWS_SECRET_ACCESS_KEY"
            raise LocationError(f"{present} is set but its pair is not: set both "
                                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or neither")
        attempts = env.get("AWS_MAX_ATTEMPTS") or None
        if attempts is not None and not attempts.strip().isdigit():
            raise LocationError(f"AWS_MAX_ATTEMPTS {attempts!r} is not a whole number")
        return cls(
            max_attempts=int(attempts) if attempts is not None else DEFAULT_MAX_ATTEMPTS,
            endpoint_url=endpoint,
            region=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None,
            access_key_id=access,
            secret_access_key=secret,
            session_token=env.get("AWS_SESSION_TOKEN") or None,
            profile=env.get("AWS_PROFILE") or None,
        )

    def __repr__(self) -> str:
        credentials = "environment" if self.access_key_id else "default chain"
        return (f"S3Settings(endpoint_url={self.endpoint_url!r}, region={self.region!r}, "
                f"credentials={credentials!r}, profile={self.profile!r}, "
                f"max_attempts={self.max_attempts}, connect_timeout_s="
                f"{self.connect_timeout_s:g}, request_timeout_s={self.request_timeout_s:g})")

    __str__ = __repr__

    def pyarrow_filesystem(self) -> FileSystem:
        from pyarrow import fs

        options: dict[str, Any] = {}
        if self.endpoint_url is not None:
            parts = urlsplit(self.endpoint_url)
            options["scheme"] = parts.scheme
            options["endpoint_override"] = parts.netloc + parts.path.rstrip("/")
        if self.region is not None:
            options["region"] = self.region
        if self.access_key_id is not None:
            options["access_key"] = self.access_key_id
            options["secret_key"] = self.secret_access_key
            if self.session_token is not None:
                options["session_token"] = self.session_token
        return fs.S3FileSystem(
            connect_timeout=self.connect_timeout_s, request_timeout=self.request_timeout_s,
            retry_strategy=fs.AwsStandardS3RetryStrategy(max_attempts=self.max_attempts),
            **options)

    def boto3_client(self) -> S3Client:
        import boto3
        from botocore.config import Config

        session = boto3.session.Session(
            aws_access_key_id=self.access_key_id,
            aws_secret_access_key=self.secret_access_key,
            aws_session_token=self.session_token,
            region_name=self.region,
            profile_name=self.profile if self.access_key_id is None else None,
        )
        config = Config(connect_timeout=self.connect_timeout_s,
                        read_timeout=self.request_timeout_s,
                        retries={"mode": "standard", "total_max_attempts": self.max_attempts})
        _redact_logs(self)
        client = session.client("s3", endpoint_url=self.endpoint_url, config=config)
        _use_backoff(client, self)
        return client


# Loggers of the libraries under boto3 that, at DEBUG, log requests with their headers
# (the session token, the access key id in Authorization) or the string they sign.
_REQUEST_LOGGERS = ("botocore.endpoint", "botocore.auth", "botocore.hooks",
                    "botocore.parsers", "botocore.httpsession", "botocore.awsrequest",
                    "botocore.credentials", "botocore.retryhandler", "botocore.utils",
                    "botocore.regions", "urllib3.connectionpool")
_CREDENTIAL_PATTERNS = (
    re.compile(r"(?i)(x-amz-security-token['\"]?\s*[:=]\s*b?['\"]?)[^'\"\s,}\\]+"),
    re.compile(r"(Credential=)[^/\s'\",]+"),
    re.compile(r"(?i)(X-Amz-Credential=)[^%&\s'\"]+"),
)


class _RedactCredentials(logging.Filter):
    """Masks credentials in the records of _REQUEST_LOGGERS: every secret value of the
    settings that made a client (known), and token and key-id header forms (whatever
    the credential chain found). Installed once per process, by boto3_client."""

    def __init__(self) -> None:
        super().__init__()
        self.known: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record is the logging module's to report
            return True
        redacted = message
        for value in self.known:
            redacted = redacted.replace(value, "***")
        for pattern in _CREDENTIAL_PATTERNS:
            redacted = pattern.sub(r"\1***", redacted)
        if redacted != message:
            record.msg, record.args = redacted, None
        return True


_REDACT = _RedactCredentials()


def _redact_logs(settings: S3Settings) -> None:
    for value in (settings.access_key_id, settings.secret_access_key,
                  settings.session_token):
        if value:
            _REDACT.known.add(value)
    for name in _REQUEST_LOGGERS:
        logger = logging.getLogger(name)
        if _REDACT not in logger.filters:
            logger.addFilter(_REDACT)


def _use_backoff(client: S3Client, settings: S3Settings) -> None:
    """Replace the backoff of botocore's standard retry handler by one with the settings'
    base delays (botocore takes max_attempts from the Config but hard-codes the delays).
    The handler is rebuilt from botocore.retries.standard's parts, as botocore's
    register_retry_handler builds it, and registered under the same event and unique id
    as botocore's own, which is unregistered first."""
    from botocore.retries import quota, standard
    from botocore.retries.base import BaseRetryBackoff

    class Backoff(BaseRetryBackoff):
        """botocore's truncated binary exponential backoff with jitter, our bases."""

        def delay_amount(self, context: Any) -> float:
            throttled = bool(throttling.is_throttling_error_from_context(context))
            base = settings.throttle_backoff_s if throttled else settings.retry_backoff_s
            attempt = int(context.attempt_number)
            return random.random() * min(base * 2.0 ** (attempt - 1),
                                         settings.max_backoff_s)

    events = client.meta.events
    adapter = standard.RetryEventAdapter()
    throttling = standard.ThrottlingErrorDetector(adapter)
    retry_quota = standard.RetryQuotaChecker(quota.RetryQuota(), throttling)
    handler = standard.RetryHandler(
        retry_policy=standard.RetryPolicy(
            retry_checker=standard.StandardRetryConditions(max_attempts=settings.max_attempts),
            retry_backoff=Backoff()),
        retry_event_adapter=adapter,
        retry_quota=retry_quota,  # type: ignore[arg-type]  # the stubs are wrong here
        service_name="s3")
    events.unregister("needs-retry.s3", unique_id="retry-config-s3")
    events.register("needs-retry.s3", handler.needs_retry,  # type: ignore[arg-type]
                    unique_id="retry-config-s3")
    events.register("after-call.s3", retry_quota.release_retry_quota)
