"""`compactlog compact` of the demo topic: cold (Spark starts in the command), with and
without the driver JVM's class archive (compaction/spark_class_archive.py; the two
interleaved), against a warm worker left by `compactlog worker start`, in the same run.

Each case gets the demo's topic afresh (examples/demo.py's produce(): 300,000 price
updates for 3,000 symbols in 4 partitions), then times the whole `compactlog compact`
command (wall clock, as a user waits for it) and reads the run's own report. Every run's
compacted view is checked against the latest value per key that produce() returned.

    .venv/bin/python bench/cli_warm_worker.py [--runs 3] [--dir /tmp/cli-bench]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))

from demo import TOPIC, produce  # type: ignore[import-not-found]  # noqa: E402

from compactlog import LogStore  # noqa: E402
from compactlog.compaction.spark_class_archive import (  # noqa: E402
    ENABLED_CONF,
    java_options,
)

COMPACTLOG = str(Path(sys.executable).with_name("compactlog"))


def fresh_topic(data: Path) -> dict[bytes, bytes]:
    with LogStore.open(data) as store:
        if TOPIC in store.list_topics():
            store.delete_topic(TOPIC)
        store.create_topic(TOPIC, 4, {"cleanup.policy": "compact",
                                      "segment.bytes": str(256 * 1024),
                                      "flush.messages": str(2**63 - 1)})
        expected: dict[bytes, bytes] = produce(store, 3000, 300_000)
    return expected


def compacted_view(data: Path) -> dict[bytes, bytes]:
    latest: dict[bytes, bytes | None] = {}
    with LogStore.open(data, read_only=True) as store:
        for partition in store.topic(TOPIC).partitions:
            for record in partition.read_compacted(0, 10_000_000):
                assert record.key is not None
                latest[record.key] = record.value
    return {key: value for key, value in latest.items() if value is not None}


def timed_compact(data: Path, expected: dict[bytes, bytes],
                  extra: tuple[str, ...] = ()) -> dict[str, Any]:
    started = time.perf_counter()
    done = subprocess.run([COMPACTLOG, "--data-dir", str(data), "compact", TOPIC, "--json",
                           *extra], capture_output=True, text=True, check=True)
    wall = time.perf_counter() - started
    report = json.loads(done.stdout)
    if compacted_view(data) != expected:
        raise SystemExit("the compacted view is not the latest value per key")
    return {"wall_s": wall, "duration_s": report["duration_s"],
            "startup_s": report["startup_s"],
            "records_in": sum(p["records_in"] for p in report["partitions"]),
            "on_worker": "warm compaction worker" in done.stderr}


def ensure_class_archive(data: Path) -> float:
    """Make sure the driver JVM's class archive exists: a cold command writes it at its
    JVM's exit, and the next start promotes it. The seconds this took."""
    started = time.perf_counter()
    if not any("SharedArchiveFile" in option for option in java_options()):
        timed_compact(data, fresh_topic(data))
        while not any("SharedArchiveFile" in option for option in java_options()):
            if time.perf_counter() - started > 600:
                raise SystemExit("no class archive after 600 s")
            time.sleep(5)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per case")
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory")
    args = parser.parse_args()
    scratch = args.dir or Path(tempfile.mkdtemp(prefix="cli-bench-"))
    data = scratch / "data"
    shutil.rmtree(data, ignore_errors=True)
    results: dict[str, list[dict[str, Any]]] = {
        "cold, no class archive": [], "cold": [], "warm worker": []}
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    waited = ensure_class_archive(data)
    print(f"class archive ready ({waited:.0f} s spent writing it)")
    for _ in range(args.runs):
        results["cold, no class archive"].append(timed_compact(
            data, fresh_topic(data), ("--spark-conf", f"{ENABLED_CONF}=false")))
        results["cold"].append(timed_compact(data, fresh_topic(data)))
    started = time.perf_counter()
    subprocess.run([COMPACTLOG, "--data-dir", str(data), "worker", "start"], check=True,
                   capture_output=True)
    worker_start_s = time.perf_counter() - started
    try:
        for _ in range(args.runs):
            results["warm worker"].append(timed_compact(data, fresh_topic(data)))
    finally:
        subprocess.run([COMPACTLOG, "--data-dir", str(data), "worker", "stop"], check=True,
                       capture_output=True)
    assert all(not r["on_worker"] for r in results["cold"] + results["cold, no class archive"])
    assert all(r["on_worker"] for r in results["warm worker"])
    print(f"worker start (Spark warm-up included): {worker_start_s:.1f} s")
    print("| case | runs | wall, whole command (s) | compaction in the report (s) | "
          "Spark start-up (s) | records |")
    print("|---|---:|---|---|---|---:|")
    for case, runs in results.items():
        print(f"| {case} | {len(runs)} | "
              + " / ".join(f"{r['wall_s']:.2f}" for r in runs) + " | "
              + " / ".join(f"{r['duration_s']:.2f}" for r in runs) + " | "
              + " / ".join(f"{r['startup_s']:.1f}" for r in runs) + " | "
              + f"{runs[0]['records_in']:,} |")
    best_cold = min(r["wall_s"] for r in results["cold"])
    best_warm = min(r["wall_s"] for r in results["warm worker"])
    print(f"best wall: cold {best_cold:.2f} s, warm {best_warm:.2f} s "
          f"({best_cold / best_warm:.1f}x); load average at end: {os.getloadavg()[0]:.2f}")
    if args.dir is None:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
