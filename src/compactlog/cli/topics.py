"""`compactlog topics create|list|describe|alter|delete`."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TypeVar

import click
from rich.console import Console
from rich.table import Table

from compactlog.cli import Context
from compactlog.config import TOPIC_KEYS, parse_assignments
from compactlog.storage.store import LogStore

console = Console()
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
@_config_option("Topic config, repeatable. See `compactlog config-docs` for every key.")
@click.pass_obj
def create(ctx: Context, topic: str, partitions: int, assignments: tuple[str, ...]) -> None:
    """Create TOPIC.

    \b
    Example:
      compactlog topics create users --partitions 3 \\
          --config cleanup.policy=compact --config delete.retention.ms=3600000
    """
    config = parse_assignments(assignments)
    with LogStore.open(ctx.data_dir) as store:
        store.create_topic(topic, partitions, config)
    click.echo(f"created topic {topic} with {partitions} partition(s)")


@topics.command(name="list")
@click.pass_obj
def list_topics(ctx: Context) -> None:
    """List topics, one per line.

    \b
    Example:
      compactlog topics list
    """
    if not (ctx.data_dir / "topics").is_dir():
        return
    with LogStore.open(ctx.data_dir, read_only=True) as store:
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
    with LogStore.open(ctx.data_dir, read_only=True) as store:
        handle = store.topic(topic)
        meta = handle.meta
        partitions = [{"partition": p.index, **p.stats()} for p in handle.partitions]
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
        settings = Table("config", "value", "source", title="Config")
        for key in TOPIC_KEYS:
            source = "topic" if key.name in meta.config.overrides else "default"
            settings.add_row(key.name, str(config[key.name]), source)
        console.print(settings)
        table = Table(
            "partition", "log start", "log end", "records", "sealed segments", "sealed bytes",
            "log segments", "log bytes", title="Partitions",
        )
        for row in partitions:
            table.add_row(*(str(row[c]) for c in (
                "partition", "log_start_offset", "log_end_offset",
            )), str(row["log_end_offset"] - row["log_start_offset"]), *(str(row[c]) for c in (
                "sealed_segments", "sealed_bytes", "log_segments", "log_bytes",
            )))
        console.print(table)


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
    with LogStore.open(ctx.data_dir) as store:
        store.alter_topic(topic, parse_assignments(assignments), deletions)
    click.echo(f"altered topic {topic}")


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
    with LogStore.open(ctx.data_dir) as store:
        store.topic(topic)  # fails with a clear error before asking about an unknown topic
        if not yes:
            click.confirm(f"delete topic {topic} and all its records?", abort=True)
        store.delete_topic(topic)
    click.echo(f"deleted topic {topic}")
