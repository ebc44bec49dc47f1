"""The concurrency harness in the manner of Jepsen (issue 21; tests/jepsen/): two or
three `compactlog serve` on one bucket (moto behind the S3 fault proxy), producers with
acks=all and acks=1, consumer groups, the cleaner, merging, retention, `compactlog
compact` from outside, DeleteRecords and config changes, under faults drawn from a seed;
then the checker (tests/jepsen/checker.py) over the history and the final log.

The default run has one short schedule. The slow suite runs many seeded schedules:
COMPACTLOG_JEPSEN_SCHEDULES of COMPACTLOG_JEPSEN_SECONDS each (defaults: 20 of 90 s, at
least 30 minutes and about 1,000 nemesis events in all), from COMPACTLOG_JEPSEN_SEED on.
A run prints its seed; `COMPACTLOG_JEPSEN_SEED=N pytest tests/test_jepsen.py -k short`
runs that schedule again (the same faults at the same times; the interleavings still
vary with timing, as in Jepsen).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jepsen.run import Settings, run_schedule
from s3_faults import (
    S3Proxy,
    s3_proxy_fixture,  # noqa: F401  (the `s3_proxy` fixture)
)
from s3_support import (
    S3Server,
    s3_fixture,  # noqa: F401  (the `s3` fixture)
)

SEED = int(os.environ.get("COMPACTLOG_JEPSEN_SEED", "2101"))
SCHEDULES = int(os.environ.get("COMPACTLOG_JEPSEN_SCHEDULES", "20"))
SECONDS = float(os.environ.get("COMPACTLOG_JEPSEN_SECONDS", "90"))
SHORT_SECONDS = float(os.environ.get("COMPACTLOG_JEPSEN_SHORT_SECONDS", "60"))


def test_a_short_seeded_schedule_keeps_the_contract(s3: S3Server, s3_proxy: S3Proxy,
                                                    tmp_path: Path) -> None:
    result = run_schedule(Settings(SEED, SHORT_SECONDS), s3, s3_proxy, tmp_path)
    assert result.counts["nemesis events"] >= 10, result.report()
    assert not result.failed, result.report()


# -- the slow suite: many schedules ------------------------------------------------------

@pytest.fixture(scope="module")
def totals() -> Iterator[Counter[str]]:
    found: Counter[str] = Counter()
    yield found
    if found["schedules"]:
        print(f"\njepsen totals: {dict(found)}", flush=True)


def add_up(totals: Counter[str], counts: dict[str, Any]) -> None:
    totals["schedules"] += 1
    totals["seconds (schedule)"] += int(counts["seconds (schedule)"])
    totals["seconds (all)"] += int(counts["seconds (all)"])
    totals["nemesis events"] += counts["nemesis events"]
    for kind, number in counts["nemesis events by kind"].items():
        totals[f"nemesis {kind}"] += number
    for level in ("all", "1"):
        totals[f"acks={level} acknowledged"] += counts[f"acks={level} acknowledged"]
    totals["acks=1 lost in fail-over"] += counts["acks=1 lost in fail-over"]
    totals["reads"] += counts["reads"]


@pytest.mark.slow
@pytest.mark.timeout(int(SECONDS) + 900)
@pytest.mark.parametrize("seed", range(SEED, SEED + SCHEDULES))
def test_seeded_schedules_keep_the_contract(seed: int, s3: S3Server, s3_proxy: S3Proxy,
                                            tmp_path: Path, totals: Counter[str]) -> None:
    result = run_schedule(Settings(seed, SECONDS), s3, s3_proxy, tmp_path)
    add_up(totals, result.counts)
    assert not result.failed, result.report()
