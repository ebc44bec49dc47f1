"""What a topic's format configs cost a produced batch: `Partition.append_batch` (the
Kafka server's append, in process, flushing left to the OS) of the same gzip batches on
topics that differ only in compression.type and message.timestamp.* (issue 24, item 4).

Cases: the default (`producer`, CreateTime, no limits), LogAppendTime (stamped in
place), timestamp limits (a second pass over the records for their range), and
compression.type zstd and uncompressed (each batch decoded and rebuilt in that codec).
Each prints records/s (the best of --repeat rounds, the cases interleaved, since a
shared machine's load moves between rounds) and the ratio to the default topic.

    .venv/bin/python bench/topic_formats.py [--batches 2000] [--records-per-batch 100]
        [--repeat 3]
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
import time
from pathlib import Path

from compactlog.storage.records import ProducerRecord, encode_batch
from compactlog.storage.store import LogStore

NO_FSYNC = str(2**63 - 1)
CASES = {
    "default (producer, CreateTime)": {},
    "message.timestamp.type=LogAppendTime": {"message.timestamp.type": "LogAppendTime"},
    "message.timestamp.before/after.max.ms=1h": {
        "message.timestamp.before.max.ms": "3600000",
        "message.timestamp.after.max.ms": "3600000"},
    "compression.type=zstd (recompressed)": {"compression.type": "zstd"},
    "compression.type=uncompressed": {"compression.type": "uncompressed"},
}


def batches(count: int, per_batch: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    now = int(time.time() * 1000)
    return [bytes(encode_batch(
        [ProducerRecord(b"key-%d" % rng.randrange(10_000), rng.randbytes(100), (), now)
         for _ in range(per_batch)], 0, now, "gzip"))
        for _ in range(count)]


def measure(root: Path, config: dict[str, str], sent: list[bytes]) -> float:
    """Seconds to append every batch of `sent` to a fresh topic with `config`."""
    with LogStore.open(root) as store:
        store.create_topic("t", 1, {**config, "flush.messages": NO_FSYNC})
        partition = store.topic("t").partition(0)
        began = time.perf_counter()
        for batch in sent:
            partition.append_batch(bytearray(batch))
        return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=2000)
    parser.add_argument("--records-per-batch", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    sent = batches(args.batches, args.records_per_batch, args.seed)
    records = args.batches * args.records_per_batch
    scratch = Path(tempfile.mkdtemp(prefix="topic-formats-"))
    try:
        best = dict.fromkeys(CASES, float("inf"))
        for round_ in range(args.repeat):
            for number, (name, config) in enumerate(CASES.items()):
                seconds = measure(scratch / f"{round_}-{number}", config, sent)
                best[name] = min(best[name], seconds)
        print(f"{records:,} records of 100 B in gzip batches of {args.records_per_batch}, "
              f"best of {args.repeat}")
        baseline = records / best[next(iter(CASES))]
        for name, seconds in best.items():
            rate = records / seconds
            print(f"{name:45} {rate:>12,.0f} records/s  {rate / baseline:5.2f}x")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
