"""A faust-streaming application: a running count per key, in a Table.

Run with the interpreter of .venv-apps/faust (scripts/setup-apps.sh), by
tests/apps/test_apps_faust.py:

    python count_app.py --broker HOST:PORT --app-id ID --input TOPIC --data-dir DIR

The table lives in RocksDB (rocksdict) under --data-dir, and faust writes every change to
the compacted changelog topic it creates itself (<app-id>-counts-changelog); with the
data directory gone, the worker restores the table from that topic before its agent
processes anything. Each count is printed to stdout as a JSON line:
{"key": ..., "count": ..., "partition": ..., "offset": ...}. SIGTERM stops the worker,
which commits its offsets on the way out.

Processing is at-least-once, and faust does deliver a record again at times (seen here:
the last record of a partition, a second time, in the worker that restored its table;
compare faust-streaming issues #48 and #502). So the table keeps, per key, the count and
the offset of the last record counted (a key's records are on one partition, in offset
order); a record at or below it is not counted again, only reported as
{"key": ..., "redelivered": offset, "partition": ...}.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import faust


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--broker", required=True)
    parser.add_argument("--app-id", required=True)
    parser.add_argument("--input", required=True)
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--partitions", type=int, default=2)
    args = parser.parse_args()

    app = faust.App(
        args.app_id,
        broker=f"kafka://{args.broker}",
        store="rocksdb://",
        datadir=args.data_dir,
        topic_partitions=args.partitions,
        topic_replication_factor=1,
        consumer_auto_offset_reset="earliest",
        broker_commit_interval=0.5,
        web_enabled=False,
    )
    events = app.topic(args.input, key_type=bytes, value_type=bytes,
                       key_serializer="raw", value_serializer="raw",
                       partitions=args.partitions)
    # key -> [count, offset of the last record counted]
    counts = app.Table("counts", default=lambda: [0, -1], partitions=args.partitions)

    @app.agent(events)
    async def count(stream: Any) -> None:
        async for event in stream.events():
            key = event.key.decode() if isinstance(event.key, bytes) else str(event.key)
            partition, offset = event.message.partition, event.message.offset
            total, last = counts[key]
            if offset <= last:
                print(json.dumps({"key": key, "redelivered": offset, "partition": partition}),
                      flush=True)
                continue
            counts[key] = [total + 1, offset]
            print(json.dumps({"key": key, "count": total + 1, "partition": partition,
                              "offset": offset}), flush=True)

    # The worker as `faust worker --without-web` starts it, but with stdout kept for the
    # counts (the command sends it to the log).
    faust.Worker(app, loglevel="info", redirect_stdouts=False).execute_from_commandline()


if __name__ == "__main__":
    main()
