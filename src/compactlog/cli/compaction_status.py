"""`compactlog compaction-status`: each partition's last run, from the status files on
disk or from a running server's admin API.

Invariant: read-only: the store is opened read-only, and nothing it shows is changed.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from urllib.parse import quote

import click

from compactlog.cli import Context
from compactlog.cli.admin_client import AdminClient
from compactlog.cli.output import narrow_table, stdout_console
from compactlog.compaction.status import read_status
from compactlog.storage import LogStore


@click.command("compaction-status")
@click.argument("topic")
@click.option("--server", "server_url", envvar="COMPACTLOG_SERVER", default=None,
              metavar="URL",
              help="Ask a running server (its admin API URL, or set COMPACTLOG_SERVER): "
                   "shows runs in progress and uncleanable partitions too.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def compaction_status(ctx: Context, topic: str, server_url: str | None, as_json: bool) -> None:
    """Show the compaction status of each partition of TOPIC.

    NOT_RUN, RUNNING, SUCCESS or ERROR (with the last error). The status is kept on
    disk, so it survives restarts; a run whose process died shows as ERROR. With
    --server, a running server also says which partitions are uncleanable (their last
    run failed) and when they will be retried.

    \b
    Examples:
      compactlog compaction-status prices --json
      compactlog compaction-status prices --server http://127.0.0.1:9093
    """
    if server_url is not None:
        body = AdminClient(server_url).get(f"/v1/topics/{quote(topic, safe='')}/compaction")
        rows = body["partitions"]
    else:
        with LogStore.open(ctx.target, read_only=True) as store:
            handle = store.topic(topic)
            rows = []
            for partition in handle.partitions:
                status = read_status(partition.directory)
                rows.append({"partition": partition.index, **status.to_json(),
                             "horizon": partition.stats()["horizon"]})
    if as_json:
        click.echo(json.dumps({"topic": topic, "partitions": rows}, indent=2))
        return
    headers = ["partition", "status", "horizon", "last finished", "error"]
    if server_url is not None:
        headers.append("retry at")
    table = narrow_table(f"Compaction status of {topic}", *headers, right=("horizon",))
    for row in rows:
        state = row["state"]
        if row.get("uncleanable"):
            state = f"{state} (uncleanable, {row['failures_in_a_row']} failures)"
        cells = [str(row["partition"]), state,
                 "-" if row["horizon"] is None else str(row["horizon"]),
                 _time(row["finished_ms"]), row["error"] or ""]
        if server_url is not None:
            cells.append(_time(row.get("retry_at_ms")) if row.get("uncleanable") else "")
        table.add_row(*cells)
    stdout_console().print(table)


def _time(ms: int | None) -> str:
    if not ms:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")
