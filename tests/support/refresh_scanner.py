"""A reader process for tests/storage/test_reader_refresh.py: opens a data directory read-only and
scans a topic's compacted view from the earliest offset, again and again, for a while,
while another process writes. Prints one JSON line: how many scans, and every error.

    python refresh_scanner.py DATA_DIR TOPIC SECONDS
"""

from __future__ import annotations

import json
import sys
import time

from compactlog.client.reader import Reader
from compactlog.storage.store import LogStore


def scan(store: LogStore, topic: str) -> int:
    """One scan of every partition's compacted view; the records read."""
    count = 0
    for index in range(len(store.topic(topic).partitions)):
        reader = Reader(store, topic, index, read_compacted=True)
        last = -1
        while batch := reader.poll(max_records=50):
            offsets = [record.offset for record in batch]
            assert offsets == sorted(offsets) and offsets[0] > last, f"order: {offsets}"
            last = offsets[-1]
            count += len(batch)
    return count


def main(directory: str, topic: str, seconds: float) -> None:
    scans, records, errors = 0, 0, []
    deadline = time.monotonic() + seconds
    with LogStore.open(directory, read_only=True) as store:
        while time.monotonic() < deadline:
            try:
                records += scan(store, topic)
            except Exception as error:  # every error is the finding: report them all
                errors.append(f"{type(error).__name__}: {error}")
            scans += 1
    print(json.dumps({"scans": scans, "records": records, "errors": errors}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]))
