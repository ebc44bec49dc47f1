"""Output a person reads right (issue 24, item 6): a tombstone is visible in `consume`'s
text format, compaction summaries count what the ledger holds and say when a run had
nothing to do, tables fit 80 columns (rich's console width set to 80, through $COLUMNS
as a terminal would), and `topics describe` prints booleans as they are typed."""

from __future__ import annotations

import json
from pathlib import Path

from compactlog import LogStore, ProducerRecord
from support.cli import ENV, LOCAL, assert_fits, ok, run
from support.paths import ROOT

NARROW = {**ENV, "COLUMNS": "80"}


def test_the_text_format_shows_a_tombstone_unlike_an_empty_value(tmp_path: Path) -> None:
    ok(run(tmp_path, "topics", "create", "t"))
    ok(run(tmp_path, "produce", "t",
           stdin='AAPL\t189.5\nEMPTY\t\n{"key": "GONE", "value": null}\n'))
    text = ok(run(tmp_path, "consume", "t"))
    assert text.splitlines() == ["AAPL\t189.5", "EMPTY\t", '{"key": "GONE", "value": null}']
    # What it prints is what `produce` reads: the same records again.
    ok(run(tmp_path, "topics", "create", "copy"))
    ok(run(tmp_path, "produce", "copy", stdin=text))
    copied = [json.loads(line) for line in ok(run(tmp_path, "consume", "copy", "--format",
                                                  "json")).splitlines()]
    assert [(r["key"], r["value"]) for r in copied] == [
        ("AAPL", "189.5"), ("EMPTY", ""), ("GONE", None)]
    # In base64 too.
    encoded = ok(run(tmp_path, "consume", "t", "--encoding", "base64")).splitlines()
    assert encoded[2] == '{"key": "R09ORQ==", "value": null}'


def make_compacted(data: Path, partitions: int = 2) -> None:
    ok(run(data, "topics", "create", "t", "-p", str(partitions), "-c", "cleanup.policy=compact",
           "-c", "delete.retention.ms=0"))
    lines = "".join(f"k{i % 20}\tv{i}\n" for i in range(200)) + '{"key": "k3", "value": null}\n'
    ok(run(data, "produce", "t", stdin=lines))


def test_a_run_with_nothing_new_says_so_and_counts_the_ledger(tmp_path: Path) -> None:
    make_compacted(tmp_path)
    first = json.loads(ok(run(tmp_path, "compact", "t", *LOCAL, "--json", env=ENV)))
    keys = {p["partition"]: p["keys"] for p in first["partitions"]}
    assert sum(keys.values()) == 19
    second = json.loads(ok(run(tmp_path, "compact", "t", *LOCAL, "--json", env=ENV)))
    assert all(p["skipped"] == "nothing new since the last compaction"
               for p in second["partitions"])
    # What the ledger holds, not what this run wrote.
    assert {p["partition"]: p["keys"] for p in second["partitions"]} == keys
    table = ok(run(tmp_path, "compact", "t", *LOCAL, env=NARROW))
    assert "Nothing to compact in t" in table and "Compacted t in" not in table
    assert "nothing new since the last compaction" in table
    all_row = next(line for line in table.splitlines() if line.strip().startswith("all"))
    assert " 19 " in f"{all_row} "


def test_a_run_held_back_by_the_lag_says_so(tmp_path: Path) -> None:
    ok(run(tmp_path, "topics", "create", "t", "-c", "cleanup.policy=compact",
           "-c", "min.compaction.lag.ms=3600000"))
    ok(run(tmp_path, "produce", "t", stdin="a\t1\n"))
    report = json.loads(ok(run(tmp_path, "compact", "t", *LOCAL, "--json", env=ENV)))
    assert report["partitions"][0]["skipped"] == (
        "its new records are younger than min.compaction.lag.ms (3600000 ms)")


def big_topic(data: Path) -> None:
    """Large numbers, as in the README's demo: 150,000 records over 3,000 keys."""
    with LogStore.open(data) as store:
        store.create_topic("t", partitions=2, config={"cleanup.policy": "compact",
                                                      "segment.bytes": "1048576"})
        for start in range(0, 150_000, 5000):
            store.append("t", [ProducerRecord(b"key-%d" % (i % 3000), b"v" * 20 + b"%d" % i)
                               for i in range(start, start + 5000)])


def test_tables_fit_80_columns(tmp_path: Path) -> None:
    big_topic(tmp_path)
    with LogStore.open(tmp_path, read_only=True) as store:
        ends = [p.stats()["log_end_offset"] for p in store.topic("t").partitions]
    summary = ok(run(tmp_path, "compact", "t", *LOCAL, env=NARROW))
    assert_fits(summary, "horizon", "records", "keys", "tombstones", f"{ends[0] - 1}",
                "150,000", "3,000")
    described = ok(run(tmp_path, "topics", "describe", "t", env=NARROW))
    assert_fits(described, "compaction.ledger.rewrite.live.fraction", "9223372036854775807",
                str(ends[0]), "horizon", "dirty", "ratio", "SUCCESS")
    status = ok(run(tmp_path, "compaction-status", "t", env=NARROW))
    assert_fits(status, "SUCCESS", str(ends[1] - 1))


def test_topics_describe_prints_booleans_as_typed(tmp_path: Path) -> None:
    ok(run(tmp_path, "topics", "create", "t", "-c", "empty.value.is.tombstone=true"))
    table = ok(run(tmp_path, "topics", "describe", "t"))
    assert "True" not in table and "False" not in table
    row = next(line for line in table.splitlines() if "empty.value.is.tombstone" in line)
    assert " true " in row
    row = next(line for line in table.splitlines() if "compaction.deletion.vectors" in line)
    assert " true " in row


def readme_python_example() -> str:
    readme = (ROOT / "README.md").read_text()
    after = readme.split("\nFrom Python", 1)[1]
    start = after.index("```python\n") + len("```python\n")
    return after[start:after.index("```", start)]


def printed_as_documented(code: str) -> list[str]:
    """What a block says it prints: the lines `#   ...` after a `# prints:` comment."""
    lines = code.splitlines()
    expected = []
    for at, line in enumerate(lines):
        if line.strip() == "# prints:":
            for following in lines[at + 1:]:
                if not following.startswith("#   "):
                    break
                expected.append(following[4:])
    return expected


def test_the_readmes_python_example_prints_what_it_says(tmp_path: Path) -> None:
    """Run after the README's CLI block (which made `prices`, 4 partitions), as ordered."""
    import subprocess
    import sys

    ok(run(tmp_path / "compactlog-data", "topics", "create", "prices", "--partitions", "4",
           "--config", "cleanup.policy=compact"))
    ok(run(tmp_path / "compactlog-data", "produce", "prices", stdin="AAPL\t189.5\n"))
    code = readme_python_example()
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    expected = printed_as_documented(code)
    assert expected, "the example does not say what it prints"
    assert done.stdout.splitlines() == expected
