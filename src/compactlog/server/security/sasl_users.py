"""The SASL users as the server's logins see them: a copy in memory of the SCRAM
credentials (server/security/credentials.py), and the answers for users that do not exist.

Invariants:
- A login attempt never makes a request to an object store and never blocks the event
  loop: the exchanges read the copy in memory. `refresh` checks the document (a stat,
  or one HEAD on S3) and reads it again only when it changed. The server's upkeep runs
  it off the event loop once per round, as it refreshes the ACLs; on a local disk each
  login also runs it first, on a thread (a stat), so that a user `compactlog users`
  adds or deletes can log in, or no longer can, at once. On S3 that takes up to one
  upkeep round: a HEAD per attempt would let any client make the server spend S3
  requests. A change through AlterUserScramCredentials takes effect at once.
- An unknown user looks like a real one. SCRAM's server-first gives it a salt derived
  by HMAC-SHA-256 from the store's decoy secret and the user name, as long as most real
  users' salts, the same at every attempt, after a restart and on another server of the
  same store (as a real user's is), and the iteration count most real users of that
  mechanism have (8192, the default, when none has it): the keys it gets match no
  password. PLAIN runs the same PBKDF2 for an unknown user as for a real one with the
  common iteration count, so a failure takes as long whether the user exists or not.
- The decoy secret is random, made once per store by the first server and kept beside
  the credentials (`security/decoy`, committed by compare-and-swap, so two servers
  racing to make it agree on one). Whoever reads it can tell unknown users from real
  ones, nothing more: it guards no password or key.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import hashlib
import hmac
import logging
import os
import threading

from compactlog.backend import Document, load_or_create
from compactlog.backend.local.document import LocalDocument
from compactlog.errors import CompactlogError
from compactlog.server.security.credentials import (
    DEFAULT_ITERATIONS,
    MECHANISMS,
    CredentialStore,
    ScramCredential,
    Users,
    credential_from_salted,
    keep_private,
    salted_password,
)

log = logging.getLogger("compactlog.server")
DECOY_DOCUMENT = "security/decoy"  # under the data location, beside security/scram
SALT_BYTES = 24  # what `compactlog users add` makes


class SaslUsers:
    """The credentials the SASL exchanges check, from memory."""

    def __init__(self, store: CredentialStore, secret: bytes) -> None:
        self.store = store
        self._secret = secret
        self._lock = threading.Lock()
        self._users: Users = {}
        self._iterations: dict[str, int] = {}
        self._salt_bytes = SALT_BYTES
        self._local = isinstance(store.document, LocalDocument)
        self.refresh()

    async def before_login(self) -> None:
        """On a local disk, take up a change first (a stat, on a thread); on an object
        store nothing: upkeep's refresh is the only request."""
        if not self._local:
            return
        try:
            await asyncio.to_thread(self.refresh)
        except (OSError, CompactlogError) as error:  # upkeep reports it; the copy stays
            log.debug("reading the SASL credentials again failed: %s", error)

    def refresh(self) -> None:
        """Take up what was committed since (blocking: one stat or HEAD, and a read when
        it changed; call it off the event loop)."""
        users = self.store.users()  # re-read only when the document changed
        iterations: dict[str, collections.Counter[int]] = {}
        salts: collections.Counter[int] = collections.Counter()
        for creds in users.values():
            for mechanism, credential in creds.items():
                iterations.setdefault(mechanism, collections.Counter())[
                    credential.iterations] += 1
                salts[len(credential.salt)] += 1
        with self._lock:
            self._users = users
            self._iterations = {mechanism: counts.most_common(1)[0][0]
                                for mechanism, counts in iterations.items()}
            self._salt_bytes = salts.most_common(1)[0][0] if salts else SALT_BYTES

    def lookup(self, user: str, mechanism: str) -> ScramCredential:
        """`user`'s credential for `mechanism`, or a decoy that no password matches."""
        credential = self._users.get(user, {}).get(mechanism)
        return credential if credential is not None else self._decoy(user, mechanism)

    def _decoy(self, user: str, mechanism: str) -> ScramCredential:
        digest = MECHANISMS[mechanism]
        salt = b""
        counter = 0
        while len(salt) < self._salt_bytes:  # HMAC-SHA-256 in counter mode
            salt += hmac.digest(self._secret, b"salt:%d:%s" % (counter, user.encode()),
                                "sha256")
            counter += 1
        key = hmac.digest(self._secret, os.urandom(16), digest)
        return ScramCredential(salt[:self._salt_bytes],
                               self._iterations.get(mechanism, DEFAULT_ITERATIONS),
                               hashlib.new(digest, key).digest(), key)

    def verify_password(self, user: str, password: str) -> bool:
        """PLAIN: does `password` derive the stored keys of `user`'s SCRAM credential
        (SHA-512's if it has one)? An unknown user costs the same PBKDF2 and fails.
        CPU-bound: call it off the event loop."""
        creds = self._users.get(user)
        if creds:
            mechanism = max(creds)  # "SCRAM-SHA-512" sorts after "SCRAM-SHA-256"
            credential, real = creds[mechanism], True
        else:
            mechanism = max(self._iterations, default="SCRAM-SHA-512")
            credential, real = self._decoy(user, mechanism), False
        derived = credential_from_salted(
            mechanism, credential.salt, credential.iterations,
            salted_password(mechanism, password, credential.salt, credential.iterations))
        return hmac.compare_digest(derived.stored_key, credential.stored_key) and real


def decoy_secret(document: Document) -> bytes:
    """The store's decoy secret, made and committed by the first server that asks."""
    keep_private(document)
    made = load_or_create(document, lambda: {"secret": base64.b64encode(os.urandom(32)).decode()})
    return base64.b64decode(str(made.body["secret"]))
