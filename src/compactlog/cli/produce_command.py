"""`compactlog produce`: append records read from standard input."""

from __future__ import annotations

import sys
from collections import Counter
from typing import TextIO

import click

from compactlog.cli import Context
from compactlog.cli.formats import Encoding, InputFormat, LineError, parse_line
from compactlog.cli.writer import open_writer
from compactlog.storage import LogStore, ProducerRecord


@click.command()
@click.argument("topic")
@click.option("--partition", "-p", type=int, default=None,
              help="Append every record to this partition instead of the key's partition.")
@click.option("--format", "input_format", type=click.Choice(["auto", "tsv", "json"]),
              default="auto", show_default=True,
              help="tsv: key<TAB>value lines; json: one object per line; auto: JSON when a "
                   "line starts with '{'.")
@click.option("--encoding", type=click.Choice(["utf8", "base64"]), default="utf8",
              show_default=True, help="How keys, values and header values are written.")
@click.option("--batch-size", type=click.IntRange(1, 100_000), default=1000, show_default=True,
              help="Records per appended batch.")
@click.option("--input", "-i", "source", type=click.File("r"), default="-",
              help="Read this file instead of standard input.")
@click.pass_obj
def produce(
    ctx: Context,
    topic: str,
    partition: int | None,
    input_format: InputFormat,
    encoding: Encoding,
    batch_size: int,
    source: TextIO,
) -> None:
    """Append records to TOPIC, one per input line.

    A line is `key<TAB>value`, or a JSON object with "key", "value", and optionally
    "headers" ({"name": "value"}) and "timestamp" (ms). A JSON "value": null is a
    tombstone: it deletes the key from the compacted view. Records go to their key's
    partition (Kafka's murmur2 partitioner), in batches of --batch-size.

    \b
    Examples:
      printf 'AAPL\\t189.5\\nMSFT\\t410.2\\n' | compactlog produce prices
      echo '{"key": "AAPL", "value": null}' | compactlog produce prices
      compactlog produce prices --input updates.jsonl --format json
    """
    produced: Counter[int] = Counter()
    pending: list[ProducerRecord] = []
    with LogStore.open(ctx.target, read_only=True) as reader:
        config = reader.topic(topic).config
    refuse_null_keys = config.compacted and config["null.key.policy"] == "reject"
    with open_writer(ctx.target, ctx.data_dir) as writer:

        def send() -> None:
            produced.update(writer.append(topic, pending, partition))
            pending.clear()

        try:
            for number, line in enumerate(source, start=1):
                if not line.strip():
                    continue
                record = parse_line(line, number, input_format, encoding)
                if refuse_null_keys and record.key is None:
                    raise LineError(number, f"the record has no key; compacted topic {topic!r} "
                                    "refuses null keys (null.key.policy=reject)")
                pending.append(record)
                if len(pending) >= batch_size:
                    send()
            if pending:
                send()
        finally:
            total = sum(produced.values())
            if total or sys.stdin.isatty():
                parts = ", ".join(f"{p}: {n}" for p, n in sorted(produced.items()))
                click.echo(f"produced {total} record(s) to {topic} ({parts or 'none'})"
                           f"{writer.via}", err=True)
