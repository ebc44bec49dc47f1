"""`compactlog topics create|list|describe|alter|delete`."""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
from rich.filesize import decimal
from rich.table import Table

from compactlog.cli import Context
from compactlog.cli.output import narrow_table, stdout_console
from compactlog.compaction.status import read_status
from compactlog.config import TOPIC_KEYS, parse_assignments
from compactlog.errors import UserError

if TYPE_CHECKING:
    from compactlog.cli.writer import Writer
    from compactlog.storage import LogStore

console = stdout_console()


# The store and the Kafka client are imported when a command runs, not for `--help`.
def _writer(ctx: Context) -> AbstractContextManager[Writer]:
    from compactlog.cli.writer import open_writer

    return open_writer(ctx.target, ctx.data_dir)


def _reader(ctx: Context) -> LogStore:
    from compactlog.storage import LogStore

    return LogStore.open(ctx.target, read_only=True)


FC = TypeVar("FC", bound=Callable[..., object])


def _config_option(help_text: str) -> Callable[[FC], FC]:
    return click.option(
        "--config", "-c", "assignments", multiple=True, metavar="KEY=VALUE", help=help_text
    )


@click.group()
def topics() -> None:
    """Create, list, describe, alter and delete topics.

    \b
    Examples:
      compactlog topics create prices --partitions 4 --config cleanup.policy=compact
      compactlog topics list
      compactlog topics describe prices
      compactlog topics alter prices --config delete.retention.ms=3600000
      compactlog topics delete prices --yes
    """


@topics.command()
@click.argument("topic")
@click.option("--partitions", "-p", default=1, show_default=True, type=int,
              help="Number of partitions.")
@click.option("--replication-factor", "replication_factor", default=1, show_default=True,
              type=int, help="Replicas of each partition, as Kafka's kafka-topics takes it; "
              "compactlog is a single broker, so only 1.")
@_config_option("Topic config, repeatable. See `compactlog config-docs` for every key.")
@click.pass_obj
def create(ctx: Context, topic: str, partitions: int, replication_factor: int,
           assignments: tuple[str, ...]) -> None:
    """Create TOPIC.

    \b
    Example:
      compactlog topics create users --partitions 3 --replication-factor 1 \\
          --config cleanup.policy=compact --config delete.retention.ms=3600000
    """
    if replication_factor != 1:
        # Kafka refuses a factor above the brokers it has (INVALID_REPLICATION_FACTOR).
        raise UserError(f"--replication-factor {replication_factor} for topic {topic!r}: "
                        "compactlog runs a single broker, so a topic has 1 replica")
    config = {key: str(value) for key, value in parse_assignments(assignments).items()}
    with _writer(ctx) as writer:
        writer.create_topic(topic, partitions, config)
    click.echo(f"created topic {topic} with {partitions} partition(s){writer.via}")


@topics.command(name="list")
@click.pass_obj
def list_topics(ctx: Context) -> None:
    """List topics, one per line.

    \b
    Example:
      compactlog topics list
    """
    with _reader(ctx) as store:
        for name in store.list_topics():
            click.echo(name)


@topics.command()
@click.argument("topic")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@click.pass_obj
def describe(ctx: Context, topic: str, as_json: bool) -> None:
    """Show TOPIC's config and its partitions' offsets and sizes.

    \b
    Example:
      compactlog topics describe prices --json
    """
    with _reader(ctx) as store:
        handle = store.topic(topic)
        meta = handle.meta
        partitions = [
            {"partition": p.index, **p.stats(), "compaction": _last_run(p.directory)}
            for p in handle.partitions
        ]
        config = meta.config.effective()
        if as_json:
            click.echo(json.dumps({
                "topic": meta.name,
                "topic_id": meta.topic_id,
                "partitions": partitions,
                "config": config,
                "overrides": sorted(meta.config.overrides),
            }, indent=2))
            return
        console.print(f"[bold]{meta.name}[/] (id {meta.topic_id}), {meta.partitions} partition(s)")
        settings = narrow_table("Config", "config", "value", "source", right=())
        for key in TOPIC_KEYS:
            source = "topic" if key.name in meta.config.overrides else "default"
            settings.add_row(key.name, format_value(config[key.name]), source)
        console.print(settings)
        table = narrow_table("Partitions", "partition", "log\nstart", "log\nend", "records",
                             "sealed\nsegments", "sealed\nsize", "log\nsegments", "log\nsize")
        for row in partitions:
            table.add_row(
                str(row["partition"]), str(row["log_start_offset"]), str(row["log_end_offset"]),
                str(row["log_end_offset"] - row["log_start_offset"]), str(row["sealed_segments"]),
                decimal(row["sealed_bytes"]), str(row["log_segments"]),
                decimal(row["log_bytes"]))
        console.print(table)
        if meta.config.compacted:
            console.print(_compaction_table(partitions))


def format_value(value: object) -> str:
    """A config value as it is typed (`true`, not Python's `True`)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _last_run(directory: Path) -> dict[str, Any]:
    status = read_status(directory)
    last = status.last_success
    return {
        "state": status.state,
        "error": status.error,
        "last_run_ms": last.get("finished_ms"),
        "last_run_duration_ms": (last["finished_ms"] - last["started_ms"]) if last else None,
        "last_run_records_removed": last.get("records_removed"),
    }


def _compaction_table(partitions: list[dict[str, Any]]) -> Table:
    table = narrow_table("Compaction", "partition", "horizon", "ledger\nrecords",
                         "ledger\nsize", "dirty\nsize", "dirty\nratio", "status", "last run",
                         right=("horizon", "ledger\nrecords", "ledger\nsize", "dirty\nsize",
                                "dirty\nratio"))
    for row in partitions:
        run = row["compaction"]
        if run["last_run_ms"]:
            when = datetime.fromtimestamp(run["last_run_ms"] / 1000, UTC).strftime(
                "%Y-%m-%d %H:%M:%S")
            duration = (f"{run['last_run_duration_ms'] / 1000:.1f}s"
                        if run["last_run_duration_ms"] is not None else "")
            removed = run["last_run_records_removed"]
            details = ", ".join(filter(None, [
                duration, f"{removed:,} removed" if removed is not None else ""]))
            last = f"{when}\n{details}" if details else when
        else:
            last = "never"
        table.add_row(
            str(row["partition"]), str(row["horizon"] if row["horizon"] is not None else "-"),
            f"{row['ledger_records']:,}", decimal(row["ledger_bytes"]),
            decimal(row["dirty_bytes"]), f"{row['dirty_ratio']:.2f}", run["state"], last,
        )
    return table


@topics.command()
@click.argument("topic")
@_config_option("Set a config key, repeatable.")
@click.option("--delete-config", "-d", "deletions", multiple=True, metavar="KEY",
              help="Return a key to its default, repeatable.")
@click.pass_obj
def alter(
    ctx: Context, topic: str, assignments: tuple[str, ...], deletions: tuple[str, ...]
) -> None:
    """Change TOPIC's config.

    \b
    Example:
      compactlog topics alter prices --config min.cleanable.dirty.ratio=0.2 \\
          --delete-config retention.ms
    """
    if not assignments and not deletions:
        raise click.UsageError("nothing to change: give --config KEY=VALUE or --delete-config KEY")
    changes = {key: str(value) for key, value in parse_assignments(assignments).items()}
    with _writer(ctx) as writer:
        writer.alter_topic(topic, changes, deletions)
    click.echo(f"altered topic {topic}{writer.via}")


@topics.command()
@click.argument("topic")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_obj
def delete(ctx: Context, topic: str, yes: bool) -> None:
    """Delete TOPIC and all its data.

    \b
    Example:
      compactlog topics delete prices --yes
    """
    with _reader(ctx) as store:
        store.topic(topic)  # fails with a clear error before asking about an unknown topic
    if not yes:
        click.confirm(f"delete topic {topic} and all its records?", abort=True)
    with _writer(ctx) as writer:
        writer.delete_topic(topic)
    click.echo(f"deleted topic {topic}{writer.via}")
