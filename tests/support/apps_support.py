"""Running the applications of tests/apps/test_apps_*.py as real processes.

The Python applications run with the interpreter of their own virtualenv under
.venv-apps/ (scripts/setup-apps.sh makes them), KafkaJS with node from
tests/apps/kafkajs. Every process started here is stopped by its pid when the test
leaves the `with` block, also when the test fails.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KpTopicPartition
from kafka.admin import ConfigResource, ConfigResourceType, NewTopic

from compactlog import LogStore
from support.compat import APPS, ROOT
from support.kafka_server import LoggedServer
from support.paths import TESTS_DIR

APPS_VENVS = ROOT / ".venv-apps"
COMPACTLOG = Path(sys.executable).parent / "compactlog"
LOCAL_SERVICE = "local_engine:LocalCompactionServiceFactory"
SETUP_HINT = "run scripts/setup-apps.sh (scripts/setup.sh --dev and scripts/test.sh run it)"


def app_python(app: str) -> Path:
    """The interpreter of .venv-apps/<app>; fails (not skips) when it is missing, so that
    a machine without the applications cannot pass these tests unnoticed."""
    python = APPS_VENVS / app / "bin" / "python"
    if not python.exists():
        pytest.fail(f"{python} is missing: {SETUP_HINT}")
    return python


def node() -> str:
    found = shutil.which("node")
    if found is None:
        pytest.fail(f"node is not installed: {SETUP_HINT}")
    if not (APPS / "kafkajs" / "node_modules" / "kafkajs").is_dir():
        pytest.fail(f"tests/apps/kafkajs/node_modules is missing: {SETUP_HINT}")
    return found


def server_config(tmp_path: Path, **settings: float) -> list[str]:
    """--config for logged_server: upkeep (manifest pickup, rolls) and new groups quick."""
    values = {"upkeep_interval_s": 0.2, "group_initial_rebalance_delay_s": 0.2, **settings}
    path = tmp_path / "server.toml"
    path.write_text("".join(f"{key} = {value}\n" for key, value in values.items()))
    return ["--config", str(path)]


class AppProcess:
    """An application's process: stdout is read line by line into `lines` (JSON lines
    into `records`), stderr goes to a log file."""

    def __init__(self, args: Sequence[str], log_path: Path, env: dict[str, str] | None,
                 cwd: Path | None) -> None:
        self.args = list(args)
        self.log_path = log_path
        self.lines: list[str] = []
        self.records: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        with log_path.open("w") as log:
            self.process = subprocess.Popen(
                self.args, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL,
                text=True, cwd=cwd, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        with self.log_path.with_suffix(".stdout").open("w") as copy:
            for line in self.process.stdout:
                copy.write(line)
                copy.flush()
                self._add(line)

    def _add(self, line: str) -> None:
        with self._lock:
            self.lines.append(line)
            if line.startswith("{"):
                with suppress(ValueError):
                    self.records.append(json.loads(line))

    def snapshot(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.records)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def describe(self) -> str:
        tail = "\n".join(self.log().splitlines()[-60:])
        return (f"{self.args[:3]} (pid {self.process.pid}, exit {self.process.poll()}); "
                f"stdout lines: {len(self.lines)}; its log ends with:\n{tail}")

    def wait_until(self, done: Callable[[list[dict[str, Any]]], bool], timeout: float,
                   what: str, server_log: Callable[[], str] | None = None) -> None:
        """Wait until `done(records)` holds; fail with the app's log (and the server's)
        after `timeout` or if the process exits first."""
        deadline = time.monotonic() + timeout
        while not done(self.snapshot()):
            exited = self.process.poll() is not None
            if exited:
                self._reader.join(5)
                if done(self.snapshot()):
                    return
            if exited or time.monotonic() > deadline:
                server = ""
                if server_log is not None:
                    server = "\nthe server's log (warnings):\n" + "\n".join(
                        line for line in server_log().splitlines() if " INFO " not in line)
                raise AssertionError(
                    f"{what}: {'the app exited' if exited else f'not after {timeout:.0f} s'}; "
                    f"{self.describe()}{server}")
            time.sleep(0.05)

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM (a graceful stop: the apps commit their state and offsets), SIGKILL if
        it is not gone after `timeout`. Returns the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(30)
        self._reader.join(10)
        assert self.process.stdout is not None
        self.process.stdout.close()
        return self.process.returncode

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)


@contextmanager
def app_process(args: Sequence[str], log_path: Path, env: dict[str, str] | None = None,
                cwd: Path | None = None) -> Iterator[AppProcess]:
    """Start an application; when the block ends, stop it by its pid (SIGTERM, then
    SIGKILL), also when the test failed."""
    app = AppProcess(args, log_path, env, cwd)
    try:
        yield app
    finally:
        app.stop()


def latest_counts(records: list[dict[str, Any]]) -> dict[str, int]:
    """The last count an app reported for each key."""
    counts: dict[str, int] = {}
    for record in records:
        if "count" in record:
            counts[str(record["key"])] = int(record["count"])
    return counts


def compact(data: Path, topic: str) -> dict[str, Any]:
    """`compactlog compact TOPIC --json` as a separate process, beside the running
    server, with the plain-Python engine of tests/local_engine.py (Spark's start-up would
    add about 20 s and is tested elsewhere). Returns its JSON summary."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(TESTS_DIR), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(
        [str(COMPACTLOG), "--data-dir", str(data), "compact", topic, "--json",
         "--service", LOCAL_SERVICE],
        capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, f"compactlog compact {topic}: {done.stderr}"
    summary: dict[str, Any] = json.loads(done.stdout)
    return summary


# -- the stateful scenario of Quix Streams and faust -------------------------------------


def create_topic(bootstrap: str, topic: str, partitions: int,
                 config: dict[str, str] | None = None) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30000)
    try:
        admin.create_topics([NewTopic(topic, partitions, 1, topic_configs=config or {})])
    finally:
        admin.close()


def produce(bootstrap: str, topic: str, items: Sequence[tuple[str, str | None]]) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5,
                             enable_idempotence=False)
    try:
        futures = [producer.send(topic, key=key.encode(),
                                 value=None if value is None else value.encode())
                   for key, value in items]
        producer.flush(timeout=30)
        for future in futures:
            future.get(timeout=30)
    finally:
        producer.close(timeout=30)


def topic_configs(bootstrap: str, topic: str) -> dict[str, str]:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30000)
    try:
        described = admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, topic)], config_filter="all")
    finally:
        admin.close()
    return {name: entry["value"] for name, entry in described["topic"][topic].items()}


def alter_topic(bootstrap: str, topic: str, config: dict[str, str]) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30000)
    try:
        admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic, configs=config)],
                            incremental=True)
    finally:
        admin.close()


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, request_timeout_ms=30000)
    try:
        partitions = consumer.partitions_for_topic(topic) or set()
        tps = [KpTopicPartition(topic, p) for p in sorted(partitions)]
        return {tp.partition: offset for tp, offset in consumer.end_offsets(tps).items()}
    finally:
        consumer.close()


def committed(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30000)
    try:
        offsets = admin.list_group_offsets(group)[group]
    finally:
        admin.close()
    return {tp.partition: meta.offset for tp, meta in offsets.items() if tp.topic == topic}


def wait_until_sealed(data: Path, topic: str, timeout: float = 60.0) -> None:
    """Wait until every record of `topic` is in a sealed segment (the server rolls an
    idle active segment after segment.ms and seals it in its upkeep): only sealed
    segments are compacted."""
    deadline = time.monotonic() + timeout
    with LogStore.open(data, read_only=True) as store:
        partitions = store.topic(topic).partitions
        while True:
            stats = {}
            for partition in partitions:
                partition.refresh()
                stats[partition.index] = partition.stats()
            if all(s["log_bytes"] == 0 for s in stats.values()):
                return
            assert time.monotonic() < deadline, f"{topic} not sealed: {stats}"
            time.sleep(0.1)


def latest_offset_per_key(data: Path, topic: str) -> dict[int, list[int]]:
    """The offset of the latest record of each key in `topic`'s raw log (a key whose
    latest record is a tombstone included: a tombstone younger than delete.retention.ms
    survives compaction), per partition, in offset order."""
    with LogStore.open(data, read_only=True) as store:
        latest: dict[int, list[int]] = {}
        for partition in store.topic(topic).partitions:
            partition.refresh()
            last: dict[bytes | None, int] = {}
            for record in partition.read(0, 1_000_000):
                last[record.key] = record.offset
            latest[partition.index] = sorted(last.values())
    return latest


def wait_for_compacted_view(bootstrap: str, data: Path, topic: str,
                            timeout: float = 60.0) -> dict[int, list[int]]:
    """Wait until the server serves `topic`'s compacted view (it picks up a compaction
    committed by another process in its upkeep): from offset 0 a consumer must get
    exactly the offsets of the view (the ledger up to the horizon, then the live log).
    Returns them per partition."""
    with LogStore.open(data, read_only=True) as store:
        view: dict[int, list[int]] = {}
        for partition in store.topic(topic).partitions:
            partition.refresh()
            view[partition.index] = [r.offset for r in partition.read_compacted(0, 1_000_000)]
    deadline = time.monotonic() + timeout
    while True:
        served = read_offsets(bootstrap, topic, list(view))
        if served == view:
            return view
        assert time.monotonic() < deadline, (
            f"the server still serves {served} from offset 0, not the view {view}")
        time.sleep(0.2)


def read_offsets(bootstrap: str, topic: str, partitions: list[int]) -> dict[int, list[int]]:
    """The offsets a consumer gets from offset 0 up to the high watermark."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                             fetch_max_wait_ms=100, request_timeout_ms=30000)
    try:
        tps = [KpTopicPartition(topic, p) for p in partitions]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        ends = consumer.end_offsets(tps)
        seen: dict[int, list[int]] = {p: [] for p in partitions}
        deadline = time.monotonic() + 30
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, f"reading {topic} stalled: {seen}"
            for messages in consumer.poll(timeout_ms=200).values():
                for message in messages:
                    seen[message.partition].append(message.offset)
        return seen
    finally:
        consumer.close()


def keyed_updates(keys: int, rounds: int, tag: str) -> list[tuple[str, str]]:
    """Records for `keys` keys; key i gets `rounds + i % 3` of them, so counts differ."""
    items = [(f"k{i:02d}", f"{tag}-{r}") for r in range(rounds + 2) for i in range(keys)
             if r < rounds + i % 3]
    return items


@dataclass
class CountRun:
    records: list[dict[str, Any]]
    counts: dict[str, int]
    redelivered: list[dict[str, Any]]  # records the app got again and did not count


def counted(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if "count" in r]


class StatefulCountScenario:
    """A stateful application that counts records per key and keeps the counts in a
    changelog topic it creates (Quix Streams, faust): run it, stop it, delete its local
    state, restart it (the counts must be restored from the changelog, not recounted),
    compact the changelog with `compactlog compact`, delete the state again, restart:
    restored again, with the right counts."""

    KEYS = 12
    RUN_TIMEOUT_S = 90.0

    def __init__(self, tmp_path: Path, group: str, changelog: str,
                 start: Callable[[str, Path, Path], AbstractContextManager[AppProcess]],
                 input_topic: str = "events", partitions: int = 2) -> None:
        """`start(bootstrap, state_dir, log_path)` starts the app; `group` is its
        consumer group, `changelog` the changelog topic it creates."""
        self.tmp_path = tmp_path
        self.group = group
        self.data = tmp_path / "data"
        self.state = tmp_path / "app-state"
        self.changelog = changelog
        self.start = start
        self.input = input_topic
        self.partitions = partitions
        self.expected: Counter[str] = Counter()
        self.runs = 0

    def run(self, server: LoggedServer, items: list[tuple[str, str]]) -> CountRun:
        """Produce `items`, run the app until it has counted them and committed its
        offsets, stop it gracefully; check that it counted each new record once, going
        on from the counts of the runs before."""
        ends_before = end_offsets(server.bootstrap, self.input)
        produce(server.bootstrap, self.input, items)
        ends = end_offsets(server.bootstrap, self.input)
        before = dict(self.expected)
        self.expected.update(key for key, _ in items)
        want = dict(self.expected)
        self.runs += 1
        log = self.tmp_path / f"app-run{self.runs}.log"
        with self.start(server.bootstrap, self.state, log) as app:
            app.wait_until(lambda records: latest_counts(records) == want
                           or len(counted(records)) > len(items),
                           self.RUN_TIMEOUT_S, f"run {self.runs}: counting {want}",
                           server.log)
            # Stop it once it has committed its progress: the apps commit offsets in the
            # background (at-least-once), and a stop before that would deliver records
            # again on the next run.
            deadline = time.monotonic() + self.RUN_TIMEOUT_S
            while (done := committed(server.bootstrap, self.group, self.input)) != ends:
                assert time.monotonic() < deadline, (
                    f"run {self.runs}: the app committed {done}, not {ends}: {app.describe()}")
                time.sleep(0.1)
            records = app.snapshot()
            code = app.stop()
        assert code == 0, f"run {self.runs} exited with {code}: {app.describe()}"
        # Each new record was counted once, and none of the runs before: a record of an
        # earlier run counted again means its count was not in the restored state.
        new = {(p, o) for p, end in ends.items() for o in range(ends_before.get(p, 0), end)}
        seen = [(int(r["partition"]), int(r["offset"])) for r in counted(records)]
        assert sorted(seen) == sorted(new), (
            f"run {self.runs} counted the records at {sorted(set(seen) - new)} that earlier "
            f"runs counted, or missed {sorted(new - set(seen))}: {app.describe()}")
        per_key: dict[str, list[int]] = {}
        for record in counted(records):
            per_key.setdefault(str(record["key"]), []).append(int(record["count"]))
        for key, counts in per_key.items():
            start = before.get(key, 0)
            assert counts == list(range(start + 1, start + 1 + len(counts))), (
                f"run {self.runs}, key {key}: counts {counts} should go on from {start}"
                + (" (the state was not restored from the changelog)" if counts[0] == 1
                   and start else ""))
        assert latest_counts(records) == want
        return CountRun(records, latest_counts(records),
                        [r for r in records if "redelivered" in r])

    def play(self, server: LoggedServer) -> None:
        bootstrap = server.bootstrap
        create_topic(bootstrap, self.input, self.partitions)

        # 1. First run: the app creates its changelog topic, compacted.
        self.run(server, keyed_updates(self.KEYS, 2, "a"))
        assert committed(bootstrap, self.group, self.input) == end_offsets(
            bootstrap, self.input)
        configs = topic_configs(bootstrap, self.changelog)
        assert configs["cleanup.policy"] == "compact", configs
        # An operator makes the changelog's segments roll soon (the apps create it with
        # the defaults), so that its records are sealed and can be compacted.
        alter_topic(bootstrap, self.changelog, {"segment.ms": "100",
                                                "min.compaction.lag.ms": "0"})

        # 2. State deleted: restored from the changelog.
        shutil.rmtree(self.state)
        self.run(server, keyed_updates(self.KEYS, 1, "b"))

        # 3. The changelog compacted by `compactlog compact` while the server runs.
        wait_until_sealed(self.data, self.changelog)
        latest = latest_offset_per_key(self.data, self.changelog)
        summary = compact(self.data, self.changelog)
        records_in = sum(p["records_in"] for p in summary["partitions"])
        records_out = sum(p["records_out"] for p in summary["partitions"])
        assert 0 < records_out < records_in, summary
        view = wait_for_compacted_view(bootstrap, self.data, self.changelog)
        # The oracle: exactly the latest record of each key the app wrote survives (an
        # app may keep several state keys per input key: Quix keeps a count and an offset).
        assert view == latest, f"compacted view {view}, latest record per key {latest}"
        assert sum(len(offsets) for offsets in view.values()) == records_out

        # 4. State deleted again: restored from the compacted changelog.
        shutil.rmtree(self.state)
        self.run(server, keyed_updates(self.KEYS, 1, "c"))
        closed = [line for line in server.log().splitlines() if "closing connection" in line]
        assert closed == [], closed


# -- a client call that may crash the interpreter ----------------------------------------


def _child(target: Callable[..., Any], args: tuple[Any, ...], sender: Any) -> None:
    try:
        result = target(*args)
    except BaseException as error:  # reported to the parent, which raises it
        sender.send(("error", f"{type(error).__name__}: {error}",
                     "".join(traceback.format_exception(error))))
    else:
        sender.send(("ok", result, ""))
    sender.close()


def run_isolated(target: Callable[..., Any], *args: Any, timeout: float = 120.0) -> Any:
    """Run `target(*args)` in a forked child process and return its result, so that a
    client library that aborts the interpreter fails one test, not the run: librdkafka
    2.16 aborts (rdkafka_queue.h:233: assert rkq->rkq_refcnt > 0) when an AdminClient is
    destroyed after a DeleteGroups call the broker does not support. An exception in the
    child is raised here as an AssertionError with its text and traceback."""
    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(target=_child, args=(target, args, sender), daemon=True)
    child.start()
    sender.close()
    try:
        if not receiver.poll(timeout):
            raise AssertionError(f"{target.__name__} did not finish in {timeout:.0f} s")
        status, value, trace = receiver.recv()
    except EOFError:
        child.join(30)
        raise AssertionError(f"{target.__name__}: the process died with exit code "
                             f"{child.exitcode} (a crash in the client library)") from None
    finally:
        receiver.close()
        child.join(30)
        if child.is_alive():
            child.kill()
            child.join(30)
    if status == "error":
        raise AssertionError(f"{value}\n{trace}")
    if child.exitcode not in (0, None):
        raise AssertionError(f"{target.__name__} returned, then its process died with "
                             f"exit code {child.exitcode} (a crash in the client library)")
    return value
