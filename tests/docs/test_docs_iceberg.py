"""docs/querying.md's state-table examples (DuckDB, pyiceberg, Polars, time travel), run
as written, each in a Python of its own (without this checkout on its PYTHONPATH; the
examples import nothing of compactlog, which the test checks), in a directory holding
`compactlog-data`, and compared with the Reader's compacted view up to each horizon.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from compactlog.storage.records import ProducerRecord
from compactlog.storage.store import LogStore
from local_engine import LocalCompactionService
from support.iceberg_support import expected_state
from support.paths import ROOT

DOC = ROOT / "docs" / "querying.md"
SECTION = "## The compacted state as an Iceberg table"


def blocks() -> list[str]:
    text = DOC.read_text()
    section = text[text.index(SECTION) + len(SECTION):]
    if "\n## " in section:
        section = section[:section.index("\n## ")]
    return re.findall(r"```python\n(.*?)```", section, re.S)


@pytest.fixture(scope="module")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, int]]:
    root = tmp_path_factory.mktemp("docs-iceberg")
    with LogStore.open(root / "compactlog-data") as store:
        store.create_topic("prices", 4, {"cleanup.policy": "compact",
                                         "min.compaction.lag.ms": "0",
                                         "compaction.ledger.rewrite.live.fraction": "0"})
        for run, count in enumerate((2000, 150)):
            store.append("prices", [
                ProducerRecord(b"SYM%d" % ((i * 7 + run) % 300),
                               None if i % 41 == 3 else b"%d" % i) for i in range(count)])
            for partition in store.topic("prices").partitions:
                partition.roll()
            LocalCompactionService(store, "prices", {"engine": "arrow"}).compact()
        store.append("prices", [ProducerRecord(b"SYM1", b"after the horizon")])
        counts: dict[int, int] = {}
        for row in expected_state(store, "prices"):
            counts[row[0]] = counts.get(row[0], 0) + 1
    return root, counts


def run(block: str, root: Path) -> str:
    assert "import compactlog" not in block and "from compactlog" not in block
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", block], cwd=root, env=env, text=True,
                          capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_page_has_the_four_examples() -> None:
    found = blocks()
    assert len(found) == 4
    assert "iceberg_scan" in found[0] and "StaticTable" in found[1]
    assert "scan_iceberg" in found[2] and "snapshot_id=" in found[3]


def test_duckdb_reads_the_state(data_root: tuple[Path, dict[int, int]]) -> None:
    root, counts = data_root
    out = run(blocks()[0], root)
    rows = [line.split("│")[1:4] for line in out.splitlines()
            if re.match(r"│\s+\d", line)]
    assert {int(p): int(k) for p, k, _ in rows} == counts


def test_pyiceberg_reads_the_state(data_root: tuple[Path, dict[int, int]]) -> None:
    root, counts = data_root
    assert run(blocks()[1], root).strip() == f"{sum(counts.values())} keys"


def test_polars_reads_the_state(data_root: tuple[Path, dict[int, int]]) -> None:
    root, counts = data_root
    out = run(blocks()[2], root)
    rows = re.findall(r"│ (\d+)\s+┆ (\d+)", out)
    assert {int(p): int(k) for p, k in rows} == counts


def test_time_travel_reads_the_first_snapshot(data_root: tuple[Path, dict[int, int]]) -> None:
    root, _ = data_root
    out = run(blocks()[3], root)
    assert re.fullmatch(r"when partition 0's horizon was \d+: \d+ keys\n", out)
