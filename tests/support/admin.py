"""The admin API and Prometheus metrics of a server process (`Servers`, the `servers`
fixture of tests/conftest.py), and the HTTP calls and waits the tests make on it."""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from prometheus_client.parser import text_string_to_metric_families

from support.kafka_server import LoggedServer, logged_server
from support.paths import TESTS_DIR

LOCAL_SERVICE = "local_engine:LocalCompactionServiceFactory"
ENV = {"PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS_DIR),
                                                   os.environ.get("PYTHONPATH")]))}


def http(method: str, url: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else (body if isinstance(body, bytes)
                                      else json.dumps(body).encode())
    request = urllib.request.Request(url, data=data, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            text = response.read().decode()
            status = response.status
            kind = response.headers.get("Content-Type", "")
    except urllib.error.HTTPError as error:
        text, status, kind = error.read().decode(), error.code, error.headers["Content-Type"]
    return status, json.loads(text) if "json" in kind else text


def get(server: LoggedServer, path: str) -> Any:
    status, body = http("GET", f"{server.admin_url}{path}")
    assert status == 200, body
    return body


def metrics(server: LoggedServer) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of /metrics, by (name, sorted labels)."""
    text = get(server, "/metrics")
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def sample(scraped: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str,
           **labels: str) -> float:
    return scraped[(name, tuple(sorted(labels.items())))]


def wait_until(check: Callable[[], Any], what: str, timeout: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def toml_value(value: Any) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {json.dumps(v)}"
                                for k, v in value.items()) + " }"
    return json.dumps(value)


def server_config(tmp_path: Path, **compaction: Any) -> list[str]:
    lines = ["group_initial_rebalance_delay_s = 0.2", "upkeep_interval_s = 0.2",
             "[compaction]", *(f"{key} = {toml_value(value)}"
                               for key, value in compaction.items())]
    path = tmp_path / "server.toml"
    path.write_text("\n".join(lines) + "\n")
    return ["--config", str(path)]


class Servers:
    """One server at a time on the test's data directory, with an admin listener."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.started = 0
        self.context: Any = None

    def start(self, *extra: str) -> LoggedServer:
        self.stop()
        self.started += 1
        self.context = logged_server(self.tmp_path / "data",
                                     self.tmp_path / f"server-{self.started}.log",
                                     "--admin-listen", "127.0.0.1:0", *extra, env=ENV)
        server: LoggedServer = self.context.__enter__()
        return server

    def stop(self) -> None:
        """SIGTERM, and check that the server exited 0."""
        if self.context is not None:
            context, self.context = self.context, None
            context.__exit__(None, None, None)


def create_topic(server: LoggedServer, name: str, partitions: int,
                 config: dict[str, str]) -> None:
    admin = AdminClient({"bootstrap.servers": server.bootstrap})
    futures = admin.create_topics([NewTopic(name, partitions, 1, config=config)])
    futures[name].result(30)


def produce(server: LoggedServer, topic: str, records: list[tuple[bytes, bytes | None]],
            partition: int | None = None, batch: int = 20) -> dict[bytes, int]:
    """Produce with acks=all, `batch` records per request (so that the small test
    segments roll and seal); returns each key's last acknowledged offset."""
    producer = Producer({"bootstrap.servers": server.bootstrap, "linger.ms": 5})
    acked: dict[bytes, int] = {}

    def delivered(error: Any, message: Any) -> None:
        assert error is None, error
        acked[message.key()] = message.offset()

    for number, (key, value) in enumerate(records, 1):
        if partition is None:
            producer.produce(topic, value, key, on_delivery=delivered)
        else:
            producer.produce(topic, value, key, partition=partition, on_delivery=delivered)
        if number % batch == 0:
            assert producer.flush(30) == 0
    assert producer.flush(30) == 0
    return acked
