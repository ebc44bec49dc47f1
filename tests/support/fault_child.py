"""Run one fault scenario (tests/support/fault_scenarios.py) and SIGKILL this process at the
Nth fault point it passes (or never, with -1), printing "ACK ..." for every record
acknowledged before the kill.

    python fault_child.py SCENARIO DATA_DIR CLOCK_MS KILL_AT
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/, for support.*

from compactlog import faults
from support.fakes import FakeClock
from support.fault_scenarios import SCENARIOS, print_ack
from support.faultkit import Oracle


def main() -> None:
    name, data, clock_ms, kill_at = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), \
        int(sys.argv[4])
    scenario = SCENARIOS[name]
    clock = FakeClock(clock_ms / 1000)
    passed = [0]

    def kill(point: str, path: str) -> None:
        if passed[0] == kill_at:
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        passed[0] += 1

    store = scenario.open(data, clock)
    oracle = Oracle.of(store)
    faults.install(kill)
    scenario.operation(store, oracle, clock, print_ack)
    faults.install(None)
    store.close()
    print(f"DONE {passed[0]}", flush=True)


if __name__ == "__main__":
    main()
