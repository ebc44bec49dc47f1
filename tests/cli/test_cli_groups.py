"""`compactlog groups` (issue 24, item 9) against a real server and a real consumer
group (confluent-kafka's Consumer committing offsets): list, describe with offsets and
lag per partition, reset-offsets (dry run by default, --execute commits, refused while
the group has members) and delete (refused while the group has members), as Kafka's
kafka-consumer-groups does them; tables fit 80 columns."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from compactlog import LogStore, ProducerRecord
from support.cli import assert_fits, ok, run
from support.kafka_server import LoggedServer, logged_server

GROUP = "billing"
NARROW = {"COLUMNS": "80"}
# Records appended with these timestamps, 10 per partition of "prices".
OLD_MS, NEW_MS = 1_700_000_000_000, 1_800_000_000_000


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LoggedServer]:
    data = tmp_path / "data"
    with LogStore.open(data) as store:
        store.create_topic("prices", 2, {})
        for partition in (0, 1):
            store.append("prices", [ProducerRecord(b"k%d" % i, b"v%d" % i,
                                                   timestamp=OLD_MS if i < 6 else NEW_MS)
                                    for i in range(10)], partition=partition)
    config = tmp_path / "server.toml"
    config.write_text("group_initial_rebalance_delay_s = 0.1\n")
    with logged_server(data, tmp_path / "server.log", "--config", str(config)) as running:
        yield running


def consume_and_commit(bootstrap: str, count: int) -> Consumer:
    """A member of GROUP that has read and committed `count` records of each partition."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP,
                         "client.id": "billing-app", "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    consumer.subscribe(["prices"])
    seen: dict[int, int] = {}
    deadline = time.monotonic() + 60
    while sum(seen.values()) < 20:
        assert time.monotonic() < deadline, f"consumed only {seen}"
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            seen[message.partition()] = seen.get(message.partition(), 0) + 1
    consumer.commit(offsets=[TopicPartition("prices", p, count) for p in (0, 1)],
                    asynchronous=False)
    return consumer


def rows(text: str) -> list[list[str]]:
    """The table's rows (those that start with the topic's name, or for reset-offsets
    the group's), split on whitespace."""
    return [line.split() for line in text.splitlines()
            if line.startswith(("prices ", GROUP + " "))]


def test_describe_shows_offsets_lag_and_members_and_changes_are_refused_while_active(
    server: LoggedServer, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    consumer = consume_and_commit(server.bootstrap, 7)
    try:
        assert ok(run(data, "groups", "list")).split() == [GROUP]
        listed = ok(run(data, "groups", "list", "--state", env=NARROW))
        assert [GROUP, "Stable", "1"] in [line.split() for line in listed.splitlines()]
        described = ok(run(data, "groups", "describe", GROUP, env=NARROW))
        assert_fits(described, "CURRENT-", "LOG-END-", "CONSUMER-ID", "CLIENT-ID")
        table = rows(described)
        # The member id folds onto a second line at 80 columns; the row's first cells hold.
        assert f"GROUP {GROUP}: Stable, 1 member(s)" in described
        assert [row[:5] for row in table] == [["prices", "0", "7", "10", "3"],
                                              ["prices", "1", "7", "10", "3"]]
        assert all("billing-app" in row[-1] for row in table), described
        assert all(row[-2] == "127.0.0.1" for row in table), described
        # Kafka's rules: no reset and no deletion while the group has members.
        refused = run(data, "groups", "reset-offsets", GROUP, "--topic", "prices",
                      "--to-earliest", "--execute")
        assert refused.returncode == 1
        assert "active member" in refused.stderr and GROUP in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
        refused = run(data, "groups", "delete", GROUP)
        assert refused.returncode == 1 and "active member" in refused.stderr
    finally:
        consumer.close()
    # Closed: the member left, the offsets stay.
    described = ok(run(data, "groups", "describe", GROUP, "--bootstrap-server",
                       server.bootstrap))
    assert [row for row in rows(described)] == [["prices", "0", "7", "10", "3", "-", "-", "-"],
                                                ["prices", "1", "7", "10", "3", "-", "-", "-"]]


def new_offsets(text: str) -> list[int]:
    return [int(row[3]) for row in rows(text)]


def test_reset_offsets_dry_run_then_execute_and_delete(server: LoggedServer,
                                                         tmp_path: Path) -> None:
    data = tmp_path / "data"
    consume_and_commit(server.bootstrap, 7).close()

    def current() -> list[str]:
        return [row[2] for row in rows(ok(run(data, "groups", "describe", GROUP)))]

    dry = run(data, "groups", "reset-offsets", GROUP, "--topic", "prices", "--to-earliest")
    assert dry.returncode == 0, dry.stderr
    assert new_offsets(dry.stdout) == [0, 0] and "dry run" in dry.stderr
    assert current() == ["7", "7"]  # nothing committed

    done = run(data, "groups", "reset-offsets", GROUP, "--topic", "prices", "--to-earliest",
               "--execute")
    assert done.returncode == 0 and "committed" in done.stderr, done.stderr
    assert current() == ["0", "0"]

    ok(run(data, "groups", "reset-offsets", GROUP, "--all-topics", "--to-offset", "4",
           "--execute"))
    assert current() == ["4", "4"]
    # Past the log end: kept within the log, as Kafka keeps it.
    assert new_offsets(ok(run(data, "groups", "reset-offsets", GROUP, "--all-topics",
                              "--to-offset", "99"))) == [10, 10]
    ok(run(data, "groups", "reset-offsets", GROUP, "--all-topics", "--to-latest",
           "--execute"))
    assert current() == ["10", "10"]
    # The first record at or after the time: offsets 6.. carry NEW_MS.
    between = datetime.fromtimestamp((OLD_MS + NEW_MS) / 2000, UTC).isoformat()
    ok(run(data, "groups", "reset-offsets", GROUP, "--topic", "prices", "--to-datetime",
           between, "--execute"))
    assert current() == ["6", "6"]

    for wrong, message in (
        (["--topic", "prices"], "exactly one of"),
        (["--topic", "prices", "--to-earliest", "--to-latest"], "exactly one of"),
        (["--to-earliest"], "--topic TOPIC"),
        (["--topic", "nope", "--to-earliest"], "unknown topic 'nope'"),
        (["--topic", "prices", "--to-datetime", "yesterday"], "ISO 8601"),
    ):
        refused = run(data, "groups", "reset-offsets", GROUP, *wrong)
        assert refused.returncode == 1 and message in refused.stderr, refused.stderr

    assert ok(run(data, "groups", "delete", GROUP)).strip() == f"deleted consumer group {GROUP}"
    assert ok(run(data, "groups", "list")).split() == []
    gone = run(data, "groups", "describe", GROUP)
    assert gone.returncode == 1 and "does not exist" in gone.stderr


def test_without_a_server_the_command_says_where_it_looked(tmp_path: Path) -> None:
    data = tmp_path / "data"
    ok(run(data, "topics", "create", "prices"))
    result = run(data, "groups", "list")
    assert result.returncode == 1
    assert f"no compactlog server is running on the data directory {data}" in result.stderr
    assert "--bootstrap-server" in result.stderr
