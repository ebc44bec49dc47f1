"""A fault-injecting S3 proxy for the tests, in front of the moto server (never inside the
product): the faults a real object store and its network produce, made deterministic.

Invariant: a request that no rule matches reaches the store unchanged and its answer
reaches the client unchanged (method, path, query, headers including Host, so SigV4
signatures still verify, and body), so a test through the proxy with no rules behaves
as a test against moto. Each rule fires only on the requests the test names (method,
key pattern, the nth match and how many after it), so a fault lands on exactly one step
of a protocol, whatever the timing. `stop()` ends every thread the proxy started and
releases every stalled request. One exception to transparency: conditional PUTs are
forwarded one at a time, standing in for the atomicity a real S3 gives them and moto
does not (it checks the condition, then writes, unlocked), so that stalled conditional
PUTs released together decide as they would on S3.

Actions (what a matching request gets):
  error(status, code)  an S3 XML error answer, without forwarding: 503 SlowDown
                       (throttling), 500 InternalError, or 403 InvalidAccessKeyId /
                       SignatureDoesNotMatch (emulated bad credentials)
  stall(then)          hold the request until `release()`, `seconds` pass or `stop()`;
                       then "forward" it (it lands late, after the client gave up) or
                       "drop" it (it never reaches the store: a black hole)
  lost_answer          forward it (the write lands), then close the connection without
                       answering: the client cannot know whether it landed
  truncate             forward it and answer with the right Content-Length but only
                       half the body, then close: a response cut short
  strip_conditions     forward it without If-Match / If-None-Match (or one of them): a
                       store that ignores conditional writes
Tests take the `s3_proxy` fixture (tests/conftest.py): a proxy per test in front of the
session's moto server, whose `env` points the AWS settings at the proxy.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import re
import socket
import threading
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

from compactlog.backend.s3.settings import S3Settings
from support.s3_support import S3Server

HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te",
              "trailer", "upgrade", "proxy-authorization", "proxy-authenticate"}
CONDITIONS = ("if-match", "if-none-match")
MESSAGES = {
    "SlowDown": "Please reduce your request rate.",
    "InternalError": "We encountered an internal error. Please try again.",
    "ServiceUnavailable": "Service is unable to handle request.",
    "InvalidAccessKeyId": "The AWS Access Key Id you provided does not exist in our records.",
    "SignatureDoesNotMatch": "The request signature we calculated does not match the "
                             "signature you provided. Check your key and signing method.",
    "AccessDenied": "Access Denied",
}


ATTEMPTS = 3


def fast(env: dict[str, str], request_timeout_s: float = 5.0) -> S3Settings:
    """S3 settings for tests: ATTEMPTS attempts, a millisecond backoff, short timeouts."""
    return dataclasses.replace(
        S3Settings.from_env(env), max_attempts=ATTEMPTS, connect_timeout_s=1.0,
        request_timeout_s=request_timeout_s, throttle_backoff_s=0.001,
        retry_backoff_s=0.001, max_backoff_s=0.01)


@dataclass
class Rule:
    """Which requests a fault hits. `method` (None: any) and `key` (a regex searched in
    the object key, None: any; the key of a bucket-level request such as a LIST is "")
    select the matching requests; of those, the `nth` (1-based) and the `count - 1`
    after it fire (count None: every one from the nth on). `fired` counts them."""

    action: str
    method: str | None = None
    key: str | None = None
    nth: int = 1
    count: int | None = 1
    status: int = 503
    code: str = "SlowDown"
    then: str = "forward"
    seconds: float = 30.0
    strip: tuple[str, ...] = CONDITIONS
    matched: int = 0
    fired: int = 0

    def matches(self, method: str, key: str) -> bool:
        if self.method is not None and method != self.method:
            return False
        return self.key is None or re.search(self.key, key) is not None

    def take(self) -> bool:
        """Count one matching request; whether the fault fires on it."""
        self.matched += 1
        if self.matched < self.nth:
            return False
        if self.count is not None and self.matched >= self.nth + self.count:
            return False
        self.fired += 1
        return True


def error(status: int, code: str, **where: Any) -> Rule:
    return Rule("error", status=status, code=code, **where)


def slow_down(**where: Any) -> Rule:
    return error(503, "SlowDown", **where)


def internal_error(**where: Any) -> Rule:
    return error(500, "InternalError", **where)


def stall(then: str = "forward", seconds: float = 30.0, **where: Any) -> Rule:
    assert then in ("forward", "drop")
    return Rule("stall", then=then, seconds=seconds, **where)


def lost_answer(**where: Any) -> Rule:
    return Rule("lost_answer", **where)


def truncate(**where: Any) -> Rule:
    return Rule("truncate", **where)


def strip_conditions(strip: tuple[str, ...] = CONDITIONS, **where: Any) -> Rule:
    """Forward without the `strip` headers (lower-case): by default every condition."""
    return Rule("strip_conditions", strip=strip, **{"count": None, **where})


@dataclass
class Seen:
    """One request as the proxy saw it, and what it did with it."""

    method: str
    key: str
    query: str
    headers: dict[str, str]
    action: str = "forward"
    status: int | None = None


@dataclass
class S3Proxy:
    """The proxy's control surface: add rules, read what it saw, release stalls."""

    upstream: tuple[str, int]
    server: S3Server
    rules: list[Rule] = field(default_factory=list)
    seen: list[Seen] = field(default_factory=list)
    endpoint_url: str = ""
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _conditional: threading.Lock = field(default_factory=threading.Lock)
    _released: threading.Event = field(default_factory=threading.Event)
    _idle: threading.Condition = field(default_factory=threading.Condition)
    _active: int = 0
    _connections: set[socket.socket] = field(default_factory=set)
    _httpd: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None

    def add(self, *rules: Rule) -> list[Rule]:
        with self._lock:
            self.rules.extend(rules)
        return list(rules)

    def clear(self) -> None:
        with self._lock:
            self.rules.clear()

    def release(self) -> None:
        """Let every stalled request go on (forwarded or dropped, per its rule)."""
        self._released.set()

    def wait_idle(self, timeout: float = 30.0) -> None:
        """Wait until no request is being handled (a released stall has finished)."""
        with self._idle:
            assert self._idle.wait_for(lambda: self._active == 0, timeout), \
                "the proxy is still handling a request"

    @property
    def env(self) -> dict[str, str]:
        return {**self.server.env, "AWS_ENDPOINT_URL": self.endpoint_url}

    def requests(self, method: str | None = None, key: str | None = None,
                 since: int = 0) -> list[Seen]:
        """The requests seen (from the `since`th on: see `mark`) that match."""
        with self._lock:
            return [s for s in self.seen[since:] if (method is None or s.method == method)
                    and (key is None or re.search(key, s.key) is not None)]

    def mark(self) -> int:
        """A position in `seen`, for `requests(since=...)`."""
        with self._lock:
            return len(self.seen)

    def _decide(self, seen: Seen) -> Rule | None:
        with self._lock:
            self.seen.append(seen)
            for rule in self.rules:
                if rule.matches(seen.method, seen.key) and rule.take():
                    seen.action = rule.action
                    return rule
        return None

    def start(self) -> S3Proxy:
        proxy = self

        class Handler(_Handler):
            owner = proxy

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        # Handler threads are joined by server_close (after stop() closed their sockets).
        self._httpd.daemon_threads = False
        self._httpd.block_on_close = True
        host, port = self._httpd.server_address[:2]
        self.endpoint_url = f"http://{host}:{port}"
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        name="s3-fault-proxy", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Release stalls, stop accepting, close every client connection (idle
        keep-alive ones included) and join every thread the proxy started."""
        self._released.set()
        if self._httpd is not None:
            self._httpd.shutdown()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.wait_idle()
        with self._lock:
            connections = list(self._connections)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        if self._httpd is not None:
            self._httpd.server_close()


class _Handler(BaseHTTPRequestHandler):
    owner: S3Proxy
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        with self.owner._lock:
            self.owner._connections.add(self.connection)

    def finish(self) -> None:
        with contextlib.suppress(OSError):
            super().finish()
        with self.owner._lock:
            self.owner._connections.discard(self.connection)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: the test reads `seen`

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _handle(self) -> None:
        owner = self.owner
        with owner._idle:
            owner._active += 1
        try:
            self._serve(owner)
        finally:
            with owner._idle:
                owner._active -= 1
                owner._idle.notify_all()

    def _serve(self, owner: S3Proxy) -> None:
        body = self._body()
        parts = urlsplit(self.path)
        _, _, key = parts.path.lstrip("/").partition("/")
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
        seen = Seen(self.command, unquote(key), parts.query, dict(headers))
        rule = owner._decide(seen)
        action = rule.action if rule is not None else "forward"
        if rule is not None and action == "error":
            seen.status = rule.status
            self._send_error(rule.status, rule.code, seen.key)
            return
        if rule is not None and action == "stall":
            owner._released.wait(rule.seconds)
            if rule.then == "drop":
                self._drop()
                return
        if rule is not None and action == "strip_conditions":
            headers = {k: v for k, v in headers.items() if k.lower() not in rule.strip}
        status, reason, answer_headers, answer = self._forward(owner, headers, body)
        seen.status = status
        if action == "lost_answer":
            self._drop()
            return
        self.send_response_only(status, reason)
        for name, value in answer_headers:
            if name.lower() not in HOP_BY_HOP:
                self.send_header(name, value)
        if self.command != "HEAD" and not any(
                n.lower() == "content-length" for n, _ in answer_headers):
            self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        if self.command == "HEAD":
            return
        if action == "truncate":
            self.wfile.write(answer[: len(answer) // 2])
            self.wfile.flush()
            self._drop()
            return
        self.wfile.write(answer)

    def _forward(self, owner: S3Proxy, headers: dict[str, str],
                 body: bytes) -> tuple[int, str, list[tuple[str, str]], bytes]:
        conditional = any(name.lower() in CONDITIONS for name in headers)
        with owner._conditional if conditional else contextlib.nullcontext():
            return self._send_upstream(owner, headers, body)

    def _send_upstream(self, owner: S3Proxy, headers: dict[str, str],
                       body: bytes) -> tuple[int, str, list[tuple[str, str]], bytes]:
        connection = http.client.HTTPConnection(*owner.upstream, timeout=60)
        try:
            connection.putrequest(self.command, self.path, skip_host=True,
                                  skip_accept_encoding=True)
            for name, value in headers.items():
                if name.lower() != "content-length":
                    connection.putheader(name, value)
            if body or self.command in ("PUT", "POST"):
                connection.putheader("Content-Length", str(len(body)))
            connection.endheaders(body or None)
            response = connection.getresponse()
            answer = response.read()
            return response.status, response.reason, response.getheaders(), answer
        finally:
            connection.close()

    def _send_error(self, status: int, code: str, key: str) -> None:
        request_id = uuid.uuid4().hex[:16].upper()
        message = MESSAGES.get(code, code)
        xml = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
               f"<Message>{message}</Message><Key>{key}</Key>"
               f"<RequestId>{request_id}</RequestId></Error>").encode()
        self.send_response_only(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("x-amz-request-id", request_id)
        self.send_header("Content-Length", "0" if self.command == "HEAD" else str(len(xml)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(xml)

    def _drop(self) -> None:
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def handle_one_request(self) -> None:
        try:
            super().handle_one_request()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle
