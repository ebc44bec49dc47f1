"""SASL mechanisms on the server side: PLAIN (RFC 4616) and SCRAM-SHA-256/512 (RFC 5802,
RFC 7677, with `scramp`), checked against the SCRAM credential store.

Invariants:
- An exchange ends in exactly one of: a user name (authenticated), or AuthFailed whose
  message holds nothing the client sent as a secret (no password, no proof), as Kafka's
  messages do not. An exchange is used once: a step after its end fails.
- Each SCRAM exchange has a fresh random server nonce, and the client's proof must sign
  it: a recorded exchange replayed on another connection fails at its final message.
- An unknown user and a wrong password fail at the same step with the same message, at
  the same cost, and an unknown SCRAM user gets a salt and iteration count like a real
  user's, and keys nobody can match (server/security/sasl_users.py).
- No step waits for the store: credentials are read from the copy in memory.
- Repeated failures from one address are slowed down (FailureDelay), with memory
  bounded by `max_hosts` addresses.

Debian's kcat (librdkafka before 2.6.1, librdkafka PR #4895) sends a client-final nonce
that is its client nonce followed by the whole server-first nonce (the client part
twice). Kafka 3.8.1 to 3.9 accepted it (a suffix check); Kafka 4 and scramp refuse it.
compactlog accepts exactly that form and nothing looser: it still holds this exchange's
fresh nonce whole, and the proof the client sends is checked over the message as the
client sent it, so a replay fails as before.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from dataclasses import dataclass

from scramp import ScramException, ScramMechanism

from compactlog.server.security.sasl_users import SaslUsers

log = logging.getLogger("compactlog.server")
# Kafka's answers (SaslServerAuthenticator, PlainSaslServer, ScramSaslServer).
PLAIN_FAILED = "Authentication failed: Invalid username or password"


class AuthFailed(Exception):
    """The client is not authenticated; the message is safe to send and to log."""


@dataclass
class Step:
    challenge: bytes
    user: str | None  # set when the exchange succeeded


class PlainExchange:
    mechanism = "PLAIN"

    def __init__(self, users: SaslUsers) -> None:
        self.users = users
        self.done = False

    async def step(self, token: bytes) -> Step:
        if self.done:
            raise AuthFailed("SASL/PLAIN takes one message")
        self.done = True
        parts = token.split(b"\0")
        if len(parts) != 3:
            raise AuthFailed("Invalid SASL/PLAIN message: expected authzid, user name and "
                             "password separated by NUL")
        try:
            authzid, user, password = (p.decode() for p in parts)
        except UnicodeDecodeError:
            raise AuthFailed("Invalid SASL/PLAIN message: not UTF-8") from None
        if not user or not password:
            raise AuthFailed("Authentication failed: username or password not specified")
        if authzid and authzid != user:
            raise AuthFailed("Authentication failed: Client requested an authorization id "
                             "that is different from username")
        await self.users.before_login()
        # PBKDF2, for an unknown user too: off the event loop.
        ok = await asyncio.to_thread(self.users.verify_password, user, password)
        if not ok:
            raise AuthFailed(PLAIN_FAILED)
        return Step(b"", user)


class ScramExchange:
    def __init__(self, mechanism: str, users: SaslUsers) -> None:
        self.mechanism = mechanism
        self.users = users
        self._scram = ScramMechanism(mechanism)
        self._server = self._scram.make_server(self._auth_info)
        self._user: str | None = None
        self._round = 0

    def _failed(self) -> AuthFailed:
        return AuthFailed(f"Authentication failed during authentication due to invalid "
                          f"credentials with SASL mechanism {self.mechanism}")

    def _auth_info(self, user: str) -> tuple[bytes, bytes, bytes, int]:
        self._user = str(user)
        # From memory (a decoy for an unknown user): scramp calls this on the event loop.
        credential = self.users.lookup(self._user, self.mechanism)
        return (credential.salt, credential.stored_key, credential.server_key,
                credential.iterations)

    async def step(self, token: bytes) -> Step:
        self._round += 1
        try:
            text = token.decode()
        except UnicodeDecodeError:
            raise AuthFailed(f"Invalid {self.mechanism} message: not UTF-8") from None
        if self._round == 1:
            await self.users.before_login()
            return self._first(text)
        if self._round == 2:
            return self._final(text)
        raise AuthFailed(f"{self.mechanism}: the exchange is over")

    def _first(self, text: str) -> Step:
        try:
            self._server.set_client_first(text)
            return Step(self._server.get_server_first().encode(), None)
        except ScramException as error:
            raise AuthFailed(f"Invalid {self.mechanism} client-first message: "
                             f"{_scram_reason(error)}") from None
        except (ValueError, KeyError, IndexError, TypeError):
            raise AuthFailed(f"Invalid {self.mechanism} client-first message") from None

    def _final(self, text: str) -> Step:
        server = self._server
        nonce = str(server.nonce)
        client_nonce = nonce[:len(nonce) - len(str(server.s_nonce))]
        sent = _attribute(text, "r")
        if sent is not None and sent == client_nonce + nonce:
            # librdkafka < 2.6.1 (see the module doc); scramp then checks the proof over
            # the message as sent.
            server.nonce = type(server.nonce)(sent)
            log.info("SASL/%s: accepting the client-final nonce of librdkafka < 2.6.1 (its "
                     "client nonce repeated) for %r", self.mechanism, self._user)
        try:
            server.set_client_final(text)
            final = server.get_server_final()
        except ScramException:
            raise self._failed() from None
        except (ValueError, KeyError, IndexError, TypeError):
            raise AuthFailed(f"Invalid {self.mechanism} client-final message") from None
        assert self._user is not None
        return Step(final.encode(), self._user)


def _attribute(message: str, name: str) -> str | None:
    for part in message.split(","):
        if part.startswith(name + "="):
            return part[len(name) + 1:]
    return None


def _scram_reason(error: ScramException) -> str:
    # scramp's messages name the problem and never echo a proof.
    return str(error.args[0]) if error.args else "malformed"


Exchange = PlainExchange | ScramExchange


def new_exchange(mechanism: str, users: SaslUsers) -> Exchange:
    if mechanism == "PLAIN":
        return PlainExchange(users)
    return ScramExchange(mechanism, users)


class FailureDelay:
    """How long to wait before answering a failed authentication from a host: nothing
    for its first `free` failures within `window_s`, then `base_s` doubling with each
    further failure up to `max_s`. At most `max_hosts` addresses are remembered (the
    least recently failed are forgotten first)."""

    def __init__(self, base_s: float = 0.1, max_s: float = 5.0, free: int = 1,
                 window_s: float = 300.0, max_hosts: int = 10_000) -> None:
        self.base_s = base_s
        self.max_s = max_s
        self.free = free
        self.window_s = window_s
        self.max_hosts = max_hosts
        self._failures: collections.OrderedDict[str, tuple[int, float]] = (
            collections.OrderedDict())

    def failed(self, host: str, now: float | None = None) -> float:
        """Count a failure from `host`; the delay before answering it."""
        now = time.monotonic() if now is None else now
        count, last = self._failures.pop(host, (0, now))
        if now - last > self.window_s:
            count = 0
        count += 1
        self._failures[host] = (count, now)
        while len(self._failures) > self.max_hosts:
            self._failures.popitem(last=False)
        if count <= self.free or self.base_s <= 0:
            return 0.0
        return float(min(self.max_s, self.base_s * 2 ** min(count - self.free - 1, 30)))

    def __len__(self) -> int:
        return len(self._failures)
