"""KafkaJS (node) against `compactlog serve`: create a compacted topic, alter its config,
produce keyed records and tombstones, consume with a group, commit, restart the server,
resume, delete records, delete the group.

KafkaJS is installed with `npm ci` from tests/apps/kafkajs/package-lock.json
(scripts/setup-apps.sh); each step is one run of tests/apps/kafkajs/scenario.js, which
prints its results as JSON lines. KafkaJS negotiates old, non-flexible versions (Metadata
v6, Produce v7, Fetch v11) and checks ApiVersions itself: an API the server does not
advertise fails in the client ("The Kafka server does not support the requested API
version") without a request, so the server logs nothing for it.
"""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from support.apps_support import node, server_config
from support.compat import APPS
from support.kafka_server import LoggedServer, logged_server

SCENARIO = APPS / "kafkajs" / "scenario.js"
STEP_TIMEOUT_S = 120

COMPACTED = {"cleanup.policy": "compact", "min.compaction.lag.ms": "0"}

def js(server: LoggedServer, step: str, *args: Any) -> list[dict[str, Any]]:
    """One step of scenario.js; its JSON lines. subprocess.run kills it by its pid if it
    outlives the timeout."""
    try:
        done = subprocess.run(
            [node(), str(SCENARIO), server.bootstrap, step, *map(str, args)],
            capture_output=True, text=True, timeout=STEP_TIMEOUT_S, cwd=SCENARIO.parent)
    except subprocess.TimeoutExpired as error:
        raise AssertionError(f"kafkajs {step} {args} did not finish: {error.stderr!r}\n"
                             f"server log:\n{server.log()}") from None
    assert done.returncode == 0, (
        f"kafkajs {step} {args} failed:\n{done.stderr}\nserver log (warnings):\n"
        + "\n".join(line for line in server.log().splitlines() if " INFO " not in line))
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def no_connection_closed(server: LoggedServer) -> None:
    closed = [line for line in server.log().splitlines() if "closing connection" in line]
    assert closed == [], closed


def items(tag: str, keys: int, rounds: int) -> list[tuple[str, str | None]]:
    """Keyed updates, then tombstones for the first two keys."""
    out: list[tuple[str, str | None]] = [
        (f"acct-{k}", f"{tag}-{r}") for r in range(rounds) for k in range(keys)]
    return [*out, ("acct-0", None), ("acct-1", None)]


def as_multiset(records: list[dict[str, Any]] | list[tuple[str, str | None]]) -> Counter[Any]:
    pairs = [(r["key"], r["value"]) if isinstance(r, dict) else r for r in records]
    return Counter(pairs)


def consume(server: LoggedServer, topic: str, group: str,
            expected: int) -> tuple[list[dict[str, Any]], dict[int, int]]:
    lines = js(server, "consume", topic, group, expected)
    records = [line for line in lines if "offset" in line]
    (commit,) = [line["committed"] for line in lines if "committed" in line]
    return records, {int(p): int(o) for p, o in commit.items()}


def watermarks(server: LoggedServer, topic: str) -> dict[int, tuple[int, int]]:
    return {w["partition"]: (w["low"], w["high"]) for w in js(server, "watermarks", topic)}


@pytest.mark.compat("kafkajs", "topic-produce-group")
def test_kafkajs_compacted_topic_group_commit_restart_resume(tmp_path: Path) -> None:
    data, log, config = tmp_path / "data", tmp_path / "server.log", server_config(tmp_path)
    topic, group = "accounts", "ledger"
    first = items("a", keys=6, rounds=3)
    with logged_server(data, log, *config) as server:
        assert js(server, "create", topic, 2, json.dumps(COMPACTED)) == [{"created": True}]
        (described,) = js(server, "describe", topic)
        assert described["configs"]["cleanup.policy"] == "compact"
        assert described["configs"]["min.compaction.lag.ms"] == "0"
        assert js(server, "list-topics") == [{"topics": [topic]}]

        sent = js(server, "produce", topic, json.dumps(first))
        assert {s["errorCode"] for s in sent} == {0}
        records, committed = consume(server, topic, group, len(first))
        assert as_multiset(records) == as_multiset(first), "keyed records and tombstones"
        assert any(r["value"] is None for r in records), "tombstones arrive as null values"
        for partition in {r["partition"] for r in records}:
            offsets = [r["offset"] for r in records if r["partition"] == partition]
            assert offsets == list(range(len(offsets))), "in order, from offset 0"
        ends = {p: high for p, (_, high) in watermarks(server, topic).items()}
        assert committed == {p: end for p, end in ends.items() if end}
        no_connection_closed(server)

    # Restart the server: the group resumes after its committed offsets.
    later = items("b", keys=3, rounds=1)
    with logged_server(data, log.with_name("server-2.log"), *config) as server:
        fetched = {o["partition"]: o["offset"] for o in js(server, "offsets", topic, group)}
        assert fetched == {p: end if end else -1 for p, end in ends.items()}
        js(server, "produce", topic, json.dumps(later))
        resumed, _ = consume(server, topic, group, len(later))
        assert as_multiset(resumed) == as_multiset(later), "nothing re-read, nothing lost"
        assert all(r["offset"] >= ends[r["partition"]] for r in resumed)
        no_connection_closed(server)


@pytest.mark.compat("kafkajs", "alter-config")
def test_kafkajs_alter_configs(tmp_path: Path) -> None:
    with logged_server(tmp_path / "data", tmp_path / "server.log",
                       *server_config(tmp_path)) as server:
        js(server, "create", "settings", 1, json.dumps(
            {**COMPACTED, "max.compaction.lag.ms": "600000"}))
        (altered,) = js(server, "alter", "settings", json.dumps(
            {"cleanup.policy": "compact", "delete.retention.ms": "3600000",
             "segment.bytes": "1048576"}))
        assert altered["configs"]["delete.retention.ms"] == "3600000"
        assert altered["configs"]["segment.bytes"] == "1048576"
        # As in Kafka, AlterConfigs replaces the topic's whole config: what it does not
        # name is back to its default.
        assert altered["configs"]["max.compaction.lag.ms"] == "9223372036854775807"
        no_connection_closed(server)


@pytest.mark.compat("kafkajs", "delete-records")
def test_kafkajs_delete_records(tmp_path: Path) -> None:
    with logged_server(tmp_path / "data", tmp_path / "server.log",
                       *server_config(tmp_path)) as server:
        js(server, "create", "events", 1, json.dumps({"cleanup.policy": "delete"}))
        js(server, "produce", "events", json.dumps([[f"k{i}", f"v{i}"] for i in range(10)]))
        assert watermarks(server, "events") == {0: (0, 10)}
        js(server, "delete-records", "events", 0, 4)
        assert watermarks(server, "events") == {0: (4, 10)}
        records, _ = consume(server, "events", "after-delete", 6)
        assert [r["offset"] for r in records] == list(range(4, 10))
        no_connection_closed(server)


@pytest.mark.compat("kafkajs", "delete-group")
def test_kafkajs_delete_group(tmp_path: Path) -> None:
    with logged_server(tmp_path / "data", tmp_path / "server.log",
                       *server_config(tmp_path)) as server:
        js(server, "create", "events", 1, json.dumps({}))
        js(server, "produce", "events", json.dumps([["k", "v"]]))
        consume(server, "events", "doomed", 1)
        assert {o["partition"]: o["offset"] for o in js(
            server, "offsets", "events", "doomed")} == {0: 1}
        deleted, groups = js(server, "delete-group", "doomed")
        assert deleted == {"deleted": [{"groupId": "doomed", "errorCode": 0}]}
        assert "doomed" not in groups["groups"]
        assert {o["partition"]: o["offset"] for o in js(
            server, "offsets", "events", "doomed")} == {0: -1}
        no_connection_closed(server)
