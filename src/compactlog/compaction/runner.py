"""One compaction run over some partitions of a topic, whatever engine does the work.

Invariant: a run that fails, however and wherever, leaves every partition at the
(horizon, ledger) pair it last committed: a partition whose commit happened keeps its
new pair and ledger files, the others keep their old ones, and no file a committed
manifest lists is deleted. Files are deleted by reachability (storage/sweep.py), never
because a step failed.

Protocol for each partition (tests/compaction/test_compaction_crash.py kills at each step;
tests/faults/test_fault_steps.py fails or stalls each one):
  0. get every rolled log segment sealed (compaction/rolled.py), so that the run covers
     all segments but the active one, as Kafka's cleaner does;
  1. take the partition's compaction lock; sweep ledger/ (orphans of runs that died,
     retired files whose delay has passed) and write status RUNNING;
  2. plan from the current manifest: previous ledger + cleanable dirty segments (on an
     object store, inputs that the driver reads are fetched into its read cache; Arrow
     tasks fetch their own, compaction/remote_files.py); a dirty segment's rows at or
     below the old horizon are never input, even were one to straddle it (plan.py);
  3. phase 1 (engine): surviving offsets per partition;
  4. phase 2 (engine): new ledger files, and with deletion vectors new DV files
     (compaction/incremental.py), each written under a temporary name, fsynced, then
     renamed into ledger/ (on an object store: published by the tasks, or by 5a);
     their names carry the run id;
  5a. on an object store, publish what the engine left in the local ledger/ and check
     that every file the commit will list is in the bucket, else fail before 5
     (tests/compaction/test_compaction_s3.py);
  5. commit the new (horizon, ledger) pair, each ledger file with its current DV, in
     one manifest version by compare-and-swap, its checks made again on the newest
     manifest after every lost race (`swap`, `_check_commit`); the previous ledger's
     files are retired by it. A check that fails raises ConflictError: the run fails,
     commits nothing, and is retried later (the cleaner's backoff), planned afresh.
     What the other actors may change between 2 and 5, and what the commit checks:
     a. another compaction commits a pair: the manifest's horizon, ledger files or
        DVs differ from those planned from: conflict. Tests:
          test_compaction_crash.py::
          test_a_compactor_that_loses_the_commit_race_leaves_nothing
          test_compaction_s3.py::test_two_compactions_from_two_machines_one_wins
          test_ledger_merge_races.py::
          test_a_compaction_that_merged_first_makes_the_second_conflict
     b. the writer seals segments: all lie above the planned ones and stay dirty for
        the next run; nothing to check. Test: test_compaction_crash.py::
          test_segments_sealed_under_a_compaction_stay_dirty_for_the_next_run
     c. the writer merges small segments (storage/merging.py): a listed segment that
        straddles the new horizon (base_offset <= horizon < last_offset) would give
        the next run records the new ledger holds: conflict. A merged file wholly on
        one side of it holds the same records as the planned segments it replaced:
        it goes through. Tests: test_merging.py::
          test_a_merge_across_a_running_compactions_horizon_makes_its_commit_conflict
          test_a_merge_below_a_running_compactions_horizon_lets_it_commit
        (the other order, the compaction's commit first, is the merge's to check:
          test_a_compaction_committed_under_a_merge_makes_the_merge_give_up)
     d. retention removes segments: on a compacted topic only those wholly at or below
        the old horizon, whose records the ledger holds: it goes through. A planned
        segment whose offsets no listed segment covers any more (retention after a
        switch to cleanup.policy=delete) held records this run read: conflict. Tests:
          test_compaction_crash.py::test_retention_under_a_compaction_lets_it_commit
          test_compaction_crash.py::
          test_retention_of_a_planned_segment_after_a_switch_to_delete_makes_the_commit_conflict
          test_ledger_merge_races.py::test_retention_under_a_merge_lets_it_commit
     e. DeleteRecords moves deleted_below: phase 1 chose among the records above the
        old cut, so under a strategy other than `latest` a survivor may lie below the
        new cut while the key's later records were left out: conflict. Under `latest`
        a survivor below the cut has no later record (readers hide it, the next run
        drops it): it goes through. Tests: test_compaction_crash.py::
          test_delete_records_under_a_compaction_makes_its_commit_conflict
          test_ledger_merge_races.py::test_delete_records_under_a_merge_lets_it_commit
          and ::test_delete_records_under_a_merge_with_first_makes_it_conflict
     f. a config change: the run keeps the config it planned with (the pair records its
        strategy) and the change applies from the next run; the commit checks nothing
        of it but what it lets another actor do (d). Test: test_compaction_crash.py::
          test_a_config_change_under_a_compaction_applies_from_the_next_run
  5b. once the run's commits are done, sync the topic's Iceberg state table
     (compactlog/iceberg: one snapshot of the manifests just committed, with the run
     id), also after a failure for the partitions that committed; a failed sync is
     logged, never fails the run, and the next sync catches the table up. The table is
     made from committed manifests only, so it is never ahead of step 5. Tests:
     test_iceberg_state.py::test_a_crash_between_the_commit_and_the_snapshot_is_repaired
  6. sweep ledger/ again and write each partition's status: SUCCESS where step 5
     committed; ERROR, with the error, where the run failed before it. The sweep after
     a failure deletes exactly the files of this run that no commit took.
Readers that loaded an older manifest keep reading the previous ledger's files for
file.delete.delay.ms; one that takes longer reloads and reads again.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from compactlog.compaction import CompactionReport, PartitionSummary
from compactlog.compaction.arrow_pipeline import uses_arrow
from compactlog.compaction.ledger import PieceResult
from compactlog.compaction.plan import PartitionPlan, plan_partition
from compactlog.compaction.rolled import seal_rolled_segments
from compactlog.compaction.status import (
    CompactionStatus,
    compaction_lock,
    read_status,
    remove_status_temps,
    write_status,
)
from compactlog.errors import ConflictError, StorageError, UserError
from compactlog.iceberg import sync_after_compaction
from compactlog.storage import (
    LEDGER_DIR,
    CompactionState,
    LogStore,
    Partition,
    PartitionManifest,
    sweep_unreachable,
)

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
        # 0. every rolled segment sealed, so the run covers all but the active segment
        unsealed = seal_rolled_segments(store, topic_name, chosen)
        for index in unsealed:
            log.warning("%s/%d: rolled segments were not sealed in time; the next run "
                        "covers them", topic_name, index)
        now_ms = int(clock() * 1000)
        progress("plan", 0, len(chosen))
        plans: list[PartitionPlan] = []
        for partition in chosen:
            _prepare(partition, run_id, now_ms)  # 1.
            plans.append(plan_partition(  # 2.
                topic_name, partition.index, partition.directory, partition.manifest,
                partition.manifest_version, topic.config, now_ms, partition.volume,
            ))
            _fetch_for_the_driver(partition, plans[-1])
        work = [plan for plan in plans if plan.has_work]
        summaries = {plan.partition: _summary(plan, topic.partition(plan.partition).manifest,
                                              topic.config["min.compaction.lag.ms"])
                     for plan in plans}
        for index in unsealed:
            summaries[index].rolled_unsealed = True
        committed: set[int] = set()
        stage_started = _lap(report, "plan", started)
        try:
            progress("phase 1: find survivors", 0, 1)
            engine.find_survivors(work)  # 3.
            stage_started = _lap(report, "phase 1", stage_started)
            progress("phase 1: find survivors", 1, 1)
            progress("phase 2: write ledgers", 0, 1)
            results = engine.write_ledgers(work, run_id)  # 4.
            stage_started = _lap(report, "phase 2", stage_started)
            progress("phase 2: write ledgers", 1, 1)
            for done, plan in enumerate(work):
                progress("commit", done, len(work))
                partition = topic.partition(plan.partition)
                _publish_staged(partition, plan, results.get(plan.partition, []))  # 5a.
                _commit(partition, plan, results.get(plan.partition, []), run_id, now_ms,
                        summaries[plan.partition])  # 5.
                committed.add(plan.partition)
            stage_started = _lap(report, "commit", stage_started)
            if committed:  # 5b.
                sync_after_compaction(store, topic_name, run_id)
                _lap(report, "iceberg", stage_started)
        except BaseException as error:
            if committed and isinstance(error, Exception):  # 5b. for what did commit
                sync_after_compaction(store, topic_name, run_id)
            for plan in plans:  # 6. after a failure
                partition = topic.partition(plan.partition)
                _sweep(partition)
                failed = plan.partition not in committed and plan in work
                _finish(plan.directory, run_id, now_ms, clock,
                        summary=None if failed else summaries[plan.partition],
                        error=error if failed else None)
            raise
        for plan in plans:  # 6.
            _sweep(topic.partition(plan.partition))
            _finish(plan.directory, run_id, now_ms, clock, summary=summaries[plan.partition])
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


def _fetch_for_the_driver(partition: Partition, plan: PartitionPlan) -> None:
    """On an object store, an engine that reads its inputs where the driver runs (the
    SQL engine on local[*], a service without tasks of its own) finds them in the
    driver's read cache, where plan.inputs point. Arrow tasks fetch for themselves."""
    if partition.volume.is_local or not plan.has_work or uses_arrow(plan):
        return
    for item in plan.inputs:
        partition.volume.fetch(item.relative)
        if item.is_ledger and item.info.dv_file:
            partition.volume.fetch(f"{LEDGER_DIR}/{item.info.dv_file}")


def _publish_staged(partition: Partition, plan: PartitionPlan,
                    pieces: list[PieceResult]) -> None:
    """Step 5a, on an object store: every file the commit will list must be in the
    bucket. An engine that wrote into the partition's local ledger directory has its
    files published here (Arrow tasks published theirs: remote_files.py); a file in
    neither place fails the run before its commit, so no manifest lists a missing file."""
    if partition.volume.is_local:
        return
    kept_dvs = {item.info.dv_file for item in plan.clean if item.info.dv_file}
    wanted = [name for piece in pieces if piece.info is not None
              for name in (piece.info.file, piece.info.dv_file)
              if name is not None and name not in kept_dvs]
    for name in wanted:
        staged = partition.ledger_dir / name
        if staged.exists():
            partition.volume.publish(staged, f"{LEDGER_DIR}/{name}")
    present = {found.name for found in partition.volume.listing(LEDGER_DIR)}
    missing = [name for name in wanted if name not in present]
    if missing:
        raise StorageError(f"{partition.name}: the compaction wrote {missing[0]} (and "
                           f"{len(missing) - 1} more) neither to the bucket nor to "
                           f"{partition.ledger_dir}; nothing was committed")


def _lap(report: CompactionReport, stage: str, since: float) -> float:
    now = time.monotonic()
    report.stages[stage] = now - since
    return now


def _prepare(partition: Partition, run_id: str, now_ms: int) -> None:
    partition.ledger_dir.mkdir(exist_ok=True)
    _sweep(partition)
    remove_status_temps(partition.directory)
    status = read_status(partition.directory)
    status.state, status.run_id, status.started_ms = "RUNNING", run_id, now_ms
    status.finished_ms, status.error = None, None
    write_status(partition.directory, status)


def _sweep(partition: Partition) -> None:
    """Sweep ledger/ as the holder of the compaction lock (storage/sweep.py), from the
    manifest as it is now: whatever a failed commit did or did not do, the manifest
    says which files are reachable. A sweep that fails is logged: it deletes nothing it
    should keep, and the next run or the writer sweeps again."""
    try:
        # Orphans only when the current version is proven (backend/local/document.py).
        orphan_dirs = [LEDGER_DIR] if partition.prove_manifest() else []
        partition.refresh()
        sweep_unreachable(partition.volume, partition.manifest, partition.now_ms(),
              partition.config["file.delete.delay.ms"], orphan_dirs,
              partition.files.retire, partition.name, partition.holds.held())
    except Exception as error:
        log.warning("%s: the ledger sweep failed (retried by the next run): %s",
                    partition.name, error)


def _summary(plan: PartitionPlan, manifest: PartitionManifest, lag_ms: int
             ) -> PartitionSummary:
    summary = PartitionSummary(
        partition=plan.partition,
        old_horizon=plan.old_horizon,
        horizon=plan.old_horizon,
        dirty_segments=len(plan.dirty),
    )
    if not plan.has_work:
        summary.skipped = _why_no_work(plan, manifest, lag_ms)
        # What the compacted view holds up to the horizon, unchanged: one record per key.
        summary.keys = sum(info.live_count for info in manifest.ledger)
    return summary


def _why_no_work(plan: PartitionPlan, manifest: PartitionManifest, lag_ms: int) -> str:
    """Why a partition's plan has nothing to read, in the words of its summary."""
    above = [info for info in manifest.segments
             if plan.old_horizon is None or info.last_offset > plan.old_horizon]
    if not above:
        return ("nothing new since the last compaction" if plan.old_horizon is not None
                else "no records to compact yet")
    if above[0].missing:
        return (f"segment {above[0].file} lost offsets to a corrupt log: compaction stops "
                "before it")
    if lag_ms > 0:
        return f"its new records are younger than min.compaction.lag.ms ({lag_ms} ms)"
    return "no sealed segment is cleanable yet"


def _commit(
    partition: Partition,
    plan: PartitionPlan,
    pieces: list[PieceResult],
    run_id: str,
    now_ms: int,
    summary: PartitionSummary,
) -> None:
    # Kept ledger files (with their DVs) and new files, in offset order: their ranges
    # never interleave (compaction/incremental.py).
    new_ledger = sorted((piece.info for piece in pieces if piece.info is not None),
                        key=lambda info: info.base_offset)
    for piece in pieces:
        summary.records_out += piece.records_out
        summary.tombstones_kept += piece.tombstones_kept
        summary.tombstones_removed += piece.tombstones_removed
        summary.null_keys_removed += piece.null_keys_removed
        summary.expired_removed += piece.expired_removed
    summary.expired_removed += plan.cut_ledger_records  # files phase 2 never read
    summary.records_in = sum(item.info.live_count for item in plan.inputs)
    summary.bytes_in = sum(item.info.size_bytes for item in plan.inputs)
    summary.bytes_out = sum(info.size_bytes for info in new_ledger)
    summary.segments_adopted = sum(1 for info in new_ledger if info.adopted_at_ms == now_ms
                                   and run_id in info.file)
    summary.ledger_files_in, summary.ledger_files_out = len(plan.clean), len(new_ledger)
    # What the new ledger holds: one record per key (a tombstone until
    # delete.retention.ms has passed), as the summary of a partition with nothing new.
    summary.keys = sum(info.live_count for info in new_ledger)
    summary.horizon = plan.new_horizon
    oldest = [p.oldest_tombstone_ms for p in pieces if p.oldest_tombstone_ms is not None]
    # The ledger's files and their deletion vectors: a run that changed only DVs
    # replaced the pair too.
    planned_files = [(item.info.file, item.info.dv_file) for item in plan.clean]
    assert plan.new_horizon is not None, "a plan with work has a horizon"
    compaction = CompactionState(
        horizon=plan.new_horizon,
        ledger=tuple(new_ledger),
        oldest_tombstone_ms=min(oldest) if oldest else None,
        run_id=run_id,
        compacted_at_ms=now_ms,
        strategy=plan.strategy.spec,
        deleted_below=plan.rules.deleted_below,
    )

    def swap(manifest: PartitionManifest) -> PartitionManifest:
        current = manifest.compaction
        if (manifest.horizon != plan.old_horizon
                or ([(info.file, info.dv_file) for info in current.ledger]
                    if current else []) != planned_files):
            raise ConflictError(
                f"{partition.name}: another compaction committed while this one ran"
            )
        _check_commit(partition.name, plan, manifest)
        return replace(manifest, compaction=compaction)

    partition.commit_manifest(swap)


def _check_commit(name: str, plan: PartitionPlan, manifest: PartitionManifest) -> None:
    """Step 5's checks of what the writer changed under the run (c, d, e of the
    protocol); raises ConflictError when the new pair would not hold on `manifest`."""
    horizon = plan.new_horizon
    assert horizon is not None, "a plan with work has a horizon"
    # A new horizon is a planned segment's end, which no segment listed at planning
    # straddled: one that does now was merged since. (One across an unmoved horizon was
    # there before this run, written by an older build: plan.py reads around it.)
    moved_horizon = horizon != plan.old_horizon
    for info in manifest.segments if moved_horizon else ():
        if info.base_offset <= horizon < info.last_offset:  # c.
            raise ConflictError(
                f"{name}: segment {info.file} (offsets {info.base_offset}.."
                f"{info.last_offset}) straddles the new horizon {horizon}: a merge "
                "replaced segments this run planned over; the next run plans over it")
    listed = manifest.segments
    starts = [info.base_offset for info in listed]
    names = {info.file for info in listed}
    for item in plan.dirty:  # d.
        planned = item.info
        if planned.file in names:
            continue
        # Replaced by a merge (the same records, in a file now wholly on one side of
        # the horizon), or removed: then no listed segment covers its offsets.
        at = bisect.bisect_right(starts, planned.base_offset) - 1
        if at < 0 or listed[at].last_offset < planned.last_offset:
            raise ConflictError(
                f"{name}: segment {planned.file} (offsets {planned.base_offset}.."
                f"{planned.last_offset}), which this run read, is no longer listed "
                "(retention removed it)")
    moved = manifest.deleted_below != plan.rules.deleted_below
    if moved and plan.strategy.kind != "latest":  # e.
        raise ConflictError(
            f"{name}: DeleteRecords moved the log start from {plan.rules.deleted_below} "
            f"to {manifest.deleted_below} while this run ran; under "
            f"{plan.strategy.spec} a survivor it chose may be a record the cut deleted")


def _finish(
    directory: Path,
    run_id: str,
    now_ms: int,
    clock: Callable[[], float],
    summary: PartitionSummary | None = None,
    error: BaseException | None = None,
) -> None:
    try:
        _write_finish(directory, run_id, now_ms, clock, summary, error)
    except Exception as failure:  # the run's outcome stands; only its record is lost
        log.warning("%s: could not write the compaction status: %s", directory, failure)


def _write_finish(
    directory: Path,
    run_id: str,
    now_ms: int,
    clock: Callable[[], float],
    summary: PartitionSummary | None,
    error: BaseException | None,
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
