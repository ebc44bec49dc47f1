"""The writer process of the crash test (tests/storage/test_crash.py); killed with SIGKILL.

    python tests/support/crash_writer.py DATA_DIR SEED SEGMENT_BYTES warm|cold [KILL_POINT]

Opens the store (which recovers what the previous kill left), creates the topic if it
is missing, prints "READY", then appends batches of records forever, alternating at
random between the partitions. The content of every record is a function of its
partition and offset (`expected_record`), so the checker can verify each record it
reads back. After each append returns, one line "ACK <partition> <base> <last>" is
written to stdout and flushed: from then on the records are acknowledged.

The first Parquet write of a process is slow (pyarrow loads its writer and codecs
lazily, ~0.25 s against ~5 ms later), so a "cold" writer is likely to be killed in its
first seal. A "warm" writer writes a throwaway Parquet file to memory before READY,
so that its kills spread over appends and seals as in a long-running writer.

With a KILL_POINT (see KILL_POINTS), the writer SIGKILLs itself at that exact point
instead of waiting for the test to kill it, at one of the store's fault points
(compactlog/faults.py, installed in this process only), so each step of the sealing
protocol is hit on every run, not only when random timing happens to land there.
"""

from __future__ import annotations

import os
import random
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from compactlog import faults
from compactlog.errors import UnknownTopicError
from compactlog.storage import appending
from compactlog.storage.logfile import LogSegment
from compactlog.storage.records import BatchHeader, Headers, ProducerRecord
from compactlog.storage.sealed import SCHEMA
from compactlog.storage.store import LogStore

TOPIC = "crash"
PARTITIONS = 2
BASE_TIMESTAMP = 1_600_000_000_000
MAX_BATCH = 12
FILLER = bytes(range(251)) * 3


def topic_config(segment_bytes: int) -> dict[str, str]:
    return {
        "segment.bytes": str(segment_bytes),
        "parquet.row.group.bytes": "65536",
        # Timestamps are synthetic (BASE_TIMESTAMP + offset): keep time out of rolling
        # and retention so that only segment.bytes decides when segments roll.
        "segment.ms": str(2**63 - 1),
        "retention.ms": "-1",
    }


def expected_record(partition: int, offset: int) -> ProducerRecord:
    """The record the writer appends at (partition, offset): varied, deterministic."""
    key = None if offset % 10 == 3 else f"k{partition}-{offset % 50}".encode()
    value: bytes | None
    if offset % 29 == 7:
        value = None
    elif offset % 13 == 4:
        value = b""
    else:
        prefix = f"p{partition}-o{offset}:".encode()
        length = (offset * 7919 + partition * 31) % 300
        value = prefix + FILLER[offset % 251 : offset % 251 + length]
    headers: Headers
    if offset % 3 == 0:
        headers = ()
    elif offset % 17 == 5:
        headers = (("p", str(partition).encode()), ("o", str(offset).encode()), ("n", None))
    else:
        headers = (("p", str(partition).encode()), ("o", str(offset).encode()))
    timestamp = BASE_TIMESTAMP + 3 * offset + partition
    return ProducerRecord(key, value, headers, timestamp)


def warm_up_parquet() -> None:
    """Load pyarrow's Parquet writer and zstd codec, as the store's first seal would."""
    sink = pa.BufferOutputStream()
    with pq.ParquetWriter(sink, SCHEMA, compression="zstd") as writer:
        writer.write_table(SCHEMA.empty_table())
    pq.read_table(pa.BufferReader(sink.getvalue()))


KILL_POINTS = {
    "create-topic": "topic built under its temporary name, not yet renamed into place",
    "torn-append": "half of a batch written to the active segment",
    "roll": "segment rolled, sealing not started",
    "seal-parquet-written": "seal step 1 done: Parquet temp file written and fsynced",
    "seal-published": "seal step 2 done: Parquet file renamed to its final name",
    "seal-manifest-temp": "seal step 3 under way: manifest version written, not published",
    "seal-committed": "seal step 3 done: manifest lists the segment, log file not deleted",
    "seal-log-unlinked": "seal step 4 under way: log file unlinked, directory not fsynced",
    "alter-topic": "topic config change written, not yet published",
}
ARMED = [False]  # kill points fire only after READY (and some appends, for some)


def die() -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def after(function: Callable[..., Any], fire: Callable[..., bool]) -> Callable[..., Any]:
    """`function`, then SIGKILL when armed and fire(*args) says so."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = function(*args, **kwargs)
        if ARMED[0] and fire(*args):
            die()
        return result

    return wrapper


def always(*args: Any) -> bool:
    return True


def kill_at(fire: Callable[[str, Path], bool]) -> None:
    """SIGKILL at the first fault point (compactlog/faults.py) that `fire` picks once armed."""

    def injector(point: str, path: str) -> None:
        if ARMED[0] and fire(point, Path(path)):
            die()

    faults.install(injector)


def is_current_manifest(directory: str) -> Callable[[str, Path], bool]:
    # The commit point of a manifest or topic document: the rename over current.json.
    return lambda point, path: (point == "rename" and path.name == "current.json"
                                and path.parent.name == directory)


def install_kill_point(name: str) -> None:
    if name == "create-topic":
        # The topic is whole under staging/; the rename into topics/ has not happened.
        ARMED[0] = True
        kill_at(lambda point, path: point == "rename" and path.parent.name == "topics")
    elif name == "torn-append":
        real_append = LogSegment.append
        appends = [0]

        def torn_append(self: LogSegment, batch: bytes | bytearray, header: BatchHeader,
                        sync: bool) -> None:
            appends[0] += 1
            if ARMED[0] and appends[0] == 5:
                os.pwrite(self._fd, bytes(batch[: len(batch) // 2]), self.size)
                die()
            real_append(self, batch, header, sync)

        LogSegment.append = torn_append  # type: ignore[method-assign]
    elif name == "roll":
        appending.next_segment = after(appending.next_segment, always)
    elif name == "seal-parquet-written":
        kill_at(lambda point, path: point == "rename" and path.parent.name == "segments")
    elif name == "seal-published":
        # Renamed into segments/; the manifest commit has not begun.
        kill_at(lambda point, path: point == "commit.begin" and path.name == "manifest")
    elif name == "seal-manifest-temp":
        kill_at(is_current_manifest("manifest"))
    elif name == "alter-topic":
        kill_at(is_current_manifest("meta"))
    elif name == "seal-committed":
        # The commit is done; the first covered log file is about to be deleted.
        kill_at(lambda point, path: point == "unlink" and path.suffix == ".log")
    elif name == "seal-log-unlinked":
        # The directory fsync that follows a log file's deletion (not a roll's).
        unlinked = [False]

        def after_unlink(point: str, path: Path) -> bool:
            if point == "unlink" and path.suffix == ".log":
                unlinked[0] = True
            return unlinked[0] and point == "fsync_dir" and path.name == "log"

        kill_at(after_unlink)
    else:
        raise SystemExit(f"unknown kill point {name!r}; known: {', '.join(KILL_POINTS)}")


def main(argv: list[str]) -> int:
    data_dir, seed, segment_bytes = argv[1], int(argv[2]), int(argv[3])
    kill_point = argv[5] if len(argv) > 5 else None
    if argv[4] == "warm":
        warm_up_parquet()
    if kill_point is not None:
        install_kill_point(kill_point)
    rng = random.Random(seed)
    store = LogStore.open(data_dir)
    try:
        topic = store.topic(TOPIC)
    except UnknownTopicError:
        topic = store.create_topic(TOPIC, PARTITIONS, topic_config(segment_bytes))
    # One write of the whole line, as for ACK lines (print writes the text and the end
    # separately; a CI run once saw "READY" without its newline from a killed writer).
    sys.stdout.write("READY\n")
    sys.stdout.flush()
    ARMED[0] = kill_point is not None
    appends = 0
    while True:
        if kill_point == "alter-topic" and appends == 3:
            store.alter_topic(TOPIC, {"segment.bytes": str(segment_bytes * 2)})
        index = rng.randrange(PARTITIONS)
        base = topic.partition(index).log_end_offset
        count = rng.randint(1, MAX_BATCH)
        batch = [expected_record(index, base + i) for i in range(count)]
        [result] = store.append(TOPIC, batch, partition=index)
        if (result.partition, result.base_offset, result.last_offset) != (
            index, base, base + count - 1
        ):
            print(f"unexpected {result} for {count} records at {index}/{base}", file=sys.stderr)
            return 3
        sys.stdout.write(f"ACK {result.partition} {result.base_offset} {result.last_offset}\n")
        sys.stdout.flush()
        appends += 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
