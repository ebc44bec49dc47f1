"""The compaction commands, run as a user runs them: `compactlog compact`,
`compactlog compaction-status`, `compactlog consume --compacted`, `topics describe`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from compactlog import LogStore
from support.cli import ENV, LOCAL, TOPIC_CONFIG, consume_json, ok, run
from support.spark import SPARK_TEST_CONF


def make_topic(data: Path, partitions: int = 2, *config: str) -> dict[str, str]:
    """Produce overwritten keys and a tombstone, seal them; return the expected view."""
    ok(run(data, "topics", "create", "t", "--partitions", str(partitions), *TOPIC_CONFIG,
           *config))
    lines = [json.dumps({"key": f"k{i % 20}", "value": f"v{i}"}) for i in range(200)]
    lines.append(json.dumps({"key": "k3", "value": None}))
    ok(run(data, "produce", "t", stdin="\n".join(lines) + "\n"))
    with LogStore.open(data) as store:
        for partition in store.topic("t").partitions:
            partition.roll()
    expected = {f"k{i % 20}": f"v{i}" for i in range(200)}
    del expected["k3"]
    return expected


def compacted_view(data: Path) -> dict[str, str | None]:
    return {str(r["key"]): r["value"]  # type: ignore[misc]
            for r in consume_json(data, "t", "--compacted")}


def test_compact_with_spark_then_status_view_and_describe(tmp_path: Path) -> None:
    # A Spark job by default, however small the topic (--without-spark: the test below).
    expected = make_topic(tmp_path, 2)
    spark_conf = [arg for key, value in SPARK_TEST_CONF.items()
                  for arg in ("--spark-conf", f"{key}={value}")]
    result = run(tmp_path, "--debug", "compact", "t", "--spark-master", "local[1]",
                 *spark_conf, "--json", env=ENV, timeout=300)
    report = json.loads(ok(result))
    assert report["topic"] == "t"
    assert re.fullmatch(r"Spark local\[1\]: job \d+ \(1 stage, 1 task\)", report["engine"])
    # Spark's JVM, its Python workers and py4j wrote into the file --debug names, and
    # nothing of theirs reached the terminal.
    named = re.search(r"Spark's output .*: (\S+\.log)$", result.stderr, re.MULTILINE)
    assert named is not None, result.stderr
    spark_log = Path(named.group(1))
    assert "Setting default log level" in spark_log.read_text()
    jvm_lines = re.compile(r"^\d\d/\d\d/\d\d \d\d:\d\d:\d\d (WARN|ERROR|INFO) |"
                           r"Setting default log level|sc\.setLogLevel|jdk\.incubator|py4j\.\w",
                           re.MULTILINE)
    assert not jvm_lines.search(result.stderr + result.stdout), result.stderr
    spark_log.unlink()
    assert sum(p["records_in"] for p in report["partitions"]) == 201
    assert sum(p["records_out"] for p in report["partitions"]) == 19
    assert sum(p["tombstones_removed"] for p in report["partitions"]) == 1
    assert report["startup_s"] > 0 and set(report["stages"]) >= {"phase 1", "phase 2"}
    assert compacted_view(tmp_path) == expected
    assert len(consume_json(tmp_path, "t")) == 201  # the raw log is untouched

    status = json.loads(ok(run(tmp_path, "compaction-status", "t", "--json")))
    assert [p["state"] for p in status["partitions"]] == ["SUCCESS", "SUCCESS"]
    assert all(p["horizon"] is not None for p in status["partitions"])
    described = ok(run(tmp_path, "topics", "describe", "t"))
    assert "dirty" in described and "removed" in described


def test_compact_without_spark_starts_no_jvm(tmp_path: Path) -> None:
    expected = make_topic(tmp_path)
    # A master no JVM could reach: the run must not start one.
    result = run(tmp_path, "compact", "t", "--without-spark", "--spark-master",
                 "spark://nowhere:1", "--json", env=ENV, timeout=300)
    report = json.loads(ok(result))
    assert report["startup_s"] == 0 and "inline: write" in report["stages"]
    assert report["engine"] == "in this process, no Spark job: 2 partitions"
    assert compacted_view(tmp_path) == expected
    # --without-spark is a run here: it does not go with --server.
    refused = run(tmp_path, "compact", "t", "--without-spark", "--server", "http://x:1")
    assert refused.returncode == 2 and "--without-spark" in refused.stderr


def test_the_retired_inline_limit_is_refused_with_what_replaced_it(tmp_path: Path) -> None:
    result = run(tmp_path, "topics", "create", "r", "-c", "cleanup.policy=compact",
                 "-c", "compaction.inline.max.bytes=0")
    assert result.returncode != 0
    assert ("config key 'compaction.inline.max.bytes' was removed: every compaction is a "
            "Spark job now; to run one without Spark, set compaction.without.spark=true"
            in result.stderr), result.stderr


def test_compact_prints_a_summary_table(tmp_path: Path) -> None:
    make_topic(tmp_path)
    before = ok(run(tmp_path, "compaction-status", "t"))
    assert before.count("NOT_RUN") == 2
    out = ok(run(tmp_path, "compact", "t", *LOCAL, env=ENV))
    # Two-word headers on two lines ("records" over "in"), to fit 80 columns.
    for column in ("records", "keys", "tombstones", "size", "horizon", "records removed"):
        assert column in out
    assert "Compacted t in" in out and "MB/s" in out
    assert ok(run(tmp_path, "compaction-status", "t")).count("SUCCESS") == 2
    again = json.loads(ok(run(tmp_path, "compact", "t", *LOCAL, "--json", env=ENV)))
    assert all(p["skipped"] for p in again["partitions"]), "nothing new: nothing to do"


def test_compact_one_partition(tmp_path: Path) -> None:
    make_topic(tmp_path)
    report = json.loads(ok(run(tmp_path, "compact", "t", "-p", "1", *LOCAL, "--json",
                               env=ENV)))
    assert [p["partition"] for p in report["partitions"]] == [1]
    states = json.loads(ok(run(tmp_path, "compaction-status", "t", "--json")))
    assert [p["state"] for p in states["partitions"]] == ["NOT_RUN", "SUCCESS"]


def test_failed_run_shows_as_error_with_the_cause(tmp_path: Path) -> None:
    make_topic(tmp_path, partitions=1)
    sealed = sorted((tmp_path / "topics" / "t" / "0" / "segments").glob("*.parquet"))
    damaged = sealed[len(sealed) // 2]
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    result = run(tmp_path, "compact", "t", *LOCAL, env=ENV)
    assert result.returncode == 1
    assert damaged.name in result.stderr and "Traceback" not in result.stderr
    status = json.loads(ok(run(tmp_path, "compaction-status", "t", "--json")))
    assert status["partitions"][0]["state"] == "ERROR"
    assert damaged.name in status["partitions"][0]["error"]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["compact", "nope"], "unknown topic 'nope'"),
        (["compact", "plain"], "cleanup.policy=delete"),
        (["compact", "t", "-p", "7"], "topic 't' has no partition 7"),
        (["compact", "t", "--service", "no_such_module:Factory"], "no_such_module"),
        (["compact", "t", "--spark-conf", "spark.driver.memory"], "KEY=VALUE"),
        (["compaction-status", "nope"], "unknown topic 'nope'"),
    ],
)
def test_bad_compaction_input_gets_one_clear_line(
    tmp_path: Path, args: list[str], expected: str
) -> None:
    ok(run(tmp_path, "topics", "create", "t", *TOPIC_CONFIG))
    ok(run(tmp_path, "topics", "create", "plain"))
    result = run(tmp_path, *args, env=ENV)
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith("error: ")
    assert expected in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
