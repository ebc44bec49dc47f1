"""What each acks level costs: produce latency and throughput of `compactlog serve` on an
s3:// location (moto on loopback), where acks=all is answered once the records are in
the bucket (the default, `ack_after_upload = true`) and acks=1 once they are on the
owner's disk, with acks=all from the disk (`ack_after_upload = false`) and a local data
directory as the baselines, in one run.

Each case is a fresh server (a subprocess) and topic. Latency: one record at a time,
acks=all, each produce() waited for (flush) before the next: the time from produce() to
its delivery report, p50/p95/p99. Throughput: N records sent as fast as the producer
batches them (linger.ms=5), from the first produce() to the end of flush(). Every
delivery report must be a success, and every record acknowledged to acks=all on s3://
must then be in the bucket (checked by reading it back from another local directory).

moto on loopback answers in well under a millisecond: the latency added here is the
upload interval (`upload_interval_s`) plus sealing and the commit's requests, not a real
store's round trips (tens of ms per request on AWS S3; a seal is about five of them).

    .venv/bin/python bench/ack_after_upload.py                      # 300 + 50k records
    .venv/bin/python bench/ack_after_upload.py --latency-records 100 --records 10000
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import signal
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic  # defined there; admin re-exports it untyped

ROOT = Path(__file__).resolve().parent.parent
COMPACTLOG = str(ROOT / ".venv" / "bin" / "compactlog")
BUCKET = "ack-bench"
# Fake credentials for the moto server: nothing real is ever used or printed.
MOTO_ENV = {"AWS_ACCESS_KEY_ID": "AKIAMOTOACKBENCH0001", "AWS_SECRET_ACCESS_KEY": "moto-ack",
            "AWS_REGION": "us-east-1"}


@contextmanager
def server(data: str, local: Path, env: dict[str, str], config: str) -> Iterator[str]:
    """A `compactlog serve` subprocess; yields its bootstrap address; SIGTERM at the end."""
    config_path = local.with_suffix(".toml")
    config_path.write_text(config)
    log_path = local.with_suffix(".log")
    with log_path.open("w") as log_file:
        process = subprocess.Popen(
            [COMPACTLOG, "--data-dir", data, "serve", "--listen", "127.0.0.1:0",
             "--no-auto-compaction", "--config", str(config_path)],
            stdout=subprocess.PIPE, stderr=log_file, text=True,
            env={**os.environ, **env, "COMPACTLOG_LOCAL_DIR": str(local)})
    assert process.stdout is not None
    line = process.stdout.readline()
    found = re.search(r"serving on ([\d.]+):(\d+)", line)
    try:
        if not found:
            raise RuntimeError(f"the server did not start: {log_path.read_text()[-2000:]}")
        yield f"{found.group(1)}:{found.group(2)}"
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(60)
        process.stdout.close()


def measure(bootstrap: str, topic: str, acks: str, latency_records: int,
            records: int) -> dict[str, Any]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    failures: list[str] = []
    latencies: list[float] = []
    producer = Producer({"bootstrap.servers": bootstrap, "acks": acks, "linger.ms": 0,
                         "enable.idempotence": False})
    for i in range(latency_records):
        started = time.perf_counter()
        producer.produce(topic, b"v" * 100, b"k%d" % i, on_delivery=lambda e, m: (
            failures.append(str(e)) if e else None))
        producer.flush(30)
        latencies.append(time.perf_counter() - started)
    batched = Producer({"bootstrap.servers": bootstrap, "acks": acks, "linger.ms": 5,
                        "enable.idempotence": False})
    started = time.perf_counter()
    for i in range(records):
        while True:
            try:
                batched.produce(topic, b"v" * 100, b"k%d" % (i % 1000), on_delivery=lambda e, m: (
                    failures.append(str(e)) if e else None))
                break
            except BufferError:
                batched.poll(0.01)
        batched.poll(0)
    batched.flush(120)
    seconds = time.perf_counter() - started
    if failures:
        raise RuntimeError(f"{len(failures)} deliveries failed, e.g. {failures[0]}")
    ms = sorted(x * 1000 for x in latencies)

    def pct(p: float) -> float:
        return ms[min(len(ms) - 1, int(p * len(ms)))]

    return {"p50_ms": statistics.median(ms), "p95_ms": pct(0.95), "p99_ms": pct(0.99),
            "records_per_s": records / seconds, "total": latency_records + records}


def check_in_bucket(url: str, topic: str, scratch: Path, expected: int) -> None:
    from compactlog import LogStore

    with LogStore.open(url, read_only=True, local_dir=scratch) as reader:
        found = sum(p.manifest.sealed_end_offset for p in reader.topic(topic).partitions)
    if found < expected:
        raise RuntimeError(f"only {found} of {expected} acknowledged records in the bucket")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--latency-records", type=int, default=300)
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--upload-interval-s", type=float, default=0.25)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    results: dict[str, Any] = {}
    try:
        host, port = moto.get_host_and_port()
        env = {**MOTO_ENV, "AWS_ENDPOINT_URL": f"http://{host}:{port}"}
        os.environ.update(env)
        import boto3

        boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"]).create_bucket(Bucket=BUCKET)
        scratch = Path(tempfile.mkdtemp(prefix="compactlog-ackbench-"))
        interval = f"upload_interval_s = {args.upload_interval_s}\n"
        # (name, data location, server config, acks, whether acks means "in the bucket")
        cases = [
            ("local, acks=all", str(scratch / "local-data"), "", "all", False),
            ("s3, acks=1 (disk)", f"s3://{BUCKET}/acks1", interval, "1", False),
            ("s3, acks=all (bucket)", f"s3://{BUCKET}/acksall", interval, "all", True),
            ("s3, acks=all from disk", f"s3://{BUCKET}/fromdisk",
             interval + "ack_after_upload = false\n", "all", False),
        ]
        for index, (name, data, config, acks, in_bucket) in enumerate(cases):
            with server(data, scratch / f"case{index}", env, config) as bootstrap:
                results[name] = measure(bootstrap, "t", acks, args.latency_records,
                                        args.records)
            if in_bucket:
                check_in_bucket(data, "t", scratch / f"check{index}", results[name]["total"])
    finally:
        moto.stop()
    base = results["local, acks=all"]
    print(f"{'case':28} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'records/s':>11} "
          f"{'vs local':>9}")
    for name, row in results.items():
        print(f"{name:28} {row['p50_ms']:8.1f} {row['p95_ms']:8.1f} {row['p99_ms']:8.1f} "
              f"{row['records_per_s']:11.0f} {row['records_per_s'] / base['records_per_s']:8.2f}x")
    print("note: moto on loopback; a real store adds its request latency to each upload")
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)},
                                         "results": results}, indent=2))


if __name__ == "__main__":
    main()
