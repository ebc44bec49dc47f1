"""DescribeAcls, CreateAcls and DeleteAcls (v1-v3), as Kafka's AclApis answers them.

Invariant: an answer says what the ACL store holds or did. CreateAcls and DeleteAcls
commit their change (server/security/authorizer.py) before answering, so an ACL reported as
created or deleted is durably so; a creation Kafka would refuse (an unknown or
ANY/UNKNOWN value, an empty name, a CLUSTER resource not named `kafka-cluster`, a
principal not of the form `Type:name`) gets INVALID_REQUEST with Kafka's message and is
not stored, and the valid ones of the same request still are.

Authorization as in Kafka: DescribeAcls needs DESCRIBE on the cluster, CreateAcls and
DeleteAcls ALTER on it; otherwise CLUSTER_AUTHORIZATION_FAILED (for each creation or
filter). With the authorizer off all three answer SECURITY_DISABLED ("No Authorizer is
configured"), as Kafka does.
"""

from __future__ import annotations

import logging
from typing import Any

from kio.schema.errors import ErrorCode

from compactlog.server.broker import Broker
from compactlog.server.protocol.error_codes import error_code, error_message
from compactlog.server.protocol.messages import Request
from compactlog.server.security import access
from compactlog.server.security.acl_model import (
    AclBinding,
    AclError,
    AclFilter,
    Operation,
    new_binding,
)

DESCRIBE_ACLS, CREATE_ACLS, DELETE_ACLS = 29, 30, 31
NO_AUTHORIZER = "No Authorizer is configured."  # Kafka's message
log = logging.getLogger("compactlog.server")


def register(broker: Broker) -> None:
    # v0 was removed in Kafka 4 (KIP-896); kio has v1-v3.
    broker.register(DESCRIBE_ACLS, (1, 3), describe_acls)
    broker.register(CREATE_ACLS, (1, 3), create_acls)
    broker.register(DELETE_ACLS, (1, 3), delete_acls)


def _refusal(broker: Broker, request: Request,
             operation: Operation) -> tuple[ErrorCode, str] | None:
    if not broker.authorizer.enabled:
        return ErrorCode.security_disabled, NO_AUTHORIZER
    if not access.cluster(broker, request, operation):
        return access.CLUSTER_DENIED, access.CLUSTER_MESSAGE
    return None


def _filter(item: Any, name_field: str = "resource_name_filter") -> AclFilter:
    return AclFilter.of(item.resource_type_filter, getattr(item, name_field),
                        item.pattern_type_filter, item.principal_filter, item.host_filter,
                        item.operation, item.permission_type)


async def describe_acls(broker: Broker, request: Request) -> dict[str, Any]:
    refused = _refusal(broker, request, Operation.DESCRIBE)
    if refused is not None:
        return {"error_code": refused[0], "error_message": refused[1], "resources": []}
    try:
        acl_filter = _filter(request.body)
    except AclError as error:
        return {"error_code": ErrorCode.invalid_request, "error_message": str(error),
                "resources": []}
    return {"error_code": ErrorCode.none, "error_message": None,
            "resources": _by_resource(broker.authorizer.describe(acl_filter))}


def _by_resource(acls: list[AclBinding]) -> list[dict[str, Any]]:
    """Bindings grouped by resource pattern, as DescribeAclsResponse carries them."""
    grouped: dict[tuple[int, str, int], list[dict[str, Any]]] = {}
    for acl in sorted(acls):
        key = (int(acl.resource_type), acl.name, int(acl.pattern_type))
        grouped.setdefault(key, []).append({
            "principal": acl.principal, "host": acl.host, "operation": int(acl.operation),
            "permission_type": int(acl.permission)})
    return [{"resource_type": kind, "resource_name": name, "pattern_type": pattern,
             "acls": entries} for (kind, name, pattern), entries in grouped.items()]


async def create_acls(broker: Broker, request: Request) -> dict[str, Any]:
    creations = list(request.body.creations)
    refused = _refusal(broker, request, Operation.ALTER)
    if refused is not None:
        return {"results": [{"error_code": refused[0], "error_message": refused[1]}
                            for _ in creations]}
    results: list[dict[str, Any]] = []
    valid: list[AclBinding] = []
    for creation in creations:
        try:
            valid.append(new_binding(
                creation.resource_type, creation.resource_name,
                creation.resource_pattern_type, creation.principal, creation.host,
                creation.operation, creation.permission_type))
            results.append({"error_code": ErrorCode.none, "error_message": None})
        except AclError as error:
            results.append({"error_code": ErrorCode.invalid_request,
                            "error_message": str(error)})
    if valid:
        try:
            await broker.run_io(broker.authorizer.create, valid)
            log.info("%s created %d ACL(s): %s", request.principal, len(valid),
                     "; ".join(_text(acl) for acl in valid))
        except Exception as error:
            log.warning("CreateAcls from %s failed: %s", request.principal, error)
            failed = {"error_code": error_code(error), "error_message": error_message(error)}
            results = [failed if r["error_code"] is ErrorCode.none else r for r in results]
    return {"results": results}


async def delete_acls(broker: Broker, request: Request) -> dict[str, Any]:
    items = list(request.body.filters)
    refused = _refusal(broker, request, Operation.ALTER)
    if refused is not None:
        return {"filter_results": [{"error_code": refused[0], "error_message": refused[1],
                                    "matching_acls": []} for _ in items]}
    filters: list[AclFilter | AclError] = []
    for item in items:
        try:
            filters.append(_filter(item))
        except AclError as error:
            filters.append(error)
    valid = [f for f in filters if isinstance(f, AclFilter)]
    try:
        removed = iter(await broker.run_io(broker.authorizer.delete, valid))
    except Exception as error:
        log.warning("DeleteAcls from %s failed: %s", request.principal, error)
        return {"filter_results": [{"error_code": error_code(error),
                                    "error_message": error_message(error),
                                    "matching_acls": []} for _ in items]}
    results = []
    for acl_filter in filters:
        if isinstance(acl_filter, AclError):
            results.append({"error_code": ErrorCode.invalid_request,
                            "error_message": str(acl_filter), "matching_acls": []})
            continue
        matched = next(removed)
        if matched:
            log.info("%s deleted %d ACL(s): %s", request.principal, len(matched),
                     "; ".join(_text(acl) for acl in matched))
        results.append({"error_code": ErrorCode.none, "error_message": None,
                        "matching_acls": [
                            {"error_code": ErrorCode.none, "error_message": None,
                             "resource_type": int(acl.resource_type),
                             "resource_name": acl.name, "pattern_type": int(acl.pattern_type),
                             "principal": acl.principal, "host": acl.host,
                             "operation": int(acl.operation),
                             "permission_type": int(acl.permission)}
                            for acl in matched]})
    return {"filter_results": results}


def _text(acl: AclBinding) -> str:
    return (f"{acl.permission.name} {acl.principal}@{acl.host} {acl.operation.name} on "
            f"{acl.resource_type.name} {acl.pattern_type.name} {acl.name!r}")
