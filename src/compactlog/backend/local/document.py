"""The commit primitive on a local directory: compare-and-swap of a metadata document's
current version (LocalDocument, the local backend's Document).

Invariant: a commit succeeds only if the version it was based on is still the current
one when it replaces it, however long it stalled before; otherwise it fails with
ConflictError and changes nothing. Every writer of a partition's manifest (sealing,
compaction, retention) and of a topic's metadata (config changes) commits through here.

A document lives in one directory:
  current.json              the committed document: {"format", "version", "crc32", "body"}
  00000000000000000007.json  audit copies of the last `keep` versions
  .lock                     flock'd by a committer between compare and replace
  .tmp-*                    a commit's files before they are published
Versions count up from 1. A version's audit copy is written before its commit point, so
the newest audit copy is never older than the committed version: it is the committed
version, or the next one of a committer that died between its steps 3 and 4. That is
what a torn or corrupt current.json falls back to, and only to it: an older copy might
lose a commit, so if the newest copy is damaged too the document is unreadable
(CorruptionError). A separate file each, so one damaged file never loses a version.

Commit protocol (LocalDocument.commit; the test of each step in tests/backend/test_commit.py):
  1. take the document's lock (an flock; waits up to lock_timeout_s, then fails with
     CommitLockTimeout); test_the_lock_times_out_into_a_conflict,
     test_commits_from_threads_and_processes_never_lose_one
  2. read the current version and compare it with the expected one; unequal: release,
     ConflictError; test_a_stale_commit_conflicts_and_changes_nothing,
     test_a_commit_stalled_before_its_compare_conflicts
  3. write the audit copy of the new version (a temp file, fsync, rename to its
     number); test_a_failed_write_or_fsync_leaves_the_old_version
  4. write the new document to a temporary file, fsync it, rename it over current.json
     and fsync the directory: the commit point. A failure before the rename removes
     the audit copy of 3 (the lock is held, and that version was never committed);
     test_a_failed_write_or_fsync_leaves_the_old_version,
     test_a_failed_directory_fsync_after_the_rename_is_an_unknown_outcome
  5. prune audit copies older than `keep` (a failure is logged; the commit stands);
     test_audit_copies_are_pruned
  6. release the lock.
A crash before 4's rename leaves the old version current, at most temporary files
(removed by `recover`) and an audit copy of a version never committed, which
`purge_uncommitted` removes before anyone deletes files as orphans; after the rename the
new version is current. test_a_torn_current_falls_back_to_the_newest_copy_only

On an object store the same primitive is a conditional PUT of current.json (If-Match on
the ETag read at the compare, If-None-Match: * for the first version), with create-only
audit copies before it: s3/document.py. The encoding of current.json and of the audit
copies is envelope.py's, the same in both.
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from pathlib import Path
from typing import Any

from compactlog import faults, fsutil
from compactlog.backend import CommitOutcomeUnknown, Snapshot
from compactlog.backend.envelope import CURRENT, DEFAULT_KEEP, SUFFIX, decode, encode, version_of
from compactlog.errors import ConflictError, CorruptionError

log = logging.getLogger(__name__)

LOCK = ".lock"
DEFAULT_LOCK_TIMEOUT_S = 30.0


class CommitLockTimeout(ConflictError):
    """Another committer held the document's lock for lock_timeout_s (stopped, or
    stalled on a slow disk). Retrying at once would wait as long again."""


def _stamp(stat: os.stat_result) -> tuple[int, int, int]:
    return stat.st_ino, stat.st_mtime_ns, stat.st_size


class LocalDocument:
    """A metadata document on a local filesystem, committed by compare-and-swap."""

    def __init__(self, directory: Path, keep: int = DEFAULT_KEEP,
                 lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S) -> None:
        self.directory = directory
        self.keep = keep
        self.lock_timeout_s = lock_timeout_s
        # Set for a document of secrets: every directory from this one down to the
        # document's is made 0700 and every file the commit writes 0600, whatever the
        # umask (`make_private`).
        self.private_root: Path | None = None

    def make_private(self, root: Path) -> None:
        """Keep this document private from here on: `root` (an ancestor of its
        directory, or the directory) and the directories below it down to the
        document's are 0700, its files 0600; those already there are changed at the
        next commit."""
        self.private_root = root

    def _file_mode(self) -> int | None:
        return 0o600 if self.private_root is not None else None

    def _secure(self) -> None:
        root = self.private_root
        if root is None:
            return
        chain = [self.directory, *self.directory.parents]
        for directory in chain[:chain.index(root) + 1] if root in chain else [root]:
            os.chmod(directory, 0o700)
        for entry in self.directory.iterdir():
            if entry.is_file() and entry.stat().st_mode & 0o077:
                os.chmod(entry, 0o600)

    def __repr__(self) -> str:
        return f"LocalDocument({self.where!r}, keep={self.keep})"

    @property
    def where(self) -> str:
        return str(self.directory)

    @property
    def current_path(self) -> Path:
        return self.directory / CURRENT

    def path_of(self, version: int) -> Path:
        """The audit copy of `version`."""
        return self.directory / f"{version:020d}{SUFFIX}"

    def history(self) -> list[int]:
        """The versions whose audit copies are kept, oldest first."""
        if not self.directory.is_dir():
            return []
        found = (version_of(entry.name) for entry in self.directory.iterdir())
        return sorted(v for v in found if v is not None)

    # -- reading ----------------------------------------------------------------------

    def load(self) -> Snapshot | None:
        """The current version, or None when nothing was ever committed."""
        current = self._load_current()
        if isinstance(current, Snapshot):
            return current
        fallback = self._newest_copy(current)
        if fallback is None:
            return None
        if current is not None:  # current.json is damaged
            log.warning("%s; using the audit copy of version %d (%s), the newest, until "
                        "the next commit replaces it", current, fallback.version,
                        self.path_of(fallback.version).name)
        else:
            # No current.json: a directory written before it existed (format 1), or one
            # whose current.json was deleted.
            log.info("%s: no %s; the newest version is %d", self.directory, CURRENT,
                     fallback.version)
        return fallback

    def _load_current(self) -> Snapshot | CorruptionError | None:
        path = self.current_path
        try:
            with open(path, "rb") as handle:
                stat = os.fstat(handle.fileno())
                raw = handle.read()
        except FileNotFoundError:
            return None
        try:
            version, body = decode(path, raw)
        except CorruptionError as error:
            return error
        return Snapshot(version, body, _stamp(stat))

    def _newest_copy(self, damaged: CorruptionError | None) -> Snapshot | None:
        """The newest audit copy, which is at least the committed version (step 3 comes
        before every commit point); never an older one, which might lose a commit."""
        for version in reversed(self.history()):
            path = self.path_of(version)
            try:
                stored, body = decode(path, path.read_bytes())
            except FileNotFoundError:
                continue  # pruned or purged meanwhile
            except CorruptionError as error:
                if damaged is None:
                    raise CorruptionError(path, f"{error.detail}; {CURRENT} is missing, "
                                          "and an older version might lack a commit") from None
                raise CorruptionError(
                    damaged.path, f"{damaged.detail}; its audit copy {path.name} is damaged "
                    f"too ({error.detail}), and an older version might lack a commit"
                ) from None
            if stored != version:
                raise CorruptionError(path, f"holds version {stored}, not {version}")
            return Snapshot(version, body, None)
        if damaged is not None:
            raise damaged
        return None

    def load_version(self, version: int) -> dict[str, Any]:
        """An audit copy's body (for inspection; commits never need them)."""
        path = self.path_of(version)
        stored, body = decode(path, path.read_bytes())
        if stored != version:
            raise CorruptionError(path, f"holds version {stored}, not {version}")
        return body

    def changed_since(self, snapshot: Snapshot | None) -> bool:
        """Whether the current version may differ from `snapshot` (one stat, no read)."""
        try:
            stat = os.stat(self.current_path)
        except FileNotFoundError:
            # Nothing committed then: changed only if a version can be loaded now (an
            # audit copy to fall back to). Committed then: changed (it is gone).
            if snapshot is None:
                return bool(self.history())
            return snapshot.stamp is not None or bool(self.history())
        return snapshot is None or snapshot.stamp != _stamp(stat)

    # -- committing -------------------------------------------------------------------

    def commit(self, expected_version: int, body: dict[str, Any]) -> Snapshot:
        """Publish `body` as version expected_version + 1 if expected_version is still
        current (0: nothing committed yet); else raise ConflictError."""
        faults.point("commit.begin", self.directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._secure()
        lock_fd = self._lock()  # 1.
        try:
            current = self.load()  # 2. compare
            current_version = current.version if current is not None else 0
            if current_version != expected_version:
                raise ConflictError(
                    f"{self.directory}: commit based on version {expected_version}, "
                    f"but version {current_version} is current"
                )
            faults.point("commit.compared", self.directory)
            version = expected_version + 1
            data = encode(version, body)
            audit = self.path_of(version)
            audit_temp = fsutil.temp_path(self.directory, f"a{version}")
            temp = fsutil.temp_path(self.directory, f"v{version}")
            try:
                fsutil.write_file_durably(audit_temp, data, self._file_mode())  # 3.
                fsutil.rename(audit_temp, audit)
                fsutil.write_file_durably(temp, data, self._file_mode())  # 4.
                fsutil.rename(temp, self.current_path)  # the commit point
            except BaseException:
                for leftover in (audit_temp, temp):
                    leftover.unlink(missing_ok=True)
                if self._current_version() != version:
                    audit.unlink(missing_ok=True)  # never committed
                raise
            try:
                fsutil.fsync_dir(self.directory)
            except OSError as error:
                raise CommitOutcomeUnknown(
                    f"{self.directory}: version {version} was published but the "
                    f"directory fsync failed ({error}); it may not survive a power loss"
                ) from error
            stat = os.stat(self.current_path)
            self._prune(version)  # 5.
            return Snapshot(version, body, _stamp(stat))
        finally:
            os.close(lock_fd)  # 6. (closing the descriptor releases the flock)

    def _current_version(self) -> int | None:
        current = self._load_current()
        return current.version if isinstance(current, Snapshot) else None

    def _lock(self, timeout_s: float | None = None) -> int:
        fd = os.open(self.directory / LOCK, os.O_RDWR | os.O_CREAT, self._file_mode() or 0o644)
        timeout = self.lock_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout
        pause = 0.001
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    raise CommitLockTimeout(
                        f"{self.directory}: another committer has held the commit lock "
                        f"for {timeout:g} s"
                    ) from None
                time.sleep(pause)
                pause = min(pause * 2, 0.05)
            except BaseException:
                os.close(fd)
                raise

    def _prune(self, version: int) -> None:
        try:
            for old in self.history():
                if old <= version - self.keep:
                    fsutil.remove(self.path_of(old))
        except OSError as error:
            log.warning("%s: version %d is committed; pruning old audit copies failed "
                        "(retried at the next commit): %s", self.directory, version, error)

    def purge_uncommitted(self) -> bool:
        """Under the lock, with current.json intact: remove audit copies newer than the
        current version (a committer died between steps 3 and 4), and say True: the
        current version is proven, and files it does not mention are orphans. False when
        current.json is missing or damaged (the newest audit copy may be a version whose
        files are not yet listed anywhere else): then nobody may delete orphans."""
        if not self.directory.is_dir():
            return False
        lock_fd = self._lock()
        try:
            current = self._load_current()
            if not isinstance(current, Snapshot):
                return False
            purged = False
            for version in self.history():
                if version > current.version:
                    purged = fsutil.remove(self.path_of(version)) or purged
                    log.info("%s: removed the audit copy of version %d, never committed",
                             self.directory, version)
            if purged:
                fsutil.fsync_dir(self.directory)
            return True
        finally:
            os.close(lock_fd)

    def proven(self) -> bool:
        """As purge_uncommitted: on a local disk the commit lock excludes every
        committer, so removing a dead committer's audit copy is safe for anyone."""
        return self.purge_uncommitted()

    def recover(self) -> list[Path]:
        """Remove temporary files left by commits that crashed, unless a commit is in
        progress (its temporary files are not leftovers): then the next call does."""
        if not self.directory.is_dir():
            return []
        try:
            lock_fd = self._lock(timeout_s=0)
        except CommitLockTimeout:
            return []
        try:
            return fsutil.remove_temp_files(self.directory)
        finally:
            os.close(lock_fd)
