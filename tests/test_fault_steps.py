"""Faults at every step of every commit protocol, deterministically.

For each scenario (tests/fault_scenarios.py: appends that roll and seal, a seal in the
server's way, compactions of one and two partitions (also incremental, with deletion
vectors), retention with its sweep, a topic
config change), the fault points the operation passes are recorded once; then, for
each step, the operation runs again on a fresh copy of its data directory with that
step failing with ENOSPC, failing with EIO, stalling while another committer commits
to the same manifests, or (tests marked slow, and a sample by default) killed with
SIGKILL. The store is then reopened and the contract checked against the oracle of
what was acknowledged (tests/faultkit.py), and it must go on working.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from compactlog.storage import faults
from compactlog.storage.store import LogStore
from fakes import T0, FakeClock
from fault_scenarios import SCENARIOS, Scenario, parse_ack
from faultkit import (
    Oracle,
    Step,
    check_contract,
    check_goes_on,
    fault_at,
    fresh_copy,
    join_stalled,
    stall_with_a_concurrent_commit,
)

TESTS = Path(__file__).parent
KINDS = ("enospc", "eio", "stall")
_TEMPLATES: dict[str, tuple[Path, list[Step]]] = {}


def template(name: str, root: Path) -> tuple[Path, list[Step]]:
    """The scenario's prepared data directory and the steps its operation passes."""
    if name not in _TEMPLATES:
        scenario = SCENARIOS[name]
        data = root / f"template-{name}"
        clock = FakeClock()
        with LogStore.open(data, clock=clock) as store:
            scenario.prepare(store, clock)
        probe = fresh_copy(data, root / f"probe-{name}")
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
    data = fresh_copy(data_template, root / f"run-{name}")
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


def cases(kinds: tuple[str, ...]) -> list[Any]:
    """(scenario, step, kind) for every step; the step counts are fixed per scenario
    (STEPS below is checked against a recording). A step of the Iceberg sync is the
    slow run's but for SYNC_SAMPLE."""
    found: list[Any] = []
    for name, count in STEPS.items():
        first, end = SYNC_STEPS.get(name, (0, 0))
        for step in range(count):
            slow = first <= step < end and step not in SYNC_SAMPLE[name]
            found += [pytest.param(name, step, kind, marks=pytest.mark.slow) if slow
                      else (name, step, kind) for kind in kinds]
    return found


# Steps each operation passes; test_step_counts_are_current keeps these in line.
STEPS = {"append": 23, "seal": 30, "compact-1": 52, "compact-2": 88, "retention": 15,
         "alter": 9, "compact-dv-1": 61, "compact-dv-2": 102, "merge": 28}
# The steps [first, end) of the Iceberg sync after a compaction (runner step 5b: the
# table's files and the partitions' hold documents; in a fresh copy the table was
# written elsewhere, so it starts afresh, iceberg/relocate.py). A failed sync is only
# logged and the next one repairs it (tests/test_iceberg_state.py), so faults at its
# steps run by default only at its first step and its commit point (v<N+1>.metadata.json
# renamed into place), and at every step in the slow run.
SYNC_STEPS = {"compact-1": (22, 48), "compact-2": (34, 80), "compact-dv-1": (21, 57),
              "compact-dv-2": (42, 94)}
SYNC_SAMPLE = {"compact-1": (22, 40), "compact-2": (34, 72), "compact-dv-1": (21, 49),
               "compact-dv-2": (42, 86)}


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
    data = fresh_copy(data_template, root / f"kill-{name}")
    clock = FakeClock()
    with scenario.open(data, clock) as store:
        oracle = Oracle.of(store)
        scenario.expect(store, oracle)
    child = subprocess.run(
        [sys.executable, str(TESTS / "fault_child.py"), name, str(data),
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


KILL_SAMPLE = {"append": (0, 5, 13), "seal": (3, 7), "compact-1": (10, 20),
               "compact-2": (30,), "retention": (4,), "alter": (2,),
               # a DV renamed into place but not committed; the new ledger file written
               "compact-dv-1": (6, 10), "compact-dv-2": (20,),
               # the merged file renamed into place, not committed; the second
               # merge's new current.json written, not yet renamed
               "merge": (3, 24)}


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
