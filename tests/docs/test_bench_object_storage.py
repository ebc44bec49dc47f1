"""bench/object_storage.py at a tiny size, so that it cannot rot: it starts moto and its
counting proxy, produces, seals and compacts on both backends with Spark, verifies every
compacted view, exits 0 and writes the JSON the docs quote. No timing is checked."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from support.paths import ROOT

KINDS = {"PUT", "GET", "HEAD", "LIST", "DELETE", "POST"}


@pytest.mark.slow
def test_object_storage_bench_runs(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "object_storage.py"), "--records", "4000",
         "--keys", "400", "--segment-bytes", "65536", "--json", str(out)],
        capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "verified:" in done.stdout
    body = json.loads(out.read_text())
    for name in ("date", "command", "machine", "load_before", "load_after", "workload",
                 "phases", "table", "per", "verified"):
        assert name in body, name
    phases = {row["phase"]: row for row in body["table"]}
    for name in ("append #1", "seal #1", "full compaction #1", "full compaction #2 (warm)",
                 "incremental compaction +1%",
                 "upload floor: boto3 PUTs, same sizes"):
        row = phases[name]
        assert set(row["requests"]) == KINDS
        assert {"local_s", "s3_s", "s3_over_local", "mb", "uploaded_mb"} <= set(row)
    # Sealing uploads every segment and commits a manifest: it cannot be request-free.
    assert phases["seal #1"]["requests"]["PUT"] > 0
    assert phases["full compaction #1"]["requests"]["GET"] > 0
    assert body["per"]["requests_per_mb_sealed"] > 0
    assert body["per"]["requests_per_full_compaction"]["total"] > 0
    # Both backends, every compaction: 2 full + 1 incremental each.
    assert len(body["verified"]) == 6
