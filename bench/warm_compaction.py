"""The server's compaction runs: a warm worker (keep_warm_s > 0) against a new process per
run (keep_warm_s = 0), on the same workload.

For each mode: a topic of N records over K keys is written with the store API and
sealed; `compactlog serve` starts (automatic compaction off, admin API on); a first run
is requested over HTTP; then M more records are produced through Kafka (confluent-kafka)
and sealed, and a second run is requested. The second run is the one automatic
compaction repeats all day: the table compares it between the two modes.

    .venv/bin/python bench/warm_compaction.py
    .venv/bin/python bench/warm_compaction.py --records 200000 --new 20000   # quick
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from compactlog.storage.records import ProducerRecord
from compactlog.storage.store import LogStore

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine_info import machine_info

COMPACTLOG = str(Path(sys.executable).parent / "compactlog")
TOPIC = "t"


def generate(data: Path, records: int, keys: int, partitions: int) -> None:
    with LogStore.open(data) as store:
        store.create_topic(TOPIC, partitions=partitions, config={
            "cleanup.policy": "compact", "min.compaction.lag.ms": "0",
            "segment.bytes": str(1 << 20)})
        for start in range(0, records, 1000):
            store.append(TOPIC, [ProducerRecord(b"k%08d" % ((start + i) % keys), b"x" * 100)
                                 for i in range(min(1000, records - start))])
        for partition in store.topic(TOPIC).partitions:
            partition.roll()


class Server:
    """`compactlog serve` with automatic compaction off and the admin API on; `compaction`
    adds lines to the `[compaction]` table of its config file."""

    def __init__(self, data: Path, keep_warm_s: float, compaction: str = "") -> None:
        config = data.parent / f"server-{keep_warm_s:g}.toml"
        config.write_text(f"[compaction]\nenabled = false\nkeep_warm_s = {keep_warm_s}\n"
                          f"{compaction}")
        self.log = (data.parent / f"server-{keep_warm_s:g}.log").open("w")
        self.process = subprocess.Popen(
            [COMPACTLOG, "--data-dir", str(data), "--log-level", "info", "serve", "--listen",
             "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--config", str(config)],
            stdout=subprocess.PIPE, stderr=self.log, text=True)
        assert self.process.stdout is not None
        self.kafka = _found(r"serving on ([\d.]+:\d+)", self.process.stdout.readline())
        self.admin = _found(r"admin on (http://\S+)", self.process.stdout.readline())

    def call(self, method: str, path: str) -> Any:
        body = b"{}" if method == "POST" else None
        request = urllib.request.Request(self.admin + path, data=body, method=method)
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.loads(response.read())

    def compact(self, topic: str = TOPIC) -> tuple[float, dict[str, Any]]:
        began = time.monotonic()
        run = self.call("POST", f"/v1/topics/{topic}/compaction")
        while run["state"] == "RUNNING":
            time.sleep(0.1)
            run = self.call("GET", f"/v1/compactions/{run['id']}")
        if run["state"] != "SUCCESS":
            raise SystemExit(f"run failed: {run['error']}")
        return time.monotonic() - began, run["report"]

    def produce(self, count: int, keys: int) -> None:
        producer = Producer({"bootstrap.servers": self.kafka, "linger.ms": 20})
        for i in range(count):
            producer.produce(TOPIC, b"y" * 100, b"k%08d" % (i % keys))
            if i % 10_000 == 0:
                producer.poll(0)
        if producer.flush(120):
            raise SystemExit("records left unacknowledged")

    def wait_sealed(self) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            parts = self.call("GET", f"/v1/topics/{TOPIC}")["partitions"]
            if all(p["dirty_bytes"] for p in parts):
                return
            time.sleep(0.2)
        raise SystemExit("the new records were not sealed within 60 s")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(120)
        self.log.close()


def _found(pattern: str, line: str) -> str:
    match = re.search(pattern, line)
    if not match:
        raise SystemExit(f"the server did not start: {line!r}")
    return match.group(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--new", type=int, default=100_000,
                        help="records produced between the two runs")
    parser.add_argument("--partitions", type=int, default=4)
    args = parser.parse_args()
    info = machine_info()
    print(f"warm compaction bench, {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC; "
          f"{info['cpu']}, {info['cores']} cores; {args.records:,} records, {args.keys:,} "
          f"keys, then {args.new:,} more", flush=True)
    rows = []
    base = Path(tempfile.mkdtemp(prefix="warm-bench-"))
    try:
        for keep_warm_s in (300.0, 0.0):
            data = base / f"data-{keep_warm_s:g}"
            generate(data, args.records, args.keys, args.partitions)
            server = Server(data, keep_warm_s)
            try:
                first_s, first = server.compact()
                server.produce(args.new, args.keys)
                server.wait_sealed()
                second_s, second = server.compact()
            finally:
                server.stop()
            mode = "warm worker" if keep_warm_s else "process per run"
            for name, seconds, report in (("first", first_s, first),
                                          ("second", second_s, second)):
                records_in = sum(p["records_in"] for p in report["partitions"])
                rows.append((mode, name, seconds, report["startup_s"], records_in))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print("\n| mode | run | wall s | Spark start-up s | records in |")
    print("|---|---|---:|---:|---:|")
    for mode, name, seconds, startup, records_in in rows:
        print(f"| {mode} | {name} | {seconds:.2f} | {startup:.2f} | {records_in:,} |")
    warm = next(r[2] for r in rows if r[0] == "warm worker" and r[1] == "second")
    cold = next(r[2] for r in rows if r[0] == "process per run" and r[1] == "second")
    print(f"\nsecond run: process per run / warm worker = {cold / warm:.1f}x")


if __name__ == "__main__":
    main()
