"""A Quix Streams application: a running count per key, in RocksDB state.

Run with the interpreter of .venv-apps/quix (scripts/setup-apps.sh), by
tests/apps/test_apps_quix.py. Quix keeps the state in RocksDB under --state-dir and writes
every change to a compacted changelog topic that it creates itself
(changelog__<group>--<input>--default); with the state directory gone, it restores the
state from that topic before processing. Each count is printed to stdout as a JSON line:
{"key": ..., "count": ..., "partition": ..., "offset": ...}. SIGTERM stops it after a
final checkpoint (state flushed to the changelog, offsets committed).

Processing is at-least-once, so a record can come again after a restart; the state keeps
the offset of the last record counted for the key (a key's records are on one partition,
in offset order) and a record at or below it is not counted again, only reported as
{"key": ..., "redelivered": offset, "partition": ...}.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from quixstreams import Application, State, message_context


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--broker", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--input", required=True)
    parser.add_argument("--state-dir", required=True)
    args = parser.parse_args()

    app = Application(
        broker_address=args.broker,
        consumer_group=args.group,
        auto_offset_reset="earliest",
        state_dir=args.state_dir,
        commit_interval=0.5,
        loglevel="INFO",
        request_timeout=30,
    )
    topic = app.topic(args.input, key_deserializer="str", value_deserializer="str")
    sdf = app.dataframe(topic)

    def count(value: Any, key: Any, timestamp: int, headers: Any, state: State) -> dict[str, Any]:
        context = message_context()
        if context.offset <= state.get("offset", -1):
            return {"key": key, "redelivered": context.offset, "partition": context.partition}
        total = state.get("count", 0) + 1
        state.set("count", total)
        state.set("offset", context.offset)
        return {"key": key, "count": total, "partition": context.partition,
                "offset": context.offset}

    def report(row: dict[str, Any], key: Any, timestamp: int, headers: Any) -> None:
        print(json.dumps(row), flush=True)

    sdf = sdf.apply(count, stateful=True, metadata=True)
    sdf = sdf.update(report, metadata=True)
    app.run()


if __name__ == "__main__":
    main()
