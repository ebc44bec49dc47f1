"""The `compactlog` command, run as users run it: the installed console script."""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path

import pytest

from support.cli import COMPACTLOG, consume_json, ok, run


def test_produce_consume_round_trip(tmp_path: Path) -> None:
    ok(run(tmp_path, "topics", "create", "prices", "--partitions", "3",
           "--config", "cleanup.policy=compact"))
    lines = "AAPL\t189.5\nMSFT\t410.2\n\nAAPL\t190.1\n"
    produced = run(tmp_path, "produce", "prices", stdin=lines)
    assert produced.returncode == 0, produced.stderr
    assert "produced 3 record(s)" in produced.stderr
    tombstone = json.dumps({"key": "MSFT", "value": None, "headers": {"why": "delisted"}})
    ok(run(tmp_path, "produce", "prices", stdin=tombstone + "\n"))

    records = consume_json(tmp_path, "prices")
    by_key: dict[str, list[dict[str, object]]] = {}
    for record in records:
        assert set(record) == {"partition", "offset", "timestamp", "key", "value", "headers"}
        by_key.setdefault(str(record["key"]), []).append(record)
    assert [r["value"] for r in by_key["AAPL"]] == ["189.5", "190.1"]
    assert [r["value"] for r in by_key["MSFT"]] == ["410.2", None]
    assert by_key["MSFT"][1]["headers"] == [["why", "delisted"]]
    # A key always lands in one partition, at increasing offsets.
    for history in by_key.values():
        assert len({r["partition"] for r in history}) == 1
        offsets = [int(str(r["offset"])) for r in history]
        assert offsets == sorted(offsets)

    text = ok(run(tmp_path, "consume", "prices"))
    assert sorted(text.splitlines()) == sorted(
        ["AAPL\t189.5", "MSFT\t410.2", "AAPL\t190.1", '{"key": "MSFT", "value": null}']
    )


def test_env_var_data_dir_and_base64(tmp_path: Path) -> None:
    env = {"COMPACTLOG_DATA_DIR": str(tmp_path / "env-dir")}
    ok(run(tmp_path, "topics", "create", "raw", env=env))
    key, value = b"\x00\xffkey", bytes(range(256))
    line = json.dumps({"key": base64.b64encode(key).decode(),
                       "value": base64.b64encode(value).decode(), "timestamp": 1234})
    ok(run(tmp_path, "produce", "raw", "--encoding", "base64", stdin=line + "\n", env=env))
    out = ok(run(tmp_path, "consume", "raw", "--format", "json", "--encoding", "base64", env=env))
    record = json.loads(out)
    assert base64.b64decode(record["key"]) == key
    assert base64.b64decode(record["value"]) == value
    assert record["timestamp"] == 1234
    assert (tmp_path / "env-dir" / "topics" / "raw").is_dir()


def test_consume_positions(tmp_path: Path) -> None:
    ok(run(tmp_path, "topics", "create", "t"))
    ok(run(tmp_path, "produce", "t", stdin="".join(f"k{i}\tv{i}\n" for i in range(10))))
    assert [r["offset"] for r in consume_json(tmp_path, "t", "--from", "7")] == [7, 8, 9]
    assert consume_json(tmp_path, "t", "--from", "latest") == []
    assert len(consume_json(tmp_path, "t", "--max-records", "4")) == 4
    assert [r["offset"] for r in consume_json(tmp_path, "t", "--partition", "0")][:2] == [0, 1]


def test_follow_sees_records_produced_by_another_process(tmp_path: Path) -> None:
    ok(run(tmp_path, "topics", "create", "live"))
    follower = subprocess.Popen(
        [COMPACTLOG, "--data-dir", str(tmp_path), "consume", "live", "--follow",
         "--max-records", "3", "--format", "json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        ok(run(tmp_path, "produce", "live", stdin="a\t1\nb\t2\nc\t3\n"))
        out, err = follower.communicate(timeout=60)
    finally:
        follower.kill()
    assert follower.returncode == 0, err
    assert [json.loads(line)["value"] for line in out.splitlines()] == ["1", "2", "3"]


def test_topics_commands(tmp_path: Path) -> None:
    ok(run(tmp_path, "topics", "create", "a", "-p", "2", "-c", "retention.ms=1000"))
    ok(run(tmp_path, "topics", "create", "b"))
    assert ok(run(tmp_path, "topics", "list")).split() == ["a", "b"]
    described = json.loads(ok(run(tmp_path, "topics", "describe", "a", "--json")))
    assert described["config"]["retention.ms"] == 1000
    assert described["overrides"] == ["retention.ms"]
    assert [p["partition"] for p in described["partitions"]] == [0, 1]
    ok(run(tmp_path, "topics", "alter", "a", "-c", "cleanup.policy=compact",
           "--delete-config", "retention.ms"))
    described = json.loads(ok(run(tmp_path, "topics", "describe", "a", "--json")))
    assert described["config"]["cleanup.policy"] == "compact"
    assert described["overrides"] == ["cleanup.policy"]
    table = ok(run(tmp_path, "topics", "describe", "a"))
    assert "cleanup.policy" in table and "compact" in table
    ok(run(tmp_path, "topics", "delete", "b", "--yes"))
    assert ok(run(tmp_path, "topics", "list")).split() == ["a"]


@pytest.mark.parametrize(
    ("args", "stdin", "expected"),
    [
        (["consume", "missing"], "", "unknown topic 'missing'"),
        (["topics", "create", "x", "-c", "segment.bytes=12"], "",
         "invalid value '12' for config 'segment.bytes': must be an int in [1024"),
        (["topics", "create", "x", "-c", "no.such.key=1"], "", "unknown config key 'no.such.key'"),
        (["topics", "create", "x", "-c", "cleanup.policy"], "", "expected KEY=VALUE"),
        (["topics", "create", "bad/name"], "", "invalid topic name 'bad/name'"),
        (["topics", "create", "x", "--partitions", "0"], "", "partitions must be in [1,"),
        (["produce", "c"], "k\tv\nno tab here\n", "input line 2: expected key<TAB>value"),
        (["produce", "c"], '{"key": "k", "value": 5}\n', "input line 1: value must be a string"),
        (["produce", "c"], '{"key": "k"\n', "input line 1: invalid JSON"),
        (["produce", "c"], '{"value": "v"}\n', "input line 1: the record has no key"),
        (["produce", "c", "--encoding", "base64"], '{"key": "!!", "value": null}\n',
         "input line 1: key is not valid base64"),
        (["consume", "c", "--from", "soon"], "", "--from must be earliest, latest or an offset"),
        (["consume", "c", "--partition", "9"], "", "topic 'c' has no partition 9"),
    ],
)
def test_bad_input_gets_one_clear_line(
    tmp_path: Path, args: list[str], stdin: str, expected: str
) -> None:
    ok(run(tmp_path, "topics", "create", "c", "-c", "cleanup.policy=compact"))
    result = run(tmp_path, *args, stdin=stdin)
    assert result.returncode == 1
    assert result.stderr.startswith("error: ")
    assert expected in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_bad_line_keeps_earlier_batches_and_debug_shows_traceback(tmp_path: Path) -> None:
    ok(run(tmp_path, "topics", "create", "t"))
    good = "".join(f"k{i}\tv{i}\n" for i in range(5))
    result = run(tmp_path, "produce", "t", "--batch-size", "5", stdin=good + "broken\n")
    assert result.returncode == 1
    assert "input line 6" in result.stderr
    assert len(consume_json(tmp_path, "t")) == 5
    debug = run(tmp_path, "--debug", "consume", "nope")
    assert debug.returncode == 1
    assert "Traceback" in debug.stderr and "UnknownTopicError" in debug.stderr


def test_second_writer_is_refused_while_readers_work(tmp_path: Path) -> None:
    from compactlog import LogStore

    ok(run(tmp_path, "topics", "create", "t"))
    with LogStore.open(tmp_path):
        result = run(tmp_path, "produce", "t", stdin="k\tv\n")
        assert result.returncode == 1
        assert "in use by another writer" in result.stderr
        assert result.stderr.count("\n") == 1
        ok(run(tmp_path, "consume", "t"))


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    result = run(tmp_path, "topics", "alter", "t")
    assert result.returncode == 2
    assert "nothing to change" in result.stderr
    result = run(tmp_path, "consume")
    assert result.returncode == 2
    assert "Missing argument 'TOPIC'" in result.stderr


def test_topics_create_takes_kafkas_replication_factor(tmp_path: Path) -> None:
    """`--replication-factor 1` as kafka-topics takes it; more is one clear line."""
    out = ok(run(tmp_path, "topics", "create", "prices", "--replication-factor", "1"))
    assert "created topic prices" in out
    refused = run(tmp_path, "topics", "create", "other", "--replication-factor", "3")
    assert refused.returncode == 1
    assert refused.stderr == ("error: --replication-factor 3 for topic 'other': compactlog "
                              "runs a single broker, so a topic has 1 replica\n")
