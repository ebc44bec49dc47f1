"""A real S3 API server on loopback for the object-storage tests, and a fault-injecting
client in front of it.

moto's server mode (ThreadedMotoServer) speaks S3 over HTTP on 127.0.0.1 and an
ephemeral port and enforces If-None-Match: * and If-Match (412 otherwise). It checks a
condition and then writes without a lock, so two racing conditional PUTs can both pass:
tests against it prove the protocol, not the store's atomicity (see LockedConditionalPuts).

Tests take the `s3` fixture (tests/conftest.py), or `s3_env` for the same server with its
AWS settings in the test's environment. The server is started once per test run and
stopped at its end; each test gets its own key prefix.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from botocore.exceptions import ClientError

from compactlog.backend import Location
from compactlog.backend.s3.settings import S3Settings
from compactlog.storage.store import LogStore

BUCKET = "compactlog-test"
# Fake credentials, distinctive so that tests can check they never leak.
ACCESS_KEY_ID = "AKIAMOTOTESTKEYID0001"
SECRET_ACCESS_KEY = "moto-test-SECRET-do-not-print-7f3a9c"
SESSION_TOKEN = "moto-test-SESSION-TOKEN-do-not-print-51e0"


@dataclass
class S3Server:
    endpoint_url: str
    env: dict[str, str]
    bucket: str

    def client(self) -> Any:
        return S3Settings.from_env(self.env).boto3_client()

    def location(self, name: str = "") -> Location:
        """A fresh, unique prefix in the test bucket."""
        prefix = f"t-{uuid.uuid4().hex[:12]}" + (f"/{name}" if name else "")
        return Location.parse(f"s3://{self.bucket}/{prefix}")


def open_local_or_s3(where: str, request: Any, tmp_path: Path, monkeypatch: Any,
                     clock: Callable[[], float], name: str) -> LogStore:
    """A store in `tmp_path` (`where` "local"), or under a fresh prefix of the `s3`
    fixture's bucket named `name` ("s3"), its AWS settings put in the test's environment
    through `monkeypatch`: for fixtures parametrized over both backends."""
    if where == "local":
        return LogStore.open(tmp_path / "data", clock=clock)
    s3: S3Server = request.getfixturevalue("s3")
    for variable, value in s3.env.items():
        monkeypatch.setenv(variable, value)
    return LogStore.open(s3.location(name), local_dir=tmp_path / "local", clock=clock)


def start_s3_server() -> Iterator[S3Server]:
    """moto's server, running until the generator is closed (the `s3` fixture)."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        env = {
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY_ID,
            "AWS_SECRET_ACCESS_KEY": SECRET_ACCESS_KEY,
            "AWS_SESSION_TOKEN": SESSION_TOKEN,
            "AWS_REGION": "us-east-1",
        }
        found = S3Server(endpoint, env, BUCKET)
        found.client().create_bucket(Bucket=BUCKET)
        yield found
    finally:
        server.stop()


def client_error(status: int, code: str, operation: str = "PutObject") -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": f"injected {code}"},
                        "ResponseMetadata": {"HTTPStatusCode": status}}, operation)


Hook = Callable[[str, dict[str, Any]], None]


class FaultyClient:
    """A boto3 S3 client with hooks before and after each call, deterministic faults in
    front of the server: `before(op, kwargs)` may raise (the request is never sent) or
    block; `after(op, kwargs)` runs once the server has answered and may raise (the
    answer is lost: a timeout after sending)."""

    def __init__(self, client: Any, before: Hook | None = None,
                 after: Hook | None = None) -> None:
        self._client = client
        self.before = before
        self.after = after

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._client, name)
        if name.startswith("_") or not callable(attribute) or name in (
                "get_paginator", "meta"):
            return attribute

        def call(**kwargs: Any) -> Any:
            if self.before is not None:
                self.before(name, kwargs)
            result = attribute(**kwargs)
            if self.after is not None:
                self.after(name, kwargs)
            return result

        return call


class LockedConditionalPuts:
    """Makes each conditional PUT atomic at the client, standing in for what a real S3
    guarantees and moto does not (it checks the condition, then writes, unlocked).
    Everything else, including the compare of step 2 and stalls, interleaves freely: a
    race test through it checks the protocol; it cannot check the store's atomicity."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def put_object(self, **kwargs: Any) -> Any:
        if "IfMatch" in kwargs or "IfNoneMatch" in kwargs:
            with self._lock:
                return self._client.put_object(**kwargs)
        return self._client.put_object(**kwargs)
