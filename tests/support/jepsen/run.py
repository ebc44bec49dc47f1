"""One schedule from start to check: start the nodes and the clients, run the seeded
schedule of faults and operations, heal, let the groups catch up, read every view, stop
everything (by pid, also on failure) and check the history.

    result = run_schedule(Settings(seed=7, seconds=60), s3, s3_proxy, tmp_path)
    assert not result.failed, result.report()
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import queue
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka.admin import NewTopic

from support.jepsen import clients
from support.jepsen.checker import Result, check
from support.jepsen.clients import KV, LOG, ExternalCompactions, GroupWorker, ProducerWorker
from support.jepsen.cluster import (
    Node,
    Ownership,
    free_port,
    mount_tmpfs,
    server_config,
    unmount,
    wait_for,
)
from support.jepsen.final import Row, read_final
from support.jepsen.history import FAILED, History, Op
from support.jepsen.nemesis import Nemesis, Step, is_fault, schedule
from support.s3_faults import S3Proxy
from support.s3_support import S3Server

TOPICS = {KV: 2, LOG: 1}
FS_BYTES = 192 * 1024 * 1024


@dataclass
class Settings:
    seed: int
    seconds: float = 60.0
    nodes: int = 3
    # Opening the store on a take-over takes 2-3 s here (busy machine, moto): with a
    # 2 s lease the new owner's lease ran out before it first renewed it, over and
    # over (see the report of issue 21's harness); 4 s lets an owner settle.
    ttl_s: float = 4.0
    rate: float = 3.0  # records per second per producer
    disk: bool = True  # the disk-full nemesis (needs root to mount a tmpfs)
    message_timeout_s: float = 10.0
    quiet: bool = False  # print only the report


@dataclass
class Run:
    """The moving parts of a run, so that `stop_all` can end every one of them."""

    nodes: dict[str, Node] = field(default_factory=dict)
    mounts: list[Path] = field(default_factory=list)
    producers: list[ProducerWorker] = field(default_factory=list)
    groups: list[GroupWorker] = field(default_factory=list)
    producing: threading.Event = field(default_factory=threading.Event)
    grouping: threading.Event = field(default_factory=threading.Event)
    external: ExternalCompactions | None = None
    ops: Operations | None = None


class Operations(threading.Thread):
    """Runs the schedule's operations one at a time, off the nemesis' thread (they
    block for up to their timeouts)."""

    def __init__(self, nodes: dict[str, Node], history: History,
                 external: ExternalCompactions) -> None:
        super().__init__(name="operations", daemon=True)
        self.nodes = nodes
        self.history = history
        self.external = external
        self.steps: queue.Queue[Step | None] = queue.Queue()
        self.asked: dict[int, int] = collections.defaultdict(int)

    def run(self) -> None:
        while (step := self.steps.get()) is not None:
            try:
                self.execute(step)
            except Exception as error:
                self.history.note(f"operation {step} failed in the harness: {error!r}")

    def execute(self, step: Step) -> None:
        if step.kind == "compact":
            if not self.external.start():
                self.history.add(Op("compact", "outside", time.time(), {}, time.time(),
                                    FAILED, "skipped: the previous run is still going"))
            return
        node = self.nodes[step.target]
        if step.kind == "delete-records":
            partition = step.param("partition")
            # Below what was acknowledged to acks=all (durable), past what was asked.
            acked = [s.offset for s in self.history.snapshot().sends
                     if s.acknowledged and s.acks == "all" and s.topic == KV
                     and s.partition == partition and s.offset is not None]
            ceiling = max(acked, default=-1) + 1
            before = min(ceiling, self.asked[partition] + step.param("ahead"))
            if before <= self.asked[partition]:
                return
            self.asked[partition] = before
            clients.delete_records(node.bootstrap, node.name, partition, before,
                                   self.history)
        elif step.kind == "alter-config":
            clients.alter_config(node.bootstrap, node.name, step.param("key"),
                                 step.param("value"), self.history)


def say(settings: Settings, text: str) -> None:
    if not settings.quiet:
        print(f"jepsen[{settings.seed}]: {text}", flush=True)


def run_schedule(settings: Settings, s3: S3Server, proxy: S3Proxy, workdir: Path) -> Result:
    """Run one seeded schedule and check it; every process it started is stopped."""
    print(f"jepsen: seed {settings.seed}, {settings.seconds:g} s, {settings.nodes} nodes, "
          f"lease ttl {settings.ttl_s:g} s, files in {workdir}", flush=True)
    # moto logs every request at INFO: a failing test would print thousands of lines.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    history = History()
    run = Run()
    began = time.monotonic()
    try:
        return _run(settings, s3, proxy, workdir, history, run, began)
    finally:
        stop_all(run)
        history.dump(workdir / "history.jsonl")


def _run(settings: Settings, s3: S3Server, proxy: S3Proxy, workdir: Path,
         history: History, run: Run, began: float) -> Result:
    where = str(s3.location("jepsen"))
    names = [f"n{i}" for i in range(1, settings.nodes + 1)]
    disk = settings.disk
    for name in names if disk else ():
        fs = workdir / f"{name}-fs"
        why = mount_tmpfs(fs, FS_BYTES)
        if why is not None:
            print(f"jepsen: the disk-full nemesis is skipped: {why}", flush=True)
            disk = False
            break
        run.mounts.append(fs)
    steps = schedule(settings.seed, settings.seconds, names, settings.ttl_s, disk,
                     TOPICS[KV])
    faults = collections.Counter(step.kind for step in steps if is_fault(step))
    say(settings, f"schedule: {len(steps)} steps, faults {dict(faults)}")
    config = workdir / "server.toml"
    config.write_text(server_config(settings.ttl_s))
    logs = workdir / "logs"
    logs.mkdir(exist_ok=True)
    for name in names:
        fs = workdir / f"{name}-fs" if disk else None
        local = fs / "local" if fs is not None else workdir / name
        run.nodes[name] = Node(name, where, free_port(), local, config, logs, proxy.env, fs)
    first = run.nodes[names[0]]
    first.start()
    assert wait_for(lambda: first.serving_since(0), 60), first.log_text()
    create_topics(first.bootstrap)
    for name in names[1:]:
        run.nodes[name].start()
    assert wait_for(lambda: all("standing by" in run.nodes[n].log_text()
                                for n in names[1:]), 60), "the standbys did not start"
    run.external = ExternalCompactions(where, proxy.env, workdir, history)
    run.ops = Operations(run.nodes, history, run.external)
    run.ops.start()
    for name in names:
        node = run.nodes[name]
        for acks, label in (("all", "all"), ("1", "one")):
            worker = ProducerWorker(f"{name}-{label}", name, node.bootstrap, acks, history,
                                    f"{settings.seed}-{name}-{label}", settings.rate,
                                    run.producing, settings.message_timeout_s)
            run.producers.append(worker)
        run.groups.append(GroupWorker(f"g-{name}", name, node.bootstrap, history,
                                      f"{settings.seed}-g-{name}", run.grouping))
    for worker in [*run.producers, *run.groups]:
        worker.start()
    say(settings, f"nodes and clients up after {time.monotonic() - began:.1f} s")

    nemesis = Nemesis(run.nodes, proxy, history, run.ops.steps.put)
    started = time.monotonic()
    nemesis.run(steps, started, lambda: False)
    schedule_s = time.monotonic() - started
    say(settings, f"schedule done after {schedule_s:.1f} s; healing")
    nemesis.heal()
    owner = wait_for_owner(run, 90)
    assert owner is not None, "no node serves after healing:\n" + last_lines(run)
    say(settings, f"{owner.name} serves; stopping the producers")
    time.sleep(2.0)
    run.producing.set()
    for worker in run.producers:
        worker.join(settings.message_timeout_s + 30)
    run.grouping.set()
    for group in run.groups:
        group.join(60)
    owner = wait_for_owner(run, 60)
    assert owner is not None, "no node serves after the producers stopped:\n" + last_lines(run)
    say(settings, f"{owner.name} serves; the groups catch up")
    time.sleep(1.0)  # the last acks=1 records uploaded (every upload_interval_s)
    caught: dict[str, bool] = {}
    for group in run.groups:
        caught[group.group] = with_owner(run, history, lambda node, g=group.group: (
            clients.consume(g, f"{g}-catch-up", node.name, node.bootstrap, history,
                            until=time.monotonic() + 30, partitions=TOPICS[KV])))
    views: list[dict[int, list[Row]] | None] = []
    with_owner(run, history, lambda node: views.append(
        clients.read_view(node.bootstrap, KV, TOPICS[KV], 30)) or views[-1] is not None)
    fetch_view = views[-1] if views else None
    say(settings, f"groups caught up: {caught}; stopping the nodes")
    run.ops.steps.put(None)
    run.ops.join(60)
    run.external.stop()
    codes = {name: node.terminate(60) for name, node in run.nodes.items()}
    final = read_final(where, s3.env, workdir / "final", TOPICS, KV)
    takes = [take for node in run.nodes.values() for take in node.takes()]
    takes += run.external.takes()
    ownership = Ownership(takes)
    snapshot = history.snapshot()
    counts = {
        "seconds (schedule)": round(schedule_s, 1),
        "seconds (all)": round(time.monotonic() - began, 1),
        "nemesis events": sum(not f.skipped and f.kind != "exited" for f in snapshot.faults),
        "nemesis events by kind": dict(sorted(collections.Counter(
            f.kind for f in snapshot.faults if not f.skipped and f.kind != "exited").items())),
        "nemesis events skipped": sum(f.skipped for f in snapshot.faults),
        "operations": dict(sorted(collections.Counter(
            f"{op.kind} {op.outcome}" for op in snapshot.ops).items())),
        "lease takes": len(ownership.takes),
        "step-downs": sum(node.step_downs() for node in run.nodes.values()),
        "exits without a nemesis": sum(len(node.exits) for node in run.nodes.values()),
        "exit codes at the end": codes,
        "final records": {f"{t}/{p}": len(part.records)
                          for (t, p), part in final.partitions.items()},
        "groups caught up": caught,
    }
    result = check(settings.seed, snapshot, final, fetch_view, ownership, KV, LOG, counts)
    print(result.report(), flush=True)
    if result.failed:
        print(f"jepsen: history in {workdir / 'history.jsonl'}, node logs in {logs}",
              flush=True)
    return result


def with_owner(run: Run, history: History, action: Callable[[Node], bool],
               attempts: int = 4) -> bool:
    """`action` on the node that owns the lease, again on the owner then (a node may
    step down meanwhile: with a short lease on a busy machine the lease can move
    without a fault) until it succeeds or `attempts` are spent."""
    for _ in range(attempts):
        owner = wait_for_owner(run, 60)
        if owner is None:
            history.note("no node served for 60 s after the schedule")
            return False
        if action(owner):
            return True
    return False


def create_topics(bootstrap: str) -> None:
    admin = clients.admin_client(bootstrap)
    futures = admin.create_topics([
        NewTopic(KV, TOPICS[KV], 1, config={
            "cleanup.policy": "compact,delete", "segment.bytes": "16384",
            "min.cleanable.dirty.ratio": "0.3"}),
        NewTopic(LOG, TOPICS[LOG], 1, config={
            "cleanup.policy": "delete", "segment.bytes": "4096", "retention.bytes": "16384"}),
    ], request_timeout=30)
    for future in futures.values():
        future.result(60)


def serving(node: Node) -> bool:
    if not node.alive or node.paused:
        return False
    try:
        clients.admin_client(node.bootstrap).list_topics(timeout=1.0)
    except Exception:
        return False
    return True


def wait_for_owner(run: Run, timeout_s: float) -> Node | None:
    """The node that took the lease last, once it answers (a node that exited by
    itself is started again)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for node in run.nodes.values():
            if node.note_exit() is not None:
                node.start()
        takes = [take for node in run.nodes.values() for take in node.takes()]
        owner = Ownership(takes).owner_at_end()
        node = run.nodes.get(owner or "")
        if node is not None and serving(node):
            return node
        time.sleep(0.5)
    return None


def last_lines(run: Run, count: int = 30) -> str:
    return "\n".join(f"--- {name}\n" + "\n".join(node.log_text().splitlines()[-count:])
                     for name, node in run.nodes.items())


def stop_all(run: Run) -> None:
    """Every thread and process of the run ends, by pid; the tmpfs mounts go."""
    run.producing.set()
    run.grouping.set()
    if run.ops is not None:
        run.ops.steps.put(None)
    if run.external is not None:
        run.external.stop()
    for node in run.nodes.values():
        node.kill()
    for worker in [*run.producers, *run.groups]:
        worker.join(30)
    kill_descendants_of(run)
    for mount in run.mounts:
        unmount(mount)


def kill_descendants_of(run: Run) -> None:
    """The compaction workers the nodes started: each reads the end of its input when
    its node dies and exits; any still there (mid-run) are killed by pid, found by the
    local directory in their environment."""
    dirs = {str(node.local_dir) for node in run.nodes.values()}
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            with contextlib.suppress(OSError):
                environ = (entry / "environ").read_bytes().split(b"\0")
                local = next((e.split(b"=", 1)[1].decode() for e in environ
                              if e.startswith(b"COMPACTLOG_LOCAL_DIR=")), None)
                if local in dirs:
                    found.append(int(entry.name))
        if not found:
            return
        time.sleep(0.5)
    for pid in found:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
