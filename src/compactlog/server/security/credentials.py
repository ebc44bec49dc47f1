"""SCRAM credentials: `<data location>/security/scram/`, one document committed through
the commit primitive (LocalDocument locally, ObjectDocument on S3, where a server
that takes over finds them), so a change is all or nothing and two writers (the
server's AlterUserScramCredentials and `compactlog users`) never lose each other's.

Invariants:
- No password is ever stored or logged: a credential is what RFC 5802 §3 lets a server
  keep, the salt, the iteration count, StoredKey = H(HMAC(SaltedPassword, "Client Key"))
  and ServerKey = HMAC(SaltedPassword, "Server Key"), per user and mechanism, as Kafka
  keeps them.
- The document is private (`keep_private`): locally `security/` is 0700 and its files
  0600, and no audit copy older than the current version is kept, so a deleted user's
  keys are gone once the deletion is committed.
- Every change is a compare-and-swap of the whole document: a change based on a version
  that is no longer current is retried on the new one, never written over it.
- A reader sees a committed version: `lookup` stats current.json before each use and
  reloads it when another process committed, so users added by the CLI while the server
  runs can authenticate at once, and deleted ones cannot.

PLAIN has no store of its own: a PLAIN password is checked by deriving the SCRAM keys of
one of the user's SCRAM credentials from it (`verify_password`), so each user has one
password, whichever mechanism the client picks.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compactlog.backend import Document, Snapshot, update_document
from compactlog.backend.local.document import LocalDocument
from compactlog.errors import UserError

DIRECTORY = "security/scram"  # under the data location
# Kafka's names and hash functions; Kafka's ScramMechanism numbers them 1 and 2 on the wire.
MECHANISMS: dict[str, str] = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
MECHANISM_CODES: dict[int, str] = {1: "SCRAM-SHA-256", 2: "SCRAM-SHA-512"}
# Kafka's bounds on the iteration count (ScramMechanism.minIterations / maxIterations).
MIN_ITERATIONS, MAX_ITERATIONS = 4096, 16384
DEFAULT_ITERATIONS = 8192
_RETRIES = 8


@dataclass(frozen=True)
class ScramCredential:
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes

    def to_json(self) -> dict[str, Any]:
        return {"salt": _b64(self.salt), "iterations": self.iterations,
                "stored_key": _b64(self.stored_key), "server_key": _b64(self.server_key)}

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> ScramCredential:
        return cls(base64.b64decode(body["salt"]), int(body["iterations"]),
                   base64.b64decode(body["stored_key"]), base64.b64decode(body["server_key"]))


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def check_mechanism(mechanism: str) -> str:
    if mechanism not in MECHANISMS:
        raise UserError(f"unknown SCRAM mechanism {mechanism!r}; known: "
                        f"{', '.join(MECHANISMS)}")
    return mechanism


def check_iterations(iterations: int) -> int:
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise UserError(f"SCRAM iterations must be in [{MIN_ITERATIONS}, {MAX_ITERATIONS}] "
                        f"(Kafka's bounds), got {iterations}")
    return iterations


def salted_password(mechanism: str, password: str, salt: bytes, iterations: int) -> bytes:
    """RFC 5802's Hi(): PBKDF2 with HMAC of the mechanism's hash."""
    return hashlib.pbkdf2_hmac(MECHANISMS[mechanism], password.encode(), salt, iterations)


def credential_from_salted(mechanism: str, salt: bytes, iterations: int,
                           salted: bytes) -> ScramCredential:
    """The stored form from a salted password (what AlterUserScramCredentials sends)."""
    digest = MECHANISMS[mechanism]
    client_key = hmac.digest(salted, b"Client Key", digest)
    stored_key = hashlib.new(digest, client_key).digest()
    server_key = hmac.digest(salted, b"Server Key", digest)
    return ScramCredential(salt, iterations, stored_key, server_key)


def make_credential(mechanism: str, password: str,
                    iterations: int = DEFAULT_ITERATIONS) -> ScramCredential:
    check_mechanism(mechanism)
    check_iterations(iterations)
    salt = os.urandom(24)
    return credential_from_salted(mechanism, salt, iterations,
                                  salted_password(mechanism, password, salt, iterations))


# user -> mechanism -> credential
Users = dict[str, dict[str, ScramCredential]]


class CredentialStore:
    """The SCRAM credentials of one data location. Thread-safe; lookups are cheap (a
    stat of current.json, a HEAD on S3) unless another process changed it."""

    def __init__(self, source: Path | Document) -> None:
        """`source`: a local data directory, or the document itself (a store's
        `layout.state_document(DIRECTORY)`)."""
        self.document: Document = (LocalDocument(source / DIRECTORY)
                                   if isinstance(source, Path) else source)
        keep_private(self.document)
        self._lock = threading.Lock()
        self._snapshot: Snapshot | None = None
        self._users: Users = {}
        self._loaded = False

    def _fresh(self) -> Users:
        with self._lock:
            if not self._loaded or self.document.changed_since(self._snapshot):
                snapshot = self.document.load()
                self._users = _parse(snapshot.body if snapshot is not None else {})
                self._snapshot = snapshot
                self._loaded = True
            return self._users

    def users(self) -> Users:
        """Every user's credentials, as committed now."""
        return {user: dict(creds) for user, creds in self._fresh().items()}

    def lookup(self, user: str, mechanism: str) -> ScramCredential | None:
        return self._fresh().get(user, {}).get(mechanism)

    def verify_password(self, user: str, password: str) -> bool:
        """PLAIN: does `password` derive the stored keys of one of `user`'s SCRAM
        credentials? (CPU-bound: PBKDF2; call it off the event loop.)"""
        creds = self._fresh().get(user, {})
        for mechanism in sorted(creds, reverse=True):  # SHA-512 first
            cred = creds[mechanism]
            derived = credential_from_salted(
                mechanism, cred.salt, cred.iterations,
                salted_password(mechanism, password, cred.salt, cred.iterations))
            return hmac.compare_digest(derived.stored_key, cred.stored_key)
        return False

    def change(self, edit: Callable[[Users], None]) -> None:
        """Apply `edit` to the current credentials and commit the result; on a race with
        another writer, apply it again to what that writer committed."""
        def edited(snapshot: Snapshot | None) -> dict[str, Any]:
            users = _parse(snapshot.body if snapshot is not None else {})
            edit(users)
            return _unparse(users)

        # Another writer landed first: `edit` again on its version; a killed one left a
        # claim that would refuse every change: cleared (update_document).
        update_document(self.document, edited, _RETRIES)

    def upsert(self, user: str, mechanism: str, credential: ScramCredential) -> None:
        check_mechanism(mechanism)
        _check_user(user)
        self.change(lambda users: users.setdefault(user, {}).__setitem__(mechanism,
                                                                          credential))

    def delete(self, user: str, mechanisms: Iterable[str] | None = None) -> list[str]:
        """Remove `user`'s credentials of `mechanisms` (None: all); the mechanisms removed."""
        removed: list[str] = []

        def edit(users: Users) -> None:
            removed.clear()
            creds = users.get(user, {})
            for mechanism in list(creds if mechanisms is None else mechanisms):
                if creds.pop(mechanism, None) is not None:
                    removed.append(mechanism)
            if not creds:
                users.pop(user, None)

        self.change(edit)
        return removed


def keep_private(document: Document) -> None:
    """A document of secrets under `security/`: locally, `security/` and below are
    0700 and the files 0600; everywhere, only the current version's audit copy is kept
    (`keep` 1, the least a torn current.json may fall back to), so that a deleted
    user's keys leave the store with the next commit."""
    document.keep = 1
    if isinstance(document, LocalDocument):
        directory = document.directory
        root = next((parent for parent in (directory, *directory.parents)
                     if parent.name == "security"), directory)
        document.make_private(root)


def valid_user_name(user: str) -> bool:
    """1 to 255 characters, none of them a control character (C0, DEL, C1, or a
    Unicode line or paragraph separator)."""
    return 0 < len(user) <= 255 and not any(
        ord(c) < 32 or 0x7F <= ord(c) <= 0x9F or c in "\u2028\u2029" for c in user)


def _check_user(user: str) -> None:
    if not valid_user_name(user):
        raise UserError(f"a user name must be 1 to 255 printable characters, got {user!r}")


def _parse(body: dict[str, Any]) -> Users:
    return {user: {mech: ScramCredential.from_json(cred) for mech, cred in creds.items()}
            for user, creds in body.get("users", {}).items()}


def _unparse(users: Users) -> dict[str, Any]:
    return {"users": {user: {mech: cred.to_json() for mech, cred in sorted(creds.items())}
                      for user, creds in sorted(users.items()) if creds}}
