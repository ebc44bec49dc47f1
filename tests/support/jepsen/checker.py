"""The checks over a run's history and its final state (issue 21, "How it must be
shown"), their counts, and the violations with the history that shows each.

1. Every record acknowledged to acks=all is in the final log at its acknowledged
   offset, with its key and value, unless it lies below a DeleteRecords that succeeded
   or whose outcome is unknown (or, on the `delete` topic, below the log start that
   retention moved); and once per producer session: two copies under one producer id,
   epoch and sequence are a retry the server stored twice. (Copies under different
   epochs are librdkafka's own re-sends after it bumped its epoch, which Kafka's broker
   stores too; they are counted.)
2. Offsets are dense and never reused: each partition's final log holds every offset
   from its start to its end once; no two acks=all acknowledgements name one offset with
   different records; an acks=1 record whose offset the final log holds with another
   record is allowed only if another process took the lease after it was sent (counted
   as "acks=1 lost in fail-over"); every record in the final log was sent by a client.
3. Groups: every record a group read is in the final log at that offset (consumers are
   served only what is durable: the durable high watermark); no committed offset passes
   the final log end; every acks=all record that is the last of its key in the final log
   (so no compaction could have hidden it) was read by every group that read to the end.
4. The compacted view from every read path (Reader, Kafka Fetch, DuckDB and Polars over
   tables.view_dataset) is the fold of the final raw log up to some horizon plus every
   record after it; the Reader's, at the horizon of the final manifest.
5. A process that had lost the writer lease acknowledged nothing: each acknowledgement
   of a node's pinned producer was decided while that node may have held the lease
   (some instant between the send and the acknowledgement lies in one of its ownership
   intervals); and no two takes of the lease have the same epoch.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from compactlog.storage.records import Record
from support.jepsen.cluster import Ownership
from support.jepsen.final import Final, FinalPartition, Row, rid
from support.jepsen.history import OK, UNKNOWN, History, Send

SHOWN = 20  # violations printed per check


@dataclass
class Result:
    seed: int
    counts: dict[str, Any]
    violations: dict[str, list[str]] = field(default_factory=dict)

    def add(self, check: str, text: str) -> None:
        self.violations.setdefault(check, []).append(text)

    @property
    def failed(self) -> bool:
        return any(self.violations.values())

    def report(self) -> str:
        lines = [f"jepsen: seed {self.seed}"]
        for name, value in self.counts.items():
            lines.append(f"  {name}: {value}")
        if not self.failed:
            lines.append("  violations: none")
        for check, found in self.violations.items():
            lines.append(f"  VIOLATIONS of {check}: {len(found)}")
            lines += [f"    - {text}" for text in found[:SHOWN]]
            if len(found) > SHOWN:
                lines.append(f"    ... and {len(found) - SHOWN} more")
        return "\n".join(lines)


def show(send: Send) -> str:
    value = "tombstone" if send.value is None else send.value.decode(errors="replace")
    return (f"{send.rid} (acks={send.acks} via {send.server}, key {send.key.decode()}, "
            f"{value}, sent {send.send_time:.3f}, acked {send.ack_time or 0:.3f} at "
            f"{send.topic}/{send.partition}@{send.offset})")


def show_record(record: Record | None) -> str:
    if record is None:
        return "nothing"
    value = "tombstone" if record.value is None else record.value.decode(errors="replace")
    return f"{rid(record)} (key {(record.key or b'').decode()}, {value})"


def matches(record: Record | None, send: Send) -> bool:
    return (record is not None and rid(record) == send.rid and record.key == send.key
            and record.value == send.value)


def sequence_of(where: tuple[str, int, int],
                batch: tuple[int, int, int, int] | None) -> tuple[int, int, int] | None:
    """(producer id, epoch, sequence) of the record at `where`, from its batch."""
    if batch is None or batch[0] < 0:
        return None
    producer_id, epoch, base_sequence, base_offset = batch
    return producer_id, epoch, base_sequence + where[2] - base_offset


def view_at(part: FinalPartition, horizon: int | None) -> list[Row]:
    """The compacted view of the final raw log with `horizon`: the latest record of each
    key at or below it, then every record after it, in offset order."""
    if horizon is None:
        return [(r.offset, r.key, r.value) for r in part.records]
    latest: dict[bytes | None, int] = {}
    for record in part.records:
        if record.offset <= horizon:
            latest[record.key] = record.offset
    kept = set(latest.values())
    return [(r.offset, r.key, r.value) for r in part.records
            if r.offset > horizon or r.offset in kept]


def matching_horizon(part: FinalPartition, rows: Sequence[Row]) -> int | bool | None:
    """A horizon whose view equals `rows` (None: no compaction), or False."""
    present = {row[0] for row in rows}
    tail_from = part.end
    for record in reversed(part.records):
        if record.offset not in present:
            break
        tail_from = record.offset
    candidates: list[int | None] = [None, part.horizon, tail_from - 1]
    candidates += [r.offset for r in part.records if r.offset >= tail_from]
    for horizon in candidates:
        if view_at(part, horizon) == list(rows):
            return horizon
    return False


def difference(expected: Sequence[Row], got: Sequence[Row]) -> str:
    want, have = set(expected), set(got)
    missing = sorted(want - have)[:5]
    extra = sorted(have - want)[:5]
    return (f"{len(got)} rows, expected {len(expected)}; missing {missing}; "
            f"unexpected {extra}")


def check(seed: int, history: History, final: Final,
          fetch_view: dict[int, list[Row]] | None, ownership: Ownership,
          compacted: str, retained: str, counts: dict[str, Any]) -> Result:
    result = Result(seed, counts)
    sends = history.sends
    acked = [s for s in sends if s.acknowledged]
    for level in ("all", "1"):
        mine = [s for s in sends if s.acks == level]
        counts[f"acks={level} acknowledged"] = sum(s.acknowledged for s in mine)
        counts[f"acks={level} failed"] = sum(s.error is not None for s in mine)
        counts[f"acks={level} unanswered"] = sum(s.ack_time is None for s in mine)

    # DeleteRecords that may have taken effect: records below them need not be there.
    asked: dict[tuple[str, int], int] = collections.defaultdict(int)
    for op in history.ops:
        if op.kind == "delete-records" and op.outcome in (OK, UNKNOWN):
            where = (op.args["topic"], op.args["partition"])
            asked[where] = max(asked[where], op.args["before"])

    def bound(topic: str, partition: int) -> int:
        if topic == retained:
            return final.partitions[(topic, partition)].log_start
        return asked[(topic, partition)]

    for (topic, index), part in final.partitions.items():
        if topic != retained and part.log_start > asked[(topic, index)]:
            result.add("1 acknowledged records survive",
                       f"{topic}/{index} starts at {part.log_start}, but DeleteRecords "
                       f"asked for at most {asked[(topic, index)]}")

    copies: dict[str, list[tuple[str, int, int]]] = collections.defaultdict(list)
    for (topic, index), part in final.partitions.items():
        for record in part.records:
            copies[rid(record) or ""].append((topic, index, record.offset))

    # 1. acks=all: exactly once, at its offset. A copy under another producer epoch is
    # the client's: librdkafka bumps an idempotent producer's epoch itself after a
    # message timed out in flight (KIP-360) and sends what was in flight again under the
    # new epoch, from sequence 0, though it may have been stored: Kafka's broker appends
    # it too. Two copies under one producer id, epoch and sequence are the server's.
    below = resent = 0
    for send in acked:
        if send.acks != "all":
            continue
        assert send.partition is not None and send.offset is not None
        limit = bound(send.topic, send.partition)
        if send.offset < limit:
            below += 1
            continue
        part = final.partitions[(send.topic, send.partition)]
        found = part.by_offset.get(send.offset)
        if not matches(found, send):
            result.add("1 acknowledged records survive",
                       f"{show(send)}: the final log holds {show_record(found)} there")
        seen = [c for c in copies[send.rid] if c[2] >= limit]
        if len(seen) > 1:
            batches = [final.batches.get(c) for c in seen]
            sessions = [sequence_of(c, b) for c, b in zip(seen, batches, strict=True)]
            if None in sessions or len(set(sessions)) < len(sessions):
                result.add("1 acknowledged records survive",
                           f"{show(send)} is in the final log {len(seen)} times: {seen}; "
                           "their batches (producer id, epoch, base sequence, base offset): "
                           f"{batches}")
            else:
                resent += 1
    counts["acknowledged records below a DeleteRecords or retention (not checked)"] = below
    counts["acks=all stored again by the client under a new producer epoch"] = resent

    # 2. dense offsets, no offset acknowledged twice, nothing nobody sent.
    for (topic, index), part in final.partitions.items():
        offsets = [r.offset for r in part.records]
        if offsets != list(range(part.log_start, part.end)):
            gaps = sorted(set(range(part.log_start, part.end)) - set(offsets))[:10]
            twice = [o for o, n in collections.Counter(offsets).items() if n > 1][:10]
            result.add("2 offsets dense and never reused",
                       f"{topic}/{index} [{part.log_start}, {part.end}): {len(offsets)} "
                       f"records; missing {gaps}, twice {twice}")
    by_offset: dict[tuple[str, int, int], list[Send]] = collections.defaultdict(list)
    for send in acked:
        assert send.partition is not None and send.offset is not None
        by_offset[(send.topic, send.partition, send.offset)].append(send)
    for (topic, index, offset), group in by_offset.items():
        strong = {s.rid: s for s in group if s.acks == "all"}
        if len(strong) > 1:
            result.add("2 offsets dense and never reused",
                       f"{topic}/{index}@{offset} acknowledged to acks=all for "
                       f"{len(strong)} records: " + "; ".join(map(show, strong.values())))
    lost = duplicated = 0
    for send in acked:
        if send.acks != "1":
            continue
        assert send.partition is not None and send.offset is not None
        if send.offset < bound(send.topic, send.partition):
            continue
        part = final.partitions[(send.topic, send.partition)]
        found = part.by_offset.get(send.offset)
        if len(copies[send.rid]) > 1:
            duplicated += 1
        if matches(found, send):
            continue
        if ownership.taken_from_after(send.server, send.send_time):
            lost += 1
        else:
            result.add("2 offsets dense and never reused",
                       f"{show(send)}: the final log holds {show_record(found)} there, "
                       f"and no other process took the lease after it was sent")
    counts["acks=1 lost in fail-over"] = lost
    counts["acks=1 in the log more than once (retries, not idempotent)"] = duplicated
    sent = {s.rid: s for s in sends}
    for (topic, index), part in final.partitions.items():
        for record in part.records:
            origin = sent.get(rid(record) or "")
            if origin is None or origin.topic != topic or not matches(record, origin):
                result.add("2 offsets dense and never reused",
                           f"{topic}/{index}@{record.offset} holds {show_record(record)}, "
                           "which no client sent")

    check_groups(result, history, final, compacted, acked, bound)
    check_views(result, final, fetch_view, compacted)

    # 5. no acknowledgement from a process that had lost the lease.
    for send in acked:
        assert send.ack_time is not None
        if not ownership.owned_between(send.server, send.send_time, send.ack_time):
            result.add("5 a writer that lost its lease acknowledges nothing",
                       f"{show(send)}: {send.server} did not hold the lease at any time "
                       f"between the send and the acknowledgement; its intervals: "
                       f"{ownership.intervals.get(send.server)}")
    epochs = collections.Counter(take.epoch for take in ownership.takes)
    for epoch, times in epochs.items():
        if times > 1:
            result.add("5 a writer that lost its lease acknowledges nothing",
                       f"epoch {epoch} was taken {times} times: "
                       f"{[t for t in ownership.takes if t.epoch == epoch]}")
    return result


def check_groups(result: Result, history: History, final: Final, compacted: str,
                 acked: list[Send], bound: Any) -> None:
    counts = result.counts
    wrong = 0
    for read in history.reads:
        part = final.partitions[(read.topic, read.partition)]
        if read.offset < part.log_start:
            continue
        found = part.by_offset.get(read.offset)
        if found is None or rid(found) != read.rid or found.value != read.value:
            wrong += 1
            result.add("3 groups read only what is durable and skip nothing",
                       f"group {read.group} ({read.member} via {read.server}) read "
                       f"{read.rid} at {read.topic}/{read.partition}@{read.offset} at "
                       f"{read.time:.3f}; the final log holds {show_record(found)} there")
    counts["reads"] = len(history.reads)
    counts["commits"] = sum(c.error is None for c in history.commits)
    counts["commits failed"] = sum(c.error is not None for c in history.commits)
    for entry in history.commits:
        for name, offset in entry.offsets.items():
            topic, _, index = name.rpartition("/")
            end = final.partitions[(topic, int(index))].end
            if offset > end:
                result.add("3 groups read only what is durable and skip nothing",
                           f"group {entry.group} ({entry.member} via {entry.server}) "
                           f"committed {name}@{offset} at {entry.time:.3f} "
                           f"({'ok' if entry.error is None else entry.error}); the final "
                           f"log ends at {end}")
    # The last record of each key: no compaction can hide it from a group.
    last: dict[tuple[int, bytes | None], int] = {}
    for (topic, index), part in final.partitions.items():
        if topic == compacted:
            for record in part.records:
                last[(index, record.key)] = record.offset
    caught_up = [g for g, done in counts.get("groups caught up", {}).items() if done]
    for group in caught_up:
        read = {(r.partition, r.offset) for r in history.reads
                if r.group == group and r.topic == compacted}
        for send in acked:
            if send.topic != compacted or send.acks != "all":
                continue
            assert send.partition is not None and send.offset is not None
            if (send.offset < bound(compacted, send.partition)
                    or last.get((send.partition, send.key)) != send.offset):
                continue
            if (send.partition, send.offset) not in read:
                result.add("3 groups read only what is durable and skip nothing",
                           f"group {group} never read {show(send)}, the last record of "
                           "its key")


def check_views(result: Result, final: Final, fetch_view: dict[int, list[Row]] | None,
                compacted: str) -> None:
    views = dict(final.views)
    if fetch_view is None:
        result.add("4 one compacted view", "Kafka Fetch: the consumer of the compacted "
                                           "view did not reach the end of every partition")
    else:
        views["fetch"] = fetch_view
    for path, error in final.view_errors.items():
        result.add("4 one compacted view", f"{path}: {error}")
    compared = []
    for path, partitions in views.items():
        for index, rows in sorted(partitions.items()):
            part = final.partitions[(compacted, index)]
            found = matching_horizon(part, rows)
            if found is False:
                result.add("4 one compacted view",
                           f"{path}, {compacted}/{index}: no horizon gives this view; at "
                           f"the manifest's horizon {part.horizon} (deleted below "
                           f"{part.deleted_below}): "
                           + difference(view_at(part, part.horizon), rows))
            elif path == "reader" and found != part.horizon:
                expected = view_at(part, part.horizon)
                if expected != list(rows):
                    result.add("4 one compacted view",
                               f"reader, {compacted}/{index}: not the view at the "
                               f"manifest's horizon {part.horizon}: "
                               + difference(expected, rows))
        compared.append(path)
    result.counts["read paths compared"] = ", ".join(compared)
