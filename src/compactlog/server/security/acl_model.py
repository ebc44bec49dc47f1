"""Kafka's ACL model: bindings, filters, and the rule that decides one request.

Pure values and functions, no I/O: the ACLs in force are authorizer.py's, and what
a handler asks is access.py's.

Invariant: `decide` is Kafka's StandardAuthorizer rule, and nothing else. For a
principal P at host H wanting operation O on resource (T, N):
  1. a super user is allowed;
  2. the ACLs that apply to (T, N) are those of type T whose pattern is the literal N,
     the literal wildcard `*`, or a prefix of N (PREFIXED); if there is none at all (for
     any principal, host or operation), `allow_if_no_acl` decides;
  3. of those, an ACL matches when its principal is P or `User:*`, its host is H or
     `*`, and its operation is O or ALL; an ALLOW ACL of READ, WRITE, DELETE or ALTER
     also grants DESCRIBE, and one of ALTER_CONFIGS grants DESCRIBE_CONFIGS (a DENY
     ACL denies only its own operation, or ALL);
  4. a matching DENY wins over any ALLOW; else a matching ALLOW allows; else denied.

Filters (DescribeAcls, DeleteAcls) match bindings as Kafka's AclBindingFilter: a null
field matches anything, ANY matches any value, and the pattern type MATCH selects the
bindings that would apply to the named resource (step 2 above).

The numeric values of every enum are Kafka's wire values. This module does no I/O.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

WILDCARD = "*"  # a resource name or host that matches every one
WILDCARD_PRINCIPAL = "User:*"
CLUSTER_NAME = "kafka-cluster"  # the one name of the CLUSTER resource
ANONYMOUS = "User:ANONYMOUS"


class ResourceType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class Operation(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


class Permission(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


# Resource types an ACL may name here (Kafka also has DELEGATION_TOKEN and USER, which
# belong with delegation tokens and SCRAM credential management).
SERVED_TYPES = (ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER,
                ResourceType.TRANSACTIONAL_ID)
# Operations that an ALLOW ACL of them grants besides themselves.
_IMPLIES_DESCRIBE = frozenset({Operation.DESCRIBE, Operation.READ, Operation.WRITE,
                               Operation.DELETE, Operation.ALTER})
_IMPLIES_DESCRIBE_CONFIGS = frozenset({Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS})


class AclError(ValueError):
    """An ACL or filter that Kafka refuses with INVALID_REQUEST; the message says why."""


@dataclass(frozen=True, order=True)
class AclBinding:
    """One ACL: a resource pattern and an access control entry."""

    resource_type: ResourceType
    name: str
    pattern_type: PatternType  # LITERAL or PREFIXED
    principal: str  # "Type:name", e.g. "User:alice"; "User:*" is every principal
    host: str  # an IP address, or "*"
    operation: Operation
    permission: Permission  # ALLOW or DENY

    def to_json(self) -> dict[str, Any]:
        return {"resource_type": self.resource_type.name, "name": self.name,
                "pattern_type": self.pattern_type.name, "principal": self.principal,
                "host": self.host, "operation": self.operation.name,
                "permission": self.permission.name}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AclBinding:
        return cls(ResourceType[data["resource_type"]], str(data["name"]),
                   PatternType[data["pattern_type"]], str(data["principal"]),
                   str(data["host"]), Operation[data["operation"]],
                   Permission[data["permission"]])

    def applies_to(self, resource_type: ResourceType, name: str) -> bool:
        """Step 2: whether this ACL's pattern covers the resource (T, N)."""
        if self.resource_type != resource_type:
            return False
        if self.pattern_type == PatternType.PREFIXED:
            return name.startswith(self.name)
        return self.name == name or self.name == WILDCARD


def _enum(kind: type[enum.IntEnum], value: int, what: str) -> Any:
    try:
        return kind(value)
    except ValueError:
        raise AclError(f"Invalid {what} {value}") from None


def new_binding(resource_type: int, name: str | None, pattern_type: int, principal: str,
                host: str, operation: int, permission: int) -> AclBinding:
    """An ACL from a CreateAcls creation, checked as Kafka's AclControlManager and
    AclApis check one (AclError with Kafka's message otherwise)."""
    kind = _enum(ResourceType, resource_type, "resourceType")
    if kind in (ResourceType.UNKNOWN, ResourceType.ANY):
        raise AclError(f"Invalid resourceType {kind.name}")
    if kind not in SERVED_TYPES:
        raise AclError(f"ACLs on {kind.name} resources are not supported by compactlog "
                       "(TOPIC, GROUP, CLUSTER and TRANSACTIONAL_ID are)")
    pattern = _enum(PatternType, pattern_type, "patternType")
    if pattern not in (PatternType.LITERAL, PatternType.PREFIXED):
        raise AclError(f"Invalid patternType {pattern.name}")
    op = _enum(Operation, operation, "operation")
    if op in (Operation.UNKNOWN, Operation.ANY):
        raise AclError(f"Invalid operation {op.name}")
    perm = _enum(Permission, permission, "permissionType")
    if perm not in (Permission.ALLOW, Permission.DENY):
        raise AclError(f"Invalid permissionType {perm.name}")
    if not name:
        raise AclError("Resource name should not be empty")
    if kind == ResourceType.CLUSTER and name != CLUSTER_NAME:
        raise AclError(f"The only valid name for the CLUSTER resource is {CLUSTER_NAME}")
    if not principal:
        raise AclError("Invalid empty principal specified in ACL")
    check_principal(principal)
    if not host:
        raise AclError("Invalid empty host specified in ACL")
    return AclBinding(kind, name, pattern, principal, host, op, perm)


def check_principal(principal: str) -> None:
    """Kafka's SecurityUtils.parseKafkaPrincipal: "Type:name", both non-empty."""
    kind, sep, name = principal.partition(":")
    if not sep or not kind or not name:
        raise AclError(f"Could not parse principal from `{principal}` (no colon is found "
                       "between the principal type and name, or one of them is empty)")


@dataclass(frozen=True)
class AclFilter:
    """A DescribeAcls or DeleteAcls filter (Kafka's AclBindingFilter)."""

    resource_type: ResourceType
    name: str | None
    pattern_type: PatternType
    principal: str | None
    host: str | None
    operation: Operation
    permission: Permission

    @classmethod
    def of(cls, resource_type: int, name: str | None, pattern_type: int,
           principal: str | None, host: str | None, operation: int,
           permission: int) -> AclFilter:
        """AclError for a value Kafka does not know or a filter with UNKNOWN in it
        (Kafka: "The filter contained UNKNOWN elements")."""
        made = cls(_enum(ResourceType, resource_type, "resourceType"), name,
                   _enum(PatternType, pattern_type, "patternType"), principal, host,
                   _enum(Operation, operation, "operation"),
                   _enum(Permission, permission, "permissionType"))
        if (made.resource_type == ResourceType.UNKNOWN
                or made.pattern_type == PatternType.UNKNOWN
                or made.operation == Operation.UNKNOWN
                or made.permission == Permission.UNKNOWN):
            raise AclError("The filter contained UNKNOWN elements")
        return made

    def matches(self, acl: AclBinding) -> bool:
        return self._matches_pattern(acl) and self._matches_entry(acl)

    def _matches_pattern(self, acl: AclBinding) -> bool:
        if self.resource_type not in (ResourceType.ANY, acl.resource_type):
            return False
        if self.pattern_type not in (PatternType.ANY, PatternType.MATCH, acl.pattern_type):
            return False
        if self.name is None:
            return True
        if self.pattern_type in (PatternType.ANY, acl.pattern_type):
            return self.name == acl.name
        # MATCH: the bindings that would apply to the resource named.
        if acl.pattern_type == PatternType.PREFIXED:
            return self.name.startswith(acl.name)
        return self.name == acl.name or acl.name == WILDCARD

    def _matches_entry(self, acl: AclBinding) -> bool:
        return ((self.principal is None or self.principal == acl.principal)
                and (self.host is None or self.host == acl.host)
                and self.operation in (Operation.ANY, acl.operation)
                and self.permission in (Permission.ANY, acl.permission))


def _grants(acl: AclBinding, operation: Operation) -> bool:
    """Step 3's operation rule."""
    if acl.operation in (Operation.ALL, operation):
        return True
    if acl.permission != Permission.ALLOW:
        return False
    if operation == Operation.DESCRIBE:
        return acl.operation in _IMPLIES_DESCRIBE
    if operation == Operation.DESCRIBE_CONFIGS:
        return acl.operation in _IMPLIES_DESCRIBE_CONFIGS
    return False


def entry_matches(acl: AclBinding, principal: str, host: str) -> bool:
    return (acl.principal in (principal, WILDCARD_PRINCIPAL)
            and acl.host in (host, WILDCARD))


def decide(acls: Iterable[AclBinding], principal: str, host: str, operation: Operation,
           resource_type: ResourceType, name: str, super_users: frozenset[str],
           allow_if_no_acl: bool) -> bool:
    """Whether the request is allowed (the module doc's rule)."""
    if principal in super_users:
        return True
    found = allowed = False
    for acl in acls:
        if not acl.applies_to(resource_type, name):
            continue
        found = True
        if not entry_matches(acl, principal, host) or not _grants(acl, operation):
            continue
        if acl.permission == Permission.DENY:
            return False
        allowed = True
    if not found:
        return allow_if_no_acl
    return allowed


def decide_by_type(acls: Iterable[AclBinding], principal: str, host: str,
                   operation: Operation, resource_type: ResourceType,
                   super_users: frozenset[str], allow_if_no_acl: bool) -> bool:
    """Kafka's Authorizer.authorizeByResourceType: whether the principal may do
    `operation` on at least one resource of the type (InitProducerId of an idempotent
    producer: WRITE on some topic). First a check of a made-up name, which lets super
    users and `allow_if_no_acl` through; then an ALLOW ACL (operation or ALL, no
    implications) whose pattern no DENY ACL covers wholly: a literal allow is dominated
    by a literal deny of the same name or a prefixed deny that is a prefix of it; a
    prefixed allow by a prefixed deny that is a prefix of it; a DENY on the literal
    wildcard dominates everything."""
    if decide(acls, principal, host, operation, resource_type, "hardcode", super_users,
              allow_if_no_acl):
        return True
    denied: dict[PatternType, set[str]] = {PatternType.LITERAL: set(),
                                           PatternType.PREFIXED: set()}
    allowed: dict[PatternType, set[str]] = {PatternType.LITERAL: set(),
                                            PatternType.PREFIXED: set()}
    for acl in acls:
        if (acl.resource_type != resource_type or not entry_matches(acl, principal, host)
                or acl.operation not in (operation, Operation.ALL)):
            continue
        (denied if acl.permission == Permission.DENY else allowed)[acl.pattern_type].add(
            acl.name)
    if WILDCARD in denied[PatternType.LITERAL]:
        return False
    for name in allowed[PatternType.LITERAL]:
        if name in denied[PatternType.LITERAL]:
            continue
        if any(name.startswith(prefix) for prefix in denied[PatternType.PREFIXED]):
            continue
        return True
    for name in allowed[PatternType.PREFIXED]:
        if not any(name.startswith(prefix) for prefix in denied[PatternType.PREFIXED]):
            return True
    return False
