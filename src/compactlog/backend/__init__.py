"""The storage backends' interface: where a store's durable data lives (Location), a
partition's data files (Volume), a committed metadata document (Document), how a store
finds, creates and deletes its topics (Layout); and the factories that pick the backend
by a location's URL scheme. The backends are siblings: `local/` (a directory) and `s3/`
(a bucket prefix, the one home of boto3 and botocore). This module names no backend at
import time (the factories import theirs when called), so nothing here needs boto3.

Invariants every backend keeps (the tests run the same contract tests against both):
- Location: a Location never holds a credential, so its repr, its str and every message
  that names it are safe to print and log. Credentials and the endpoint come only from
  the standard AWS settings, read when a client is made (s3/settings.py).
- Volume: a data file is published whole under a name that is never reused, and is
  never overwritten. A reader gets a local path it can open (`fetch`): the file itself
  on a local disk, or a copy downloaded whole into a local read cache, never partial.
  The readers' checks (size and CRC32C against the manifest, sealed.verify_file) run on
  that path, so a damaged object is caught as a damaged file is. Relative names are
  '/'-separated: `segments/<file>`, `ledger/<file>`, `manifest`. Everything a partition
  keeps that is not durable (its log segments, locks, compaction status, files being
  written) stays in the partition's local directory: see storage/partition.py.
- Document: a commit succeeds only if the version it was based on is still current
  when it replaces it, else ConflictError and nothing changed; the newest audit copy is
  never older than the committed version, and a damaged current.json falls back to it
  and to nothing older; an outcome the committer cannot know is CommitOutcomeUnknown,
  resolved by re-reading. The encoding is envelope.py's, the same in both backends.
  tests/backend/test_object_commit.py runs the same contract tests against both
  (local/document.py, s3/document.py).
- Layout: a topic exists exactly when its metadata document holds a live (not deleted)
  version, and creating or deleting one is one step that readers see whole (how, in
  local/layout.py and s3/layout.py).
"""

from __future__ import annotations

import enum
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

from compactlog.errors import ConflictError, StorageError, UserError

if TYPE_CHECKING:
    from pyarrow.fs import FileSystem

    from compactlog.backend.s3.settings import S3Settings

S3_SCHEME = "s3"
DELETED = "deleted"

# S3's bucket naming rules (general purpose buckets): 3-63 characters, lower-case
# letters, digits, dots and hyphens, starting and ending with a letter or a digit.
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")  # matched whole


# "s3:/bucket", as a shell or Path("s3://bucket") leaves it: not meant as a directory.
_ONE_SLASH_URL = re.compile(r"^(s3|s3a|s3n|file|gs|http|https):/[^/]", re.IGNORECASE)


class LocationError(UserError):
    """A data location that is neither a usable path nor a valid s3:// URL."""


@dataclass(frozen=True)
class Location:
    """A local directory (`bucket` is None, `path` absolute) or an S3 prefix (`bucket`
    set, `path` the key prefix without leading or trailing slash, maybe empty)."""

    path: str
    bucket: str | None = None

    @property
    def is_s3(self) -> bool:
        return self.bucket is not None

    @classmethod
    def parse(cls, text: str | os.PathLike[str]) -> Location:
        """A Location from a path, `file://PATH` or `s3://BUCKET[/PREFIX]`."""
        raw = os.fspath(text)
        if not raw.strip():
            raise LocationError("empty data location: give a directory or s3://BUCKET/PREFIX")
        if "://" not in raw:
            if _ONE_SLASH_URL.match(raw):
                raise LocationError(
                    f"{_safe(raw)} looks like a URL with one slash after its scheme; write "
                    "s3://BUCKET/PREFIX (a directory with a ':' in its name: ./" + raw + ")")
            return cls(str(Path(raw).expanduser().absolute()))
        scheme = raw.split("://", 1)[0].lower()
        if scheme == "file":
            return cls._parse_file(raw)
        if scheme != S3_SCHEME:
            hint = " (use s3://; s3a:// is a Hadoop connector name)" if scheme in (
                "s3a", "s3n") else ""
            raise LocationError(f"unsupported data location scheme {scheme + '://'!r} in "
                                f"{_safe(raw)}{hint}: give a directory or s3://BUCKET/PREFIX")
        return cls._parse_s3(raw)

    @classmethod
    def _parse_file(cls, raw: str) -> Location:
        parts = urlsplit(raw)
        if parts.netloc not in ("", "localhost"):
            raise LocationError(f"{_safe(raw)}: a file:// URL names no host (file:///PATH)")
        if not parts.path.startswith("/"):
            raise LocationError(f"{_safe(raw)}: a file:// URL needs an absolute path")
        return cls(str(Path(parts.path)))

    @classmethod
    def _parse_s3(cls, raw: str) -> Location:
        rest = raw.split("://", 1)[1]
        shown = _safe(raw)
        netloc, _, prefix = rest.partition("/")
        if "@" in netloc:
            raise LocationError(f"{shown}: credentials do not belong in the URL; set "
                                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY or a profile")
        if "?" in rest or "#" in rest:
            raise LocationError(f"{shown}: an s3:// location takes no query or fragment "
                                "(the endpoint comes from AWS_ENDPOINT_URL)")
        if ":" in netloc:
            raise LocationError(f"{shown}: {netloc!r} is not a bucket name (a port or "
                                "endpoint goes in AWS_ENDPOINT_URL, not the URL)")
        if not netloc:
            raise LocationError(f"{shown}: no bucket name (s3://BUCKET/PREFIX)")
        if not _BUCKET.fullmatch(netloc) or ".." in netloc:
            raise LocationError(
                f"{shown}: invalid bucket name {netloc!r}: 3-63 lower-case letters, digits, "
                "dots and hyphens, starting and ending with a letter or digit")
        prefix = prefix.rstrip("/")
        segments = prefix.split("/") if prefix else []
        for index, segment in enumerate(segments):
            if segment in ("", ".", ".."):
                raise LocationError(
                    f"{shown}: path segment {index + 1} of the prefix is {segment!r}; "
                    "empty, '.' and '..' segments are not allowed")
        return cls(prefix, netloc)

    def join(self, *children: str) -> Location:
        """A child location (`children` are relative, '/'-separated names)."""
        parts = [self.path] if self.path else []
        for child in children:
            for segment in child.split("/"):
                if segment in ("", ".", ".."):
                    raise LocationError(f"{self}: cannot join {child!r} (empty, '.' or '..' "
                                        "segment)")
                parts.append(segment)
        if self.bucket is None:
            return Location(str(Path(*parts)))
        return Location("/".join(parts), self.bucket)

    def key(self, name: str) -> str:
        """The object key of `name` under an S3 location's prefix."""
        if self.bucket is None:
            raise LocationError(f"{self} is a local directory, not an s3:// location")
        return self.join(name).path

    @property
    def fs_path(self) -> str:
        """The path to give to `filesystem()`: a local path, or BUCKET/PREFIX."""
        if self.bucket is None:
            return self.path
        return f"{self.bucket}/{self.path}" if self.path else self.bucket

    def filesystem(self, env: Mapping[str, str] | None = None,
                   settings: S3Settings | None = None) -> FileSystem:
        """The pyarrow filesystem that reads and writes this location's data files
        (`settings`, when given, instead of those from `env`)."""
        from pyarrow import fs

        if self.bucket is None:
            return fs.LocalFileSystem()
        if settings is None:
            from compactlog.backend.s3.settings import S3Settings

            settings = S3Settings.from_env(env)
        return settings.pyarrow_filesystem()

    def __str__(self) -> str:
        if self.bucket is None:
            return self.path
        return f"s3://{self.fs_path}"

    def __repr__(self) -> str:
        return f"Location({str(self)!r})"


def _safe(raw: str) -> str:
    """`raw` for an error message, with anything that looks like userinfo masked."""
    scheme, sep, rest = raw.partition("://")
    netloc, slash, tail = rest.partition("/")
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    return repr(f"{scheme}{sep}{netloc}{slash}{tail}")


@dataclass(frozen=True)
class Listed:
    """A data file found by `Volume.listing`: its name in the folder and its age."""

    name: str
    modified_ms: int


class Volume(Protocol):
    """A partition's durable files (see the module's invariant)."""

    @property
    def spec(self) -> dict[str, str]:
        """What a process elsewhere (a Spark task) needs to open the same volume."""
        ...

    @property
    def is_local(self) -> bool:
        ...

    def document(self, name: str) -> Document:
        """The committed document `name` (a partition's manifest)."""
        ...

    def path_of(self, relative: str) -> Path:
        """Where the local copy of `relative` is or would be, without any I/O."""
        ...

    def fetch(self, relative: str) -> Path:
        """A local path holding `relative` whole; FileNotFoundError when it is gone."""
        ...

    def publish(self, temp: Path, relative: str) -> None:
        """Make the fsynced local file `temp` the data file `relative`, never replacing
        one; `temp` is gone afterwards (moved or removed)."""
        ...

    def publish_copy(self, temp: Path, relative: str, source: str) -> None:
        """As `publish`, for a local file whose bytes are those of this volume's data file
        `source` (an adopted segment: compaction/adoption.py): an object store copies
        `source` where it is, so the bytes are not sent again, under a name no other
        writer uses for other bytes; `temp` becomes the local copy of `relative`."""
        ...

    def evict(self, relative: str) -> None:
        """Drop a downloaded copy that failed its checks, so the next fetch downloads it
        again (nothing to do for a local file)."""
        ...

    def remove(self, relative: str) -> bool:
        """Delete data file `relative`; True when it was there."""
        ...

    def settle(self, folder: str) -> None:
        """Make the removals in `folder` durable (a local directory fsync)."""
        ...

    def listing(self, folder: str) -> list[Listed]:
        """The files in `folder` (temporary ones included on a local disk)."""
        ...

    def describe(self, relative: str) -> str:
        """`relative` as a user should see it in a message."""
        ...

    def url(self, relative: str) -> str:
        """Where an engine that knows nothing of compactlog opens `relative`: an
        absolute local path, or its s3:// URL (what the Iceberg tables list)."""
        ...


@dataclass(frozen=True)
class Snapshot:
    """One committed version of a document, as loaded."""

    version: int
    body: dict[str, Any]
    # What current.json looked like when this was read (inode, mtime, size; on an object
    # store its ETag), so that `changed_since` can tell without reading it; None when it
    # came from an audit copy (current.json missing or damaged: then the version is not
    # proven current).
    stamp: tuple[int, int, int] | str | None

    @property
    def proven(self) -> bool:
        """Read from an intact current.json: certainly the committed version."""
        return self.stamp is not None


class CommitOutcomeUnknown(StorageError):
    """The commit's rename happened but a later step (the directory fsync) failed: the
    new version is visible but may not survive power loss. The caller must reload
    rather than assume either outcome."""


class Document(Protocol):
    """A metadata document committed by compare-and-swap (see the module docstring)."""

    keep: int

    @property
    def where(self) -> str:
        """Where the document lives (a directory or an s3:// prefix), for messages."""
        ...

    def load(self) -> Snapshot | None:
        """The current version, or None when nothing was ever committed."""
        ...

    def commit(self, expected_version: int, body: dict[str, Any]) -> Snapshot:
        """Publish `body` as expected_version + 1 if expected_version is still current."""
        ...

    def history(self) -> list[int]:
        """The versions whose audit copies are kept, oldest first."""
        ...

    def load_version(self, version: int) -> dict[str, Any]:
        """An audit copy's body."""
        ...

    def changed_since(self, snapshot: Snapshot | None) -> bool:
        """Whether the current version may differ from `snapshot`, cheaply."""
        ...

    def purge_uncommitted(self) -> bool:
        """Remove audit copies of versions never committed; True if current is proven.
        Only the document's owner may call it (s3/document.py)."""
        ...

    def proven(self) -> bool:
        """Whether the current version is proven (current intact, and no audit copy of a
        newer version that a commit in flight may still land), removing nothing: what a
        process that does not own the document asks before deleting orphans."""
        ...

    def recover(self) -> Sequence[Path | str]:
        """Remove what crashed commits left behind; what was removed."""
        ...


def clear_dead_claim(document: Document, based_on: int) -> bool:
    """After a commit based on version `based_on` failed with ConflictError: if the
    document is still at that version, no commit landed and the conflict was an audit
    copy of the next version that a committer killed inside a commit left (steps 3-4 of
    s3/document.py), which would make every later commit of that version conflict.
    Remove it (purge_uncommitted); True if so, and the caller may try again.

    Safe while a committer is merely stalled between those steps: its commit point is
    the compare-and-swap of current.json, which removing its audit copy does not touch,
    so of it and the caller's retry at most one lands (the other conflicts); a version
    that lands without its audit copy only loses the fallback past a damaged current.
    Tests: tests/backend/test_lease.py test_a_holder_killed_inside_a_renewal_does_not_block_
    the_next_taker, tests/server/test_offset_files_s3.py test_a_dead_claim_does_not_block_
    the_server_state_documents."""
    current = document.load()
    if (current.version if current is not None else 0) != based_on:
        return False  # another commit landed: the caller retries on it
    return document.purge_uncommitted()


UPDATE_ATTEMPTS = 8


class Unread(enum.Enum):
    """`update_document`'s `loaded` when the caller has not read the document."""

    UNREAD = 0


def update_document(document: Document,
                    change: Callable[[Snapshot | None], dict[str, Any] | None],
                    attempts: int = UPDATE_ATTEMPTS,
                    loaded: Snapshot | Unread | None = Unread.UNREAD) -> Snapshot | None:
    """The one read-modify-write loop over a document: load it, apply `change` to what
    is current (None: nothing to commit, and nothing is), commit the new body based on
    the version loaded. On ConflictError, clear a dead claim (clear_dead_claim: without
    it a committer killed inside a commit would make every later commit of that version
    conflict, and the loop give up each time) and apply `change` again to what is
    current then. The committed snapshot, or None when `change` had nothing to commit;
    ConflictError naming the document after `attempts` conflicts.

    `change` may run more than once, each time on a newer snapshot: it must be a pure
    function of the snapshot it is given. A caller that has just read the document
    passes what it read as `loaded` (None: there was none), and the first attempt starts
    from it instead of reading again (one request fewer on S3). tests/backend/test_object_commit.py
    test_update_document_goes_past_a_dead_claim, tests/faults/test_fault_steps_s3.py (the hold
    document of the Iceberg sync)."""
    for attempt in range(attempts):
        snapshot = document.load() if attempt or isinstance(loaded, Unread) else loaded
        body = change(snapshot)
        if body is None:
            return None
        based_on = 0 if snapshot is None else snapshot.version
        try:
            return document.commit(based_on, body)
        except ConflictError:
            clear_dead_claim(document, based_on)
    raise ConflictError(f"{document.where}: the document kept changing under {attempts} "
                        f"attempts to change it")


def load_or_create(document: Document, make: Callable[[], dict[str, Any]]) -> Snapshot:
    """A document made once and then only read (the cluster id on S3, the decoy secret
    of SCRAM logins): what is current, or else `make()` committed as its first version
    by whoever comes first, everyone else reading that (update_document's loop: a
    racing maker's commit conflicts, and it reads the winner's). tests/backend/
    test_object_commit.py test_load_or_create_makes_once_and_every_server_reads_the_same."""
    current = document.load()  # made already, the usual case: one read
    if current is not None:
        return current
    made = update_document(document, lambda found: None if found is not None else make(),
                           loaded=None)
    current = made if made is not None else document.load()  # another maker won
    if current is None:  # committed, then gone: only a deletion from outside does that
        raise ConflictError(f"{document.where}: the document could not be read or made")
    return current


# Lays out an empty partition: (local directory, volume) -> None.
PartitionMaker = Callable[[Path, Volume], None]


def is_deleted(body: dict[str, Any]) -> bool:
    return bool(body.get(DELETED))


class UploadSweeper(Protocol):
    """Aborts the multipart uploads under a location that stay incomplete for a while:
    a data file whose upload failed leaves its parts stored, and billed, until then."""

    def sweep(self, now: float) -> list[str]:
        """One look at `now` (the caller's monotonic clock, in seconds): abort the
        uploads seen incomplete since long enough before; their keys."""
        ...


class Layout(Protocol):
    """How a store finds, creates and deletes its topics (see the module's invariant)."""

    # Whether a name `names()` lists is a topic for sure (a local topic directory is
    # renamed into place whole), or only may be one (on S3 a key prefix stays until its
    # objects are gone: its metadata decides).
    names_are_topics: bool

    def check_readable(self) -> None:
        """Ready the location for a reader: UserError naming it if there is no store
        there to read (locally: no data directory)."""
        ...

    def prepare(self) -> None:
        """Ready the location for the writer, before it takes its lock: on S3, first
        refuse a store whose conditional writes do nothing (two commits could both
        land: s3/probe.py)."""
        ...

    def lease_document(self) -> Document | None:
        """The writer lease's document (lease.py), or None where the writer's local lock
        excludes every other writer (a local directory)."""
        ...

    def may_hold(self, name: str) -> bool:
        """Whether topic `name` may exist, cheaply: False proves it does not."""
        ...

    def meta_document(self, name: str) -> Document: ...

    def names(self) -> list[str]:
        """Names that may be topics (the caller loads their metadata to be sure)."""
        ...

    def partition_dir(self, name: str, topic_id: str, index: int) -> Path: ...

    def partition_volume(self, name: str, topic_id: str, index: int) -> Volume: ...

    def create(self, name: str, topic_id: str, partitions: int, meta: dict[str, Any],
               make_partition: PartitionMaker) -> None: ...

    def delete(self, name: str, snapshot: Snapshot | None) -> None:
        """Delete topic `name` (`snapshot`: its metadata as the caller last loaded it)."""
        ...

    def remove_leftovers(self) -> None: ...

    def upload_sweeper(self, min_age_s: float) -> UploadSweeper | None:
        """What aborts the multipart uploads that writers of this location abandoned
        (s3/abandoned_uploads.py), or None where there are none (a local directory)."""
        ...

    def state_document(self, name: str) -> Document:
        """A document of the server's own state (credentials, ACLs, the producer-id
        counter, the cluster id) kept with the topics, so that whoever opens the same
        location finds it: `name` is its path under the data location."""
        ...


def layout_for(location: Location, local_dir: Path) -> Layout:
    """The layout of the store at `location`, whose local directory is `local_dir`."""
    if location.is_s3:
        from compactlog.backend.s3.layout import ObjectLayout

        return ObjectLayout(location, local_dir)
    from compactlog.backend.local.layout import LocalLayout

    return LocalLayout(local_dir)


def state_document(location: Location, local_dir: Path, name: str) -> Document:
    """`Layout.state_document` of the store at `location` without opening it (no writer
    lease: the CLI's `users` and `acls` change the documents beside a running server)."""
    if location.is_s3:
        return layout_for(location, local_dir).state_document(name)
    from compactlog.backend.local.document import LocalDocument

    return LocalDocument(local_dir / name)


def volume_from_spec(spec: Mapping[str, Any], cache_dir: Path | None = None) -> Volume:
    """The volume a `Volume.spec` names, in this process (a Spark task's). An S3 volume
    caches into `cache_dir`, else into a directory of this process's own."""
    if spec["kind"] == "local":
        from compactlog.backend.local.volume import LocalVolume

        return LocalVolume(Path(spec["root"]))
    from compactlog.backend.s3.volume import ObjectVolume, task_cache_dir

    return ObjectVolume(Location.parse(spec["url"]), cache_dir or task_cache_dir())
