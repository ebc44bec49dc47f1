"""One compaction run over some partitions of a topic, whatever engine does the work.

Protocol for each partition (a crash after any step leaves the old pair in force, or
the new one, and never a reader-visible half-written file):
  1. take the partition's compaction lock; remove ledger files no manifest lists
     (left by a run that died) and write status RUNNING;
  2. plan from the current manifest: previous ledger + cleanable dirty segments;
  3. phase 1 (engine): surviving offsets per partition;
  4. phase 2 (engine): new ledger files, each written under a temporary name, fsynced,
     then renamed into ledger/; their names carry the run id;
  5. commit the new (horizon, ledger) pair in one manifest version, provided the
     manifest's pair is still the one planned from (another compactor may not have
     won meanwhile); the writer's own commits (sealing, retention) merge in;
  6. delete the previous ledger files, now unreferenced; write status SUCCESS.
On failure in 3-5 the run's files are deleted and the status says ERROR, with the error.
Readers that loaded the old manifest and find a ledger file gone reload and retry.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Protocol

from compactlog.compaction import CompactionReport, PartitionSummary
from compactlog.compaction.ledger import LEDGER_DIR, PieceResult
from compactlog.compaction.plan import PartitionPlan, plan_partition
from compactlog.compaction.status import (
    CompactionStatus,
    compaction_lock,
    read_status,
    write_status,
)
from compactlog.errors import ConflictError, UserError
from compactlog.storage import fsutil
from compactlog.storage.manifest import PartitionManifest
from compactlog.storage.partition import Partition
from compactlog.storage.store import LogStore

log = logging.getLogger(__name__)

Progress = Callable[[str, int, int], None]  # (stage, done, total)


class Engine(Protocol):
    """Phases 1 and 2 of compaction; the runner does everything around them."""

    def find_survivors(self, plans: list[PartitionPlan]) -> None: ...

    def write_ledgers(
        self, plans: list[PartitionPlan], run_id: str
    ) -> dict[int, list[PieceResult]]: ...


def _no_progress(stage: str, done: int, total: int) -> None:
    pass


def run_compaction(
    store: LogStore,
    topic_name: str,
    engine: Engine,
    partitions: Sequence[int] | None = None,
    clock: Callable[[], float] = time.time,
    progress: Progress = _no_progress,
) -> CompactionReport:
    started = time.monotonic()
    topic = store.topic(topic_name)
    chosen = chosen_partitions(store, topic_name, partitions)
    run_id = f"{int(clock() * 1000):x}{uuid.uuid4().hex[:6]}"
    report = CompactionReport(topic_name, run_id, 0.0)
    with contextlib.ExitStack() as locks:
        for partition in chosen:
            locks.enter_context(compaction_lock(partition.directory, partition.name))
        now_ms = int(clock() * 1000)
        progress("plan", 0, len(chosen))
        plans: list[PartitionPlan] = []
        for partition in chosen:
            _prepare(partition, run_id, now_ms)
            partition.refresh()
            plans.append(plan_partition(
                topic_name, partition.index, partition.directory, partition.manifest,
                partition.manifest_version, topic.config, now_ms,
            ))
        work = [plan for plan in plans if plan.has_work]
        summaries = {plan.partition: _summary(plan) for plan in plans}
        stage_started = _lap(report, "plan", started)
        try:
            progress("phase 1: find survivors", 0, 1)
            engine.find_survivors(work)
            stage_started = _lap(report, "phase 1", stage_started)
            progress("phase 1: find survivors", 1, 1)
            progress("phase 2: write ledgers", 0, 1)
            results = engine.write_ledgers(work, run_id)
            stage_started = _lap(report, "phase 2", stage_started)
            progress("phase 2: write ledgers", 1, 1)
            for done, plan in enumerate(work):
                progress("commit", done, len(work))
                partition = topic.partition(plan.partition)
                _commit(partition, plan, results.get(plan.partition, []), run_id, now_ms,
                        summaries[plan.partition])
            _lap(report, "commit", stage_started)
        except BaseException as error:
            for plan in work:
                _remove_run_files(plan.directory / LEDGER_DIR, run_id)
                _finish(plan.directory, run_id, now_ms, clock, error=error)
            raise
        for plan in plans:
            summary = summaries[plan.partition]
            _finish(plan.directory, run_id, now_ms, clock, summary=summary)
        report.partitions = [summaries[plan.partition] for plan in plans]
    report.duration_s = time.monotonic() - started
    progress("done", 1, 1)
    log.info(
        "compacted %s partitions %s: %d records in, %d out, in %.1fs (run %s)",
        topic_name, [p.partition for p in report.partitions], report.total("records_in"),
        report.total("records_out"), report.duration_s, run_id,
    )
    return report


def chosen_partitions(
    store: LogStore, topic_name: str, partitions: Sequence[int] | None
) -> list[Partition]:
    """The partitions a run of `topic_name` compacts; a clear error if it cannot run."""
    topic = store.topic(topic_name)
    if not topic.config.compacted:
        raise UserError(
            f"topic {topic_name!r} has cleanup.policy={topic.config.cleanup_policy}; "
            "compaction needs compact or compact,delete"
        )
    indexes = partitions if partitions is not None else range(len(topic.partitions))
    return [topic.partition(i) for i in indexes]


def _lap(report: CompactionReport, stage: str, since: float) -> float:
    now = time.monotonic()
    report.stages[stage] = now - since
    return now


def _prepare(partition: Partition, run_id: str, now_ms: int) -> None:
    ledger_dir = partition.directory / LEDGER_DIR
    ledger_dir.mkdir(exist_ok=True)
    fsutil.remove_temp_files(ledger_dir)
    partition.refresh()
    listed = {info["file"] for info in (partition.manifest.compaction or {}).get("ledger", [])}
    for path in ledger_dir.glob("*.parquet"):
        if path.name not in listed:  # left by a run that died before its commit
            path.unlink()
            log.info("%s: removed %s, written by a compaction that never committed",
                     partition.name, path.name)
    status = read_status(partition.directory)
    status.state, status.run_id, status.started_ms = "RUNNING", run_id, now_ms
    status.finished_ms, status.error = None, None
    write_status(partition.directory, status)


def _summary(plan: PartitionPlan) -> PartitionSummary:
    summary = PartitionSummary(
        partition=plan.partition,
        old_horizon=plan.old_horizon,
        horizon=plan.old_horizon,
        dirty_segments=len(plan.dirty),
    )
    if not plan.has_work:
        summary.skipped = "no sealed segment is cleanable yet"
    return summary


def _commit(
    partition: Partition,
    plan: PartitionPlan,
    pieces: list[PieceResult],
    run_id: str,
    now_ms: int,
    summary: PartitionSummary,
) -> None:
    new_ledger = [piece.info for piece in pieces if piece.info is not None]
    for piece in pieces:
        summary.records_out += piece.records_out
        summary.tombstones_kept += piece.tombstones_kept
        summary.tombstones_removed += piece.tombstones_removed
        summary.null_keys_removed += piece.null_keys_removed
        summary.expired_removed += piece.expired_removed
    summary.records_in = sum(item.info.record_count for item in plan.inputs)
    summary.bytes_in = sum(item.info.size_bytes for item in plan.inputs)
    summary.bytes_out = sum(info.size_bytes for info in new_ledger)
    summary.keys = len(plan.survivors)
    summary.horizon = plan.new_horizon
    oldest = [p.oldest_tombstone_ms for p in pieces if p.oldest_tombstone_ms is not None]
    planned_files = [item.info.file for item in plan.clean]
    compaction: dict[str, Any] = {
        "horizon": plan.new_horizon,
        "ledger": [asdict(info) for info in new_ledger],
        "oldest_tombstone_ms": min(oldest) if oldest else None,
        "run_id": run_id,
        "compacted_at_ms": now_ms,
        "strategy": plan.strategy.spec,
    }

    def swap(manifest: PartitionManifest) -> PartitionManifest:
        current = manifest.compaction or {}
        if (current.get("horizon") != plan.old_horizon
                or [info["file"] for info in current.get("ledger", [])] != planned_files):
            raise ConflictError(
                f"{partition.name}: another compaction committed while this one ran"
            )
        return replace(manifest, compaction=compaction)

    partition.commit_manifest(swap)
    for item in plan.clean:
        item.path.unlink(missing_ok=True)
    fsutil.fsync_dir(plan.directory / LEDGER_DIR)


def _remove_run_files(ledger_dir: Path, run_id: str) -> None:
    for path in ledger_dir.glob(f"*-{run_id}-*.parquet"):
        path.unlink(missing_ok=True)
    fsutil.remove_temp_files(ledger_dir)


def _finish(
    directory: Path,
    run_id: str,
    now_ms: int,
    clock: Callable[[], float],
    summary: PartitionSummary | None = None,
    error: BaseException | None = None,
) -> None:
    status: CompactionStatus = read_status(directory)
    status.run_id = run_id
    status.finished_ms = int(clock() * 1000)
    if error is None:
        status.state, status.error, status.failures_in_a_row = "SUCCESS", None, 0
        if summary is not None:
            status.last_success = summary.__dict__ | {
                "started_ms": now_ms, "finished_ms": status.finished_ms,
                "records_removed": summary.records_removed,
            }
    else:
        status.state = "ERROR"
        status.error = f"{type(error).__name__}: {error}"
        status.failures_in_a_row += 1
    write_status(directory, status)
