"""Run one fault scenario on a store on S3 (tests/support/s3_fault_kit.py), for the crash tests
of tests/faults/test_fault_steps_s3.py: open the store (its requests go through the test's
fault proxy, per the AWS settings in the environment), read what the oracle reads, print
"READY" and wait for a line on stdin (the test then arms the proxy, so that the step
numbers count the operation's requests only), run the operation, printing "ACK ..." for
every record acknowledged, and print "DONE". The test kills this process with SIGKILL
while the proxy holds one of its requests.

    python s3_fault_child.py SCENARIO S3_URL LOCAL_DIR CLOCK_MS
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/, for support.*

from support.fakes import FakeClock
from support.fault_scenarios import print_ack
from support.faultkit import Oracle
from support.s3_fault_kit import S3_SCENARIOS, Place


def main() -> None:
    name, url, local, clock_ms = sys.argv[1], sys.argv[2], Path(sys.argv[3]), \
        int(sys.argv[4])
    scenario, _ = S3_SCENARIOS[name]
    clock = FakeClock(clock_ms / 1000)
    store = Place(url, local).open(clock, scenario)
    oracle = Oracle.of(store)
    scenario.expect(store, oracle)
    print("READY", flush=True)
    sys.stdin.readline()
    scenario.operation(store, oracle, clock, print_ack)
    print("DONE", flush=True)
    store.close()


if __name__ == "__main__":
    main()
