"""The commit primitive on an S3 prefix: compare-and-swap of current.json by conditional PUT.

Invariant (the same as local/document.py's): a commit succeeds only if the version it was based
on is still current when it replaces it, however long it stalled before; otherwise it
fails with ConflictError and changes nothing. The store's atomic conditional PUT plays
the part of the local lock and rename: current.json is replaced only by a PUT with
`If-Match: <ETag of the current.json the commit compared>` (`If-None-Match: *` while
there is none), so of two commits based on the same version at most one lands.

A document lives under one key prefix:
  PREFIX/current.json               the committed document: {"format", "version",
                                    "crc32", "body", "commit_id"}
  PREFIX/00000000000000000007.json  audit copies of the last `keep` versions
An object is replaced whole or not at all, so there are no temporary objects; a torn
current.json only comes from outside damage. As on a local disk, the newest audit copy is
never older than the committed version, and a damaged current.json falls back to it
and to nothing older. `commit_id` (random, per commit call) lets a committer recognise
its own PUT when an answer was lost.

Commit protocol (ObjectDocument.commit; the test of each step in
tests/backend/test_object_commit.py, which runs the same tests against LocalDocument):
  1. (no lock: the store's conditional write decides at step 4)
  2. GET current.json (its ETag and version; past a damaged one, the newest audit copy:
     test_a_torn_current_falls_back_to_the_newest_copy_only) and compare with the
     expected version; unequal: ConflictError;
     test_a_stale_commit_conflicts_and_changes_nothing,
     test_a_commit_stalled_before_its_compare_conflicts
  3. PUT the audit copy of the new version with `If-None-Match: *`: a 412 means another
     committer claimed that version (or died after claiming it: purge_uncommitted):
     ConflictError; test_a_lost_audit_put_of_someone_elses_version_conflicts,
     test_racing_writers_never_lose_a_commit. A lost answer, or a 412 to botocore's
     retry of this same PUT, is settled by reading the copy back (its commit_id);
     test_a_lost_answer_to_the_audit_put_is_settled_by_reading_it_back. Any other
     failure: StorageError, nothing committed;
     test_a_failed_audit_put_leaves_the_old_version
  4. PUT current.json with `If-Match: <ETag of 2>` (`If-None-Match: *` when there was
     none): the commit point. 412/409: another commit landed first; unless current.json
     is this commit's own (an earlier attempt of the same PUT landed and its answer was
     lost), remove the audit copy of 3 and raise ConflictError;
     test_a_commit_stalled_after_its_compare_conflicts_at_the_store. A 4xx: not written;
     remove the audit copy, StorageError; test_a_refused_commit_put_leaves_the_old_version.
     A 5xx or a lost answer (timeout after sending): re-read; this commit's own
     current.json is success; else CommitOutcomeUnknown, which `resolve` settles by
     re-sending the same conditional PUT (idempotent: the same bytes under the same
     If-Match); test_a_lost_answer_is_resolved_by_rereading,
     test_an_unknown_outcome_blocks_its_version_until_resolved
  5. DELETE audit copies older than `keep` versions (a failure is logged; the commit
     stands); test_audit_copies_are_pruned
Faults of the store, through the fault proxy in front of moto (tests/faults/test_s3_faults.py):
every request is retried by botocore with backoff (S3Settings in backend/s3/settings.py), and what
outlasts the retries is a one-line error from backend/s3/error_mapping.py naming the operation and
the key. Per step:
  2. 503/500 retried: test_a_transient_fault_at_each_commit_step_is_retried; persistent:
     StorageError, nothing changed: test_a_persistent_fault_before_the_commit_point_
     changes_nothing; a stall past the timeout: test_a_stalled_read_ends_in_a_clear_error;
     a body cut short is read again by _get: test_a_document_body_cut_short_is_read_again
  3. as 2 (same tests), and a lost answer whose retry gets 412:
     test_a_lost_answer_to_a_commit_put_is_retried_and_settled[audit]
  4. 503/500 retried (same test); persistent 5xx: CommitOutcomeUnknown, then resolve():
     test_a_persistent_fault_at_the_commit_point_is_settled_by_resolve; stalled on every
     attempt, the PUTs dropped or landing late: test_a_stalled_commit_put_is_unknown_
     until_resolved; a lost answer: test_a_lost_answer_to_a_commit_put_is_retried_and_
     settled[current]
  5. retried (same test); persistent: the commit stands, pruning is retried at the next:
     test_a_persistent_fault_when_pruning_leaves_the_commit_standing
Bad setup (a missing bucket, refused credentials, a store without conditional writes,
checked once by backend/s3/probe.py in `at`) is an ObjectStoreSetupError:
tests/backend/test_s3_setup.py.

A commit that dies after 3 leaves an audit copy of a version maybe never committed: it
blocks commits of that version (they conflict at 3) until `purge_uncommitted` removes it.
On S3 nothing tells a dead committer from a stalled one; a stalled committer whose audit
copy was purged can still land step 4, leaving its version without an audit copy
(harmless unless current.json is then damaged as well), and of it and the purger's own
commit at most one lands, since step 4 is the commit point. So a committer whose commit
conflicts on a document still at the version it read may purge and try again
(compactlog.backend `clear_dead_claim`: the writer lease, topic metadata, the server's state
documents); a partition's manifest is purged by its writer at open (recovery.py).
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from compactlog import faults
from compactlog.backend import CommitOutcomeUnknown, Location, Snapshot
from compactlog.backend.envelope import (
    CURRENT,
    DEFAULT_KEEP,
    FORMAT,
    SUFFIX,
    checksum,
    decode,
    version_of,
)
from compactlog.backend.s3.bucket import Bucket, PreconditionFailed, PutOutcomeUnknown, answered
from compactlog.backend.s3.error_mapping import ObjectStoreSetupError
from compactlog.backend.s3.settings import S3Settings
from compactlog.errors import ConflictError, CorruptionError, StorageError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from mypy_boto3_s3 import S3Client

log = logging.getLogger(__name__)

# Every this many versions, pruning LISTs the audit copies (else it deletes by name).
FULL_PRUNE_EVERY = 16
# What a failed request raises (backend/s3/error_mapping.py): retryable, or a setup error.
_REQUEST_FAILED = (StorageError, ObjectStoreSetupError)


class ObjectCommitOutcomeUnknown(CommitOutcomeUnknown):
    """Step 4's answer was lost (timeout, connection reset, 5xx) and a re-read did not
    show this commit: it may still land. `ObjectDocument.resolve(error)` settles it."""

    def __init__(self, message: str, version: int, commit_id: str, data: bytes,
                 based_on_etag: str | None) -> None:
        super().__init__(message)
        self.version = version
        self.commit_id = commit_id
        self.data = data
        self.based_on_etag = based_on_etag


@dataclass(frozen=True)
class _Object:
    etag: str
    raw: bytes


def _encode(version: int, body: dict[str, Any], commit_id: str) -> bytes:
    envelope = {"format": FORMAT, "version": version, "crc32": checksum(body),
                "body": body, "commit_id": commit_id}
    return json.dumps(envelope, sort_keys=True).encode()


def _decode_at(url: str, raw: bytes) -> tuple[int, dict[str, Any]]:
    # _decode names its file only in the CorruptionError it raises, which takes a str.
    return decode(cast(Path, url), raw)


def _commit_id_of(raw: bytes) -> str | None:
    try:
        value = json.loads(raw).get("commit_id")
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, str) else None


class ObjectDocument:
    """A metadata document under an S3 prefix, committed by conditional PUT."""

    def __init__(self, client: S3Client, bucket: str, prefix: str,
                 keep: int = DEFAULT_KEEP) -> None:
        self.objects = Bucket(client, bucket)
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.keep = keep
        self._prune_failed = False

    @classmethod
    def at(cls, location: Location, keep: int = DEFAULT_KEEP,
           env: Mapping[str, str] | None = None,
           settings: S3Settings | None = None) -> ObjectDocument:
        """The document at an s3:// location, with a client from the AWS settings
        (`settings`, when given, instead of those from `env`), once the store passed
        object_probe's check for conditional writes (once per endpoint and bucket)."""
        from compactlog.backend.s3.probe import check_conditional_writes

        if location.bucket is None:
            raise ValueError(f"{location} is not an s3:// location")
        client = (settings or S3Settings.from_env(env)).boto3_client()
        check_conditional_writes(location, client)
        return cls(client, location.bucket, location.path, keep)

    def __repr__(self) -> str:
        return f"ObjectDocument({self.where!r}, keep={self.keep})"

    @property
    def where(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    def key_of(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    @property
    def current_key(self) -> str:
        return self.key_of(CURRENT)

    def audit_key(self, version: int) -> str:
        return self.key_of(f"{version:020d}{SUFFIX}")

    def url_of(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    # -- requests (backend/s3/bucket.py) --------------------------------------------------

    @property
    def client(self) -> S3Client:
        """The boto3 client the requests go through (tests wrap it to inject faults)."""
        return self.objects.client

    @client.setter
    def client(self, client: S3Client) -> None:
        self.objects = Bucket(client, self.bucket)

    def _get(self, key: str) -> _Object | None:
        """GET an object (None if there is none). The client retries the request; a
        body cut short or stalled while being read is read again, as often."""
        found = self.objects.get(key, body_attempts=self.objects.attempts)
        return None if found is None else _Object(found[1], found[0])

    def _delete(self, key: str, if_match: str | None = None) -> None:
        # A 404 or a 412: gone already, or no longer ours.
        self.objects.delete(key, if_match=if_match, missing_ok=True)

    def _keys(self) -> list[str]:
        start = self.key_of("")
        return [entry.key[len(start):] for entry in self.objects.list(start, delimiter=True)]

    # -- reading ----------------------------------------------------------------------

    def history(self) -> list[int]:
        """The versions whose audit copies are kept, oldest first."""
        found = (version_of(name) for name in self._keys())
        return sorted(v for v in found if v is not None)

    def load(self) -> Snapshot | None:
        """The current version, or None when nothing was ever committed."""
        return self._load()[1]

    def _load(self) -> tuple[_Object | None, Snapshot | None]:
        current = self._get(self.current_key)
        damaged: CorruptionError | None = None
        if current is not None:
            try:
                version, body = _decode_at(self.url_of(self.current_key), current.raw)
                return current, Snapshot(version, body, current.etag)
            except CorruptionError as error:
                damaged = error
        fallback = self._newest_copy(damaged)
        if fallback is not None and damaged is not None:
            log.warning("%s; using the audit copy of version %d, the newest, until the next "
                        "commit replaces it", damaged, fallback.version)
        elif fallback is not None:
            log.info("%s: no %s; the newest version is %d", self.where, CURRENT,
                     fallback.version)
        return current, fallback

    def _newest_copy(self, damaged: CorruptionError | None) -> Snapshot | None:
        """The newest audit copy: never an older one, which might lack a commit."""
        for version in reversed(self.history()):
            key = self.audit_key(version)
            found = self._get(key)
            if found is None:
                continue  # pruned or purged meanwhile
            try:
                stored, body = _decode_at(self.url_of(key), found.raw)
            except CorruptionError as error:
                if damaged is None:
                    raise CorruptionError(self.url_of(key), f"{error.detail}; {CURRENT} is "
                                          "missing, and an older version might lack a "
                                          "commit") from None
                raise CorruptionError(
                    self.url_of(self.current_key), f"{damaged.detail}; its audit copy "
                    f"{key} is damaged too ({error.detail}), and an older version might "
                    "lack a commit") from None
            if stored != version:
                raise CorruptionError(self.url_of(key), f"holds version {stored}, not {version}")
            return Snapshot(version, body, None)
        if damaged is not None:
            raise damaged
        return None

    def load_version(self, version: int) -> dict[str, Any]:
        """An audit copy's body."""
        key = self.audit_key(version)
        found = self._get(key)
        if found is None:
            raise FileNotFoundError(self.url_of(key))
        stored, body = _decode_at(self.url_of(key), found.raw)
        if stored != version:
            raise CorruptionError(self.url_of(key), f"holds version {stored}, not {version}")
        return body

    def changed_since(self, snapshot: Snapshot | None) -> bool:
        """Whether the current version may differ from `snapshot` (one HEAD)."""
        head = self.objects.head(self.current_key)
        if head is None:
            return snapshot is None or snapshot.stamp is not None or bool(self.history())
        return snapshot is None or snapshot.stamp != head.etag

    # -- committing -------------------------------------------------------------------

    def commit(self, expected_version: int, body: dict[str, Any]) -> Snapshot:
        """Publish `body` as version expected_version + 1 if expected_version is still
        current (0: nothing committed yet); else raise ConflictError."""
        faults.point("commit.begin", self.where)
        current_object, current = self._load()  # 2.
        current_version = current.version if current is not None else 0
        if current_version != expected_version:
            raise ConflictError(f"{self.where}: commit based on version {expected_version}, "
                                f"but version {current_version} is current")
        faults.point("commit.compared", self.where)
        version = expected_version + 1
        commit_id = uuid.uuid4().hex
        data = _encode(version, body, commit_id)
        audit_key = self.audit_key(version)
        audit_etag = self._put_audit(version, audit_key, data, commit_id)  # 3.
        based_on = current_object.etag if current_object is not None else None
        snapshot = self._put_current(version, body, commit_id, data, based_on,
                                     audit_key, audit_etag)  # 4.
        self._prune(version)  # 5.
        return snapshot

    def _put_audit(self, version: int, key: str, data: bytes, commit_id: str) -> str:
        """Step 3: create the audit copy; its ETag. An answer lost (or a retry by botocore
        that finds its own first attempt landed, as a 412) is settled by reading it back."""
        # Refused (any other 4xx) or never sent: not written, and raised as it is.
        try:
            return self.objects.put(key, data, if_none_match=True)
        except (PreconditionFailed, PutOutcomeUnknown) as error:
            cause: PreconditionFailed | PutOutcomeUnknown = error
        try:
            found = self._get(key)
        except _REQUEST_FAILED:
            found = None
        if found is not None and _commit_id_of(found.raw) == commit_id:
            return found.etag
        if isinstance(cause, PreconditionFailed):
            raise ConflictError(
                f"{self.where}: version {version} is being committed by another writer "
                f"(its audit copy {key} exists; if that writer died, the owner's "
                "purge_uncommitted removes it)") from None
        # Perhaps written later: then an audit copy of a version never committed, which
        # blocks commits of that version until purge_uncommitted; never a wrong current.
        raise cause

    def _put_current(self, version: int, body: dict[str, Any], commit_id: str,
                     data: bytes, based_on: str | None, audit_key: str,
                     audit_etag: str) -> Snapshot:
        key = self.current_key
        try:
            etag = self.objects.put(key, data, if_match=based_on,
                                    if_none_match=based_on is None)
            return Snapshot(version, body, etag)
        except PreconditionFailed:
            mine = self._own_current(commit_id)
            if mine is not None:
                return Snapshot(version, body, mine)
            self._drop_audit(audit_key, audit_etag)
            raise ConflictError(f"{self.where}: another commit replaced version "
                                f"{version - 1} first") from None
        except PutOutcomeUnknown as error:
            cause = error
        except _REQUEST_FAILED as error:
            # Refused by the store (a 4xx: unless an earlier attempt of this PUT landed)
            # or never sent: not written.
            if answered(error):
                mine = self._own_current(commit_id)
                if mine is not None:
                    return Snapshot(version, body, mine)
            self._drop_audit(audit_key, audit_etag)
            raise
        mine = self._own_current(commit_id)
        if mine is not None:
            return Snapshot(version, body, mine)
        raise ObjectCommitOutcomeUnknown(
            f"{self.url_of(key)}: the answer to the PUT of version {version} was lost "
            f"({cause}); it may still land: resolve() settles it", version, commit_id, data,
            based_on) from cause

    def _own_current(self, commit_id: str) -> str | None:
        """current.json's ETag if it is this commit's (None if not, or unreadable)."""
        try:
            found = self._get(self.current_key)
        except _REQUEST_FAILED:
            return None
        if found is not None and _commit_id_of(found.raw) == commit_id:
            return found.etag
        return None

    def _drop_audit(self, key: str, etag: str) -> None:
        try:
            self._delete(key, if_match=etag)
        except _REQUEST_FAILED as error:
            log.warning("%s: the audit copy of a commit that did not land stays (removed by "
                        "purge_uncommitted): %s", self.where, error)

    def resolve(self, unknown: ObjectCommitOutcomeUnknown) -> Snapshot | None:
        """Settle a lost answer: the committed Snapshot, or None if that commit did not
        land and never will. Re-sends the same conditional PUT, which lands only if the
        version it was based on is still current (the first attempt did not land), and
        otherwise fails with 412, after which current.json shows whether it was ours.
        Raises `unknown` again while the version is not settled and this commit's audit
        copy is gone (purged by the owner): re-sending then could commit a version whose
        audit copy is another writer's."""
        body = json.loads(unknown.data)["body"]
        audit_key = self.audit_key(unknown.version)
        audit = self._get(audit_key)
        current = self.load()
        if current is not None and current.version >= unknown.version:
            # Landed and since replaced by later commits? Its audit copy says.
            if audit is not None and _commit_id_of(audit.raw) == unknown.commit_id \
                    and current.version > unknown.version:
                return Snapshot(unknown.version, body, None)
            mine = self._own_current(unknown.commit_id)
            return Snapshot(unknown.version, body, mine) if mine is not None else None
        if audit is None or _commit_id_of(audit.raw) != unknown.commit_id:
            # Its audit copy was purged (and perhaps another writer claimed the version):
            # re-sending could land a version whose audit copy is not this one. Only a
            # later commit settles it (the lost PUT's ETag is then gone).
            raise unknown
        try:
            return self._put_current(unknown.version, body, unknown.commit_id, unknown.data,
                                     unknown.based_on_etag, audit_key, audit.etag)
        except ConflictError:
            return None

    def _prune(self, version: int) -> None:
        """Each commit makes one audit copy too old: delete it by name, without a LIST.
        Every FULL_PRUNE_EVERY versions (and after a failed prune) a LIST finds and
        deletes older leftovers too (a committer that died before its prune)."""
        try:
            stale = version - self.keep
            if version % FULL_PRUNE_EVERY == 0 or self._prune_failed:
                for old in self.history():
                    if old <= stale:
                        self._delete(self.audit_key(old))
            elif stale >= 1:
                self._delete(self.audit_key(stale))
            self._prune_failed = False
        except _REQUEST_FAILED as error:
            self._prune_failed = True
            log.warning("%s: version %d is committed; pruning old audit copies failed "
                        "(retried at the next commit): %s", self.where, version, error)

    def purge_uncommitted(self) -> bool:
        """With current.json intact: remove audit copies newer than the current version
        (a committer died between steps 3 and 4) and say True: the current version is
        proven. False when current.json is missing or damaged. Only the document's owner
        may call it: on S3 a stalled committer looks the same as a dead one."""
        current = self._intact_current_version()
        if current is None:
            return False
        for version in self.history():
            if version > current:
                self._delete(self.audit_key(version))
                log.info("%s: removed the audit copy of version %d, never committed",
                         self.where, version)
        return True

    def proven(self) -> bool:
        """As purge_uncommitted, but removing nothing: a process that does not own the
        document (a compaction's sweep, a fenced writer) must not remove an audit copy
        that a stalled owner's commit may still land on; it finds the version unproven
        and deletes no orphan. test_a_non_owner_never_removes_an_audit_copy
        (tests/faults/test_failover_steps_s3.py)."""
        current = self._intact_current_version()
        if current is None:
            return False
        return all(version <= current for version in self.history())

    def _intact_current_version(self) -> int | None:
        """The version current.json holds, or None when it is missing or damaged."""
        found = self._get(self.current_key)
        if found is None:
            return None
        try:
            current, _ = _decode_at(self.url_of(self.current_key), found.raw)
        except CorruptionError:
            return None
        return current

    def recover(self) -> list[str]:
        """Nothing to do: a PUT is whole or absent, so no commit leaves temporary objects."""
        return []
