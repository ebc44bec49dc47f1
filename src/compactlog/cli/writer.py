"""The CLI's writes: straight into the data directory, or through the server that
writes it.

Invariant: a data directory has one writer (the store's writer lock). When the CLI can
take the lock it writes through the store; when `compactlog serve` holds it, the write
commands go through that server's Kafka listener (server/info.py names it), as any
Kafka client would, so they work while the server runs; when another process holds it,
the command fails with one line that says what to do. Every command works with no
server at all.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Coroutine, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol, TypeVar

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError

from compactlog.config import TopicConfig
from compactlog.errors import CompactlogError, DataDirLockedError, UserError
from compactlog.server.info import running_server
from compactlog.storage import LogStore, ProducerRecord

T = TypeVar("T")


class ServerRefusedError(CompactlogError):
    """The running server answered a write with an error (its message is passed on)."""


class Writer(Protocol):
    via: str  # where the writes go, for the command's last line

    def create_topic(self, name: str, partitions: int, config: Mapping[str, str]) -> None: ...

    def alter_topic(self, name: str, set_values: Mapping[str, str],
                    delete: Sequence[str]) -> None: ...

    def delete_topic(self, name: str) -> None: ...

    def append(self, topic: str, records: Sequence[ProducerRecord],
               partition: int | None) -> Counter[int]: ...


class StoreWriter:
    """Writes through the store: this process holds the writer lock."""

    via = ""

    def __init__(self, store: LogStore) -> None:
        self.store = store

    def create_topic(self, name: str, partitions: int, config: Mapping[str, str]) -> None:
        self.store.create_topic(name, partitions, config)

    def alter_topic(self, name: str, set_values: Mapping[str, str],
                    delete: Sequence[str]) -> None:
        self.store.alter_topic(name, set_values, delete)

    def delete_topic(self, name: str) -> None:
        self.store.delete_topic(name)

    def append(self, topic: str, records: Sequence[ProducerRecord],
               partition: int | None) -> Counter[int]:
        counts: Counter[int] = Counter()
        for result in self.store.append(topic, records, partition=partition):
            counts[result.partition] += result.last_offset - result.base_offset + 1
        return counts


class ServerWriter:
    """Writes through the running server's Kafka listener (aiokafka, a dependency
    already: its record codec is the store's)."""

    def __init__(self, target: str | Path, bootstrap: str) -> None:
        self.target = target
        self.bootstrap = bootstrap
        self.via = f" through the server at {bootstrap}"
        self._loop = asyncio.new_event_loop()
        self._producer: AIOKafkaProducer | None = None

    def _run(self, work: Coroutine[Any, Any, T]) -> T:
        try:
            return self._loop.run_until_complete(work)
        except KafkaError as error:
            raise ServerRefusedError(f"the server at {self.bootstrap} refused it: "
                                     f"{error}") from None

    async def _admin(self) -> AIOKafkaAdminClient:
        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap,
                                    client_id="compactlog-cli")
        await admin.start()
        return admin

    def create_topic(self, name: str, partitions: int, config: Mapping[str, str]) -> None:
        TopicConfig.from_strings(config)  # the same clear error as without a server

        async def create() -> None:
            admin = await self._admin()
            try:
                response = await admin.create_topics(
                    [NewTopic(name, partitions, 1, topic_configs=dict(config))])
            finally:
                await admin.close()
            _check_topic_errors(response, "topics")

        self._run(create())

    def alter_topic(self, name: str, set_values: Mapping[str, str],
                    delete: Sequence[str]) -> None:
        # AlterConfigs replaces a topic's whole config: send the current overrides with
        # the change applied (validated here first, as the store would).
        with LogStore.open(self.target, read_only=True) as store:
            current = store.topic(name).config
        altered = current.altered(set_values, delete)

        async def alter() -> None:
            admin = await self._admin()
            try:
                responses = await admin.alter_configs([ConfigResource(
                    ConfigResourceType.TOPIC, name,
                    {key: str(value) for key, value in altered.overrides.items()})])
            finally:
                await admin.close()
            for response in responses:
                for code, message, *_ in response.resources:
                    if code:
                        raise ServerRefusedError(f"the server refused the change: "
                                                 f"{message or f'error code {code}'}")

        self._run(alter())

    def delete_topic(self, name: str) -> None:
        async def delete() -> None:
            admin = await self._admin()
            try:
                response = await admin.delete_topics([name])
            finally:
                await admin.close()
            _check_topic_errors(response, "topic_error_codes")

        self._run(delete())

    def append(self, topic: str, records: Sequence[ProducerRecord],
               partition: int | None) -> Counter[int]:
        async def send() -> Counter[int]:
            if self._producer is None:
                self._producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap,
                                                  acks="all", enable_idempotence=True,
                                                  client_id="compactlog-cli")
                await self._producer.start()
            futures = [await self._producer.send(
                topic, value=record.value, key=record.key, partition=partition,
                timestamp_ms=record.timestamp,
                headers=[(k, v if v is not None else b"") for k, v in record.headers] or None)
                for record in records]
            counts: Counter[int] = Counter()
            for future in futures:
                counts[(await future).partition] += 1
            return counts

        return self._run(send())

    def close(self) -> None:
        if self._producer is not None:
            self._run(self._producer.stop())
        self._loop.close()


def _check_topic_errors(response: Any, field: str) -> None:
    for entry in getattr(response, field, []):
        code = entry[1]
        message = entry[2] if len(entry) > 2 and isinstance(entry[2], str) else None
        if code:
            raise ServerRefusedError(
                f"the server refused it: {message or f'Kafka error code {code}'}")


@contextmanager
def open_writer(target: str | Path, data_dir: Path) -> Iterator[Writer]:
    """A writer for the store at `target` (a directory or an s3:// URL, whose local
    directory is `data_dir`): the store, or the server that holds it."""
    try:
        store = LogStore.open(target, local_dir=data_dir)
    except DataDirLockedError as locked:
        server = running_server(data_dir)
        if server is None:
            raise UserError(f"{locked}; it is not a compactlog server this command can "
                            "write through") from None
        if server.listeners and not any(entry.get("protocol") == "PLAINTEXT"
                                        for entry in server.listeners.values()):
            raise UserError(
                f"{locked}; the server has no PLAINTEXT listener for this command to "
                f"write through (its listeners: {', '.join(server.listeners)}). Add one "
                f"on 127.0.0.1 (listen = \"127.0.0.1:9092\"), or stop the server") from None
        writer = ServerWriter(target, server.kafka)
        try:
            yield writer
        finally:
            writer.close()
        return
    with store:
        yield StoreWriter(store)
