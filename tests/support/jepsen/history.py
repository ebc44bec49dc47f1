"""What happened in a run, as the clients and the nemesis saw it: every send and its
acknowledgement, every record a group read and every offset it committed, every admin
operation and `compactlog compact` with its outcome, every fault. Times are wall-clock
seconds (time.time()), comparable with the nodes' log lines (same machine, same clock).
"""

from __future__ import annotations

import dataclasses
import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# An operation's outcome: it took effect, it did not, or the client cannot know.
OK, FAILED, UNKNOWN = "ok", "failed", "unknown"


@dataclass
class Send:
    """One record a producer sent; ack_time, partition and offset once acknowledged,
    or error once it failed. `rid` is unique in the run, carried in a header."""

    producer: str
    server: str
    acks: str  # "all" or "1"
    topic: str
    key: bytes
    value: bytes | None
    rid: str
    send_time: float
    ack_time: float | None = None
    partition: int | None = None
    offset: int | None = None
    error: str | None = None

    @property
    def acknowledged(self) -> bool:
        return self.ack_time is not None and self.error is None and self.offset is not None


@dataclass
class Read:
    group: str
    member: str
    server: str
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    rid: str | None
    time: float


@dataclass
class Commit:
    group: str
    member: str
    server: str
    time: float
    offsets: dict[str, int]  # "topic/partition" -> the next offset to read
    error: str | None = None


@dataclass
class Op:
    """An admin operation or a `compactlog compact` run, and its outcome."""

    kind: str
    server: str
    start: float
    args: dict[str, Any]
    end: float | None = None
    outcome: str = UNKNOWN
    detail: str = ""


@dataclass
class Fault:
    """One nemesis event as executed (or skipped, with the reason in detail)."""

    time: float
    kind: str
    target: str
    detail: str = ""
    skipped: bool = False


@dataclass
class History:
    sends: list[Send] = field(default_factory=list)
    reads: list[Read] = field(default_factory=list)
    commits: list[Commit] = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, item: Send | Read | Commit | Op | Fault) -> None:
        with self._lock:
            if isinstance(item, Send):
                self.sends.append(item)
            elif isinstance(item, Read):
                self.reads.append(item)
            elif isinstance(item, Commit):
                self.commits.append(item)
            elif isinstance(item, Op):
                self.ops.append(item)
            else:
                self.faults.append(item)

    def note(self, text: str) -> None:
        with self._lock:
            self.notes.append(text)

    def snapshot(self) -> History:
        """A copy of the lists as they are now (clients may still be appending)."""
        with self._lock:
            return History(list(self.sends), list(self.reads), list(self.commits),
                           list(self.ops), list(self.faults), list(self.notes))

    def dump(self, path: Path) -> None:
        """Every event as a JSON line, for reading a failed run afterwards."""
        def plain(value: Any) -> Any:
            if isinstance(value, bytes):
                return value.decode(errors="replace")
            if isinstance(value, dict):
                return {k: plain(v) for k, v in value.items()}
            return value

        with self._lock, path.open("w") as out:
            for name in ("faults", "ops", "sends", "commits", "reads"):
                for item in getattr(self, name):
                    row = {k: plain(v) for k, v in dataclasses.asdict(item).items()}
                    out.write(json.dumps({"type": name[:-1], **row}) + "\n")
            for note in self.notes:
                out.write(json.dumps({"type": "note", "text": note}) + "\n")
