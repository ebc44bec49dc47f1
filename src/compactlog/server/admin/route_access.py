"""Who is calling the admin HTTP API, and what they may do: the Kafka listener's ACLs.

Invariant: an admin request is served only if (1) its principal is established, and
(2) the authorizer allows that principal the operation the route needs (with the
authorizer off, step 2 allows everything). A principal comes from the first source
that knows one, in order:
  1. a TLS client certificate, when the admin API runs over TLS (`admin_tls`) and the
     client sent one: its principal as the Kafka listeners name it (`tls_principal`;
     other sources plug in by `principal_sources`);
  2. `Authorization: Bearer TOKEN`, TOKEN a line of the tokens file; a token that is
     not in the file is refused (401), never taken for anonymous;
  3. none: `User:ANONYMOUS`, as an unauthenticated Kafka client is, unless a tokens
     file is configured, which makes a principal required (401).
`/metrics` and `/v1/health` skip both steps while `admin_open_health_and_metrics`,
except that with the authorizer on, /metrics shows the samples of a topic or group only
to a principal that may DESCRIBE it (server/admin/http_api.py): there a request that proves no
principal is User:ANONYMOUS, and a token it sends must be valid.
Tokens are compared in constant time and never logged or echoed; log lines and errors
name the principal and the route only.

The tokens file: one `PRINCIPAL TOKEN` pair a line (`User:ops 6f1c...`), blank lines
and lines starting with `#` ignored. It is read again when it changes, so tokens are
added and revoked without a restart; it should be readable by the server's user only.
It fails closed: while it is missing or unreadable no token is valid, as when it is
emptied (a WARNING says why, at most once a minute). A file that reads but has a
malformed line keeps the tokens read before it (a half-saved edit must not lock every
operator out), with a WARNING naming the line. A bad file at start stops the server.
"""

from __future__ import annotations

import hmac
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compactlog.errors import UserError
from compactlog.log_throttle import Throttle, held_back
from compactlog.server.security.acl_model import ANONYMOUS, AclError, check_principal
from compactlog.server.security.tls import certificate_principal

log = logging.getLogger("compactlog.admin")

# A source of principals: the principal it proves for a request, or None.
PrincipalSource = Callable[[Any], str | None]


class Unauthenticated(Exception):
    """401: no principal could be established; the message is safe to show."""


class Forbidden(Exception):
    """403: the principal may not do this; the message is safe to show."""


class _Unreadable(UserError):
    """The tokens file is missing or cannot be read."""


@dataclass(frozen=True)
class _Loaded:
    stamp: tuple[int, int, int]
    tokens: tuple[tuple[bytes, str], ...]  # (token, principal)


class TokenFile:
    """The bearer tokens of the admin API, by the file they are kept in."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._loaded: _Loaded | None = None
        self._warnings = Throttle(60.0)
        self._load()  # a bad file stops the server at start, not at the first request

    def _load(self) -> tuple[tuple[bytes, str], ...]:
        try:
            stat = os.stat(self.path)
        except OSError as error:
            raise _Unreadable(f"admin tokens file {self.path}: {error.strerror}") from None
        stamp = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
        if self._loaded is not None and self._loaded.stamp == stamp:
            return self._loaded.tokens
        try:
            text = self.path.read_text()
        except (OSError, UnicodeDecodeError) as error:
            reason = error.strerror if isinstance(error, OSError) else "not UTF-8"
            raise _Unreadable(f"admin tokens file {self.path}: {reason}") from None
        tokens = []
        for number, line in enumerate(text.splitlines(), 1):
            text = line.strip()
            if not text or text.startswith("#"):
                continue
            parts = text.split()
            if len(parts) != 2:
                # The line is not quoted: it may hold a token.
                raise UserError(f"admin tokens file {self.path}, line {number}: expected "
                                "PRINCIPAL TOKEN (two fields)")
            principal, token = parts
            try:
                check_principal(principal)
            except AclError as error:
                raise UserError(f"admin tokens file {self.path}, line {number}: "
                                f"{error}") from None
            tokens.append((token.encode(), principal))
        self._loaded = _Loaded(stamp, tuple(tokens))
        return self._loaded.tokens

    def principal_of(self, token: str) -> str | None:
        try:
            tokens = self._load()
        except _Unreadable as error:
            # Deleted or unreadable while serving: no token is valid (fail closed:
            # deleting the file revokes them, as emptying it does).
            self._loaded = None
            held = self._warnings.allow("unreadable")
            if held is not None:
                log.warning("%s; no token is valid until it can be read%s", error,
                            held_back(held))
            tokens = ()
        except UserError as error:
            # A malformed line (a half-saved edit): keep the last good tokens, say why.
            held = self._warnings.allow("malformed")
            if held is not None:
                log.warning("%s; keeping the tokens read before%s", error, held_back(held))
            tokens = self._loaded.tokens if self._loaded is not None else ()
        given = token.encode()
        found = None
        for known, principal in tokens:  # every entry compared: no early exit
            if hmac.compare_digest(known, given):
                found = principal
        return found


def tls_principal(request: Any) -> str | None:
    """The client certificate's principal, as the Kafka listeners name it
    (server/security/tls.py: `User:CN=...,O=...`), when the admin API runs over TLS and the
    client sent a certificate."""
    transport = getattr(request, "transport", None)
    if transport is None:
        return None
    ssl_object = transport.get_extra_info("ssl_object")
    if ssl_object is None:
        return None
    return certificate_principal(ssl_object.getpeercert(binary_form=True))


class AdminAuth:
    """The principal of an admin request (the module doc's order)."""

    def __init__(self, tokens: TokenFile | None,
                 principal_sources: tuple[PrincipalSource, ...] = (tls_principal,)) -> None:
        self.tokens = tokens
        self.principal_sources = principal_sources

    def principal(self, request: Any, required: bool = True) -> str:
        """The request's principal; `required` False (an open path): User:ANONYMOUS
        when it proves none, even with a tokens file (a token it sends must be valid)."""
        for source in self.principal_sources:
            found = source(request)
            if found is not None:
                return found
        header = request.headers.get("Authorization")
        if header is not None:
            scheme, _, token = header.partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise Unauthenticated("the Authorization header must be 'Bearer TOKEN'")
            principal = (self.tokens.principal_of(token.strip())
                         if self.tokens is not None else None)
            if principal is None:
                raise Unauthenticated("the bearer token is not valid")
            return principal
        if self.tokens is not None and required:
            raise Unauthenticated("a bearer token is required (Authorization: Bearer TOKEN)")
        return ANONYMOUS
