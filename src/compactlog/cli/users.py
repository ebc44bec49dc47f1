"""`compactlog users add/list/delete`: SASL/SCRAM users of a data directory.

Invariant: the credentials are written only through the credential store's commit
(server/security/credentials.py), a compare-and-swap that is safe beside a running server: the
server reads the document again when it changes, so a user added here can log in at
once and a deleted one no longer can, with or without a server running, and whatever
listeners (even SASL-only ones) that server has. The password never reaches the disk,
a log or the command line (it is prompted for, or read from stdin).
"""

from __future__ import annotations

import sys

import click

from compactlog.cli import Context
from compactlog.errors import UserError
from compactlog.server.security.credentials import (
    DEFAULT_ITERATIONS,
    DIRECTORY,
    MECHANISMS,
    CredentialStore,
    check_iterations,
    make_credential,
)


@click.group()
def users() -> None:
    """Manage the SASL users (SCRAM-SHA-256, SCRAM-SHA-512 and PLAIN) of the server.

    Credentials are stored salted (never the password) in <data dir>/security/scram
    (for s3://, in the bucket).
    A PLAIN login is checked against the same credentials.

    \b
    Examples:
      compactlog users add alice                      # prompts for the password
      printf '%s' "$PASSWORD" | compactlog users add alice --password-stdin
      compactlog users list
      compactlog users delete alice
    """


@users.command()
@click.argument("name")
@click.option("--mechanism", "mechanisms", multiple=True,
              type=click.Choice(list(MECHANISMS)),
              help="SCRAM mechanism to store (repeat for both; default both).")
@click.option("--iterations", type=int, default=DEFAULT_ITERATIONS, show_default=True,
              help="PBKDF2 iterations of the salted password (4096 to 16384).")
@click.option("--password-stdin", is_flag=True,
              help="Read the password from stdin (its first line) instead of prompting.")
@click.pass_obj
def add(ctx: Context, name: str, mechanisms: tuple[str, ...], iterations: int,
        password_stdin: bool) -> None:
    """Add a user, or set a user's password.

    \b
    Examples:
      compactlog users add alice
      compactlog users add bob --mechanism SCRAM-SHA-512 --iterations 16384
      printf '%s' "$PASSWORD" | compactlog users add carol --password-stdin
    """
    check_iterations(iterations)
    if password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = click.prompt("Password", hide_input=True, confirmation_prompt=True)
    if not password:
        raise UserError("the password is empty")
    store = CredentialStore(ctx.state_document(DIRECTORY))
    chosen = mechanisms or tuple(MECHANISMS)
    for mechanism in chosen:
        store.upsert(name, mechanism, make_credential(mechanism, password, iterations))
    click.echo(f"user {name}: {', '.join(chosen)} credentials stored ({iterations} "
               f"iterations)")


@users.command(name="list")
@click.pass_obj
def list_users(ctx: Context) -> None:
    """List the users and their mechanisms (never a secret).

    \b
    Example:
      compactlog users list
    """
    found = CredentialStore(ctx.state_document(DIRECTORY)).users()
    if not found:
        click.echo("no users")
        return
    for name in sorted(found):
        details = ", ".join(f"{mech} ({cred.iterations} iterations)"
                            for mech, cred in sorted(found[name].items()))
        click.echo(f"{name}\t{details}")


@users.command()
@click.argument("name")
@click.option("--mechanism", "mechanisms", multiple=True,
              type=click.Choice(list(MECHANISMS)),
              help="Delete only this mechanism's credential (repeat for more; default all).")
@click.pass_obj
def delete(ctx: Context, name: str, mechanisms: tuple[str, ...]) -> None:
    """Delete a user's credentials: new logins fail at once (open connections stay).

    \b
    Examples:
      compactlog users delete alice
      compactlog users delete bob --mechanism SCRAM-SHA-256
    """
    removed = CredentialStore(ctx.state_document(DIRECTORY)).delete(name, mechanisms or None)
    if not removed:
        raise UserError(f"no user {name!r}" + (f" with {', '.join(mechanisms)}"
                                              if mechanisms else ""))
    click.echo(f"user {name}: {', '.join(removed)} credentials deleted")
