"""A compaction asked for by hand covers the last record at the time it is asked, as
Pulsar's does (issue 24, item 2): `compactlog compact`, the admin API's compaction
endpoint and the Python API's `trigger()` roll the active segment first, still honouring
min.compaction.lag.ms. The server's automatic cleaner keeps Kafka's rule: the active
segment is never compacted."""

from __future__ import annotations

import json
import time
from pathlib import Path

from compactlog import LogStore, ProducerRecord
from compactlog.compaction import load_factory
from compactlog.compaction.rolled import rolled_end
from support.admin import LOCAL_SERVICE, Servers, get, http, server_config, wait_until
from support.cli import ENV, LOCAL, consume_json, ok, run
from support.kafka_server import LoggedServer

# The default segment.bytes and segment.ms: nothing rolls by itself in these tests.
COMPACTED = ["-c", "cleanup.policy=compact"]
LINES = "AAPL\t189.5\nMSFT\t410.2\nAAPL\t190.1\nGOOG\t170.0\n"
TOMBSTONE = '{"key": "GOOG", "value": null}\n'


def horizons(data: Path, topic: str = "prices") -> dict[int, int | None]:
    with LogStore.open(data, read_only=True) as store:
        return {p.index: p.manifest.horizon for p in store.topic(topic).partitions}


def log_ends(data: Path, topic: str = "prices") -> dict[int, int]:
    with LogStore.open(data, read_only=True) as store:
        return {p.index: p.stats()["log_end_offset"] for p in store.topic(topic).partitions}


def produce_prices(data: Path, *config: str) -> None:
    ok(run(data, "topics", "create", "prices", "-p", "2", *COMPACTED, *config))
    ok(run(data, "produce", "prices", stdin=LINES + TOMBSTONE))


def test_cli_compact_covers_the_active_segment(tmp_path: Path) -> None:
    produce_prices(tmp_path)
    report = json.loads(ok(run(tmp_path, "compact", "prices", *LOCAL, "--json", env=ENV)))
    assert sum(p["records_in"] for p in report["partitions"]) == 5
    assert not any(p["skipped"] for p in report["partitions"])
    ends = log_ends(tmp_path)
    assert horizons(tmp_path) == {i: end - 1 for i, end in ends.items()}
    view = consume_json(tmp_path, "prices", "--compacted")
    assert sorted((r["key"], r["value"]) for r in view) == [  # type: ignore[type-var]
        ("AAPL", "190.1"), ("GOOG", None), ("MSFT", "410.2")]


def test_cli_compact_no_roll_keeps_kafkas_rule(tmp_path: Path) -> None:
    produce_prices(tmp_path)
    report = json.loads(ok(run(tmp_path, "compact", "prices", *LOCAL, "--no-roll", "--json",
                               env=ENV)))
    assert sum(p["records_in"] for p in report["partitions"]) == 0
    assert horizons(tmp_path) == {0: None, 1: None}


def test_a_manual_compaction_honours_min_compaction_lag(tmp_path: Path) -> None:
    produce_prices(tmp_path, "-c", "min.compaction.lag.ms=3600000")
    report = json.loads(ok(run(tmp_path, "compact", "prices", *LOCAL, "--json", env=ENV)))
    assert sum(p["records_in"] for p in report["partitions"]) == 0
    assert horizons(tmp_path) == {0: None, 1: None}
    assert len(consume_json(tmp_path, "prices", "--compacted")) == 5


def test_the_python_apis_trigger_compacts_up_to_the_last_record(tmp_path: Path) -> None:
    factory = load_factory("local_engine:LocalCompactionServiceFactory")
    with LogStore.open(tmp_path) as store:
        store.create_topic("prices", partitions=1, config={"cleanup.policy": "compact"})
        store.append("prices", [ProducerRecord(b"AAPL", b"189.5"),
                                ProducerRecord(b"AAPL", b"190.1")])
        # The writer itself: it rolls its own active segment.
        service = factory.new_service(store, "prices", {})
        assert service.compact().total("records_in") == 0  # Kafka's rule
        assert service.trigger().total("records_in") == 2
        store.append("prices", [ProducerRecord(b"AAPL", b"191.0")])
    # Read-only, with no writer running: it rolls as the writer for a moment.
    with LogStore.open(tmp_path, read_only=True) as store:
        report = factory.new_service(store, "prices", {}).trigger()
        assert report.partitions[0].horizon == 2
    assert horizons(tmp_path) == {0: 2}


def test_the_admin_api_rolls_and_the_cleaner_does_not(tmp_path: Path,
                                                      servers: Servers) -> None:
    server: LoggedServer = servers.start(*server_config(
        tmp_path, enabled=True, check_interval_s=0.2, service=LOCAL_SERVICE),
        "--auto-compaction")
    data = tmp_path / "data"
    # A topic whose segments roll every few records: the cleaner compacts it by itself,
    # all but its active segment.
    ok(run(data, "topics", "create", "auto", *COMPACTED, "-c", "segment.bytes=1024",
           "-c", "min.cleanable.dirty.ratio=0.01"))
    ok(run(data, "produce", "auto", "--batch-size", "1",
           stdin="".join(f"k{i % 5}\t{'v' * 100}{i}\n" for i in range(60)) + "k0\tlast\n"))
    with LogStore.open(data, read_only=True) as store:
        active_base = rolled_end(store.topic("auto").partition(0))
    assert active_base < log_ends(data, "auto")[0], "the test needs a non-empty active segment"
    wait_until(lambda: horizons(data, "auto")[0] is not None, "an automatic run", 60)
    time.sleep(1)  # more checks of the cleaner: the active segment stays
    assert horizons(data, "auto")[0] < active_base  # type: ignore[operator]

    produce_prices(data)
    status, started = http("POST", f"{server.admin_url}/v1/topics/prices/compaction")
    assert status == 202, started
    done = wait_until(lambda: (r := get(server, f"/v1/compactions/{started['id']}"))["state"]
                      != "RUNNING" and r, "the requested run")
    assert done["state"] == "SUCCESS", done
    assert sum(p["records_in"] for p in done["report"]["partitions"]) == 5
    assert horizons(data) == {i: end - 1 for i, end in log_ends(data).items()}

    # The CLI beside the server: through its admin API, and with --local (the CLI asks
    # the server to roll, then compacts here).
    ok(run(data, "produce", "prices", stdin="MSFT\t411.0\n"))
    ok(run(data, "compact", "prices", "--json"))
    assert horizons(data) == {i: end - 1 for i, end in log_ends(data).items()}
    ok(run(data, "produce", "prices", stdin="AAPL\t192.0\n"))
    report = json.loads(ok(run(data, "compact", "prices", *LOCAL, "--local", "--json",
                               env=ENV)))
    assert sum(p["records_in"] for p in report["partitions"]) > 0
    assert horizons(data) == {i: end - 1 for i, end in log_ends(data).items()}
