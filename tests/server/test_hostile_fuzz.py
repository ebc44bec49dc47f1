"""The hostile-client suite (issue 25): a fuzzer (tests/support/hostile_fuzz.py) sends every API
the server advertises in ApiVersions, at every advertised version and one past it, with
null, empty, full, repeated, huge and random fields and as malformed raw frames
(truncated, wrong and hostile lengths, garbage tags, bad compact lengths, flipped bits,
unknown APIs and versions), on a SASL listener before authentication and as a principal
with narrow grants (READ and WRITE on topic t, READ on group g; the authorizer is on).
Meanwhile a well-behaved client produces and fetches on topic t0000 over its own
connection. The checks:

- the server never exits;
- its memory (the larger of VmRSS sampled every 0.1 s and VmHWM) stays under
  PEAK_RSS_BOUND;
- the good client's requests are all answered without an error, its p99 latency under
  GOOD_P99_BOUND_S (generous: the machine is shared);
- every well-formed request is answered with that API's response at that version and
  correlation id, or the connection is closed, within ANSWER_TIMEOUT_S (except requests
  that may wait: Fetch, JoinGroup, SyncGroup, Produce with acks=0);
- the server logs nothing at ERROR and no traceback: every malformed request is refused
  by closing its connection (a WARNING line) or with an error code.

The seed is printed; FUZZ_SEED=<seed> reproduces a run. The full suite (slow) fuzzes for
FUZZ_SECONDS (default 240) with huge fields up to 1 MiB; the smoke variant makes one pass
of a few modes with small fields in the default run.
"""

from __future__ import annotations

import os
import random
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode

from support.hostile_fuzz import (
    MODES,
    Findings,
    FuzzConnection,
    GoodClient,
    MemorySampler,
    advertised_versions,
    fuzz_pass,
    loopback_source,
    percentile,
)
from support.hostile_support import hostile_server
from support.process_usage import MIB
from support.wire import Wire

PEAK_RSS_BOUND = 600 * MIB
GOOD_P99_BOUND_S = 2.0
ANSWER_TIMEOUT_S = 10.0
GOOD_TOPIC = "t0000"
# The good client, on the PLAINTEXT listener, is User:ANONYMOUS, a super user: the
# fuzzer's principals are User:alice (narrow grants) and, before authentication, none.
SETTINGS = ("group_initial_rebalance_delay_s = 0.1\n"
            '[authorization]\nenabled = true\nsuper_users = ["User:ANONYMOUS"]\n')
CREATE_ACLS, TOPIC_RESOURCE, GROUP_RESOURCE, LITERAL, ALLOW, READ, WRITE = (
    30, 2, 3, 3, 3, 3, 4)


@dataclass
class Run:
    seed: int
    seconds: float
    requests: int
    outcomes: dict[str, int]
    faults: list[str]
    peak_rss: int
    good_requests: int
    good_p50_s: float
    good_p99_s: float
    good_max_s: float
    good_errors: list[str]
    error_lines: list[str]

    def __str__(self) -> str:
        return (f"seed {self.seed}: {self.requests} requests in {self.seconds:.0f} s "
                f"({dict(self.outcomes)}); server peak RSS {self.peak_rss / MIB:.0f} MiB; "
                f"good client {self.good_requests} requests, p50 "
                f"{self.good_p50_s * 1000:.1f} ms, p99 {self.good_p99_s * 1000:.1f} ms, max "
                f"{self.good_max_s * 1000:.0f} ms")


def seed_of(default: int | None) -> int:
    text = os.environ.get("FUZZ_SEED")
    if text:
        return int(text)
    return default if default is not None else random.SystemRandom().randrange(2**32)


def grant(address: tuple[str, int], principal: str, resource_type: int, name: str,
          *operations: int) -> None:
    """ALLOW `operations` on a literal resource, by CreateAcls from the PLAINTEXT
    listener, whose User:ANONYMOUS is a super user here (faster than `compactlog acls
    add`, a process per call)."""
    with Wire(address) as wire:
        body = wire.call(CREATE_ACLS, 3, {"creations": [
            {"resource_type": resource_type, "resource_name": name,
             "resource_pattern_type": LITERAL, "principal": principal, "host": "*",
             "operation": operation, "permission_type": ALLOW}
            for operation in operations]})
    assert [result.error_code for result in body.results] == [ErrorCode.none] * len(
        operations), body


def fuzz(tmp_path: Path, seed: int, seconds: float, modes: tuple[str, ...],
         malformed_per_version: int, huge_bytes: int, passes: int | None) -> Run:
    """Fuzz a fresh server for `seconds` (or `passes` passes, whichever ends first)."""
    with hostile_server(tmp_path, SETTINGS, sasl=True, extra_topics=1) as hostile:
        plaintext = hostile.address("PLAINTEXT")
        grant(plaintext, "User:alice", TOPIC_RESOURCE, "t", READ, WRITE)
        grant(plaintext, "User:alice", GROUP_RESOURCE, "g", READ)
        advertised = advertised_versions(hostile.address("SASL_PLAINTEXT"))
        mark = hostile.server.mark()
        sampler = MemorySampler(hostile.pid)
        good = GoodClient(hostile.address("PLAINTEXT"), GOOD_TOPIC)
        findings = Findings()
        started = time.monotonic()
        deadline = started + seconds

        def worker(login: str | None, source: str, worker_seed: int) -> None:
            rng = random.Random(worker_seed)
            connection = FuzzConnection(hostile.address("SASL_PLAINTEXT"), source, login,
                                        ANSWER_TIMEOUT_S)
            done = 0
            try:
                while (passes is None or done < passes) and time.monotonic() < deadline:
                    fuzz_pass(connection, advertised, rng, findings, huge_bytes, modes,
                              malformed_per_version, lambda: time.monotonic() > deadline)
                    done += 1
            except Exception:
                findings.fault(f"{login or 'unauthenticated'} fuzzer stopped: "
                               f"{traceback.format_exc(limit=-3)}")
            finally:
                connection.close()

        workers = [threading.Thread(target=worker, args=(None, loopback_source(2), seed)),
                   threading.Thread(target=worker, args=("alice", loopback_source(3),
                                                         seed + 1))]
        sampler.start()
        good.start()
        for thread in workers:
            thread.start()
        for thread in workers:
            thread.join()
        elapsed = time.monotonic() - started
        good.stopping.set()
        good.join(60)
        sampler.stopping.set()
        sampler.join()
        hostile.server.assert_running()
        log = hostile.server.log_since(mark)
        print("requests that waited:", findings.waited[:20])
        print("outcomes:", sorted(findings.kinds.items()))
        error_lines = [line for line in log.splitlines()
                       if " ERROR " in line or "Traceback" in line
                       or "internal error" in line or " CRITICAL " in line]
        return Run(seed, elapsed, findings.sent, dict(findings.outcomes),
                   list(findings.faults), sampler.peak(), len(good.latencies),
                   percentile(good.latencies, 0.5), percentile(good.latencies, 0.99),
                   max(good.latencies, default=0.0),
                   good.errors, error_lines)


def check(run: Run) -> None:
    print(run)
    again = f"(reproduce with FUZZ_SEED={run.seed})"
    assert not run.faults, f"{again}\n" + "\n".join(run.faults)
    assert not run.error_lines, f"{again} the server logged:\n" + "\n".join(
        run.error_lines[:30])
    assert run.peak_rss < PEAK_RSS_BOUND, f"{again} {run}"
    assert not run.good_errors, f"{again} {run.good_errors[:5]}"
    assert run.good_requests > 0, f"{again} the good client got no answer"
    assert run.good_p99_s < GOOD_P99_BOUND_S, f"{again} {run}"


def test_hostile_fuzz_smoke(tmp_path: Path) -> None:
    """One pass over every advertised API and version: a request of random fields, a
    malformed frame and a version past the range each, before and after
    authentication, for at most 15 s."""
    check(fuzz(tmp_path, seed_of(25), seconds=15, modes=("random",),
               malformed_per_version=1, huge_bytes=4096, passes=1))


@pytest.mark.slow
def test_hostile_fuzz(tmp_path: Path) -> None:
    """Every mode, huge fields up to 1 MiB (512 KiB before authentication is the frame
    limit there; larger frames are refused), malformed frames, for FUZZ_SECONDS."""
    check(fuzz(tmp_path, seed_of(None), seconds=float(os.environ.get("FUZZ_SECONDS", 240)),
               modes=MODES, malformed_per_version=4, huge_bytes=1 << 20, passes=None))
