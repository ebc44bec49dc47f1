"""`compactlog groups`: consumer groups, their offsets and lag, as Kafka's
kafka-consumer-groups shows and changes them.

Invariant: groups live in a running server (its group coordinator), so every command
asks one over the Kafka protocol (cli/group_client.py): `--bootstrap-server HOST:PORT`,
else the server serving the data directory (its server.json, as the write commands
find it). Column names and reset options are Kafka's; tables fit 80 columns.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, TypeVar

import click

from compactlog.cli import Context, where
from compactlog.cli.output import narrow_table, stdout_console
from compactlog.errors import UserError

if TYPE_CHECKING:
    from compactlog.cli.group_client import GroupClient

FC = TypeVar("FC", bound=Callable[..., object])


def _bootstrap_option(function: FC) -> FC:
    return click.option(
        "--bootstrap-server", "bootstrap", default=None, metavar="HOST:PORT",
        help="The server's Kafka listener. Default: the server running on the data "
             "directory.")(function)


def _client(ctx: Context, bootstrap: str | None) -> GroupClient:
    # Imported when a command runs: aiokafka is not needed for --help.
    from compactlog.cli.group_client import GroupClient
    from compactlog.server.info import running_server

    if bootstrap is None:
        server = running_server(ctx.data_dir)
        if server is None:
            raise UserError(f"no compactlog server is running on {where(ctx)}, and groups "
                            "live in a server: start `compactlog serve`, or pass "
                            "--bootstrap-server HOST:PORT")
        if server.listeners and not any(entry.get("protocol") == "PLAINTEXT"
                                        for entry in server.listeners.values()):
            raise UserError(f"the server on {where(ctx)} has no PLAINTEXT listener "
                            f"(its listeners: {', '.join(server.listeners)}): pass "
                            "--bootstrap-server HOST:PORT of one this command can reach")
        bootstrap = server.kafka
    return GroupClient(bootstrap)


def _dash(value: object) -> str:
    return "-" if value is None or value == "" else str(value)


@click.group()
def groups() -> None:
    """List, describe, delete consumer groups and reset their offsets.

    Groups live in the running server, asked over the Kafka protocol as Kafka's
    kafka-consumer-groups asks a broker.

    \b
    Examples:
      compactlog groups list
      compactlog groups describe billing
      compactlog groups reset-offsets billing --topic prices --to-earliest
      compactlog groups reset-offsets billing --topic prices --to-earliest --execute
      compactlog groups delete billing
    """


@groups.command(name="list")
@click.option("--state", "with_state", is_flag=True,
              help="Show each group's state and number of members too.")
@_bootstrap_option
@click.pass_obj
def list_groups(ctx: Context, with_state: bool, bootstrap: str | None) -> None:
    """List the consumer groups, one name a line (as kafka-consumer-groups --list).

    \b
    Examples:
      compactlog groups list
      compactlog groups list --state --bootstrap-server 127.0.0.1:9092
    """
    found = _client(ctx, bootstrap).list_groups()
    if not with_state:
        for group in found:
            click.echo(group.name)
        return
    table = narrow_table("Consumer groups", "GROUP", "STATE", "MEMBERS", right=("MEMBERS",))
    for group in found:
        table.add_row(group.name, group.state, str(len(group.members)))
    stdout_console().print(table)


@groups.command()
@click.argument("group")
@_bootstrap_option
@click.pass_obj
def describe(ctx: Context, group: str, bootstrap: str | None) -> None:
    """Show GROUP's committed offset, log end offset and lag per partition, and the
    member that consumes it (as kafka-consumer-groups --describe).

    CURRENT-OFFSET is the group's committed offset (- when none); LAG is LOG-END-OFFSET
    minus it. Kafka's columns, with the group in the title rather than in each row.

    \b
    Example:
      compactlog groups describe billing
    """
    described, rows = _client(ctx, bootstrap).describe(group)
    # Kafka's columns but GROUP, which is the title here: with it, nine columns do not
    # fit 80.
    table = narrow_table(
        f"GROUP {described.name}: {described.state}, {len(described.members)} member(s)",
        "TOPIC", "PARTITION", "CURRENT-\nOFFSET", "LOG-END-\nOFFSET", "LAG", "CONSUMER-ID",
        "HOST", "CLIENT-ID", right=("PARTITION", "CURRENT-\nOFFSET", "LOG-END-\nOFFSET", "LAG"))
    for column in table.columns:  # headers whole; a long member id folds instead
        column.min_width = max(len(line) for line in str(column.header).splitlines())
    for row in rows:
        member = row.member
        table.add_row(row.topic, str(row.partition), _dash(row.current_offset),
                      str(row.log_end_offset), _dash(row.lag),
                      _dash(member and member.member_id), _dash(member and member.host),
                      _dash(member and member.client_id))
    stdout_console().print(table)


@groups.command()
@click.argument("group")
@_bootstrap_option
@click.pass_obj
def delete(ctx: Context, group: str, bootstrap: str | None) -> None:
    """Delete GROUP and its committed offsets. A group with active members is refused,
    as Kafka refuses it (NON_EMPTY_GROUP).

    \b
    Example:
      compactlog groups delete billing
    """
    _client(ctx, bootstrap).delete(group)
    click.echo(f"deleted consumer group {group}")


def _datetime(value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        raise UserError(f"--to-datetime {value!r}: not an ISO 8601 time such as "
                        "2026-11-26T09:30:00 or 2026-11-26T09:30:00+00:00") from None


@groups.command(name="reset-offsets")
@click.argument("group")
@click.option("--topic", "topics", multiple=True, metavar="TOPIC",
              help="A topic whose offsets to reset, all its partitions (repeatable).")
@click.option("--all-topics", is_flag=True,
              help="Every topic the group has committed offsets for.")
@click.option("--to-earliest", is_flag=True, help="Reset to each partition's log start.")
@click.option("--to-latest", is_flag=True, help="Reset to each partition's log end.")
@click.option("--to-offset", type=click.IntRange(min=0), default=None, metavar="OFFSET",
              help="Reset to OFFSET (kept within each partition's log, as Kafka does).")
@click.option("--to-datetime", default=None, metavar="ISO-TIME",
              help="Reset to the first record at or after this time (the log end when "
                   "none). No zone: the local time zone, as Kafka reads it.")
@click.option("--execute", is_flag=True,
              help="Commit the new offsets. Without it, only show them (--dry-run).")
@click.option("--dry-run", is_flag=True, help="Only show the new offsets (the default).")
@_bootstrap_option
@click.pass_obj
def reset_offsets(ctx: Context, group: str, topics: tuple[str, ...], all_topics: bool,
                  to_earliest: bool, to_latest: bool, to_offset: int | None,
                  to_datetime: str | None, execute: bool, dry_run: bool,
                  bootstrap: str | None) -> None:
    """Reset GROUP's committed offsets, as kafka-consumer-groups --reset-offsets does.

    Shows the new offsets and commits nothing unless --execute is given. The group must
    have no active members (stop its consumers first), as Kafka requires.

    \b
    Examples:
      compactlog groups reset-offsets billing --topic prices --to-earliest
      compactlog groups reset-offsets billing --all-topics --to-latest --execute
      compactlog groups reset-offsets billing --topic prices --to-offset 42 --execute
      compactlog groups reset-offsets billing --topic prices \\
          --to-datetime 2026-11-26T09:30:00+00:00 --execute
    """
    chosen = [name for name, given in (("--to-earliest", to_earliest),
                                       ("--to-latest", to_latest),
                                       ("--to-offset", to_offset is not None),
                                       ("--to-datetime", to_datetime is not None)) if given]
    if len(chosen) != 1:
        raise UserError("reset-offsets needs exactly one of --to-earliest, --to-latest, "
                        f"--to-offset, --to-datetime (got {', '.join(chosen) or 'none'})")
    if bool(topics) == all_topics:
        raise UserError("reset-offsets needs --topic TOPIC (repeatable) or --all-topics")
    if execute and dry_run:
        raise UserError("reset-offsets takes --execute or --dry-run, not both")
    to = chosen[0].removeprefix("--to-")
    value = to_offset if to == "offset" else _datetime(to_datetime)
    client = _client(ctx, bootstrap)
    offsets = client.plan_reset(group, list(topics) if topics else None, to, value)
    if execute:
        client.commit(group, offsets)
    table = narrow_table(f"Consumer group {group}: new offsets", "GROUP", "TOPIC",
                         "PARTITION", "NEW-OFFSET", right=("PARTITION", "NEW-OFFSET"))
    for (topic, partition), offset in sorted(offsets.items()):
        table.add_row(group, topic, str(partition), str(offset))
    stdout_console().print(table)
    print("committed" if execute else "dry run: nothing committed; pass --execute to "
          "commit these offsets", file=sys.stderr)
