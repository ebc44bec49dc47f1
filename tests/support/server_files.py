"""A server's open files, and a consumer reading a topic from its first offset."""

from __future__ import annotations

import os
import time

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition


def consume_from_zero(bootstrap: str, topic: str, end: int) -> list[int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{topic}",
                         "enable.auto.commit": False, "enable.partition.eof": True,
                         "fetch.max.bytes": 1 << 20, "max.partition.fetch.bytes": 64 << 10})
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    offsets: list[int] = []
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF and offsets \
                        and offsets[-1] == end - 1:
                    return offsets
                assert error.code() == KafkaError._PARTITION_EOF, f"{topic}: {error}"
                continue
            offsets.append(message.offset())
    finally:
        consumer.close()
    raise AssertionError(f"{topic}: read {len(offsets)} records, last "
                         f"{offsets[-1] if offsets else None}, in 120 s")


def open_parquet_files(pid: int) -> list[str]:
    found = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if ".parquet" in target:
            found.append(target)
    return found
