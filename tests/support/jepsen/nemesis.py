"""The schedule of a run, drawn from its seed, and its execution.

A schedule is a list of steps (when, what, on which node, with which parameters), made
before the run from the seed alone: the same seed gives the same schedule (the
interleavings it meets still vary with timing, as in Jepsen). Faults:

  kill         SIGKILL a node; `restart` starts it again later on its old directory
  pause        SIGSTOP a node for longer than the lease; `resume` sends SIGCONT
  stop-start   SIGTERM a node and start it again at once on its old directory
  s3-500/503   S3 requests (by method and key pattern) answered 500 / 503
  s3-stall     S3 requests held for seconds, then forwarded or dropped
  s3-lost      S3 writes forwarded, their answers lost
  slow-lease   the next PUT of the writer lease held past the lease's ttl
  disk-full    a node's local directory (a tmpfs) filled; `disk-free` frees it

and operations: DeleteRecords, a topic config change, `compactlog compact` from
outside. At most all nodes but one are down (killed or paused) at once.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from support import s3_faults
from support.jepsen.cluster import Node
from support.jepsen.history import Fault, History
from support.s3_faults import S3Proxy

# Key patterns of the S3 faults: the data, the commits, the documents.
KEYS = (r"/segments/", r"/ledger/", r"/manifest/", r"manifest/current\.json$",
        r"groups/", r"meta/current\.json$", r"producer-ids/", r"writer/current\.json$", "")
METHODS = ("PUT", "GET", "HEAD", "POST", None)
CONFIGS = {
    "segment.bytes": ("4096", "16384", "65536", "1048576"),
    "min.compaction.lag.ms": ("0", "500", "3000"),
    "min.cleanable.dirty.ratio": ("0.1", "0.3", "0.5"),
    "compaction.deletion.vectors": ("true", "false"),
    # small ledger files merged as soon as two are neighbours, or at the default
    "compaction.ledger.merge.min.files": ("2", "5"),
}
FAULTS = {"kill": 2.0, "pause": 2.0, "stop-start": 1.0, "s3-500": 1.0, "s3-503": 1.0,
          "s3-stall": 1.0, "s3-lost": 1.0, "slow-lease": 1.5, "disk-full": 1.0}
HEALS = {"restart", "resume", "disk-free"}
OPERATIONS = {"delete-records": 2.0, "alter-config": 2.0, "compact": 1.0}


@dataclass(frozen=True)
class Step:
    at: float  # seconds after the schedule's start
    kind: str
    target: str = ""
    params: tuple[tuple[str, Any], ...] = ()

    def param(self, name: str) -> Any:
        return dict(self.params)[name]

    def __str__(self) -> str:
        args = " ".join(f"{k}={v}" for k, v in self.params)
        return f"{self.at:7.2f}s {self.kind} {self.target} {args}".rstrip()


def schedule(seed: int, seconds: float, nodes: list[str], ttl_s: float,
             disk: bool, partitions: int) -> list[Step]:
    """The steps of a run of `seconds`, from `seed` alone."""
    rng = random.Random(seed)
    steps: list[Step] = []
    down: dict[str, float] = {}  # node -> until when it is killed, paused or restarting
    full: dict[str, float] = {}  # node -> until when its disk is full
    lease_slow_until = 0.0
    kinds = {k: w for k, w in FAULTS.items() if disk or k != "disk-full"}
    at = rng.uniform(1.0, 3.0)
    while at < seconds:
        kind = rng.choices(list(kinds), list(kinds.values()))[0]
        up = [n for n in nodes if down.get(n, 0.0) <= at]
        if kind in ("kill", "pause", "stop-start") and len(up) >= 2:
            target = rng.choice(up)
            if kind == "kill":
                back = at + rng.uniform(0.5, 3 * ttl_s)
                steps += [Step(at, "kill", target), Step(back, "restart", target)]
            elif kind == "pause":
                back = at + ttl_s * rng.uniform(1.3, 3.0)
                steps += [Step(at, "pause", target), Step(back, "resume", target)]
            else:
                back = at + 3.0
                steps.append(Step(at, "stop-start", target))
            down[target] = back
        elif kind in ("s3-500", "s3-503"):
            steps.append(Step(at, kind, params=(
                ("method", rng.choice(METHODS)), ("key", rng.choice(KEYS)),
                ("count", rng.randint(1, 12)))))
        elif kind == "s3-stall":
            steps.append(Step(at, kind, params=(
                ("method", rng.choice(METHODS)), ("key", rng.choice(KEYS)),
                ("count", rng.randint(1, 4)), ("seconds", round(rng.uniform(0.5, 8.0), 2)),
                ("then", rng.choice(("forward", "drop"))))))
        elif kind == "s3-lost":
            steps.append(Step(at, kind, params=(
                ("method", rng.choice(("PUT", "POST", "DELETE"))),
                ("key", rng.choice(KEYS)), ("count", rng.randint(1, 4)))))
        elif kind == "slow-lease" and lease_slow_until <= at:
            held = round(ttl_s * rng.uniform(1.2, 2.5), 2)
            steps.append(Step(at, kind, params=(("seconds", held),)))
            lease_slow_until = at + held
        elif kind == "disk-full":
            target = rng.choice(nodes)
            if full.get(target, 0.0) <= at:
                back = at + rng.uniform(1.0, 8.0)
                steps += [Step(at, "disk-full", target), Step(back, "disk-free", target)]
                full[target] = back
        at += rng.uniform(0.4, 3.0)
    # Operations, on a node drawn at random (one that stands by refuses them).
    at = rng.uniform(2.0, 6.0)
    while at < seconds:
        kind = rng.choices(tuple(OPERATIONS), tuple(OPERATIONS.values()))[0]
        if kind == "delete-records":
            steps.append(Step(at, kind, rng.choice(nodes), (
                ("partition", rng.randrange(partitions)), ("ahead", rng.randint(3, 25)))))
        elif kind == "alter-config":
            key = rng.choice(sorted(CONFIGS))
            steps.append(Step(at, kind, rng.choice(nodes), (
                ("key", key), ("value", rng.choice(CONFIGS[key])))))
        else:
            steps.append(Step(at, kind))
        at += rng.uniform(2.0, 8.0)
    return sorted(steps, key=lambda step: step.at)


def is_fault(step: Step) -> bool:
    return step.kind in FAULTS or step.kind in HEALS


class Nemesis:
    """Executes a schedule's faults against the nodes and the proxy; operations go to
    `operate`. Each fault is recorded, with what it did or why it was skipped."""

    def __init__(self, nodes: dict[str, Node], proxy: S3Proxy, history: History,
                 operate: Callable[[Step], None]) -> None:
        self.nodes = nodes
        self.proxy = proxy
        self.history = history
        self.operate = operate

    def run(self, steps: list[Step], started: float, until: Callable[[], bool]) -> None:
        for step in steps:
            while time.monotonic() < started + step.at:
                if until():
                    return
                self.watch()
                time.sleep(min(0.1, max(0.0, started + step.at - time.monotonic())))
            self.execute(step)

    def watch(self) -> None:
        """A node that exited by itself is recorded and started again."""
        for node in self.nodes.values():
            exited = node.note_exit()
            if exited is not None:
                self.history.note(exited)
                self.history.add(Fault(time.time(), "exited", node.name, exited))
                node.start()

    def execute(self, step: Step) -> None:
        if not is_fault(step):
            self.operate(step)
            return
        node = self.nodes.get(step.target)
        detail, skipped = "", False
        kind = step.kind
        if kind == "kill":
            skipped = node is None or not node.alive
            if not skipped and node is not None:
                node.kill()
        elif kind == "restart":
            skipped = node is None or node.alive
            if not skipped and node is not None:
                node.start()
        elif kind == "pause":
            skipped = node is None or not node.alive or node.paused
            if not skipped and node is not None:
                node.pause()
        elif kind == "resume":
            skipped = node is None or not node.paused
            if not skipped and node is not None:
                node.resume()
        elif kind == "stop-start":
            skipped = node is None or not node.alive or node.paused
            if not skipped and node is not None:
                detail = f"exit {node.terminate(30)}"
                node.start()
        elif kind in ("s3-500", "s3-503"):
            status, code = (500, "InternalError") if kind == "s3-500" else (503, "SlowDown")
            self.proxy.add(s3_faults.error(status, code, method=step.param("method"),
                                           key=step.param("key") or None,
                                           count=step.param("count")))
        elif kind == "s3-stall":
            self.proxy.add(s3_faults.stall(step.param("then"), step.param("seconds"),
                                           method=step.param("method"),
                                           key=step.param("key") or None,
                                           count=step.param("count")))
        elif kind == "s3-lost":
            self.proxy.add(s3_faults.lost_answer(method=step.param("method"),
                                                 key=step.param("key") or None,
                                                 count=step.param("count")))
        elif kind == "slow-lease":
            self.proxy.add(s3_faults.stall("forward", step.param("seconds"), method="PUT",
                                           key=r"writer/current\.json$", count=1))
        elif kind == "disk-full":
            skipped = node is None or node.fs is None
            if not skipped and node is not None:
                detail = f"ballast {node.fill_disk() >> 20} MiB"
        elif kind == "disk-free":
            skipped = node is None or node.fs is None
            if not skipped and node is not None:
                node.free_disk()
        self.history.add(Fault(time.time(), kind, step.target,
                               detail or " ".join(f"{k}={v}" for k, v in step.params),
                               skipped))

    def heal(self) -> None:
        """Undo every fault: rules off, paused nodes on, disks freed, dead nodes up."""
        self.proxy.clear()
        for node in self.nodes.values():
            node.free_disk()
            if node.paused:
                node.resume()
                self.history.add(Fault(time.time(), "resume", node.name, "heal"))
            if not node.alive:
                node.note_exit()
                node.start()
                self.history.add(Fault(time.time(), "restart", node.name, "heal"))
