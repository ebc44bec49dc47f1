"""Produce and consume throughput of `compactlog serve` over SASL_SSL against PLAINTEXT,
in the same run, on the same server.

One server (a subprocess on a fresh data directory) has two listeners: PLAINTEXT and
SASL_SSL (TLS with a certificate from a CA made here with `cryptography`, SCRAM users
made with `compactlog users add`). For each round and each case (PLAINTEXT; SASL_SSL
with SCRAM-SHA-512; SASL_SSL with PLAIN, whose every login derives the SCRAM keys) a
confluent-kafka producer sends N keyed records to a topic of its own (fsync left to the
OS, so the disk does not hide the network's cost), timed from the first produce() to the
end of flush(); then a consumer assigned every partition reads them back, timed from
assign() to the N-th record. The cases alternate within each round, so a drift of the
machine hits them alike. The server's CPU time per record comes from psutil.

bench/server.py measures the PLAINTEXT paths in depth (baselines, flush policies,
sealing); this bench measures only what security adds. The module stands alone
(bench/server.py is at its size limit).

    .venv/bin/python bench/server_security.py                   # 500k records, 2 rounds
    .venv/bin/python bench/server_security.py --records 100000 --json out.json
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]  # psutil ships no type information
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from machine_info import machine_info

COMPACTLOG = shutil.which("compactlog", path=str(Path(sys.executable).parent)) or "compactlog"
PASSWORD = "bench-password"
CASES = {"PLAINTEXT": None, "SASL_SSL SCRAM-SHA-512": "SCRAM-SHA-512",
         "SASL_SSL PLAIN": "PLAIN"}


def make_certificates(directory: Path) -> tuple[Path, Path, Path]:
    """A CA, and a server certificate for 127.0.0.1 it signs: (ca, cert, key)."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "bench CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(1)
          .not_valid_before(now - datetime.timedelta(days=1))
          .not_valid_after(now + datetime.timedelta(days=2))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(2)
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .sign(ca_key, hashes.SHA256()))
    paths = directory / "ca.pem", directory / "server.pem", directory / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return paths


class Server:
    """`compactlog serve` with a PLAINTEXT and a SASL_SSL listener on free ports."""

    def __init__(self, data_dir: Path, certs: tuple[Path, Path, Path], log: Path) -> None:
        subprocess.run([COMPACTLOG, "--data-dir", str(data_dir), "users", "add", "bench",
                        "--password-stdin"], input=PASSWORD + "\n", text=True, check=True,
                       capture_output=True)
        self._log = log.open("w")
        self.process = subprocess.Popen(
            [COMPACTLOG, "--data-dir", str(data_dir), "serve", "--no-auto-compaction",
             "--listen", "127.0.0.1:0", "--listener", "SASL_SSL://127.0.0.1:0",
             "--tls-cert", str(certs[1]), "--tls-key", str(certs[2])],
            stdout=subprocess.PIPE, stderr=self._log, text=True)
        assert self.process.stdout is not None
        self.addresses: dict[str, str] = {}
        while len(self.addresses) < 2:
            line = self.process.stdout.readline()
            if not line:
                raise RuntimeError(f"the server did not start; see {log}")
            match = re.search(r"listener (\w+) \(\w+\) on (\S+)", line)
            if match:
                self.addresses[match.group(1)] = match.group(2)
        self.ps = psutil.Process(self.process.pid)

    def cpu_s(self) -> float:
        times = self.ps.cpu_times()
        return float(times.user + times.system)

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(120)
        self._log.close()


def client_config(server: Server, ca: Path, mechanism: str | None) -> dict[str, Any]:
    if mechanism is None:
        return {"bootstrap.servers": server.addresses["PLAINTEXT"]}
    return {"bootstrap.servers": server.addresses["SASL_SSL"], "security.protocol": "SASL_SSL",
            "sasl.mechanism": mechanism, "sasl.username": "bench", "sasl.password": PASSWORD,
            "ssl.ca.location": str(ca)}


def run_case(server: Server, config: dict[str, Any], topic: str, args: argparse.Namespace,
             values: list[bytes]) -> dict[str, float]:
    admin = AdminClient(config)
    for future in admin.create_topics([NewTopic(
            topic, args.partitions, 1, config={"cleanup.policy": "compact",
                                               "flush.messages": str(2**63 - 1)})]).values():
        future.result(60)
    producer = Producer({**config, "acks": "1", "linger.ms": 20, "batch.size": 1_000_000,
                         "queue.buffering.max.messages": max(100_000, args.records),
                         "queue.buffering.max.kbytes": 2_097_151,
                         "delivery.report.only.error": True, "partitioner": "murmur2_random"})
    producer.list_topics(topic, timeout=30)
    cpu, start = server.cpu_s(), time.perf_counter()
    for index in range(args.records):
        while True:
            try:
                producer.produce(topic, values[index % len(values)], b"key-%08d" % index)
                break
            except BufferError:
                producer.poll(0.01)
        if index % 10_000 == 0:
            producer.poll(0)
    if producer.flush(300):
        raise RuntimeError("produce: records left undelivered")
    produce_s, produce_cpu = time.perf_counter() - start, server.cpu_s() - cpu
    consumer = Consumer({**config, "group.id": "bench", "enable.auto.commit": False,
                         "queued.min.messages": 1_000_000, "fetch.queue.backoff.ms": 10})
    try:
        consumer.list_topics(topic, timeout=30)
        cpu, start = server.cpu_s(), time.perf_counter()
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING)
                         for p in range(args.partitions)])
        count, last = 0, time.monotonic()
        while count < args.records:
            messages = consumer.consume(10_000, 1.0)
            if any(m.error() is not None for m in messages):
                raise RuntimeError(f"consume: {messages[0].error()}")
            count += len(messages)
            if messages:
                last = time.monotonic()
            elif time.monotonic() - last > 30:
                raise RuntimeError(f"consume stalled at {count} records")
        consume_s, consume_cpu = time.perf_counter() - start, server.cpu_s() - cpu
    finally:
        consumer.close()
    return {"produce_rps": args.records / produce_s, "consume_rps": args.records / consume_s,
            "produce_cpu_us": 1e6 * produce_cpu / args.records,
            "consume_cpu_us": 1e6 * consume_cpu / args.records}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=500_000, help="records per case")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None, help="also write results here")
    args = parser.parse_args()
    values = [os.urandom(args.value_bytes) for _ in range(1024)]
    results: dict[str, list[dict[str, float]]] = {name: [] for name in CASES}
    with tempfile.TemporaryDirectory(prefix="compactlog-bench-sec-") as temp:
        root = Path(temp)
        certs = make_certificates(root)
        server = Server(root / "data", certs, root / "server.log")
        try:
            for round_ in range(args.rounds):
                for index, (name, mechanism) in enumerate(CASES.items()):
                    config = client_config(server, certs[0], mechanism)
                    results[name].append(run_case(server, config, f"t{round_}-{index}", args,
                                                  values))
        finally:
            server.stop()
    record_mb = (args.value_bytes + 12) / 1e6
    print(f"{args.records:,} records of {args.value_bytes} B per case, {args.partitions} "
          f"partitions, best of {args.rounds} rounds\n")
    print("| case | produce records/s | MB/s | server µs/record | consume records/s | MB/s "
          "| server µs/record |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    summary: dict[str, dict[str, float]] = {}
    for name, runs in results.items():
        best_p = max(runs, key=lambda r: r["produce_rps"])
        best_c = max(runs, key=lambda r: r["consume_rps"])
        summary[name] = {"produce_rps": best_p["produce_rps"],
                         "produce_cpu_us": best_p["produce_cpu_us"],
                         "consume_rps": best_c["consume_rps"],
                         "consume_cpu_us": best_c["consume_cpu_us"]}
        print(f"| {name} | {best_p['produce_rps']:,.0f} | "
              f"{best_p['produce_rps'] * record_mb:.1f} | {best_p['produce_cpu_us']:.2f} | "
              f"{best_c['consume_rps']:,.0f} | {best_c['consume_rps'] * record_mb:.1f} | "
              f"{best_c['consume_cpu_us']:.2f} |")
    if args.json is not None:
        args.json.write_text(json.dumps({"machine": machine_info(), "args": vars(args) | {
            "json": str(args.json)}, "runs": results, "best": summary}, indent=2))


if __name__ == "__main__":
    main()
