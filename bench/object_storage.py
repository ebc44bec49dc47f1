"""Object storage: produce, seal and compaction on S3 (moto on loopback) against the local
backend, in one run on the same data, with the S3 requests each phase sends.

What is measured, for each backend, on identical generated records (N records over K
keys, V-byte random values, a share of tombstones, P partitions; the same numpy streams
for both backends):

- append: `LogStore.append` of 1,000-record batches, with sealing off
  (`store.auto_seal = False`), so this is the local log alone on both backends;
- seal: `roll()` and `seal_rolled()` of every partition: the rolled log segments written
  as Parquet and, on S3, uploaded (create-only PUT) and committed into the manifest
  (conditional PUT). Every topic is produced and sealed twice (topics `bench-1`,
  `bench-2`), the backends alternating, so each figure has two samples;
- full compaction with `SparkCompactionService` on one SparkSession (`local[2]` by
  default) started once, before anything is timed, and warmed (one task per core imports
  the Arrow pipeline): run 1 compacts `bench-1` of each backend, run 2 `bench-2` (warm);
- incremental compaction: `--incremental-percent` more records appended to `bench-2` and
  sealed, then `compact()` again;
- read: the whole compacted view of `bench-2` through `Partition.compacted.read_table`;
- an upload floor (a baseline for sealing on S3, in the same run): boto3 create-only
  PUTs, through the same proxy to the same moto, of as many objects of the same sizes as
  `bench-2`'s sealed segments, and nothing else.

Requests are counted by a small HTTP proxy in front of moto (this file's CountingProxy),
so the requests of Spark's Python workers (separate processes) are counted as well as the
driver's. Each is classed as PUT (UploadPart and CopyObject included), GET, HEAD, LIST,
DELETE (DeleteObjects included) or POST (multipart create and complete), and by what the
key is (manifest, segment, ledger file, ...), with its status.

Invariant: every result is verified. After each compaction the compacted view of every
partition, read back through the store, must hold exactly the latest record of every key
(tombstones included: delete.retention.ms is a day), checked against an oracle folded in
Python from the generated records: the number of keys, the number of tombstones and an
order-independent hash of the (key, value) pairs. Any difference exits with status 1.

moto on loopback measures the protocol's overhead (how many requests, how many copies
and how much signing and HTTP work), not a real store's latency or bandwidth: a real
store adds tens of milliseconds per request and its own bandwidth. The request counts
are what a bill is made of: requests per MB sealed, times the store's price per request.

    .venv/bin/python bench/object_storage.py                       # 1 M records
    .venv/bin/python bench/object_storage.py --records 100000 --keys 10000 --json out.json
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import http.client
import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from compaction import BATCH, CHUNK, Draws, Workload, topic_config
from compactlog import LogStore
from compactlog.backend.s3.settings import S3Settings
from compactlog.compaction.spark_service import (
    SparkCompactionService,
    SparkCompactionServiceFactory,
)
from machine_info import machine_info

BUCKET = "compactlog-bench"
PREFIX = "bench"
TOPICS = ("bench-1", "bench-2")
KINDS = ("PUT", "GET", "HEAD", "LIST", "DELETE", "POST")
HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te",
              "trailer", "upgrade", "proxy-authorization", "proxy-authenticate"}
# Fake credentials for the moto server: nothing real is ever used or printed.
MOTO_ENV = {"AWS_ACCESS_KEY_ID": "AKIAMOTOBENCHKEY0001", "AWS_SECRET_ACCESS_KEY": "moto-bench",
            "AWS_REGION": "us-east-1"}


class VerificationError(Exception):
    """A compacted view differs from the oracle."""


# -- the counting proxy -------------------------------------------------------------------


def request_kind(method: str, key: str, query: dict[str, list[str]]) -> str:
    if method == "GET":
        return "GET" if key else "LIST"
    if method == "POST":
        return "DELETE" if "delete" in query else "POST"
    return method


def key_class(key: str) -> str:
    """What an object key is, without its ids: 'topics/<t>/<id>/<n>/segments/*.parquet'."""
    parts = key.split("/")
    if parts and parts[0] == PREFIX:
        parts = parts[1:]
    out: list[str] = []
    for index, part in enumerate(parts):
        if index == 1 and out and out[0] == "topics":
            out.append("<topic>")
        elif re.fullmatch(r"[0-9a-f-]{16,}", part):
            out.append("<id>")
        elif part.isdigit():
            out.append("<n>")
        else:
            out.append(re.sub(r"[0-9a-f]{6,}|\d+", "*", part))
    return "/".join(out) or "(bucket)"


@dataclass
class Seen:
    kind: str
    method: str
    key: str
    status: int
    sent: int  # request body bytes
    received: int  # response body bytes


class CountingProxy:
    """An HTTP proxy on 127.0.0.1 that forwards every request to moto unchanged (headers
    and body as sent, so SigV4 signatures verify) and records it."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.seen: list[Seen] = []
        self.lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def handle_one_request(self) -> None:
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    super().handle_one_request()

            def forward(self) -> None:
                proxy.forward(self)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = forward

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        host, port = self.httpd.server_address[:2]
        self.endpoint_url = f"http://{host!s}:{port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="s3-counter",
                                       daemon=True)
        self.thread.start()

    def forward(self, handler: BaseHTTPRequestHandler) -> None:
        headers = {k: v for k, v in handler.headers.items() if k.lower() not in HOP_BY_HOP}
        body = read_body(handler)
        connection = http.client.HTTPConnection(*self.upstream, timeout=120)
        try:
            connection.putrequest(handler.command, handler.path, skip_host=True,
                                  skip_accept_encoding=True)
            for name, value in headers.items():
                if name.lower() != "content-length":
                    connection.putheader(name, value)
            if body or handler.command in ("PUT", "POST"):
                connection.putheader("Content-Length", str(len(body)))
            connection.endheaders(body or None)
            response = connection.getresponse()
            answer = response.read()
            status, reason, answer_headers = response.status, response.reason, \
                response.getheaders()
        finally:
            connection.close()
        parts = urlsplit(handler.path)
        _, _, key = parts.path.lstrip("/").partition("/")
        query = parse_qs(parts.query, keep_blank_values=True)
        kind = request_kind(handler.command, unquote(key), query)
        if kind == "LIST":  # a LIST names its prefix in the query
            key = query.get("prefix", [""])[0] + "<list>"
        with self.lock:
            self.seen.append(Seen(kind, handler.command, unquote(key), status, len(body),
                                  len(answer)))
        handler.send_response_only(status, reason)
        for name, value in answer_headers:
            if name.lower() not in HOP_BY_HOP:
                handler.send_header(name, value)
        if handler.command != "HEAD" and not any(
                n.lower() == "content-length" for n, _ in answer_headers):
            handler.send_header("Content-Length", str(len(answer)))
        handler.end_headers()
        if handler.command != "HEAD":
            handler.wfile.write(answer)

    def mark(self) -> int:
        with self.lock:
            return len(self.seen)

    def since(self, mark: int) -> list[Seen]:
        with self.lock:
            return list(self.seen[mark:])

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=10)


def read_body(handler: BaseHTTPRequestHandler) -> bytes:
    if handler.headers.get("Transfer-Encoding", "").lower() == "chunked":
        chunks: list[bytes] = []
        while True:
            size = int(handler.rfile.readline().split(b";")[0].strip(), 16)
            if size == 0:
                while handler.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return b"".join(chunks)
            chunks.append(handler.rfile.read(size))
            handler.rfile.readline()
    length = int(handler.headers.get("Content-Length") or 0)
    return handler.rfile.read(length) if length else b""


@dataclass
class Requests:
    """The requests of one phase: by kind, and by (kind, key class, status)."""

    by_kind: dict[str, int]
    detail: dict[str, int]
    bytes_sent: int
    bytes_received: int

    @classmethod
    def of(cls, seen: list[Seen]) -> Requests:
        kinds = Counter(s.kind for s in seen)
        detail = Counter(f"{s.kind} {key_class(s.key)} -> {s.status}" for s in seen)
        return cls({kind: kinds.get(kind, 0) for kind in KINDS},
                   dict(sorted(detail.items(), key=lambda item: -item[1])),
                   sum(s.sent for s in seen), sum(s.received for s in seen))

    @property
    def total(self) -> int:
        return sum(self.by_kind.values())


# -- the oracle -----------------------------------------------------------------------------


@dataclass
class Oracle:
    """The latest value of every key (None: a tombstone), folded from the records."""

    latest: dict[bytes, bytes | None] = field(default_factory=dict)

    def fold(self, keys: list[bytes], values: list[bytes | None]) -> None:
        self.latest.update(zip(keys, values, strict=True))

    def summary(self) -> tuple[int, int, str]:
        return view_summary(self.latest.items())


def view_summary(pairs: Any) -> tuple[int, int, str]:
    """(keys, tombstones, hash): the hash is a sum of per-pair digests, so order-free."""
    total = count = tombstones = 0
    for key, value in pairs:
        count += 1
        if value is None:
            tombstones += 1
            digest = hashlib.blake2b(key + b"\x00T", digest_size=8).digest()
        else:
            digest = hashlib.blake2b(key + b"\x00V" + value, digest_size=8).digest()
        total = (total + int.from_bytes(digest, "big")) % 2**64
    return count, tombstones, f"{total:016x}"


def read_view(store: LogStore, topic: str) -> tuple[int, int, str]:
    pairs: list[tuple[bytes, bytes | None]] = []
    for partition in store.topic(topic).partitions:
        offset = 0
        while True:
            table = partition.compacted.read_table(offset, 100_000, 1 << 30)
            if not table.num_rows:
                break
            pairs.extend(zip(table.column("key").to_pylist(), table.column("value").to_pylist(),
                             strict=True))
            offset = table.column("offset")[-1].as_py() + 1
    if len({key for key, _ in pairs}) != len(pairs):
        raise VerificationError(f"{topic}: a key appears twice in the compacted view")
    return view_summary(pairs)


# -- the run ------------------------------------------------------------------------------


@dataclass
class Phase:
    backend: str  # "local" or "s3"
    name: str
    seconds: float
    records: int
    mb: float  # sealed Parquet MB this phase wrote or read (0 where none)
    requests: Requests | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        body = asdict(self)
        if self.requests is not None:
            body["requests"]["total"] = self.requests.total
        return body


@dataclass
class Backend:
    name: str
    store: LogStore


def sealed_bytes(store: LogStore, topic: str) -> tuple[int, int]:
    """(segments, bytes) of the topic's sealed Parquet files, from the manifests."""
    count = size = 0
    for partition in store.topic(topic).partitions:
        partition.refresh()
        for segment in partition.manifest.segments:
            count += 1
            size += segment.size_bytes
    return count, size


class Bench:
    def __init__(self, args: argparse.Namespace, proxy: CountingProxy, scratch: Path) -> None:
        self.args = args
        self.proxy = proxy
        self.scratch = scratch
        self.workload = Workload(args.records, args.keys, args.value_bytes, args.tombstones,
                                 "uniform", 1.0, args.partitions, args.seed)
        self.phases: list[Phase] = []
        self.oracles: dict[str, Oracle] = {}
        self.verified: list[dict[str, Any]] = []

    def measure(self, backend: Backend, name: str) -> _Measure:
        return _Measure(self, backend, name)

    def config(self) -> dict[str, str]:
        config = topic_config(self.workload)
        config["segment.bytes"] = str(self.args.segment_bytes)
        return config

    def produce(self, backend: Backend, topic: str, draws: Draws, count: int,
                oracle: Oracle | None, label: str) -> None:
        """Append `count` records (timed without the draws), then roll and seal."""
        store = backend.store
        append_s = 0.0
        mark = self.proxy.mark()
        for start in range(0, count, CHUNK):
            records = draws.records(min(CHUNK, count - start))
            if oracle is not None:
                oracle.fold([r.key or b"" for r in records], [r.value for r in records])
            began = time.perf_counter()
            for low in range(0, len(records), BATCH):
                store.append(topic, records[low:low + BATCH])
            append_s += time.perf_counter() - began
        self.record(Phase(backend.name, f"append {label}", append_s, count, 0.0,
                          self.requests(backend, mark)))
        before_segments, before = sealed_bytes(store, topic)
        with self.measure(backend, f"seal {label}") as phase:
            for partition in store.topic(topic).partitions:
                partition.roll()
                partition.seal_rolled()
        segments, after = sealed_bytes(store, topic)
        phase.records, phase.mb = count, (after - before) / 1e6
        phase.extra["segments"] = segments - before_segments

    def upload_floor(self, backend: Backend, topic: str) -> None:
        """The transport's floor for a seal: boto3 create-only PUTs, through the same
        proxy, of files of the sizes `topic`'s sealed segments have, and nothing else
        (no Parquet writing, no manifest commit)."""
        sizes = [segment.size_bytes for partition in backend.store.topic(topic).partitions
                 for segment in partition.manifest.segments]
        data = os.urandom(max(sizes))
        client = S3Settings.from_env().boto3_client()
        with self.measure(backend, "upload floor: boto3 PUTs, same sizes") as phase:
            for index, size in enumerate(sizes):
                client.put_object(Bucket=BUCKET, Key=f"floor/{index:04d}.bin",
                                  Body=data[:size], IfNoneMatch="*")
        phase.mb = sum(sizes) / 1e6

    def requests(self, backend: Backend, mark: int) -> Requests | None:
        return Requests.of(self.proxy.since(mark)) if backend.name == "s3" else None

    def record(self, phase: Phase) -> None:
        self.phases.append(phase)
        line = (f"{phase.backend:5} {phase.name:34} {phase.seconds:8.2f} s")
        if phase.records:
            line += f" {phase.records / phase.seconds:12,.0f} records/s"
        if phase.mb:
            line += f" {phase.mb / phase.seconds:8.1f} MB/s ({phase.mb:,.1f} MB)"
        if phase.requests is not None:
            line += "  requests " + " ".join(f"{k} {v}" for k, v in
                                             phase.requests.by_kind.items() if v)
        print(line, flush=True)

    def verify(self, backend: Backend, topic: str, oracle: Oracle, after: str) -> None:
        with self.measure(backend, f"read compacted view, {after}") as phase:
            got = read_view(backend.store, topic)
        want = oracle.summary()
        phase.records = got[0]
        if got != want:
            raise VerificationError(f"{backend.name} {topic} after {after}: compacted view "
                                    f"(keys, tombstones, hash) {got}, expected {want}")
        self.verified.append({"backend": backend.name, "topic": topic, "after": after,
                              "keys": got[0], "tombstones": got[1], "hash": got[2]})

    def compact(self, backend: Backend, topic: str, session: Any, name: str,
                records_in: int) -> None:
        service = SparkCompactionService(backend.store, topic, {"spark.session": session})
        with self.measure(backend, name) as phase:
            report = service.compact()
        phase.records = report.total("records_in")
        phase.mb = report.total("bytes_in") / 1e6
        phase.extra = {"stages": dict(report.stages),
                       "records_out": report.total("records_out"),
                       "bytes_out": report.total("bytes_out")}
        if phase.records != records_in:
            raise VerificationError(f"{backend.name} {name}: {phase.records} records in, "
                                    f"expected {records_in}")


class _Measure:
    def __init__(self, bench: Bench, backend: Backend, name: str) -> None:
        self.bench, self.backend = bench, backend
        self.phase = Phase(backend.name, name, 0.0, 0, 0.0)

    def __enter__(self) -> Phase:
        self.mark = self.bench.proxy.mark()
        self.began = time.perf_counter()
        return self.phase

    def __exit__(self, kind: object, *rest: object) -> None:
        self.phase.seconds = time.perf_counter() - self.began
        self.phase.requests = self.bench.requests(self.backend, self.mark)
        if kind is None:
            self.bench.record(self.phase)


def load() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def java_version() -> str:
    try:
        done = subprocess.run(["java", "-version"], capture_output=True, text=True,
                              timeout=30)
    except OSError as error:
        return f"unavailable ({error})"
    text = done.stderr or done.stdout
    return text.splitlines()[0] if text else "?"


def run(args: argparse.Namespace, scratch: Path, endpoint: str,
        proxy: CountingProxy) -> Bench:
    bench = Bench(args, proxy, scratch)
    workload = bench.workload
    local = LogStore.open(scratch / "local-data")
    s3 = LogStore.open(f"s3://{BUCKET}/{PREFIX}", local_dir=scratch / "s3-local")
    backends = [Backend("local", local), Backend("s3", s3)]
    session = None
    try:
        for backend in backends:
            backend.store.auto_seal = False  # appends never seal: sealing is its own phase
        for number, topic in enumerate(TOPICS, 1):
            for backend in backends:
                with bench.measure(backend, f"create topic {number}"):
                    backend.store.create_topic(topic, workload.partitions, bench.config())
                oracle = bench.oracles.setdefault(topic, Oracle())
                fold = oracle if backend.name == "local" else None
                bench.produce(backend, topic, Draws(workload, stream=1), workload.records,
                              fold, f"#{number}")
        bench.upload_floor(backends[1], TOPICS[1])
        print(f"\nstarting Spark ({args.spark_master}) and warming its Python workers; "
              f"load {load()}", flush=True)
        began = time.perf_counter()
        session = SparkCompactionServiceFactory().start_session(
            {"spark.master": args.spark_master})
        print(f"Spark started in {time.perf_counter() - began:.1f} s (not measured)\n",
              flush=True)
        for number, topic in enumerate(TOPICS, 1):
            for backend in backends:
                name = f"full compaction #{number}" + (" (warm)" if number > 1 else "")
                bench.compact(backend, topic, session, name, workload.records)
                bench.verify(backend, topic, bench.oracles[topic], f"full #{number}")
        count = max(1, int(workload.records * args.incremental_percent / 100))
        oracle = bench.oracles[TOPICS[1]]
        ledger = oracle.summary()[0]
        for backend in backends:
            fold = oracle if backend.name == "local" else None
            bench.produce(backend, TOPICS[1], Draws(workload, stream=2), count, fold,
                          f"+{args.incremental_percent:g}%")
        for backend in backends:
            bench.compact(backend, TOPICS[1], session,
                          f"incremental compaction +{args.incremental_percent:g}%",
                          ledger + count)
            bench.verify(backend, TOPICS[1], oracle, "incremental")
    finally:
        if session is not None:
            session.stop()
        local.close()
        s3.close()
    return bench


# -- reporting ----------------------------------------------------------------------------

TABLE_PHASES = ("append #1", "append #2", "seal #1", "seal #2", "full compaction #1",
                "full compaction #2 (warm)", "read compacted view, full #2")


def summarize(bench: Bench) -> dict[str, Any]:
    by = {(p.backend, p.name): p for p in bench.phases}
    names = [p.name for p in bench.phases if p.backend == "s3"
             and not p.name.startswith("create topic")]
    rows = []
    for name in names:
        local, s3 = by.get(("local", name)), by[("s3", name)]
        if s3.requests is None:
            continue
        local_s = None if local is None else local.seconds
        rows.append({
            "phase": name, "local_s": local_s, "s3_s": s3.seconds,
            "s3_over_local": s3.seconds / local_s if local_s else None,
            "records": s3.records, "mb": s3.mb,
            "local_records_per_s": local.records / local_s
            if local and local.records and local_s else None,
            "s3_records_per_s": s3.records / s3.seconds if s3.records else None,
            "local_mb_per_s": local.mb / local_s if local and local.mb and local_s else None,
            "s3_mb_per_s": s3.mb / s3.seconds if s3.mb else None,
            "requests": s3.requests.by_kind, "requests_total": s3.requests.total,
            "uploaded_mb": s3.requests.bytes_sent / 1e6,
            "downloaded_mb": s3.requests.bytes_received / 1e6,
        })
    seals = [by[("s3", f"seal #{n}")] for n in (1, 2)]
    seal_requests = sum(p.requests.total for p in seals if p.requests)
    seal_records = sum(p.records for p in seals)
    seal_mb = sum(p.mb for p in seals)
    per = {
        "requests_per_record_sealed": seal_requests / seal_records,
        "requests_per_mb_sealed": seal_requests / seal_mb,
        "put_per_mb_sealed": sum(p.requests.by_kind["PUT"] for p in seals
                                 if p.requests) / seal_mb,
        "requests_per_full_compaction": by[("s3", "full compaction #2 (warm)")].requests,
    }
    return {"rows": rows, "per": per}


def print_summary(summary: dict[str, Any]) -> None:
    print(f"\n{'phase':38} {'local s':>8} {'S3 s':>8} {'S3/local':>8} {'MB':>7} "
          f"{'local MB/s':>10} {'S3 MB/s':>8} "
          + " ".join(f"{k:>6}" for k in KINDS) + f" {'up MB':>7} {'down MB':>7}")

    def number(value: float | None, width: int, digits: int = 2) -> str:
        return " " * width if value is None else f"{value:{width}.{digits}f}"

    for row in summary["rows"]:
        print(f"{row['phase']:38} {number(row['local_s'], 8)} {row['s3_s']:8.2f} "
              f"{number(row['s3_over_local'], 8)} {row['mb']:7.1f} "
              f"{number(row['local_mb_per_s'], 10, 1)} {number(row['s3_mb_per_s'], 8, 1)} "
              + " ".join(f"{row['requests'][k]:6}" for k in KINDS)
              + f" {row['uploaded_mb']:7.1f} {row['downloaded_mb']:7.1f}")
    per = summary["per"]
    print(f"\nseal: {per['requests_per_record_sealed'] * 1e6:,.1f} S3 requests per million "
          f"records sealed, {per['requests_per_mb_sealed']:.3f} per MB sealed "
          f"({per['put_per_mb_sealed']:.3f} PUTs per MB): multiply by your store's price "
          "per request")
    full = per["requests_per_full_compaction"]
    print(f"full compaction (warm run): {full.total} requests: "
          + ", ".join(f"{k} {v}" for k, v in full.by_kind.items() if v))
    print("upload floor: boto3 create-only PUTs of the sealed segments' sizes through the "
          "same proxy and nothing else: what the transport alone costs a seal here")
    print("note: moto on loopback measures the protocol's overhead (requests, copies, "
          "signing, HTTP), not a real store's latency (tens of ms per request) or "
          "bandwidth")


def print_detail(bench: Bench) -> None:
    print("\nrequests by phase, kind, key and status (S3 backend):")
    for phase in bench.phases:
        if phase.requests is None or not phase.requests.total:
            continue
        print(f"  {phase.name}:")
        for what, count in phase.requests.detail.items():
            print(f"    {count:6}  {what}")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--tombstones", type=float, default=1.0, metavar="PCT")
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--segment-bytes", type=int, default=8 * 1024 * 1024,
                        help="segment.bytes: with the defaults, 8 segments per partition")
    parser.add_argument("--incremental-percent", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--spark-master", default="local[2]")
    parser.add_argument("--detail", action="store_true",
                        help="print every phase's requests by key and status")
    parser.add_argument("--json", type=Path, default=None, help="write all results here")
    args = parser.parse_args()
    if min(args.records, args.keys, args.value_bytes, args.partitions) < 1:
        parser.error("--records, --keys, --value-bytes and --partitions must be >= 1")
    return args


def main() -> None:
    args = parse_args()
    import pyarrow as pa
    import pyspark
    from moto.server import ThreadedMotoServer

    started = datetime.datetime.now(datetime.UTC)
    command = shlex.join([sys.executable, *sys.argv])
    info = {**machine_info(), "pyarrow": pa.__version__, "spark": pyspark.__version__,
            "java": java_version()}
    load_before = load()
    print(f"object storage bench, {started:%Y-%m-%d %H:%M:%S} UTC\ncommand: {command}")
    print(f"machine: {info['cpu']}, {info['cores']} cores, {info['memory']}, {info['os']}")
    print(f"software: Python {info['python']}, Spark {info['spark']}, {info['java']}, "
          f"pyarrow {info['pyarrow']}; load average {load_before}")
    workload = Workload(args.records, args.keys, args.value_bytes, args.tombstones,
                        "uniform", 1.0, args.partitions, args.seed)
    print(f"workload: {workload.describe()}; segment.bytes {args.segment_bytes:,}\n",
          flush=True)

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's per-request log lines
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    proxy: CountingProxy | None = None
    scratch = Path(tempfile.mkdtemp(prefix="object-storage-bench-"))
    saved = {name: os.environ.get(name) for name in
             [*MOTO_ENV, "AWS_ENDPOINT_URL", "AWS_SESSION_TOKEN"]}
    try:
        host, port = moto.get_host_and_port()
        proxy = CountingProxy((host, int(port)))
        # The store, and Spark's Python workers (which inherit this environment), reach
        # moto through the proxy.
        os.environ.update({**MOTO_ENV, "AWS_ENDPOINT_URL": proxy.endpoint_url})
        os.environ.pop("AWS_SESSION_TOKEN", None)
        S3Settings.from_env().boto3_client().create_bucket(Bucket=BUCKET)
        try:
            bench = run(args, scratch, proxy.endpoint_url, proxy)
        except VerificationError as error:
            print(f"\nVERIFICATION FAILED: {error}", file=sys.stderr, flush=True)
            raise SystemExit(1) from None
    finally:
        if proxy is not None:
            proxy.stop()
        moto.stop()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        shutil.rmtree(scratch, ignore_errors=True)
    print("\nverified: after every compaction, each backend's compacted view holds exactly "
          "the latest record of every key (count, tombstones and hash against a Python "
          "fold of the generated records)")
    summary = summarize(bench)
    print_summary(summary)
    if args.detail:
        print_detail(bench)
    load_after = load()
    print(f"load average: {load_before} at the start, {load_after} at the end")
    if args.json:
        per = dict(summary["per"])
        full = per["requests_per_full_compaction"]
        per["requests_per_full_compaction"] = {**full.by_kind, "total": full.total}
        args.json.write_text(json.dumps({
            "date": started.isoformat(), "command": command, "machine": info,
            "load_before": load_before, "load_after": load_after,
            "workload": {**asdict(workload), "segment_bytes": args.segment_bytes,
                         "incremental_percent": args.incremental_percent},
            "phases": [phase.to_json() for phase in bench.phases],
            "table": summary["rows"], "per": per, "verified": bench.verified,
        }, indent=2, default=str))
        print(f"results written to {args.json}")


if __name__ == "__main__":
    main()
