"""The interface of a committed metadata document, whatever stores it.

Invariant: every implementation (LocalDocument in commit.py on a local directory,
ObjectDocument in object_commit.py on an S3 prefix) gives the same guarantees: a
commit succeeds only if the version it was based on is still current when it replaces
it, else ConflictError and nothing changed; the newest audit copy is never older than
the committed version, and a damaged current.json falls back to it and to nothing older;
an outcome the committer cannot know is CommitOutcomeUnknown, resolved by re-reading.
tests/test_object_commit.py runs the same contract tests against both.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from compactlog.storage.commit import LocalDocument, Snapshot


class Document(Protocol):
    """A metadata document committed by compare-and-swap (see commit.py)."""

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
        Only the document's owner may call it (object_commit.py)."""
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
    object_commit.py), which would make every later commit of that version conflict.
    Remove it (purge_uncommitted); True if so, and the caller may try again.

    Safe while a committer is merely stalled between those steps: its commit point is
    the compare-and-swap of current.json, which removing its audit copy does not touch,
    so of it and the caller's retry at most one lands (the other conflicts); a version
    that lands without its audit copy only loses the fallback past a damaged current.
    Tests: tests/test_lease.py test_a_holder_killed_inside_a_renewal_does_not_block_
    the_next_taker, tests/test_offset_files_s3.py test_a_dead_claim_does_not_block_
    the_server_state_documents."""
    current = document.load()
    if (current.version if current is not None else 0) != based_on:
        return False  # another commit landed: the caller retries on it
    return document.purge_uncommitted()


# LocalDocument satisfies the protocol (checked by mypy, no base class needed).
_LOCAL: type[Document] = LocalDocument
