"""The authorizer: the server's ACLs, kept durable, and the decisions made from them.

It holds the ACLs and applies acl_model.py's rule to them; the handlers reach it
through access.py, the admin API through admin/route_access.py.

Invariant: the ACLs in force are exactly those of the committed version of the
document `<data>/acls/` (backend/local/document.py: compare-and-swap of `current.json`). A
change (CreateAcls, DeleteAcls) is computed from the committed version and committed
on top of it before it is answered or takes effect, so an acknowledged change survives
a crash and an unacknowledged one either happened whole or not at all; decisions read
an immutable snapshot, so one request never sees half a change. A change committed by
another process (`compactlog acls`) is picked up by `refresh`, which the server's
upkeep calls (one stat when nothing changed).

With the authorizer off (`enabled = false`, the default) every request is allowed, as
before ACLs existed, and the ACL APIs answer SECURITY_DISABLED, as Kafka does with no
authorizer configured.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from compactlog.backend import Document, Snapshot, update_document
from compactlog.backend.local.document import LocalDocument
from compactlog.errors import CorruptionError
from compactlog.log_throttle import Throttle
from compactlog.server.security.acl_model import (
    AclBinding,
    AclError,
    AclFilter,
    Operation,
    ResourceType,
    check_principal,
    decide,
    decide_by_type,
)

log = logging.getLogger("compactlog.authorizer")
ACL_DIR = "acls"
# A client retries a refused request fast: one line a minute per principal, host,
# operation and resource type.
_DENIALS = Throttle(60.0)


@dataclass
class AuthorizationConfig:
    """The `[authorization]` table of the server's config file (docs/server.md)."""

    # Check ACLs on every request. Off: everything is allowed, as without ACLs.
    enabled: bool = False
    # Principals allowed everything whatever the ACLs say (Kafka's super.users).
    super_users: list[str] = field(default_factory=list)
    # What a request on a resource that no ACL names gets (Kafka's
    # allow.everyone.if.no.acl.found; false: denied).
    allow_everyone_if_no_acl_found: bool = False
    # The admin HTTP API's bearer tokens: a file of `principal token` lines.
    admin_tokens_file: str | None = None
    # /metrics and /v1/health answer without a token.
    admin_open_health_and_metrics: bool = True

    def check(self) -> None:
        for principal in self.super_users:
            try:
                check_principal(principal)
            except AclError as error:
                raise ValueError(f"authorization.super_users: {error}") from None


@dataclass(frozen=True)
class _State:
    """One committed version of the ACLs, indexed by resource type."""

    snapshot: Snapshot | None
    acls: tuple[AclBinding, ...]
    by_type: dict[ResourceType, tuple[AclBinding, ...]]

    @property
    def version(self) -> int:
        return self.snapshot.version if self.snapshot is not None else 0

    @classmethod
    def of(cls, snapshot: Snapshot | None, acls: Iterable[AclBinding]) -> _State:
        ordered = tuple(sorted(set(acls)))
        by_type: dict[ResourceType, list[AclBinding]] = {}
        for acl in ordered:
            by_type.setdefault(acl.resource_type, []).append(acl)
        return cls(snapshot, ordered, {kind: tuple(v) for kind, v in by_type.items()})


class Authorizer:
    """Decisions from the ACLs of one data directory, and their changes."""

    def __init__(self, source: Path | Document, config: AuthorizationConfig) -> None:
        """`source`: a local data directory, or the ACL document itself (a store's
        `layout.state_document(ACL_DIR)`: on S3, with the topics)."""
        self.config = config
        self.enabled = config.enabled
        self.super_users = frozenset(config.super_users)
        self._document: Document = (LocalDocument(source / ACL_DIR)
                                    if isinstance(source, Path) else source)
        self._lock = threading.Lock()  # one change at a time in this process
        self._state = self._load()

    def _load(self) -> _State:
        return self._parse(self._document.load())

    def _parse(self, snapshot: Snapshot | None) -> _State:
        if snapshot is None:
            return _State.of(None, ())
        try:
            acls = [AclBinding.from_json(item) for item in snapshot.body["acls"]]
        except (KeyError, TypeError, ValueError) as error:
            raise CorruptionError(f"{self._document.where}/current.json",
                                  f"unreadable ACL document: {error!r}") from None
        return _State.of(snapshot, acls)

    @property
    def acls(self) -> tuple[AclBinding, ...]:
        return self._state.acls

    def refresh(self) -> bool:
        """Take up a version another process committed; whether there was one (one
        stat when current.json has not changed)."""
        if not self._document.changed_since(self._state.snapshot):
            return False
        with self._lock:
            before = self._state.version
            self._state = self._load()
            if self._state.version == before:
                return False
            log.info("ACLs reloaded: %d in force (version %d)", len(self._state.acls),
                     self._state.version)
            return True

    # -- decisions --------------------------------------------------------------------

    def authorize(self, principal: str, host: str, operation: Operation,
                  resource_type: ResourceType, name: str, audit: bool = True) -> bool:
        """Whether the request is allowed. A denial is logged (once a minute per
        principal, host, operation and resource type) unless `audit` is off: a listing that
        leaves out what the client may not see is no refusal (Kafka's logIfDenied)."""
        if not self.enabled:
            return True
        acls = self._state.by_type.get(resource_type, ())
        allowed = decide(acls, principal, host, operation, resource_type, name,
                         self.super_users, self.config.allow_everyone_if_no_acl_found)
        if not allowed and audit:
            # Keyed by what the client cannot choose freely: by resource name, one
            # request of 25,000 made-up topic names would be 25,000 lines (and keys).
            held = _DENIALS.allow((principal, host, operation, resource_type))
            if held is not None:
                log.info("Principal = %s is Denied Operation = %s from host = %s on "
                         "resource = %s:%s%s", principal, operation.name, host or "?",
                         resource_type.name, name,
                         f" ({held} more denials of this operation on this resource "
                         f"type to this principal and host since the last such line)"
                         if held else "")
        return allowed

    def authorize_by_type(self, principal: str, host: str, operation: Operation,
                          resource_type: ResourceType) -> bool:
        if not self.enabled:
            return True
        acls = self._state.by_type.get(resource_type, ())
        return decide_by_type(acls, principal, host, operation, resource_type,
                              self.super_users, self.config.allow_everyone_if_no_acl_found)

    # -- changes ----------------------------------------------------------------------

    def describe(self, acl_filter: AclFilter) -> list[AclBinding]:
        return [acl for acl in self._state.acls if acl_filter.matches(acl)]

    def create(self, bindings: Sequence[AclBinding]) -> None:
        """Add the bindings (those already present are no change), committed first."""
        self._change(lambda current: set(current) | set(bindings))

    def delete(self, filters: Sequence[AclFilter]) -> list[list[AclBinding]]:
        """Remove every binding a filter matches; per filter, the bindings it removed."""
        removed: list[list[AclBinding]] = []

        def change(current: Iterable[AclBinding]) -> set[AclBinding]:
            removed.clear()
            kept = set(current)
            for acl_filter in filters:
                matched = sorted(acl for acl in current if acl_filter.matches(acl))
                removed.append(matched)
                kept -= set(matched)
            return kept

        self._change(change)
        return removed

    def _change(self, change: Callable[[tuple[AclBinding, ...]], set[AclBinding]]) -> None:
        """Apply `change` to the ACLs committed now, and commit the result. Another
        process may commit meanwhile: then `change` is applied again to what it
        committed, and a killed committer's claim is cleared on the way
        (backend.update_document), so `change` must be a pure function of the ACLs it
        is given."""
        with self._lock:

            def changed(snapshot: Snapshot | None) -> dict[str, Any] | None:
                current = self._parse(snapshot)
                self._state = current
                new = _State.of(None, change(current.acls))
                if new.acls == current.acls:
                    return None
                return {"acls": [acl.to_json() for acl in new.acls]}

            committed = update_document(self._document, changed)
            if committed is None:
                return
            self._state = self._parse(committed)
            log.info("ACLs changed: %d in force (version %d)", len(self._state.acls),
                     committed.version)
