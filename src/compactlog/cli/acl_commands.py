"""`compactlog acls add/list/delete`: the ACLs of a data directory, as an operator.

Invariant: ACLs are written only through the authorizer's commit (server/security/authorizer.py:
compare-and-swap of `<data>/acls/current.json`), which is safe beside a running server:
the server reads the document again in its upkeep, so a change made here is in force
within `upkeep_interval_s`, whatever its listeners. Each ACL is checked as CreateAcls
checks it (server/security/acl_model.py), and filters mean what DescribeAcls/DeleteAcls
filters mean.
This is how the first ACLs (or super users' peers) are made before any client may.
"""

from __future__ import annotations

import click

from compactlog.cli import Context
from compactlog.errors import UserError
from compactlog.server.security.acl_model import (
    CLUSTER_NAME,
    AclBinding,
    AclError,
    AclFilter,
    Operation,
    PatternType,
    Permission,
    ResourceType,
    new_binding,
)
from compactlog.server.security.authorizer import ACL_DIR, AuthorizationConfig, Authorizer

OPERATIONS = [op.name for op in Operation if op not in (Operation.UNKNOWN, Operation.ANY)]


def _resource(topic: str | None, group: str | None, cluster: bool,
              transactional_id: str | None) -> tuple[ResourceType, str] | None:
    chosen = [(kind, name) for kind, name in (
        (ResourceType.TOPIC, topic), (ResourceType.GROUP, group),
        (ResourceType.CLUSTER, CLUSTER_NAME if cluster else None),
        (ResourceType.TRANSACTIONAL_ID, transactional_id)) if name is not None]
    if len(chosen) > 1:
        raise UserError("name one resource: --topic, --group, --cluster or "
                        "--transactional-id")
    return chosen[0] if chosen else None


def _resource_options(function: click.decorators.FC) -> click.decorators.FC:
    for option in reversed([
        click.option("--topic", default=None, help="A topic name (or prefix, or *)."),
        click.option("--group", default=None, help="A consumer group id (or prefix, or *)."),
        click.option("--cluster", is_flag=True, help="The cluster (kafka-cluster)."),
        click.option("--transactional-id", default=None,
                     help="A transactional id (or prefix, or *)."),
    ]):
        function = option(function)
    return function


def _text(acl: AclBinding) -> str:
    return "\t".join((acl.permission.name, acl.principal, acl.host, acl.operation.name,
                      acl.resource_type.name, acl.pattern_type.name, acl.name))


@click.group()
def acls() -> None:
    """Manage the server's ACLs (docs/server.md, "Authorization").

    They are checked when the server's config has `[authorization] enabled = true`.
    Kafka clients manage the same ACLs with CreateAcls, DescribeAcls and DeleteAcls.

    \b
    Examples:
      compactlog acls add --principal User:alice --operation READ --topic orders- --prefixed
      compactlog acls add --principal User:alice --operation READ --group orders-app
      compactlog acls add --principal User:bob --operation ALL --topic secret --deny
      compactlog acls list --topic orders-eu
      compactlog acls delete --principal User:bob
    """


@acls.command()
@click.option("--principal", required=True, help="Who: Type:name, e.g. User:alice; User:* "
              "is everyone.")
@click.option("--operation", "operations", multiple=True, required=True,
              type=click.Choice(OPERATIONS, case_sensitive=False),
              help="What (repeat for more).")
@_resource_options
@click.option("--prefixed", is_flag=True, help="The name is a prefix (PREFIXED pattern).")
@click.option("--deny", is_flag=True, help="A DENY ACL (default ALLOW).")
@click.option("--host", default="*", show_default=True, help="The client IP it applies to.")
@click.pass_obj
def add(ctx: Context, principal: str, operations: tuple[str, ...], topic: str | None,
        group: str | None, cluster: bool, transactional_id: str | None, prefixed: bool,
        deny: bool, host: str) -> None:
    """Add ACLs: one per operation, on one resource.

    \b
    Examples:
      compactlog acls add --principal User:admin --operation ALL --cluster
      compactlog acls add --principal User:app --operation WRITE --operation READ \\
          --topic prices
    """
    resource = _resource(topic, group, cluster, transactional_id)
    if resource is None:
        raise UserError("name the resource: --topic, --group, --cluster or "
                        "--transactional-id")
    kind, name = resource
    pattern = PatternType.PREFIXED if prefixed else PatternType.LITERAL
    permission = Permission.DENY if deny else Permission.ALLOW
    try:
        made = [new_binding(kind, name, pattern, principal, host, Operation[op.upper()],
                            permission) for op in operations]
    except AclError as error:
        raise UserError(str(error)) from None
    Authorizer(ctx.state_document(ACL_DIR), AuthorizationConfig()).create(made)
    for acl in made:
        click.echo(f"added\t{_text(acl)}")


def _filter(principal: str | None, operation: str | None, topic: str | None,
            group: str | None, cluster: bool, transactional_id: str | None) -> AclFilter:
    resource = _resource(topic, group, cluster, transactional_id)
    kind, name = resource if resource is not None else (ResourceType.ANY, None)
    return AclFilter(kind, name, PatternType.MATCH if name is not None else PatternType.ANY,
                     principal, None,
                     Operation[operation.upper()] if operation else Operation.ANY,
                     Permission.ANY)


@acls.command(name="list")
@click.option("--principal", default=None, help="Only this principal's ACLs.")
@click.option("--operation", default=None, type=click.Choice(OPERATIONS, case_sensitive=False),
              help="Only ACLs of this operation.")
@_resource_options
@click.pass_obj
def list_acls(ctx: Context, principal: str | None, operation: str | None,
              topic: str | None, group: str | None, cluster: bool,
              transactional_id: str | None) -> None:
    """List ACLs; a resource named lists those that apply to it (literal, * and
    prefixes: the MATCH filter).

    \b
    Examples:
      compactlog acls list
      compactlog acls list --topic orders-eu --principal User:alice
    """
    found = Authorizer(ctx.state_document(ACL_DIR), AuthorizationConfig()).describe(
        _filter(principal, operation, topic, group, cluster, transactional_id))
    if not found:
        click.echo("no ACLs")
    for acl in found:
        click.echo(_text(acl))


@acls.command()
@click.option("--principal", default=None, help="Only this principal's ACLs.")
@click.option("--operation", default=None, type=click.Choice(OPERATIONS, case_sensitive=False),
              help="Only ACLs of this operation.")
@_resource_options
@click.option("--all", "everything", is_flag=True, help="Allow a filter that matches "
              "every ACL.")
@click.pass_obj
def delete(ctx: Context, principal: str | None, operation: str | None, topic: str | None,
           group: str | None, cluster: bool, transactional_id: str | None,
           everything: bool) -> None:
    """Delete the ACLs a filter matches (a resource named: those that apply to it).

    \b
    Examples:
      compactlog acls delete --principal User:bob
      compactlog acls delete --topic orders --operation WRITE
    """
    acl_filter = _filter(principal, operation, topic, group, cluster, transactional_id)
    if acl_filter == _filter(None, None, None, None, False, None) and not everything:
        raise UserError("this would delete every ACL; add --all to mean it")
    (removed,) = Authorizer(ctx.state_document(ACL_DIR), AuthorizationConfig()).delete([acl_filter])
    if not removed:
        click.echo("no ACLs matched")
    for acl in removed:
        click.echo(f"deleted\t{_text(acl)}")
