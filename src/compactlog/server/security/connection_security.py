"""One connection's security state: its listener, its principal, and the SASL exchange
that must come before anything else on a SASL listener.

Invariants:
- On a SASL listener, until the exchange succeeds, only ApiVersions, SaslHandshake and
  SaslAuthenticate are taken; any other request closes the connection unanswered, as
  Kafka's SaslServerAuthenticator does ("Unexpected Kafka request of type ... during
  SASL handshake"), as soon as its header has arrived: the rest of its frame is never
  read or decoded (server/network/connections.py).
- The principal of every request a connection hands on is fixed once the connection is
  authenticated: "User:<name>" after SASL; on an SSL listener the client certificate's
  subject ("User:CN=alice,O=acme"), or User:ANONYMOUS without one; User:ANONYMOUS on
  PLAINTEXT.
- A failed exchange is answered once, with SASL_AUTHENTICATION_FAILED (58) and a
  message without secrets, after the failure delay for its address; then the
  connection closes. So is a handshake naming a mechanism the listener does not enable
  (UNSUPPORTED_SASL_MECHANISM, 33) and a SaslAuthenticate out of turn
  (ILLEGAL_SASL_STATE, 34).
- SaslHandshake v0 means the tokens that follow are raw (a length, then the token, no
  request header), as in Kafka before KIP-152: they are answered raw, and a failure
  closes the connection without an answer, as Kafka does.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import struct
from typing import Any

from kio.schema.errors import ErrorCode

from compactlog.server.metrics import ServerMetrics
from compactlog.server.network.listeners import Listener
from compactlog.server.protocol.messages import API_NAMES, ProtocolError, Request
from compactlog.server.security.sasl_mechanisms import (
    AuthFailed,
    Exchange,
    FailureDelay,
    new_exchange,
)
from compactlog.server.security.sasl_users import SaslUsers

log = logging.getLogger("compactlog.server")
ANONYMOUS = "User:ANONYMOUS"
API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE = 18, 17, 36
_LENGTH = struct.Struct(">i")


# What a client may ask before it is authenticated on a SASL listener.
BEFORE_AUTHENTICATION = frozenset({API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE})


def check_before_authentication(session: Session, api_key: int, correlation_id: int) -> None:
    """Raise ProtocolError (the connection closes) for an API not allowed before
    authentication. Called with the header's fields as soon as they arrive, before the
    rest of the frame is read or decoded, as Kafka's SaslServerAuthenticator refuses
    them from the header."""
    if api_key not in BEFORE_AUTHENTICATION:
        raise ProtocolError(
            f"unexpected {API_NAMES.get(api_key, f'api {api_key}')} request (correlation "
            f"id {correlation_id}) before SASL authentication on listener "
            f"{session.listener.name if session.listener else '?'}")


class Session:
    __slots__ = ("authenticated", "close_after", "exchange", "host", "listener",
                 "principal", "raw_tokens")

    def __init__(self, host: str, listener: Listener | None,
                 certificate_principal: str | None = None) -> None:
        self.host = host
        self.listener = listener
        self.principal = certificate_principal or ANONYMOUS
        self.authenticated = listener is None or not listener.sasl
        self.exchange: Exchange | None = None
        self.raw_tokens = False  # after SaslHandshake v0
        self.close_after = False  # close once the response in hand is sent


class SaslGate:
    """The SASL exchange of every connection of one server."""

    def __init__(self, users: SaslUsers, delay: FailureDelay,
                 metrics: ServerMetrics) -> None:
        self.users = users  # in memory, refreshed by upkeep (server/security/sasl_users.py)
        self.delay = delay
        self.metrics = metrics
        self.failures = 0
        self.successes = 0

    def check_allowed(self, session: Session, request: Request) -> None:
        """Raise ProtocolError (the connection closes) for a request not allowed before
        authentication."""
        check_before_authentication(session, request.api_key, request.correlation_id)

    async def handle(self, session: Session, request: Request) -> dict[str, Any]:
        if request.api_key == SASL_HANDSHAKE:
            return self._handshake(session, request)
        return await self._authenticate(session, request)

    def _handshake(self, session: Session, request: Request) -> dict[str, Any]:
        assert session.listener is not None
        enabled = list(session.listener.sasl_mechanisms)
        if session.exchange is not None:
            session.close_after = True
            return {"error_code": ErrorCode.illegal_sasl_state, "mechanisms": enabled}
        mechanism = request.body.mechanism
        if mechanism not in enabled:
            session.close_after = True
            log.warning("SASL handshake from %s on listener %s refused: mechanism %r is "
                        "not enabled (enabled: %s)", session.host, session.listener.name,
                        mechanism[:64], ", ".join(enabled))
            return {"error_code": ErrorCode.unsupported_sasl_mechanism, "mechanisms": enabled}
        session.exchange = new_exchange(mechanism, self.users)
        session.raw_tokens = request.api_version == 0
        return {"error_code": ErrorCode.none, "mechanisms": enabled}

    async def _authenticate(self, session: Session, request: Request) -> dict[str, Any]:
        exchange = session.exchange
        if exchange is None or session.raw_tokens:
            session.close_after = True
            return {"error_code": ErrorCode.illegal_sasl_state,
                    "error_message": "SaslAuthenticate before a SaslHandshake v1",
                    "auth_bytes": b"", "session_lifetime": datetime.timedelta(0)}
        try:
            challenge = await self._step(session, exchange, bytes(request.body.auth_bytes))
        except AuthFailed as failure:
            session.close_after = True
            return {"error_code": ErrorCode.sasl_authentication_failed,
                    "error_message": str(failure), "auth_bytes": b"",
                    "session_lifetime": datetime.timedelta(0)}
        return {"error_code": ErrorCode.none, "error_message": None, "auth_bytes": challenge,
                "session_lifetime": datetime.timedelta(0)}

    async def raw_token(self, session: Session, token: bytes) -> bytes:
        """A raw token after SaslHandshake v0: the raw answer, length included."""
        assert session.exchange is not None
        try:
            challenge = await self._step(session, session.exchange, token)
        except AuthFailed as failure:
            raise ProtocolError(f"SASL authentication failed: {failure}") from None
        if session.authenticated:
            session.raw_tokens = False
        return _LENGTH.pack(len(challenge)) + challenge

    async def _step(self, session: Session, exchange: Exchange, token: bytes) -> bytes:
        assert session.listener is not None
        try:
            step = await exchange.step(token)
        except AuthFailed as failure:
            self.failures += 1
            self.metrics.sasl_authentications.labels(exchange.mechanism, "failure").inc()
            wait = self.delay.failed(session.host)
            log.warning("SASL/%s authentication failed from %s on listener %s%s: %s",
                        exchange.mechanism, session.host, session.listener.name,
                        f" (answered after {wait:g} s)" if wait else "", failure)
            if wait:
                await asyncio.sleep(wait)
            raise
        if step.user is not None:
            session.authenticated = True
            session.principal = f"User:{step.user}"
            self.successes += 1
            self.metrics.sasl_authentications.labels(exchange.mechanism, "success").inc()
            log.info("SASL/%s authenticated %s from %s on listener %s", exchange.mechanism,
                     session.principal, session.host, session.listener.name)
        return step.challenge
