"""The authorizer's rule (server/security/acl_model.py) against a small independent
model, and the ACL store (server/security/authorizer.py): random ACL sets and requests
(hypothesis), then the cases Kafka documents one by one: DENY over ALLOW, literal,
prefixed and wildcard patterns, hosts, super users, the no-ACL default, the operations
that imply DESCRIBE and DESCRIBE_CONFIGS, filters with ANY and MATCH, and ACLs that
survive a reopen."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compactlog.server.security.acl_model import (
    SERVED_TYPES,
    AclBinding,
    AclError,
    AclFilter,
    Operation,
    PatternType,
    Permission,
    ResourceType,
    decide,
    decide_by_type,
    new_binding,
)
from compactlog.server.security.authorizer import AuthorizationConfig, Authorizer

L, P = PatternType.LITERAL, PatternType.PREFIXED
ALLOW, DENY = Permission.ALLOW, Permission.DENY
TOPIC, GROUP, CLUSTER = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER
OPS = [op for op in Operation if op not in (Operation.UNKNOWN, Operation.ANY)]
REQUEST_OPS = [op for op in OPS if op != Operation.ALL]
NAMES = ["a", "ab", "abc", "b", "ba", "*"]
PRINCIPALS = ["User:alice", "User:bob", "User:*"]
HOSTS = ["10.0.0.1", "10.0.0.2", "*"]


# -- the model ----------------------------------------------------------------------------

def model_covers(acl: AclBinding, kind: ResourceType, name: str) -> bool:
    if acl.resource_type != kind:
        return False
    if acl.pattern_type == P:
        return name[:len(acl.name)] == acl.name
    return acl.name in (name, "*")


def model_ops(acl: AclBinding) -> set[Operation]:
    if acl.operation == Operation.ALL:
        return set(OPS)
    ops = {acl.operation}
    if acl.permission == ALLOW:
        if acl.operation in (Operation.READ, Operation.WRITE, Operation.DELETE,
                             Operation.ALTER):
            ops.add(Operation.DESCRIBE)
        if acl.operation == Operation.ALTER_CONFIGS:
            ops.add(Operation.DESCRIBE_CONFIGS)
    return ops


def model(acls: list[AclBinding], principal: str, host: str, op: Operation,
          kind: ResourceType, name: str, supers: frozenset[str], default: bool) -> bool:
    if principal in supers:
        return True
    covering = [a for a in acls if model_covers(a, kind, name)]
    if not covering:
        return default
    hits = [a for a in covering if a.principal in (principal, "User:*")
            and a.host in (host, "*") and op in model_ops(a)]
    if any(a.permission == DENY for a in hits):
        return False
    return any(a.permission == ALLOW for a in hits)


bindings = st.builds(
    AclBinding, st.sampled_from([TOPIC, GROUP]), st.sampled_from(NAMES),
    st.sampled_from([L, P]), st.sampled_from(PRINCIPALS), st.sampled_from(HOSTS),
    st.sampled_from(OPS), st.sampled_from([ALLOW, DENY]))


@settings(max_examples=400, deadline=None)
@given(acls=st.lists(bindings, max_size=8),
       principal=st.sampled_from(["User:alice", "User:bob"]),
       host=st.sampled_from(["10.0.0.1", "10.0.0.2"]),
       op=st.sampled_from(REQUEST_OPS), kind=st.sampled_from([TOPIC, GROUP]),
       name=st.sampled_from(["a", "ab", "abc", "b", "c"]),
       supers=st.frozensets(st.sampled_from(["User:alice", "User:carol"]), max_size=1),
       default=st.booleans())
def test_the_rule_agrees_with_the_model(
        acls: list[AclBinding], principal: str, host: str, op: Operation,
        kind: ResourceType, name: str, supers: frozenset[str], default: bool) -> None:
    assert decide(acls, principal, host, op, kind, name, supers, default) == model(
        acls, principal, host, op, kind, name, supers, default)


@settings(max_examples=300, deadline=None)
@given(acls=st.lists(bindings, max_size=8), kind=st.sampled_from([TOPIC, GROUP]),
       name=st.sampled_from(["a", "ab", "abc", "b", "c"]))
def test_a_match_filter_finds_the_acls_that_apply(
        acls: list[AclBinding], kind: ResourceType, name: str) -> None:
    match = AclFilter(kind, name, PatternType.MATCH, None, None, Operation.ANY,
                      Permission.ANY)
    assert [a for a in acls if match.matches(a)] == [
        a for a in acls if model_covers(a, kind, name)]


@settings(max_examples=300, deadline=None)
@given(acls=st.lists(bindings, min_size=1, max_size=8), data=st.data())
def test_an_any_filter_is_exact_on_every_field_it_names(
        acls: list[AclBinding], data: st.DataObject) -> None:
    target = data.draw(st.sampled_from(acls))
    exact = AclFilter(target.resource_type, target.name, target.pattern_type,
                      target.principal, target.host, target.operation, target.permission)
    assert {a for a in acls if exact.matches(a)} == {target}
    # ANY pattern type: that name, literal or prefixed (never by prefix matching).
    any_pattern = AclFilter(ResourceType.ANY, target.name, PatternType.ANY, None, None,
                            Operation.ANY, Permission.ANY)
    assert {a for a in acls if any_pattern.matches(a)} == {
        a for a in acls if a.name == target.name}
    everything = AclFilter(ResourceType.ANY, None, PatternType.ANY, None, None,
                           Operation.ANY, Permission.ANY)
    assert all(everything.matches(a) for a in acls)


# -- Kafka's documented cases ---------------------------------------------------------------

def acl(name: str, op: Operation, permission: Permission = ALLOW, pattern: PatternType = L,
        principal: str = "User:alice", host: str = "*",
        kind: ResourceType = TOPIC) -> AclBinding:
    return AclBinding(kind, name, pattern, principal, host, op, permission)


def allowed(acls: list[AclBinding], op: Operation, name: str, principal: str = "User:alice",
            host: str = "10.0.0.1", kind: ResourceType = TOPIC,
            supers: frozenset[str] = frozenset(), default: bool = False) -> bool:
    return decide(acls, principal, host, op, kind, name, supers, default)


def test_deny_wins_over_allow() -> None:
    acls = [acl("t", Operation.READ), acl("t", Operation.READ, DENY, principal="User:*")]
    assert not allowed(acls, Operation.READ, "t")
    acls = [acl("t", Operation.ALL), acl("t", Operation.WRITE, DENY, P)]
    assert allowed(acls, Operation.READ, "t")
    assert not allowed(acls, Operation.WRITE, "t")


def test_literal_prefixed_and_wildcard_patterns() -> None:
    assert allowed([acl("orders", Operation.READ)], Operation.READ, "orders")
    assert not allowed([acl("orders", Operation.READ)], Operation.READ, "orders-eu")
    assert allowed([acl("orders", Operation.READ, pattern=P)], Operation.READ, "orders-eu")
    assert not allowed([acl("orders-", Operation.READ, pattern=P)], Operation.READ, "order")
    assert allowed([acl("*", Operation.READ)], Operation.READ, "anything")
    # A prefixed "*" is a prefix, not a wildcard.
    assert not allowed([acl("*", Operation.READ, pattern=P)], Operation.READ, "anything")


def test_principals_and_hosts() -> None:
    assert not allowed([acl("t", Operation.READ)], Operation.READ, "t", principal="User:bob")
    assert allowed([acl("t", Operation.READ, principal="User:*")], Operation.READ, "t",
                   principal="User:bob")
    assert allowed([acl("t", Operation.READ, host="10.0.0.1")], Operation.READ, "t")
    assert not allowed([acl("t", Operation.READ, host="10.0.0.1")], Operation.READ, "t",
                       host="10.0.0.2")


def test_implied_operations_only_from_allow() -> None:
    for op in (Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER):
        assert allowed([acl("t", op)], Operation.DESCRIBE, "t")
    assert not allowed([acl("t", Operation.CREATE)], Operation.DESCRIBE, "t")
    assert allowed([acl("t", Operation.ALTER_CONFIGS)], Operation.DESCRIBE_CONFIGS, "t")
    assert not allowed([acl("t", Operation.DESCRIBE_CONFIGS)], Operation.ALTER_CONFIGS, "t")
    # A DENY of READ does not deny DESCRIBE (Kafka's StandardAuthorizerData).
    acls = [acl("t", Operation.DESCRIBE), acl("t", Operation.READ, DENY)]
    assert allowed(acls, Operation.DESCRIBE, "t")
    assert not allowed(acls, Operation.READ, "t")


def test_super_users_and_the_no_acl_default() -> None:
    deny_all = [acl("t", Operation.ALL, DENY, principal="User:*")]
    assert allowed(deny_all, Operation.READ, "t", supers=frozenset({"User:alice"}))
    assert not allowed([], Operation.READ, "t")
    assert allowed([], Operation.READ, "t", default=True)
    # Any ACL on the resource, for anyone, turns the default off.
    assert not allowed([acl("t", Operation.READ, principal="User:bob")], Operation.READ, "t",
                       default=True)
    assert allowed([acl("u", Operation.READ, principal="User:bob")], Operation.READ, "t",
                   default=True)


def test_by_resource_type() -> None:
    def by_type(acls: list[AclBinding], default: bool = False) -> bool:
        return decide_by_type(acls, "User:alice", "10.0.0.1", Operation.WRITE, TOPIC,
                              frozenset(), default)

    assert by_type([acl("t", Operation.WRITE)])
    assert by_type([acl("t", Operation.ALL)])
    assert not by_type([acl("t", Operation.READ)])
    assert not by_type([acl("t", Operation.WRITE), acl("t", Operation.WRITE, DENY)])
    assert not by_type([acl("t", Operation.WRITE), acl("*", Operation.WRITE, DENY)])
    assert not by_type([acl("tx", Operation.WRITE), acl("t", Operation.WRITE, DENY, P)])
    assert by_type([acl("tx", Operation.WRITE, pattern=P), acl("t", Operation.WRITE, DENY)])
    assert by_type([], default=True)
    assert not by_type([])


def test_new_acls_are_checked_as_kafka_checks_them() -> None:
    good = new_binding(2, "t", 3, "User:alice", "*", 3, 3)
    assert good == acl("t", Operation.READ)
    for args, message in [
        ((1, "t", 3, "User:a", "*", 3, 3), "Invalid resourceType ANY"),
        ((2, "t", 2, "User:a", "*", 3, 3), "Invalid patternType MATCH"),
        ((2, "t", 3, "User:a", "*", 1, 3), "Invalid operation ANY"),
        ((2, "t", 3, "User:a", "*", 3, 1), "Invalid permissionType ANY"),
        ((2, "", 3, "User:a", "*", 3, 3), "Resource name should not be empty"),
        ((4, "c", 3, "User:a", "*", 3, 3), "kafka-cluster"),
        ((2, "t", 3, "alice", "*", 3, 3), "Could not parse principal"),
        ((2, "t", 3, "User:a", "*", 99, 3), "Invalid operation 99"),
        ((7, "t", 3, "User:a", "*", 3, 3), "not supported"),
    ]:
        with pytest.raises(AclError, match=message):
            new_binding(*args)
    assert set(SERVED_TYPES) == {TOPIC, GROUP, CLUSTER, ResourceType.TRANSACTIONAL_ID}
    with pytest.raises(AclError, match="UNKNOWN"):
        AclFilter.of(0, None, 1, None, None, 1, 1)


def test_acls_are_durable_and_changes_are_exact(tmp_path: Path) -> None:
    config = AuthorizationConfig(enabled=True)
    first = Authorizer(tmp_path, config)
    read, write = acl("t", Operation.READ), acl("t", Operation.WRITE, pattern=P)
    first.create([read, write])
    first.create([read])  # already there: no change
    assert first.acls == (read, write) or set(first.acls) == {read, write}
    again = Authorizer(tmp_path, config)
    assert set(again.acls) == {read, write}
    assert again.authorize("User:alice", "10.0.0.1", Operation.READ, TOPIC, "t")
    removed = again.delete([AclFilter(TOPIC, "t", PatternType.MATCH, None, None,
                                      Operation.WRITE, Permission.ANY)])
    assert removed == [[write]]
    assert set(Authorizer(tmp_path, config).acls) == {read}
    assert not Authorizer(tmp_path, config).authorize(
        "User:alice", "10.0.0.1", Operation.WRITE, TOPIC, "tx")


def test_off_allows_everything(tmp_path: Path) -> None:
    authorizer = Authorizer(tmp_path, AuthorizationConfig())
    authorizer.create([acl("t", Operation.ALL, DENY, principal="User:*")])
    assert authorizer.authorize("User:alice", "h", Operation.READ, TOPIC, "t")
    assert authorizer.authorize_by_type("User:alice", "h", Operation.WRITE, TOPIC)


def test_a_change_by_another_process_is_picked_up_by_refresh(tmp_path: Path) -> None:
    config = AuthorizationConfig(enabled=True)
    server, cli = Authorizer(tmp_path, config), Authorizer(tmp_path, config)
    assert not server.refresh()  # nothing committed yet, nothing changed
    cli.create([acl("t", Operation.READ)])
    assert not server.authorize("User:alice", "h", Operation.READ, TOPIC, "t")
    assert server.refresh()
    assert server.authorize("User:alice", "h", Operation.READ, TOPIC, "t")
    assert not server.refresh()
    # A change made by the server starts from the other process' version.
    cli.create([acl("u", Operation.READ)])
    server.create([acl("v", Operation.READ)])
    assert {a.name for a in Authorizer(tmp_path, config).acls} == {"t", "u", "v"}


@settings(max_examples=300, deadline=None)
@given(kind=st.integers(-128, 127), name=st.one_of(st.none(), st.text(max_size=5)),
       pattern=st.integers(-128, 127), principal=st.text(max_size=8),
       host=st.text(max_size=4), op=st.integers(-128, 127),
       permission=st.integers(-128, 127))
def test_any_creation_is_an_acl_or_a_clear_refusal(
        kind: int, name: str | None, pattern: int, principal: str, host: str, op: int,
        permission: int) -> None:
    try:
        made = new_binding(kind, name, pattern, principal, host, op, permission)
    except AclError as error:
        assert str(error)
        return
    assert made.resource_type in SERVED_TYPES and made.name and made.host
    assert made.pattern_type in (L, P) and made.permission in (ALLOW, DENY)
    assert AclBinding.from_json(made.to_json()) == made
