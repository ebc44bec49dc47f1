"""Faults at every step of the store's protocols on S3, where the steps are the requests.

The crash and fault tests of tests/faults/test_fault_steps.py, on a store at s3://BUCKET/PREFIX
(moto's server on loopback, tests/support/s3_support.py) whose requests all pass the fault proxy
of tests/support/s3_faults.py: the faults sit in front of the S3 server, not in the product.
For each scenario (tests/support/s3_fault_kit.py: appends that seal inside the append; appends
acknowledged from the local log, then sealed in the server's way; compactions of one
and of two partitions with the Arrow tasks run in process (tests/local_engine.py's
InlineArrowEngine: they fetch their inputs and publish their files themselves, as the
Spark service's executors do); an incremental one with deletion vectors; retention with
its sweep; a topic config change; two merges of small sealed segments), the store is
prepared once at its home prefix and a pristine copy of it kept, and the requests
(method and key) that the operation sends are recorded once. Then for each request n,
on that copy put back at home (its objects copied server side, its local directory
copied; s3_fault_kit.restore), so that a compaction's Iceberg sync builds on the
table's previous snapshot as it does in a store never moved:

- `error`: every request from the nth on is answered 500 InternalError, so botocore's
  and pyarrow's retries fail too. The operation fails with a CompactlogError (the
  scenarios swallow it, as the server's callers report it) or succeeds; the store is
  closed while the store still fails (its seal at close and lease release fail);
- `lost`: the nth request is forwarded, and its connection closed without an answer:
  the client cannot know whether it landed (its retry meets what it wrote);
- `kill` (tests/support/s3_fault_child.py): the operation runs in a child process, the proxy
  holds its nth request, and the test kills the child with SIGKILL; the held request is
  then dropped (`kill`: it never reaches the store) or forwarded (`kill-lands`: it
  lands after its sender died). The store is reopened on the child's local directory
  (a crashed server restarts), or for the scenarios whose acknowledged records were all
  in the bucket before the operation, on an empty one (`kill-fresh`: another machine
  takes over).

Afterwards, with the proxy healthy, the store is reopened as the writer (once the lease
of a writer that could not release it has expired), the contract is checked against the
oracle of what was acknowledged (faultkit.check_store: every acknowledged record at its
offset, nothing refused visible, the compacted view the old or the new (horizon, ledger)
pair and equal to what it covers), every data file that a manifest lists is an object in
the bucket, and the store goes on: append, seal, compact, sweep.

By default every ninth step of each scenario runs (DEFAULT_STRIDE), with --runslow every
third (STRIDE), each kind in turn; with COMPACTLOG_S3_EVERY_STEP=1 every step runs with
every kind (about 45 minutes).

Found (each fixed in src/, its test named at the protocol step it guards):
- a writer killed between a commit's audit copy and its PUT of current.json left an
  audit copy of a version never committed; every commit of that version conflicted, so
  the next writer's open (which stamps its epoch) gave up with "manifest kept changing"
  and the store could not open. recovery.recover now purges such copies first:
  test_a_writer_killed_at_a_commit_point_does_not_block_the_next_writer.

Not covered here: stalls that outlast the request timeout in process (a stalled commit
PUT ending in CommitOutcomeUnknown is test_s3_faults.py's), throttling (retried, it
changes no outcome), bodies cut short (test_s3_faults.py), requests of the store's open
and close themselves as steps (close runs under the persistent fault only), a second
writer racing the operation (test_compaction_s3.py, test_lease.py), the Spark job's
requests (its executors' fetch and publish are the Arrow tasks' code, run here in
process), and compaction by tests/local_engine.py's LocalEngine (tests/support/fault_scenarios'
default): it reads every plan's inputs where the driver runs, but the runner fetches
them there only for plans the Arrow tasks do not run (runner step 2), so on S3 with a
cold read cache (a copied store) it finds no files. A limit of that test engine (the
product's Spark engine runs such plans in Arrow tasks, which fetch their own), not
covered here; test_compaction_s3.py's driver_service passes on a warm cache.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs

import pytest
from pyiceberg.table import StaticTable

from compactlog.errors import CompactlogError
from compactlog.iceberg import state_table_location
from support.fakes import T0, FakeClock
from support.fault_scenarios import parse_ack
from support.faultkit import TOPIC, Oracle
from support.iceberg_readers import _row
from support.iceberg_support import expected_state, pyiceberg_properties
from support.paths import SUPPORT_DIR
from support.s3_fault_kit import (
    S3_SCENARIOS,
    Place,
    check_place,
    copy_place,
    home_place,
    new_place,
    restore,
)
from support.s3_faults import (
    ATTEMPTS,
    S3Proxy,
    Seen,
    internal_error,
    lost_answer,
    stall,
)

CHILD_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Request:
    """One request of a recorded operation: its method and key (past the prefix)."""

    index: int
    method: str
    key: str

    def describe(self) -> str:
        return f"request {self.index} ({self.method} {self.key or '/'})"


# -- templates and their recorded requests --------------------------------------------------

_TEMPLATES: dict[str, tuple[Place, list[Request]]] = {}
_ROOT: list[Path] = []


@pytest.fixture
def env(s3_proxy: S3Proxy, monkeypatch: pytest.MonkeyPatch) -> S3Proxy:
    """The AWS settings pointing at this test's proxy, with ATTEMPTS attempts a request."""
    for name, value in s3_proxy.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", str(ATTEMPTS))
    return s3_proxy


@pytest.fixture
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not _ROOT:
        _ROOT.append(tmp_path_factory.mktemp("s3steps"))
    return _ROOT[0]


def template(name: str, proxy: S3Proxy, root: Path) -> tuple[Place, list[Request]]:
    """The scenario's prepared store and the requests its operation sends."""
    if name not in _TEMPLATES:
        scenario, _ = S3_SCENARIOS[name]
        home = home_place(proxy.server.bucket, root, name)
        clock = FakeClock()
        with home.open(clock) as store:
            scenario.prepare(store, clock)
        # A pristine copy, never opened: each run puts it back at home (`restore`).
        saved = copy_place(proxy.server.client(), home,
                           new_place(proxy.server.bucket, root, f"template-{name}"))
        _TEMPLATES[name] = (saved, record(name, saved, proxy, root))
    return _TEMPLATES[name]


def record(name: str, template: Place, proxy: S3Proxy, root: Path) -> list[Request]:
    scenario, _ = S3_SCENARIOS[name]
    place = restore(proxy.server.client(), template,
                    home_place(proxy.server.bucket, root, name))
    clock = FakeClock()
    with place.open(clock, scenario) as store:
        oracle = Oracle.of(store)
        scenario.expect(store, oracle)
        mark = proxy.mark()
        scenario.operation(store, oracle, clock, lambda p, r: None)
        seen = proxy.requests(since=mark)
    return [Request(i, s.method, key_of(s, place.prefix)) for i, s in enumerate(seen)]


def key_of(seen: Seen, prefix: str) -> str:
    """The key past the store's prefix; for a LIST, "?prefix=" and the listed folder."""
    if not seen.key:
        listed = parse_qs(seen.query).get("prefix", [""])[0]
        return "?prefix=" + listed.removeprefix(prefix + "/")
    return seen.key.removeprefix(prefix + "/")


def same_step(recorded: Request, seen: Seen, prefix: str) -> bool:
    """Whether a run's request is the recorded one (names holding random parts, such as
    a ledger file's, compared by their shape)."""
    def shape(text: str) -> str:
        return re.sub(r"[0-9a-f]{8,}", "*", text)
    return recorded.method == seen.method and shape(recorded.key) == shape(
        key_of(seen, prefix))


def around(requests: list[Request], seen: list[Seen], step: int, prefix: str) -> str:
    """The recorded requests and the ones sent, side by side, up to `step` and a little
    past it: where the two first part is what changed."""
    lines = []
    for index in range(max(0, step - 20), step + 3):
        recorded = requests[index].describe() if index < len(requests) else "-"
        sent = (f"{seen[index].method} {key_of(seen[index], prefix) or '/'}"
                if index < len(seen) else "-")
        lines.append(f"  {index:3} recorded {recorded:70} sent {sent}")
    return "\n".join(lines)


# -- the runs -------------------------------------------------------------------------------

def fresh_copy(name: str, step: int, kind: str, proxy: S3Proxy,
               root: Path) -> tuple[Place, list[Request]]:
    """`name`'s prepared store put back at its home for one run (s3_fault_kit.
    home_place), and the requests its operation sends."""
    template_place, requests = template(name, proxy, root)
    return restore(proxy.server.client(), template_place,
                   home_place(proxy.server.bucket, root, name)), requests


def run_in_process(name: str, step: int, kind: str, proxy: S3Proxy, root: Path) -> None:
    scenario, engine = S3_SCENARIOS[name]
    place, requests = fresh_copy(name, step, kind, proxy, root)
    where = f"{name} on S3: {kind} at {requests[step].describe()}"
    clock = FakeClock()
    store = place.open(clock, scenario)
    oracle = Oracle.of(store)
    scenario.expect(store, oracle)
    mark = proxy.mark()
    proxy.add(internal_error(nth=step + 1, count=None) if kind == "error"
              else lost_answer(nth=step + 1))
    try:
        # The scenarios report a CompactlogError as the server's callers would; anything
        # else (an exception the store did not wrap) fails the test here.
        with contextlib.suppress(CompactlogError):
            scenario.operation(store, oracle, clock, oracle.acknowledge)
    finally:
        store.close()  # still under the fault: its seal and lease release fail
        proxy.clear()
        proxy.wait_idle()
    seen = proxy.requests(since=mark)
    assert len(seen) > step and same_step(requests[step], seen[step], place.prefix), \
        f"{where}: the operation no longer sends this request\n" + \
        around(requests, seen, step, place.prefix)
    check_place(place, scenario, oracle, clock, where, engine)
    check_state_table(name, place, clock, where, proxy)


@contextlib.contextmanager
def child_process(name: str, place: Place, proxy: S3Proxy) -> Iterator[subprocess.Popen[str]]:
    """The scenario's operation in a process of its own (tests/support/s3_fault_child.py), its
    requests through `proxy`; killed by pid if it still runs at the end."""
    log_path = place.local.with_name(place.local.name + "-child.log")
    with log_path.open("w") as log_file:
        child = subprocess.Popen(
            [sys.executable, str(SUPPORT_DIR / "s3_fault_child.py"), name, place.url,
             str(place.local), str(int(T0 * 1000))],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log_file, text=True,
            env={**os.environ, **proxy.env, "AWS_MAX_ATTEMPTS": str(ATTEMPTS)})
    try:
        yield child
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=CHILD_TIMEOUT_S)
        for stream in (child.stdin, child.stdout):
            if stream is not None:
                stream.close()


def child_log(place: Place) -> str:
    return place.local.with_name(place.local.name + "-child.log").read_text()[-4000:]


def run_with_kill(name: str, step: int, kind: str, proxy: S3Proxy, root: Path) -> None:
    scenario, engine = S3_SCENARIOS[name]
    place, requests = fresh_copy(name, step, kind, proxy, root)
    where = f"{name} on S3: {kind} at {requests[step].describe()}"
    clock = FakeClock()
    with place.open(clock, scenario, read_only=True) as reader:
        oracle = Oracle.of(reader)
        scenario.expect(reader, oracle)
    with child_process(name, place, proxy) as child:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "READY", f"{where}: {child_log(place)}"
        # Armed now, so that the requests of the child's open are not counted.
        mark = proxy.mark()
        (held,) = proxy.add(stall(then="forward" if kind == "kill-lands" else "drop",
                                  seconds=CHILD_TIMEOUT_S, nth=step + 1))
        child.stdin.write("GO\n")
        child.stdin.flush()
        deadline = time.monotonic() + CHILD_TIMEOUT_S
        while held.fired == 0 and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert held.fired, f"{where}: the child never sent this request " \
                           f"(exit {child.poll()}): {child_log(place)}"
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(timeout=CHILD_TIMEOUT_S) == -signal.SIGKILL
        output = child.stdout.read()
    proxy.release()  # the held request: dropped, or landing now that its sender is dead
    proxy.wait_idle()
    proxy.clear()
    seen = proxy.requests(since=mark)
    assert same_step(requests[step], seen[step], place.prefix), \
        f"{where}: the child's request {step} differs\n" + \
        around(requests, seen, step, place.prefix)
    for line in output.splitlines():
        if line.startswith("ACK "):
            oracle.acknowledge(*parse_ack(line))
    if kind == "kill-fresh":
        place = Place(place.url, place.local.with_name(place.local.name + "-elsewhere"))
    check_place(place, scenario, oracle, clock, where, engine)
    check_state_table(name, place, clock, where, proxy)


def check_state_table(name: str, place: Place, clock: FakeClock, where: str,
                      proxy: S3Proxy) -> None:
    """After a compaction scenario went on (check_place compacts again, and that run's
    incremental sync repairs whatever the fault left of the table), the Iceberg state
    table in the bucket, as pyiceberg reads it straight from moto, is the compacted
    view, and every file it names exists."""
    if not name.startswith("compact"):
        return
    with place.open(clock, read_only=True) as store:
        expected = expected_state(store, TOPIC)
        table = state_table_location(store, TOPIC)
    scan = StaticTable.from_metadata(table, pyiceberg_properties(proxy.server)).scan()
    found = scan.to_arrow().select(["partition", "offset", "key", "value", "headers"])
    assert sorted(_row(**row) for row in found.to_pylist()) == expected, \
        f"{where}: the state table after going on"


# -- the cases ------------------------------------------------------------------------------

# Requests each operation sends; test_request_counts_are_current keeps these in line. The
# compaction scenarios replay where they were prepared (s3_fault_kit.home_place), so
# their Iceberg sync is the incremental one, building on the template's snapshot.
STEPS = {"append": 4, "append-seal": 8, "compact-1": 40, "compact-2": 68,
         "compact-dv-1": 43, "retention": 16, "alter": 3, "merge": 10,
         "compact-merge": 44}
# Scenarios whose acknowledged records were all in the bucket before the operation: a
# crash of theirs may be taken over from an empty local directory.
IN_BUCKET = ("compact-1", "compact-2", "compact-dv-1", "retention", "alter", "merge",
             "compact-merge")
STRIDE = 3  # with --runslow
DEFAULT_STRIDE = 18  # the default (CI) run: every sixth step of STRIDE's


def kinds_of(name: str) -> tuple[str, ...]:
    return ("error", "lost", "kill", "kill-lands") + (
        ("kill-fresh",) if name in IN_BUCKET else ())


def run(name: str, step: int, kind: str, proxy: S3Proxy, root: Path) -> None:
    if kind in ("error", "lost"):
        run_in_process(name, step, kind, proxy, root)
    else:
        run_with_kill(name, step, kind, proxy, root)


def test_request_counts_are_current(env: S3Proxy, root: Path) -> None:
    found = {name: len(template(name, env, root)[1]) for name in S3_SCENARIOS}
    assert found == STEPS, "update STEPS in this file to the recorded counts"


def test_the_default_sample_reaches_each_compactions_iceberg_sync(env: S3Proxy,
                                                                   root: Path) -> None:
    """Each compaction scenario's sampled requests include its Iceberg sync's (a key
    under iceberg/), so the default run faults the incremental sync too."""
    for name in ("compact-1", "compact-2", "compact-dv-1", "compact-merge"):
        requests = template(name, env, root)[1]
        syncs = [step for scenario, step, _ in sampled(DEFAULT_STRIDE)
                 if scenario == name and "/iceberg/" in requests[step].key]
        assert syncs, f"{name}: no sampled step reaches the sync: " + ", ".join(
            r.describe() for r in requests if "/iceberg/" in r.key)


def sampled(stride: int = STRIDE) -> list[tuple[str, int, str]]:
    """Every `stride`th step of each scenario, the kinds taking turns (over all the
    scenarios' steps, so that a few steps per scenario still meet every kind)."""
    cases = []
    turn = 0
    for name, count in STEPS.items():
        kinds = kinds_of(name)
        for step in range(0, count, stride):
            cases.append((name, step, kinds[turn % len(kinds)]))
            turn += 1
    return cases


@pytest.mark.parametrize(("name", "step", "kind"), sampled(DEFAULT_STRIDE))
def test_a_fault_at_sampled_requests_keeps_the_contract(
        name: str, step: int, kind: str, env: S3Proxy, root: Path) -> None:
    run(name, step, kind, env, root)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "step", "kind"), [
    case for case in sampled() if case not in sampled(DEFAULT_STRIDE)])
def test_a_fault_at_more_sampled_requests_keeps_the_contract(
        name: str, step: int, kind: str, env: S3Proxy, root: Path) -> None:
    run(name, step, kind, env, root)


# Every request with every kind: about 560 runs, 45 minutes on 2 cores, more than even
# the slow run should take, so only with COMPACTLOG_S3_EVERY_STEP=1:
#   COMPACTLOG_S3_EVERY_STEP=1 .venv/bin/python -m pytest tests/faults/test_fault_steps_s3.py
@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("COMPACTLOG_S3_EVERY_STEP") != "1",
                    reason="every S3 request with every fault: COMPACTLOG_S3_EVERY_STEP=1")
@pytest.mark.parametrize(("name", "step", "kind"), [
    (name, step, kind) for name, count in STEPS.items() for step in range(count)
    for kind in kinds_of(name)])
def test_a_fault_at_every_request_keeps_the_contract(
        name: str, step: int, kind: str, env: S3Proxy, root: Path) -> None:
    run(name, step, kind, env, root)



def first_commit_point(requests: list[Request]) -> int:
    """The first PUT of a partition's current.json: a commit's step 4 (backend/s3/document.py)."""
    return next(r.index for r in requests
                if r.method == "PUT" and r.key.endswith("/manifest/current.json"))


@pytest.mark.parametrize("kind", ["kill", "kill-fresh"])
def test_a_writer_killed_at_a_commit_point_does_not_block_the_next_writer(
        kind: str, env: S3Proxy, root: Path) -> None:
    """A writer killed between a commit's audit copy (step 3) and its PUT of
    current.json (step 4, held and dropped) leaves an audit copy of a version never
    committed. The next writer (after the lease expired: on the same local directory or
    another) must still commit: it stamps its epoch into every manifest at open."""
    _, requests = template("compact-1", env, root)
    run_with_kill("compact-1", first_commit_point(requests), kind, env, root)
