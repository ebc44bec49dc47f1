"""SaslHandshake and SaslAuthenticate once a connection is past authentication, and the
SCRAM credential APIs: DescribeUserScramCredentials and AlterUserScramCredentials (v0).

Invariants:
- The SASL exchange itself is the connection's (server/security/connection_security.py):
  it runs before any request reaches this table. A SaslHandshake or SaslAuthenticate
  that gets here came after authentication, or on a listener without SASL, and is
  answered as Kafka's KafkaApis answers it: ILLEGAL_SASL_STATE (no re-authentication).
- AlterUserScramCredentials stores keys, never a password: the request carries a salted
  password, from which the stored and server keys are derived and the salted password
  dropped. A request's changes for one user are committed together; each user's result
  says what happened to it, with Kafka's error codes.
- With the authorizer on, DescribeUserScramCredentials needs DESCRIBE on the cluster
  and AlterUserScramCredentials ALTER on it, as in Kafka (CLUSTER_AUTHORIZATION_FAILED).
  With it off, credentials can be changed only by an authenticated principal, never by
  User:ANONYMOUS (a plaintext client).
"""

from __future__ import annotations

import datetime
from collections import Counter
from typing import Any

from kio.schema.errors import ErrorCode

from compactlog.errors import UserError
from compactlog.server.broker import Broker
from compactlog.server.protocol.messages import Request
from compactlog.server.security import access
from compactlog.server.security.acl_model import Operation
from compactlog.server.security.credentials import (
    MAX_ITERATIONS,
    MECHANISM_CODES,
    MIN_ITERATIONS,
    credential_from_salted,
    valid_user_name,
)

SASL_HANDSHAKE, SASL_AUTHENTICATE = 17, 36
DESCRIBE_USER_SCRAM_CREDENTIALS, ALTER_USER_SCRAM_CREDENTIALS = 50, 51
ANONYMOUS = "User:ANONYMOUS"
_CODE_OF = {name: code for code, name in MECHANISM_CODES.items()}


def register(broker: Broker) -> None:
    broker.register(SASL_HANDSHAKE, (0, 1), sasl_handshake)
    broker.register(SASL_AUTHENTICATE, (0, 2), sasl_authenticate)
    broker.register(DESCRIBE_USER_SCRAM_CREDENTIALS, (0, 0), describe_user_scram_credentials)
    broker.register(ALTER_USER_SCRAM_CREDENTIALS, (0, 0), alter_user_scram_credentials)


async def sasl_handshake(broker: Broker, request: Request) -> dict[str, Any]:
    return {"error_code": ErrorCode.illegal_sasl_state, "mechanisms": []}


async def sasl_authenticate(broker: Broker, request: Request) -> dict[str, Any]:
    return {"error_code": ErrorCode.illegal_sasl_state,
            "error_message": "SaslAuthenticate request received after successful "
                             "authentication, or on a listener without SASL",
            "auth_bytes": b"", "session_lifetime": datetime.timedelta(0)}


async def describe_user_scram_credentials(broker: Broker,
                                          request: Request) -> dict[str, Any]:
    if not access.cluster(broker, request, Operation.DESCRIBE):
        return {"throttle_time": datetime.timedelta(0), "error_code": access.CLUSTER_DENIED,
                "error_message": access.CLUSTER_MESSAGE, "results": []}
    users = await broker.run_io(broker.credentials.users)
    wanted = None if request.body.users is None else [u.name for u in request.body.users]
    results: list[dict[str, Any]] = []
    if wanted is None or not wanted:  # null or empty: every user, as in Kafka
        wanted_names = sorted(users)
        duplicates: Counter[str] = Counter()
    else:
        wanted_names = list(dict.fromkeys(wanted))
        duplicates = Counter(wanted)
    for name in wanted_names:
        if duplicates[name] > 1:
            results.append({"user": name, "error_code": ErrorCode.duplicate_resource,
                            "error_message": f"Cannot describe SCRAM credentials for the "
                                             f"same user twice in a single request: {name}",
                            "credential_infos": []})
        elif name not in users:
            results.append({"user": name, "error_code": ErrorCode.resource_not_found,
                            "error_message": f"Attempt to describe a user credential that "
                                             f"does not exist: {name}",
                            "credential_infos": []})
        else:
            results.append({"user": name, "error_code": ErrorCode.none, "error_message": None,
                            "credential_infos": [
                                {"mechanism": _CODE_OF[mech], "iterations": cred.iterations}
                                for mech, cred in sorted(users[name].items())]})
    return {"throttle_time": datetime.timedelta(0), "error_code": ErrorCode.none,
            "error_message": None, "results": results}


def _refusal(broker: Broker, request: Request) -> tuple[ErrorCode, str] | None:
    if broker.authorizer.enabled:
        if not access.cluster(broker, request, Operation.ALTER):
            return access.CLUSTER_DENIED, access.CLUSTER_MESSAGE
        return None
    if request.principal == ANONYMOUS:
        return (ErrorCode.cluster_authorization_failed,
                "changing SCRAM credentials needs an authenticated principal")
    return None


async def alter_user_scram_credentials(broker: Broker, request: Request) -> dict[str, Any]:
    body = request.body
    errors: dict[str, tuple[ErrorCode, str]] = {}
    seen: Counter[tuple[str, int]] = Counter(
        [(d.name, int(d.mechanism)) for d in body.deletions]
        + [(u.name, int(u.mechanism)) for u in body.upsertions])
    names = list(dict.fromkeys([d.name for d in body.deletions]
                               + [u.name for u in body.upsertions]))
    refused = _refusal(broker, request)
    for name in names:
        if refused is not None:
            errors[name] = refused
        elif not name:
            errors[name] = (ErrorCode.unacceptable_credential, "Username must not be empty")
        elif not valid_user_name(name):
            # What `compactlog users add` refuses: a name that would be logged on every
            # login must not carry control characters (or be a page long).
            errors[name] = (ErrorCode.unacceptable_credential,
                            "Username must be 1 to 255 characters, none of them a control "
                            "character")
    for (name, mechanism), count in seen.items():
        if name in errors:
            continue
        if mechanism not in MECHANISM_CODES:
            errors[name] = (ErrorCode.unsupported_sasl_mechanism,
                            f"Unknown SCRAM mechanism {mechanism}")
        elif count > 1:
            errors[name] = (ErrorCode.duplicate_resource,
                            f"A user credential cannot be altered twice in the same "
                            f"request: {name}")
    for upsertion in body.upsertions:
        if upsertion.name in errors:
            continue
        if not MIN_ITERATIONS <= upsertion.iterations <= MAX_ITERATIONS:
            errors[upsertion.name] = (
                ErrorCode.unacceptable_credential,
                f"Iterations {upsertion.iterations} is not in [{MIN_ITERATIONS}, "
                f"{MAX_ITERATIONS}]")
        elif not upsertion.salt or not upsertion.salted_password:
            errors[upsertion.name] = (ErrorCode.unacceptable_credential,
                                      "Salt and salted password must not be empty")
    await broker.run_io(_apply, broker, body, errors)
    return {"throttle_time": datetime.timedelta(0), "results": [
        {"user": name, "error_code": errors[name][0] if name in errors else ErrorCode.none,
         "error_message": errors[name][1] if name in errors else None}
        for name in names]}


def _apply(broker: Broker, body: Any, errors: dict[str, tuple[ErrorCode, str]]) -> None:
    """Commit every valid change in one commit; a deletion of a credential that does
    not exist fails its user's changes (RESOURCE_NOT_FOUND), as in Kafka."""
    def edit(users: dict[str, Any]) -> None:
        for deletion in body.deletions:
            name = deletion.name
            if name in errors:
                continue
            mechanism = MECHANISM_CODES[int(deletion.mechanism)]
            if mechanism not in users.get(name, {}):
                errors[name] = (ErrorCode.resource_not_found,
                                f"Attempt to delete a user credential that does not "
                                f"exist: {name} {mechanism}")
        for deletion in body.deletions:
            if deletion.name not in errors:
                creds = users[deletion.name]
                del creds[MECHANISM_CODES[int(deletion.mechanism)]]
                if not creds:
                    del users[deletion.name]
        for upsertion in body.upsertions:
            if upsertion.name in errors:
                continue
            mechanism = MECHANISM_CODES[int(upsertion.mechanism)]
            users.setdefault(upsertion.name, {})[mechanism] = credential_from_salted(
                mechanism, bytes(upsertion.salt), int(upsertion.iterations),
                bytes(upsertion.salted_password))

    if not any(name not in errors for name in
               [d.name for d in body.deletions] + [u.name for u in body.upsertions]):
        return
    try:
        broker.credentials.change(edit)
        if broker.sasl_users is not None:
            broker.sasl_users.refresh()  # the next login sees the change
    except UserError as error:
        for name in [d.name for d in body.deletions] + [u.name for u in body.upsertions]:
            errors.setdefault(name, (ErrorCode.unacceptable_credential, str(error)))
