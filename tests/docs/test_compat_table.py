"""The compatibility table of docs/server.md cannot go stale: it lists every application
and client the tests run against the server, at the versions pinned now, with every
scenario of tests/support/compat.py; every scenario there is some test's (or n/a); and the
renderer (scripts/compat_table.py) says what each outcome means."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from support.compat import ROOT, SUBJECTS, not_applicable, scenario_ids, server_gap, version

SCRIPT = ROOT / "scripts" / "compat_table.py"


def test_docs_list_every_application_client_version_and_scenario() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_every_scenario_is_a_tests_and_every_mark_a_scenario(tmp_path: Path) -> None:
    files = sorted(str(path) for path in (ROOT / "tests").glob("*/test_*.py")
                   if "compat" in path.read_text())
    listing = tmp_path / "compat.json"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         *files], capture_output=True, text=True, timeout=300, cwd=ROOT,
        env={**os.environ, "COMPACTLOG_LIST_COMPAT": str(listing)})
    assert done.returncode == 0, done.stdout + done.stderr
    used = {(subject, scenario) for subject, scenario, _ in json.loads(listing.read_text())}
    assert used <= scenario_ids()
    untested = {(s, c) for s, c in scenario_ids() - used if not not_applicable(s, c)}
    assert untested == set(), "scenarios in tests/support/compat.py that no test marks"


def test_versions_come_from_the_pins() -> None:
    assert version("kafkajs") == "2.2.4"
    assert version("quixstreams").startswith("3.28.1 (confluent-kafka ")
    assert version("faust-streaming").startswith("0.15.3 (aiokafka ")
    for client in ("kafka-python", "aiokafka", "confluent-kafka"):
        assert version(client)[0].isdigit()
    assert {s.kind for s in SUBJECTS.values()} == {"application", "client"}


def test_the_table_says_what_each_outcome_means() -> None:
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import compat_table
    finally:
        sys.path.remove(str(SCRIPT.parent))
    current = version("kafkajs")
    reason = server_gap("DeleteGroups (API key 42) is not served", "no log line")

    def row(outcome: str, recorded: str = current) -> str:
        result = {"subject": "kafkajs", "scenario": "delete-group", "version": recorded,
                  "outcome": outcome, "reason": reason if "x" in outcome else "",
                  "gap": "DeleteGroups (API key 42) is not served" if "x" in outcome else "",
                  "test": "tests/apps/test_apps_kafkajs.py::test_kafkajs_delete_group"}
        table = compat_table.render({"kafkajs|delete-group": result})
        (line,) = [line for line in table.splitlines() if "`delete-group`" in line
                   and line.startswith("| KafkaJS")]
        return line.rsplit("|", 2)[-2].strip()

    assert row("passed") == "passes"
    assert row("xfailed") == "fails, server gap: DeleteGroups (API key 42) is not served"
    assert row("xpassed") == "passes (its xfail mark can go)"
    assert row("failed").startswith("**FAILS**")
    assert row("passed", "0.0.1").startswith("not run at this version")
    table = compat_table.render({})
    assert "| kcat (client) |" in table and "| n/a |" in table
    assert table.count("\n") + 1 == 2 + len(scenario_ids())
