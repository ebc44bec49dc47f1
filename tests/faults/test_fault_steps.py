"""Faults at every step of every commit protocol, deterministically.

For each scenario (tests/support/fault_scenarios.py: appends that roll and seal, a seal in the
server's way, compactions of one and two partitions (also incremental, with deletion
vectors, and with dirty segments adopted as they are), retention with its sweep, a topic
config change), the fault points the operation passes are recorded once; then, for
each step, the operation runs again on a fresh copy of its data directory with that
step failing with ENOSPC, failing with EIO, stalling while another committer commits
to the same manifests, or (tests marked slow, and a sample by default) killed with
SIGKILL. The store is then reopened and the contract checked against the oracle of
what was acknowledged (tests/support/faultkit.py), and it must go on working; after a
compaction scenario, the Iceberg state table read by pyiceberg must then be the
compacted view. Every replay runs where the template was prepared (`home`), so the
sync after a compaction is the incremental one, building on the previous snapshot.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from compactlog import faults
from compactlog.iceberg import state_table_location
from compactlog.storage.store import LogStore
from support.fakes import T0, FakeClock
from support.fault_scenarios import SCENARIOS, Scenario, parse_ack
from support.faultkit import (
    TOPIC,
    Oracle,
    Step,
    check_contract,
    check_goes_on,
    fault_at,
    fresh_copy,
    join_stalled,
    stall_with_a_concurrent_commit,
)
from support.iceberg_readers import pyiceberg_rows
from support.iceberg_support import expected_state
from support.paths import SUPPORT_DIR

KINDS = ("enospc", "eio", "stall")
_TEMPLATES: dict[str, tuple[Path, list[Step]]] = {}


def home(name: str, root: Path) -> Path:
    """Where the scenario's data directory is prepared and every replay runs: a fresh
    copy of its template is put back there each time, so that the Iceberg table, whose
    metadata names absolute paths, is found where it was written and the sync after a
    compaction builds on the previous snapshot (the incremental sync), as in a store
    that was never moved (iceberg/relocate.py)."""
    return root / f"at-{name}"


def template(name: str, root: Path) -> tuple[Path, list[Step]]:
    """The scenario's prepared data directory (a pristine copy, never opened) and the
    steps its operation passes."""
    if name not in _TEMPLATES:
        scenario = SCENARIOS[name]
        clock = FakeClock()
        with LogStore.open(home(name, root), clock=clock) as store:
            scenario.prepare(store, clock)
        data = fresh_copy(home(name, root), root / f"template-{name}")
        probe = fresh_copy(data, home(name, root))
        steps = _steps_with(scenario, probe, FakeClock())
        _TEMPLATES[name] = (data, steps)
    return _TEMPLATES[name]


def _steps_with(scenario: Scenario, data: Path, clock: FakeClock) -> list[Step]:
    """Run the operation once, recording the fault points it passes."""
    steps: list[Step] = []
    store = scenario.open(data, clock)
    oracle = Oracle.of(store)
    with faults.injected(lambda point, path: steps.append(Step(len(steps), point, path))):
        scenario.operation(store, oracle, clock, lambda p, r: None)
    store.close()
    return steps


def run_with_fault(name: str, root: Path, step: int, kind: str) -> None:
    scenario = SCENARIOS[name]
    data_template, steps = template(name, root)
    data = fresh_copy(data_template, home(name, root))
    clock = FakeClock()
    where = f"{name}: {kind} at {steps[step].describe()}"
    store = scenario.open(data, clock)
    oracle = Oracle.of(store)
    scenario.expect(store, oracle)
    stall = stall_with_a_concurrent_commit(data, clock, oracle)
    try:
        with fault_at(step, kind, stall) as hit:
            scenario.operation(store, oracle, clock, oracle.acknowledge)
    finally:
        join_stalled()
        store.close()
    assert hit, f"{where}: the operation no longer passes this step"
    check_contract(data, oracle, clock, where)
    with scenario.open(data, clock) as reopened:
        scenario.verify(reopened, where)
    check_goes_on(data, clock, where)
    check_state_table(name, data, clock, where)


def check_state_table(name: str, data: Path, clock: FakeClock, where: str) -> None:
    """After a compaction scenario went on (check_goes_on compacts again, and that run's
    sync repairs whatever the fault left of the table), the Iceberg state table as
    pyiceberg reads it is the compacted view, and every file it names exists (the sweep
    that followed kept what the table holds)."""
    if not name.startswith("compact"):
        return
    with SCENARIOS[name].open(data, clock, read_only=True) as store:
        expected = expected_state(store, TOPIC)
        table = state_table_location(store, TOPIC)
    assert pyiceberg_rows(table) == expected, f"{where}: the state table after going on"


def cases(kinds: tuple[str, ...]) -> list[Any]:
    """(scenario, step, kind) for every step; the step counts are fixed per scenario
    (STEPS below is checked against a recording). A step of the Iceberg sync is the
    slow run's but for SYNC_SAMPLE. ENOSPC and EIO take the same path (an OSError
    raised by the step), so by default they take turns, step by step, and the slow run
    has both at every step; a stall runs at every step."""
    found: list[Any] = []
    for name, count in STEPS.items():
        first, end = SYNC_STEPS.get(name, (0, 0))
        for step in range(count):
            in_sync = first <= step < end and step not in SYNC_SAMPLE[name]
            for kind in kinds:
                slow = in_sync or kind == ("eio", "enospc")[step % 2]
                found.append(pytest.param(name, step, kind, marks=pytest.mark.slow)
                             if slow else (name, step, kind))
    return found


# Steps each operation passes; test_step_counts_are_current keeps these in line.
STEPS = {"append": 23, "seal": 30, "compact-1": 50, "compact-2": 86, "retention": 15,
         "alter": 9, "compact-dv-1": 59, "compact-dv-2": 100, "compact-adopt": 67,
         "merge": 28, "compact-merge": 57}
# The steps [first, end) of the Iceberg sync after a compaction (runner step 5b: the
# table's files and the partitions' hold documents; the replay runs where the table was
# written, so the sync builds v2 on the template's v1, incrementally). A failed sync is
# only logged and the next one repairs it (check_state_table, and
# tests/iceberg/test_iceberg_state.py), so faults at its steps run by default only at its first
# step and its commit point (v2.metadata.json renamed into place), and at every step in
# the slow run.
SYNC_STEPS = {"compact-1": (22, 46), "compact-2": (34, 78), "compact-dv-1": (21, 55),
              "compact-dv-2": (42, 92), "compact-adopt": (29, 63),
              "compact-merge": (22, 53)}
SYNC_SAMPLE = {"compact-1": (22, 40), "compact-2": (34, 72), "compact-dv-1": (21, 49),
               "compact-dv-2": (42, 86), "compact-adopt": (29, 57),
               "compact-merge": (22, 47)}


def sync_steps(steps: list[Step]) -> tuple[int, int] | None:
    """[first, end) of the steps on the Iceberg table's files or the hold documents."""
    found = [step.index for step in steps
             if {"iceberg", "holds"} & set(Path(step.path).parts)]
    return (found[0], found[-1] + 1) if found else None


def test_step_counts_are_current(tmp_path_factory: pytest.TempPathFactory) -> None:
    root = tmp_path_factory.mktemp("faults")
    found = {name: len(template(name, root)[1]) for name in SCENARIOS}
    assert found == STEPS, "update STEPS in this file to the recorded counts"
    synced = {name: sync_steps(template(name, root)[1]) for name in SCENARIOS}
    assert {name: found for name, found in synced.items() if found} == SYNC_STEPS, \
        "update SYNC_STEPS (and SYNC_SAMPLE) in this file to the recorded steps"


def test_the_merge_scenario_merges(tmp_path_factory: pytest.TempPathFactory) -> None:
    """compact-merge's operation, run through without a fault, rewrites both small
    ledger files with its new survivors (else its steps would test an ordinary
    incremental run)."""
    root = tmp_path_factory.mktemp("faults")
    data, _ = template("compact-merge", root)
    scenario = SCENARIOS["compact-merge"]
    probe = fresh_copy(data, root / "merge-probe")
    clock = FakeClock()
    with scenario.open(probe, clock) as store:
        small = {info.file for info in store.topic(TOPIC).partition(0).manifest.ledger}
        assert len(small) == 2
        scenario.operation(store, Oracle.of(store), clock, lambda p, r: None)
        after = {info.file for info in store.topic(TOPIC).partition(0).manifest.ledger}
        # both rewritten (phase 2 rolls its output at segment.bytes, so two files again)
        assert not small & after, f"kept {small & after}"


@pytest.mark.parametrize(("name", "step", "kind"), cases(KINDS))
def test_a_fault_at_every_step_keeps_the_contract(
    name: str, step: int, kind: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    run_with_fault(name, _root(tmp_path_factory), step, kind)


_ROOT: list[Path] = []


def _root(factory: pytest.TempPathFactory) -> Path:
    if not _ROOT:
        _ROOT.append(factory.mktemp("faults"))
    return _ROOT[0]


def run_with_kill(name: str, root: Path, step: int) -> None:
    scenario = SCENARIOS[name]
    data_template, steps = template(name, root)
    data = fresh_copy(data_template, home(name, root))
    clock = FakeClock()
    with scenario.open(data, clock) as store:
        oracle = Oracle.of(store)
        scenario.expect(store, oracle)
    child = subprocess.run(
        [sys.executable, str(SUPPORT_DIR / "fault_child.py"), name, str(data),
         str(int(T0 * 1000)), str(step)],
        capture_output=True, text=True, timeout=120, check=False)
    where = f"{name}: SIGKILL at {steps[step].describe()}"
    assert child.returncode == -9, f"{where}: exit {child.returncode}\n{child.stderr}"
    for line in child.stdout.splitlines():
        if line.startswith("ACK "):
            partition, record = parse_ack(line)
            oracle.acknowledge(partition, record)
    check_contract(data, oracle, clock, where)
    with scenario.open(data, clock) as reopened:
        scenario.verify(reopened, where)
    check_goes_on(data, clock, where)
    check_state_table(name, data, clock, where)


# compact-1's 32: the hold document's new version written and being fsynced (its
# temporary file was once left behind by recovery).
KILL_SAMPLE = {"append": (0, 5, 13), "seal": (3, 7), "compact-1": (10, 20, 32),
               "compact-2": (30,), "retention": (4,), "alter": (2,),
               # a DV renamed into place but not committed; the new ledger file written
               "compact-dv-1": (6, 10), "compact-dv-2": (20,),
               # the merged file renamed into place, not committed; the second
               # merge's new current.json written, not yet renamed
               "merge": (3, 24),
               # the merge's second file renamed into place; its manifest version
               # written, not yet current
               "compact-merge": (10, 18)}


@pytest.mark.parametrize(("name", "step"), [(name, step) for name, steps in KILL_SAMPLE.items()
                                            for step in steps])
def test_a_kill_at_sampled_steps_keeps_the_contract(
    name: str, step: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    run_with_kill(name, _root(tmp_path_factory), step)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "step"), [(name, step) for name, count in STEPS.items()
                                            for step in range(count)])
def test_a_kill_at_every_step_keeps_the_contract(
    name: str, step: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    run_with_kill(name, _root(tmp_path_factory), step)
