"""The server's admin API, Prometheus metrics and automatic compaction, over real
sockets: a real server process, real Kafka clients, real compaction processes (Spark for
the metrics test, the small pyarrow engine of local_engine.py where only the scheduling
is under test)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from support.admin import (
    ENV,
    LOCAL_SERVICE,
    Servers,
    create_topic,
    get,
    http,
    metrics,
    produce,
    sample,
    server_config,
    wait_until,
)
from support.cli import ok, run
from support.paths import ROOT
from support.spark import SPARK_TEST_CONF

TOPIC_CONFIG = {"cleanup.policy": "compact", "segment.bytes": "2048",
                "min.compaction.lag.ms": "0", "delete.retention.ms": "0"}


# -- helpers ---------------------------------------------------------------------------------


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[Servers]:
    started = Servers(tmp_path)
    yield started
    started.stop()


def damage(segment: Path) -> None:
    data = bytearray(segment.read_bytes())
    data[len(data) // 2] ^= 0xFF
    segment.write_bytes(bytes(data))


def sealed_files(tmp_path: Path, partition: int) -> list[Path]:
    return sorted((tmp_path / "data" / "topics" / "t" / str(partition) / "segments")
                  .glob("*.parquet"))


# -- admin API: bad requests ----------------------------------------------------------------


def test_admin_api_answers_bad_requests_with_clear_json_errors(servers: Servers) -> None:
    server = servers.start()
    create_topic(server, "t", 2, TOPIC_CONFIG)
    create_topic(server, "plain", 1, {})
    url = server.admin_url
    assert get(server, "/v1/health") == {"status": "ok"}
    cases = [
        ("POST", "/v1/topics/nope/compaction", None, 404, "unknown topic 'nope'"),
        ("POST", "/v1/topics/plain/compaction", None, 400, "cleanup.policy=delete"),
        ("POST", "/v1/topics/t/compaction", {"partitions": [7]}, 404, "no partition 7"),
        ("POST", "/v1/topics/t/compaction", {"partitions": []}, 400, "non-empty list"),
        ("POST", "/v1/topics/t/compaction", {"partitions": ["0"]}, 400, "integers"),
        ("POST", "/v1/topics/t/compaction", {"partition": 0}, 400, '"partitions"'),
        ("POST", "/v1/topics/t/compaction", b"{not json", 400, "not JSON"),
        ("GET", "/v1/topics/nope", None, 404, "unknown topic 'nope'"),
        ("GET", "/v1/topics/nope/compaction", None, 404, "unknown topic 'nope'"),
        ("GET", "/v1/compactions/99", None, 404, "no compaction run '99'"),
        ("GET", "/v1/compactions/x", None, 404, "no compaction run 'x'"),
        ("GET", "/nothing/here", None, 404, "Not Found"),
        ("DELETE", "/v1/topics/t", None, 405, "Method Not Allowed"),
    ]
    for method, path, body, status, message in cases:
        got_status, got = http(method, f"{url}{path}", body)
        assert (got_status, message in got["error"]) == (status, True), (method, path, got)
    server.assert_running()
    topics = get(server, "/v1/topics")
    assert [t["topic"] for t in topics["topics"]] == ["plain", "t"]
    topic = get(server, "/v1/topics/t")
    assert topic["compacted"] and topic["config"]["cleanup.policy"] == "compact"
    assert [p["partition"] for p in topic["partitions"]] == [0, 1]


# -- a requested run with Spark, and the metrics after it -------------------------------------


def test_requested_compaction_and_metrics_match_the_run(
        tmp_path: Path, servers: Servers) -> None:
    server = servers.start(*server_config(tmp_path, enabled=False, spark_master="local[1]",
                                  spark_conf=SPARK_TEST_CONF))
    create_topic(server, "t", 2, TOPIC_CONFIG)
    records = [(b"k%d" % (i % 30), b"v%d" % i) for i in range(300)] + [(b"k3", None)]
    produce(server, "t", records)
    # A group reads everything and commits; then more records arrive: lag.
    consumer = Consumer({"bootstrap.servers": server.bootstrap, "group.id": "g1",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe(["t"])
    seen = 0
    deadline = time.monotonic() + 60
    while seen < len(records) and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            seen += 1
    assert seen == len(records)
    consumer.commit(asynchronous=False)
    committed = {tp.partition: tp.offset for tp in consumer.committed(
        [TopicPartition("t", 0), TopicPartition("t", 1)], timeout=10)}
    consumer.close()
    produce(server, "t", [(b"late%d" % i, b"x") for i in range(10)])

    wait_until(lambda: all(p["sealed_bytes"] for p in get(server, "/v1/topics/t")["partitions"]),
               "sealed segments in both partitions")
    status, run_started = http("POST", f"{server.admin_url}/v1/topics/t/compaction")
    assert status == 202, run_started
    assert run_started["state"] == "RUNNING" and run_started["trigger"] == "request"
    status, busy = http("POST", f"{server.admin_url}/v1/topics/t/compaction",
                        {"partitions": [1]})
    assert status == 409 and "already running" in busy["error"], busy
    assert busy["runs"] == [run_started["id"]]
    during = get(server, "/v1/topics/t/compaction")
    assert {p["running_run"] for p in during["partitions"]} == {run_started["id"]}

    run_id = run_started["id"]
    # The CLI, asked for a run while this one goes (Spark's start-up alone is seconds),
    # waits for it and reports it.
    waited = run(tmp_path / "data", "compact", "t", "--server", server.admin_url, "--json",
                 timeout=300)
    assert f"waiting for run {run_id}" in waited.stderr
    done = wait_until(lambda: (r := get(server, f"/v1/compactions/{run_id}"))["state"]
                      != "RUNNING" and r, "the run to finish", timeout=300)
    assert done["state"] == "SUCCESS", done
    report = done["report"]
    assert json.loads(ok(waited)) == report
    parts = report["partitions"]
    records_in = sum(p["records_in"] for p in parts)
    records_out = sum(p["records_out"] for p in parts)
    assert records_in > 0 and records_out < records_in
    # The server's compaction process ran it as a Spark job, however small (the default).
    assert re.fullmatch(r"Spark local\[1\]: job \d+ \(1 stage, 1 task\)", report["engine"]), \
        report["engine"]

    scraped = metrics(server)
    assert sample(scraped, "compactlog_compaction_runs_total", topic="t", result="success",
                  trigger="request") == 1
    assert ("compactlog_compaction_runs_total", (("result", "error"), ("topic", "t"),
                                                 ("trigger", "request"))) not in scraped
    assert sample(scraped, "compactlog_compaction_records_in_total", topic="t") == records_in
    assert sample(scraped, "compactlog_compaction_records_out_total", topic="t") == records_out
    assert sample(scraped, "compactlog_compaction_records_removed_total",
                  topic="t") == records_in - records_out
    assert sample(scraped, "compactlog_compaction_bytes_in_total", topic="t") == sum(
        p["bytes_in"] for p in parts)
    # What the I/O cap counts, as the run's report has it (no cap: nothing throttled).
    assert sample(scraped, "compactlog_compaction_io_bytes_total", topic="t",
                  direction="read") == report["io_read_bytes"] >= sum(p["bytes_in"] for p in parts)
    assert sample(scraped, "compactlog_compaction_io_bytes_total", topic="t",
                  direction="written") == report["io_written_bytes"] > 0
    assert sample(scraped, "compactlog_compaction_throttled_seconds_total", topic="t") == 0
    assert sample(scraped, "compactlog_compaction_duration_seconds_count", topic="t") == 1
    assert sample(scraped, "compactlog_compaction_duration_seconds_sum",
                  topic="t") >= report["duration_s"]
    assert sample(scraped, "compactlog_topic_records_in_total", topic="t") == len(records) + 10
    assert sample(scraped, "compactlog_topic_records_out_total", topic="t") >= len(records)
    assert sample(scraped, "compactlog_compaction_uncleanable_partitions") == 0
    assert sample(scraped, "compactlog_compaction_running") == 0
    assert sample(scraped, "compactlog_compaction_seconds_since_last_run") < 60
    assert sample(scraped, "compactlog_compaction_cleaner_enabled") == 0
    topic = get(server, "/v1/topics/t")
    for p in topic["partitions"]:
        index = str(p["partition"])
        assert p["horizon"] == next(q["horizon"] for q in parts if q["partition"] == int(index))
        assert sample(scraped, "compactlog_compaction_dirty_ratio", topic="t",
                      partition=index) == p["dirty_ratio"]
        assert sample(scraped, "compactlog_compaction_ledger_files", topic="t",
                      partition=index) == p["ledger_files"] >= 1
        assert sample(scraped, "compactlog_partition_log_end_offset", topic="t",
                      partition=index) == p["log_end_offset"]
        assert sample(scraped, "compactlog_consumer_group_lag", group="g1", topic="t",
                      partition=index) == p["log_end_offset"] - committed[p["partition"]]
    # The status the CLI shows through the server agrees.
    shown = json.loads(ok(run(tmp_path / "data", "compaction-status", "t", "--server",
                              server.admin_url, "--json")))
    assert [p["state"] for p in shown["partitions"]] == ["SUCCESS", "SUCCESS"]
    assert [p["run_id"] for p in shown["partitions"]] == [report["run_id"]] * 2
    history = get(server, "/v1/compactions")["runs"]
    assert [r["id"] for r in history] == [run_id]

    # A second run goes to the same warm worker: no Spark start-up this time.
    mark = server.mark()
    # (The first run rolled the active segments: these may all be in new active ones,
    # which the requested run rolls too.)
    produce(server, "t", [(b"k%d" % (i % 30), b"w%d" % i) for i in range(100)])
    status, second = http("POST", f"{server.admin_url}/v1/topics/t/compaction")
    assert status == 202, second
    second = wait_until(lambda: (r := get(server, f"/v1/compactions/{second['id']}"))["state"]
                        != "RUNNING" and r, "the second run", timeout=300)
    assert second["state"] == "SUCCESS", second
    assert second["report"]["startup_s"] == 0 and "spark start-up" not in second["report"][
        "stages"]
    assert "started compaction worker" not in server.log_since(mark)
    assert server.log().count("started compaction worker") == 1


# -- automatic compaction, and a partition that keeps failing ---------------------------------


@pytest.mark.parametrize("keep_warm_s", [60.0, pytest.param(0.0, marks=pytest.mark.slow)],
                         ids=["warm-worker", "process-per-run"])
def test_failing_partition_is_uncleanable_and_the_others_keep_being_compacted(
        tmp_path: Path, servers: Servers, keep_warm_s: float) -> None:
    # First, with automatic compaction off: two partitions of overwritten keys, sealed.
    server = servers.start("--no-auto-compaction")
    create_topic(server, "t", 2, TOPIC_CONFIG)
    for partition in (0, 1):
        produce(server, "t", [(b"k%d" % (i % 10), b"v%d" % i) for i in range(200)], partition)
    wait_until(lambda: all(p["sealed_segments"] >= 1
                           for p in get(server, "/v1/topics/t")["partitions"]), "sealing")
    # Then damage a sealed segment of partition 1 and restart with the cleaner on.
    servers.stop()
    damaged = sealed_files(tmp_path, 1)[0]
    damage(damaged)
    server = servers.start(*server_config(tmp_path, enabled=True, check_interval_s=0.2,
                                          backoff_initial_s=3600.0, max_concurrent_runs=2,
                                          keep_warm_s=keep_warm_s, service=LOCAL_SERVICE),
                           "--auto-compaction")

    def settled() -> dict[str, Any] | None:
        body = get(server, "/v1/topics/t/compaction")
        rows = body["partitions"]
        # running_run: the status file says SUCCESS just before the run's process exits;
        # the server counts the run once it has the report.
        done = rows[0]["state"] == "SUCCESS" and rows[0]["running_run"] is None
        return body if done and rows[1]["uncleanable"] else None

    body = wait_until(settled, "partition 0 compacted and partition 1 uncleanable", 60)
    bad = body["partitions"][1]
    assert bad["state"] == "ERROR" and damaged.name in bad["error"]
    assert bad["retry_at_ms"] > time.time() * 1000 + 1000 * 1000  # backing off (capped)
    good_horizon = body["partitions"][0]["horizon"]
    assert good_horizon is not None and body["partitions"][1]["horizon"] is None
    scraped = metrics(server)
    assert sample(scraped, "compactlog_compaction_partition_uncleanable", topic="t",
                  partition="1") == 1
    assert ("compactlog_compaction_partition_uncleanable",
            (("partition", "0"), ("topic", "t"))) not in scraped
    assert sample(scraped, "compactlog_compaction_uncleanable_partitions") == 1
    assert sample(scraped, "compactlog_compaction_runs_total", topic="t", result="error",
                  trigger="scheduler") >= 1
    assert sample(scraped, "compactlog_compaction_runs_total", topic="t", result="success",
                  trigger="scheduler") >= 1
    assert sample(scraped, "compactlog_compaction_cleaner_enabled") == 1
    assert sample(scraped, "compactlog_compaction_seconds_since_last_check") < 30

    # New records make partition 0 due again: it is compacted again, 1 still waits.
    successes = sample(scraped, "compactlog_compaction_runs_total", topic="t",
                       result="success", trigger="scheduler")
    produce(server, "t", [(b"k%d" % (i % 10), b"w%d" % i) for i in range(200)], 0)
    wait_until(lambda: sample(metrics(server), "compactlog_compaction_runs_total", topic="t",
                              result="success", trigger="scheduler") > successes,
               "partition 0 compacted again", 60)
    assert get(server, "/v1/topics/t/compaction")["partitions"][0]["horizon"] > good_horizon
    scraped = metrics(server)
    assert sample(scraped, "compactlog_compaction_uncleanable_partitions") == 1
    shown = json.loads(ok(run(tmp_path / "data", "compaction-status", "t", "--server",
                              server.admin_url, "--json")))["partitions"]
    assert [p["uncleanable"] for p in shown] == [False, True]
    assert damaged.name in shown[1]["error"]
    assert "uncleanable" in ok(run(tmp_path / "data", "compaction-status", "t", "--server",
                                   server.admin_url))

    # A run asked for from the CLI goes through the server's engine, past the backoff.
    # (--no-roll: rolled, the active segment would hold every key's survivor, and this
    # test engine reads no file with none of them in phase 2, where it checks files.)
    result = run(tmp_path / "data", "compact", "t", "--partition", "1", "--no-roll",
                 "--server", server.admin_url, env=ENV)
    assert result.returncode == 1 and damaged.name in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    table = ok(run(tmp_path / "data", "compact", "t", "-p", "0", "--server",
                   server.admin_url, env=ENV))
    assert "Compacted t in" in table and "records removed" in table


def test_failures_survive_a_restart_with_their_backoff(
        tmp_path: Path, servers: Servers) -> None:
    server = servers.start("--no-auto-compaction")
    create_topic(server, "t", 1, TOPIC_CONFIG)
    produce(server, "t", [(b"k%d" % (i % 10), b"v%d" % i) for i in range(200)])
    wait_until(lambda: get(server, "/v1/topics/t")["partitions"][0]["sealed_segments"] >= 1,
               "sealing")
    servers.stop()
    damage(sealed_files(tmp_path, 0)[0])
    config = server_config(tmp_path, enabled=True, check_interval_s=0.2,
                           backoff_initial_s=3600.0, service=LOCAL_SERVICE)
    server = servers.start(*config, "--auto-compaction")
    failed = wait_until(
        lambda: (p := get(server, "/v1/topics/t/compaction")["partitions"][0])["uncleanable"]
        and p, "the failure", 60)
    assert len(get(server, "/v1/compactions")["runs"]) == 1
    server = servers.start(*config, "--auto-compaction")
    started = time.monotonic()
    # The cleaner has looked since the start (the gauge counts from the server's start
    # until its first check), and a few times more.
    wait_until(lambda: sample(metrics(server), "compactlog_compaction_seconds_since_last_check")
               < time.monotonic() - started, "the cleaner's first check", 30)
    time.sleep(1)
    restored = get(server, "/v1/topics/t/compaction")["partitions"][0]
    assert restored["uncleanable"] and restored["failures_in_a_row"] == 1
    assert restored["retry_at_ms"] == pytest.approx(failed["retry_at_ms"], abs=1000)
    assert get(server, "/v1/compactions")["runs"] == []  # still backing off
    assert sample(metrics(server), "compactlog_compaction_uncleanable_partitions") == 1


def test_idle_warm_worker_exits_and_the_next_run_starts_another(
        tmp_path: Path, servers: Servers) -> None:
    server = servers.start(*server_config(tmp_path, enabled=False, keep_warm_s=0.5,
                                          service=LOCAL_SERVICE))
    create_topic(server, "t", 1, TOPIC_CONFIG)
    for _ in range(2):
        mark = server.mark()
        produce(server, "t", [(b"k%d" % (i % 10), b"v%d" % i) for i in range(400)])
        wait_until(lambda: get(server, "/v1/topics/t")["partitions"][0]["dirty_bytes"],
                   "sealing")
        status, started = http("POST", f"{server.admin_url}/v1/topics/t/compaction")
        assert status == 202, started
        path = f"/v1/compactions/{started['id']}"
        done = wait_until(lambda path=path: (r := get(server, path))["state"] != "RUNNING"
                          and r, "the run")
        assert done["state"] == "SUCCESS", done
        server.wait_for_log(r"started compaction worker", mark)
        server.wait_for_log(r"stopping compaction worker \d+, idle", mark)


def test_a_partition_compacted_by_another_process_is_left_alone_not_failed(
        tmp_path: Path, servers: Servers) -> None:
    from compactlog.compaction.status import compaction_lock

    server = servers.start("--no-auto-compaction")
    create_topic(server, "t", 1, TOPIC_CONFIG)
    produce(server, "t", [(b"k%d" % (i % 10), b"v%d" % i) for i in range(400)])
    wait_until(lambda: get(server, "/v1/topics/t")["partitions"][0]["dirty_bytes"], "sealing")
    servers.stop()
    directory = tmp_path / "data" / "topics" / "t" / "0"
    with compaction_lock(directory, "t/0"):  # as `compactlog compact` holds it
        server = servers.start(*server_config(tmp_path, enabled=True, check_interval_s=0.2,
                                              service=LOCAL_SERVICE), "--auto-compaction")
        started = time.monotonic()
        wait_until(lambda: sample(metrics(server), "compactlog_compaction_seconds_since_last_check")
                   < time.monotonic() - started, "the cleaner's first check", 30)
        time.sleep(1)
        assert get(server, "/v1/compactions")["runs"] == []
        assert not get(server, "/v1/topics/t/compaction")["partitions"][0]["uncleanable"]
    wait_until(lambda: get(server, "/v1/topics/t/compaction")["partitions"][0]["state"]
               == "SUCCESS", "the compaction once the lock is free", 60)


def test_without_spark_runs_the_servers_compactions_with_no_jvm(
        tmp_path: Path, servers: Servers) -> None:
    # A master no JVM could reach: the run must not start one.
    server = servers.start(*server_config(tmp_path, enabled=False, without_spark=True,
                                          spark_master="spark://nowhere:1"))
    create_topic(server, "t", 1, TOPIC_CONFIG)
    produce(server, "t", [(b"k%d" % (i % 30), b"v%d" % i) for i in range(300)])
    wait_until(lambda: get(server, "/v1/topics/t")["partitions"][0]["sealed_bytes"],
               "sealed segments")
    status, started = http("POST", f"{server.admin_url}/v1/topics/t/compaction")
    assert status == 202, started
    done = wait_until(lambda: (r := get(server, f"/v1/compactions/{started['id']}"))["state"]
                      != "RUNNING" and r, "the run to finish", timeout=120)
    assert done["state"] == "SUCCESS", done
    assert done["report"]["engine"] == "in this process, no Spark job: 1 partition"
    assert done["report"]["startup_s"] == 0


def test_serve_refuses_bad_compaction_settings(tmp_path: Path) -> None:
    for text, message in [
        ("[compaction]\nenabled = 1\n", "compaction.enabled must be a bool"),
        ("[compaction]\nmax_concurrent_runs = 0\n", "max_concurrent_runs must be above 0"),
        ("[compaction]\nspeed = 3\n", "unknown setting compaction.'speed'"),
        ("admin_listen = 'nowhere'\n", "--admin-listen wants HOST:PORT"),
    ]:
        path = tmp_path / "server.toml"
        path.write_text(text)
        result = run(tmp_path / "data", "serve", "--config", str(path))
        assert result.returncode == 1 and message in result.stderr, result.stderr
        assert "Traceback" not in result.stderr


def test_the_documented_config_file_is_valid_and_complete(tmp_path: Path) -> None:
    from compactlog.cli.serve import (
        AUTHORIZATION_SETTINGS,
        COMPACTION_SETTINGS,
        LISTENER_SETTINGS,
        SETTINGS,
        TLS_SETTINGS,
        load_settings,
    )

    text = (ROOT / "docs" / "server.md").read_text()
    section = text.split("## Configuration file", 1)[1]
    block = section.split("```toml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "server.toml"
    path.write_text(block)
    settings = load_settings(path)
    assert set(settings) == set(SETTINGS)
    assert set(settings["compaction"]) | {"service"} == set(COMPACTION_SETTINGS)
    assert set(settings["authorization"]) | {"admin_tokens_file"} == set(
        AUTHORIZATION_SETTINGS)
    assert set(settings["tls"]) == set(TLS_SETTINGS)
    assert set(settings["listener"]["SASL_SSL"]) == set(LISTENER_SETTINGS)
