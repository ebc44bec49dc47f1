"""`compactlog consume`: print records of a topic."""

from __future__ import annotations

import click

from compactlog.cli import Context
from compactlog.cli.formats import Encoding, record_json, record_text
from compactlog.client.reader import Reader, StartPosition
from compactlog.errors import UserError
from compactlog.storage import LogStore


def _start(value: str) -> StartPosition:
    if value in ("earliest", "latest"):
        return value  # type: ignore[return-value]
    if value.isdigit():
        return int(value)
    raise UserError(f"--from must be earliest, latest or an offset >= 0, got {value!r}")


@click.command()
@click.argument("topic")
@click.option("--from", "start", default="earliest", show_default=True,
              metavar="earliest|latest|OFFSET", help="Where each partition starts.")
@click.option("--partition", "-p", type=int, default=None, help="Read only this partition.")
@click.option("--follow", "-f", is_flag=True, help="Keep waiting for new records (Ctrl-C stops).")
@click.option("--format", "output_format", type=click.Choice(["text", "json"]), default="text",
              show_default=True,
              help="text: key<TAB>value, and a tombstone as {\"key\": ..., \"value\": "
                   "null} (what `produce` reads); json: one object per record with "
                   "partition, offset, timestamp, key, value and headers.")
@click.option("--encoding", type=click.Choice(["utf8", "base64"]), default="utf8",
              show_default=True, help="How keys and values are printed.")
@click.option("--compacted", is_flag=True,
              help="Read the compacted view: the latest record per key up to the horizon, "
                   "then every record after it.")
@click.option("--max-records", "-n", type=click.IntRange(min=1), default=None,
              help="Stop after this many records.")
@click.pass_obj
def consume(
    ctx: Context,
    topic: str,
    start: str,
    partition: int | None,
    follow: bool,
    output_format: str,
    encoding: Encoding,
    compacted: bool,
    max_records: int | None,
) -> None:
    """Print the records of TOPIC, partition by partition, in offset order.

    A tombstone (a null value) prints as {"key": "K", "value": null}, in the text
    format too, where an empty value prints as `K<TAB>`: the lines `produce` reads.
    Reading does not block a running producer.

    \b
    Examples:
      compactlog consume prices --from earliest
      compactlog consume prices --compacted --format json
      compactlog consume prices --partition 2 --from 1000 --format json
      compactlog consume prices --from latest --follow --format json --encoding base64
    """
    position = _start(start)
    with LogStore.open(ctx.target, read_only=True) as store:
        handle = store.topic(topic)
        indexes = [partition] if partition is not None else range(len(handle.partitions))
        readers = [
            Reader(store, topic, index, position, read_compacted=compacted) for index in indexes
        ]
        printed = 0

        def emit(reader: Reader, timeout: float) -> bool:
            nonlocal printed
            records = reader.poll(max_records=500, timeout=timeout)
            for record in records:
                if output_format == "json":
                    click.echo(record_json(reader.partition.index, record, encoding))
                else:
                    click.echo(record_text(record, encoding))
                printed += 1
                if max_records is not None and printed >= max_records:
                    return False
            return bool(records)

        for reader in readers:
            while not reader.at_end:
                if not emit(reader, 0.0):
                    if max_records is not None and printed >= max_records:
                        return
                    break
        while follow:
            wait = 0.5 / len(readers)
            for reader in readers:
                emit(reader, wait)
                if max_records is not None and printed >= max_records:
                    return
