"""The client examples in the docs put keys where compactlog does (issue 24, item 1).

compactlog's CLI, its Python API and Kafka's Java clients put a key in the partition
Kafka's murmur2 partitioner picks. librdkafka (so kcat and confluent-kafka) defaults to
`consistent_random` (CRC32): a key produced with plain `kcat -P` lands in another
partition than the same key produced with `compactlog produce`, and a compacted view
then keeps both records, the older one winning in its partition. So every producing
example sets librdkafka's `murmur2_random`, and the docs say why.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from compactlog.storage.partitioner import partition_for_key
from support.kafka_server import logged_server
from support.paths import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
KEYS = [b"AAPL", b"MSFT", b"GOOG", b"AMZN", b"TSLA", b"NVDA", b"META"]


def commands(text: str) -> list[str]:
    """Shell commands as one line each: continuation lines joined."""
    return text.replace("\\\n", " ").splitlines()


def test_every_kcat_producer_in_the_docs_uses_kafkas_partitioner() -> None:
    found = []
    for page in PAGES:
        for line in commands(page.read_text()):
            if re.search(r"\bkcat\b.*\s-P\b", line):
                found.append(line)
                assert "-X partitioner=murmur2_random" in line, (
                    f"{page.name}: kcat produces with librdkafka's default partitioner, "
                    f"not Kafka's murmur2: {line.strip()}")
    assert found, "no kcat producer found: the test reads the wrong pages"


def test_every_confluent_kafka_producer_in_the_docs_uses_kafkas_partitioner() -> None:
    found = 0
    for page in PAGES:
        for block in re.findall(r"```python\n(.*?)```", page.read_text(), re.S):
            if "confluent_kafka" not in block or "Producer(" not in block:
                continue
            found += 1
            assert re.search(r"""["']partitioner["']\s*:\s*["']murmur2_random["']""",
                             block), f"{page.name}: a confluent-kafka Producer without " \
                                     f"\"partitioner\": \"murmur2_random\":\n{block}"
    assert found, "no confluent-kafka producer found: the test reads the wrong pages"


def test_the_readme_says_why_the_partitioner_is_set() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "consistent_random" in readme and "murmur2_random" in readme
    assert re.search(r"librdkafka.{0,200}(default|partitioner)", readme, re.S)


@pytest.mark.skipif(shutil.which("kcat") is None, reason="needs kcat")
def test_with_murmur2_random_kcat_and_confluent_kafka_agree_with_compactlog(
        tmp_path: Path) -> None:
    """What the docs' setting is for: librdkafka's default puts keys elsewhere; with
    murmur2_random, kcat and confluent-kafka put every key where compactlog does."""
    from confluent_kafka import Consumer, Producer

    from compactlog import LogStore

    with LogStore.open(tmp_path / "data") as store:
        for name in ("default", "murmur", "confluent"):
            store.create_topic(name, partitions=4)
    with logged_server(tmp_path / "data", tmp_path / "server.log") as server:
        lines = "".join(f"{key.decode()}:v\n" for key in KEYS)
        for topic, extra in (("default", []), ("murmur", ["-X", "partitioner=murmur2_random"])):
            subprocess.run(["kcat", "-b", server.bootstrap, "-t", topic, "-P", "-K:", *extra],
                           input=lines, text=True, check=True, timeout=60)
        producer = Producer({"bootstrap.servers": server.bootstrap,
                             "partitioner": "murmur2_random"})
        for key in KEYS:
            producer.produce("confluent", key=key, value=b"v")
        assert producer.flush(30) == 0
        consumer = Consumer({"bootstrap.servers": server.bootstrap, "group.id": "check",
                             "auto.offset.reset": "earliest"})
        placed: dict[str, dict[bytes, int]] = {}
        try:
            consumer.subscribe(["default", "murmur", "confluent"])
            while sum(len(p) for p in placed.values()) < 3 * len(KEYS):
                message = consumer.poll(1.0)
                if message is not None and message.error() is None:
                    placed.setdefault(message.topic(), {})[message.key()] = \
                        message.partition()
        finally:
            consumer.close()
    expected = {key: partition_for_key(key, 4) for key in KEYS}
    assert placed["murmur"] == expected
    assert placed["confluent"] == expected
    assert placed["default"] != expected  # why the docs set it
