"""The writer lease of a store on an object store: which process may write its topics.

Invariant: at most one process at a time believes it holds the lease, as far as the
lease document says (it is committed by compare-and-swap, so two takers of one version
cannot both succeed); and correctness never rests on that belief or on clocks. Each
taking of the lease gets a new epoch, one higher than any before. A writer stamps its
epoch into every partition manifest it opens (`Partition.writer_epoch`,
`extra["writer_epoch"]`) before it writes, and every commit it makes to a manifest
checks that the manifest's epoch is still its own: a stalled former owner whose
lease expired and was taken finds a newer epoch at its next commit (its compare-and-swap
fails on the stamped version, it re-reads, and sees the epoch) and stops with
FencedError. The lease's expiry only decides when a new owner may take over.

Lease protocol (WriterLease; tests in tests/backend/test_lease.py):
  1. acquire: load the lease document; if a live lease (not released, not expired by
     this machine's clock) names another owner, refuse with DataDirLockedError naming
     it; else commit {owner, epoch + 1, expires_ms} on the version read. A conflict
     means another process took it meanwhile: refuse the same way.
     test_a_second_writer_is_refused_while_the_lease_lives,
     test_an_expired_lease_is_taken_over_with_a_higher_epoch
  1a. a conflict on a free lease may be the audit copy a holder killed inside a commit
     left (backend/s3/document.py steps 3-4), which would block every taker for good: remove
     audit copies of versions never committed and try once more;
     test_a_holder_killed_inside_a_renewal_does_not_block_the_next_taker
  2. renew every ttl/3: commit {owner, epoch, new expiry} on the version this process
     last committed, one renewal at a time whatever the thread (two from one version
     would conflict with each other); a conflict means the lease was taken: raise
     LeaseLostError, and the store stops writing. test_a_taken_lease_is_lost_at_renewal.
     A server renews on a thread of its own (`keep`), so that nothing it does at the
     same time, such as opening every partition of a store it just took over on a slow
     bucket, can outlast the lease; tests/faults/test_jepsen.py, test_a_node_that_takes_over_
     keeps_its_lease_while_it_opens_the_store. A library writer renews in its tick.
  3. release (close): commit {released: true} on our version; a conflict is logged (the
     lease was taken already). test_a_released_lease_is_taken_at_once
  4. serve only while valid (`valid`): a holder acknowledges and serves nothing once its
     own clock passes the expiry it last committed, less a margin (`SAFETY_MARGIN` of
     the ttl, for clock skew between machines), whether or not a renewal is under way:
     a process paused (SIGSTOP, a long GC, a slow renewal request) past its lease may
     already have been replaced, and only a successful renewal makes it valid again.
     tests/faults/test_failover_steps_s3.py,
     test_a_holder_past_its_expiry_serves_nothing_until_it_renews
A holder that dies simply stops renewing; after ttl the next writer takes over.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from compactlog.backend import Document, Snapshot, clear_dead_claim
from compactlog.errors import CompactlogError, ConflictError, DataDirLockedError

log = logging.getLogger(__name__)

DEFAULT_TTL_S = 30.0
EPOCH_KEY = "writer_epoch"
# Step 4: the part of the ttl before the committed expiry at which a holder stops
# serving, so that another machine's clock running this much ahead of ours cannot let
# it take over while we still acknowledge.
SAFETY_MARGIN = 0.2


class _Blocked(Exception):
    """acquire's commit conflicted: another taker, or a claim a killed holder left."""

    def __init__(self, based_on: int) -> None:
        super().__init__(based_on)
        self.based_on = based_on  # the version the conflicting commit was based on


class LeaseLostError(CompactlogError):
    """Another process took this store's writer lease: this process writes no more."""


@dataclass(frozen=True)
class LeaseState:
    owner: str
    epoch: int
    expires_ms: int
    released: bool

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> LeaseState:
        return cls(str(body.get("owner", "")), int(body.get("epoch", 0)),
                   int(body.get("expires_ms", 0)), bool(body.get("released", False)))

    def to_body(self) -> dict[str, Any]:
        return {"owner": self.owner, "epoch": self.epoch, "expires_ms": self.expires_ms,
                "released": self.released}


class WriterLease:
    """This process' claim on a store's writer lease (see the module's protocol)."""

    def __init__(self, document: Document, where: str, ttl_s: float = DEFAULT_TTL_S,
                 clock: Any = time.time) -> None:
        self.document = document
        self.where = where
        self.ttl_s = ttl_s
        self.clock = clock
        self.owner = f"{socket.gethostname()} pid {os.getpid()} ({uuid.uuid4().hex[:8]})"
        self.epoch = 0
        self._snapshot: Snapshot | None = None
        self._renewed_at = 0.0
        self._expires_ms = 0  # the expiry of this holder's last committed lease state
        self._renewing = threading.Lock()  # step 2: one renewal at a time
        self._keeping = threading.Event()  # set: the keeper thread stops
        self._keeper: threading.Thread | None = None

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    def acquire(self) -> int:
        """Step 1; the new epoch."""
        try:
            return self._acquire()
        except _Blocked as blocked:
            # 1a. The version after the current one is claimed by an audit copy and
            # never committed: a holder was killed inside a commit. The lease is free
            # (released or expired), so the document has no owner to wait for: remove
            # the claim and try once more. A taker racing this one still loses at the
            # compare-and-swap of current.json.
            clear_dead_claim(self.document, blocked.based_on)
            try:
                return self._acquire()
            except _Blocked:
                raise DataDirLockedError(self.where, "another process that took the "
                                                     "writer lease just now") from None

    def _acquire(self) -> int:
        current = self.document.load()
        previous = LeaseState.from_body(current.body) if current is not None else None
        if (previous is not None and not previous.released
                and previous.expires_ms > self._now_ms() and previous.owner != self.owner):
            raise DataDirLockedError(self.where, f"{previous.owner}, whose writer lease "
                                                 f"is live for {self._left_s(previous):.0f}s more")
        epoch = (previous.epoch if previous is not None else 0) + 1
        state = LeaseState(self.owner, epoch, self._expiry(), False)
        started = time.monotonic()
        try:
            self._snapshot = self.document.commit(
                current.version if current is not None else 0, state.to_body())
        except ConflictError:
            raise _Blocked(current.version if current is not None else 0) from None
        self.epoch = epoch
        self._renewed_at = started
        self._expires_ms = state.expires_ms
        if previous is not None and not previous.released:
            log.warning("%s: took over the writer lease from %s (expired); epoch %d",
                        self.where, previous.owner, epoch)
        else:
            log.info("%s: took the writer lease, epoch %d", self.where, epoch)
        return epoch

    def _left_s(self, state: LeaseState) -> float:
        return max(0.0, (state.expires_ms - self._now_ms()) / 1000)

    def _expiry(self) -> int:
        return self._now_ms() + int(self.ttl_s * 1000)

    @property
    def renewal_due(self) -> bool:
        """A third of the ttl since the last renewal began, or (by the lease's clock) less
        than two thirds of it left: whichever comes first."""
        left_ms = self._expires_ms - self._now_ms()
        return (time.monotonic() - self._renewed_at >= self.ttl_s / 3
                or left_ms < self.ttl_s * 1000 * 2 / 3)

    def keep(self, on_lost: Callable[[LeaseLostError], None],
             on_error: Callable[[Exception], None]) -> None:
        """Step 2 on a thread of its own until `stop_keeping` or the lease is lost
        (`on_lost`, once); a renewal that fails otherwise (the bucket unreachable) is
        reported to `on_error` and tried again."""

        def run() -> None:
            while not self._keeping.wait(min(self.ttl_s / 12, 1.0)):
                try:
                    self.renew_if_due()
                except LeaseLostError as error:
                    on_lost(error)
                    return
                except Exception as error:  # retried at the next check
                    on_error(error)

        self._keeping.clear()
        self._keeper = threading.Thread(target=run, name="writer-lease", daemon=True)
        self._keeper.start()

    def stop_keeping(self) -> None:
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            self._keeping.set()
            keeper.join(timeout=max(self.ttl_s, 30.0))

    def renew_if_due(self) -> None:
        """Step 2 from any thread, when due."""
        with self._renewing:
            if self.renewal_due:
                self.renew()

    def renew(self) -> None:
        """Step 2."""
        if self._snapshot is None:
            raise LeaseLostError(f"{self.where}: the writer lease is not held")
        state = LeaseState(self.owner, self.epoch, self._expiry(), False)
        started = time.monotonic()
        try:
            self._snapshot = self.document.commit(self._snapshot.version, state.to_body())
        except ConflictError:
            self._snapshot = None
            raise LeaseLostError(f"{self.where}: another process took the writer lease; "
                                 "this one writes no more") from None
        # The expiry was computed before the request went out, so a slow request only
        # shortens what it bought.
        self._renewed_at = started
        self._expires_ms = state.expires_ms

    @property
    def valid(self) -> bool:
        """Step 4: whether this holder may acknowledge and serve now."""
        margin_ms = int(self.ttl_s * 1000 * SAFETY_MARGIN)
        return self._snapshot is not None and self._now_ms() < self._expires_ms - margin_ms

    def require_valid(self) -> None:
        """LeaseLostError unless `valid`: the error a produce or a fetch answers with."""
        if self._snapshot is None:
            raise LeaseLostError(f"{self.where}: another process took the writer lease; "
                                 "this one writes no more")
        if not self.valid:
            raise LeaseLostError(
                f"{self.where}: this server's writer lease ran out at "
                f"{self._expires_ms} ms (not renewed in time); it serves nothing until "
                "a renewal succeeds, and another server may have taken over")

    def check(self) -> None:
        """LeaseLostError unless the lease document still holds this writer's epoch (one
        HEAD while it is unchanged since this writer's last commit of it): for a write
        that no compare-and-swap fences, such as the first of a new document."""
        if self._snapshot is not None and not self.document.changed_since(self._snapshot):
            return
        current = self.document.load()
        if current is None or LeaseState.from_body(current.body).epoch != self.epoch:
            raise LeaseLostError(f"{self.where}: another process took the writer lease; "
                                 "this one writes no more")

    def release(self) -> None:
        """Step 3."""
        self.stop_keeping()
        if self._snapshot is None:
            return
        state = LeaseState(self.owner, self.epoch, self._now_ms(), True)
        with self._renewing:
            try:
                self.document.commit(self._snapshot.version, state.to_body())
            except ConflictError:
                log.warning("%s: the writer lease was taken before it was released",
                            self.where)
            self._snapshot = None
