"""A second compaction service, in plain Python and pyarrow: proof that the plug works.

Phase 1 is a dictionary fold over each partition's input rows in offset order, written
independently of the Spark pipeline's SQL, so the two also check each other. Phase 2
reuses the engine-neutral `write_ledger_piece`, as any engine would.

Loaded by import path in the tests: `local_engine:LocalCompactionServiceFactory`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from compactlog.compaction import CompactionReport, TopicCompactionService
from compactlog.compaction.arrow_pipeline import compact_inline, uses_arrow
from compactlog.compaction.ledger import (
    PieceResult,
    ledger_file_name,
    write_ledger_piece,
)
from compactlog.compaction.ledger_reads import LedgerReads
from compactlog.compaction.plan import PartitionPlan, load_deleted, split_pieces
from compactlog.compaction.runner import run_compaction
from compactlog.compaction.strategies import Strategy, surviving_record
from compactlog.storage.records import Record
from compactlog.storage.sealed import table_to_records
from compactlog.storage.store import LogStore


def _order_value(record: Record, strategy: Strategy) -> Any:
    if strategy.order_header is None:
        return record.timestamp
    for name, value in record.headers:
        if name == strategy.order_header:
            if not strategy.order_as_long:
                return value
            try:
                return int((value or b"").decode())
            except ValueError:
                return None
    return None


def _beats(candidate: Any, best: Any) -> bool:
    # None (no ordering value) loses to anything; ties go to the later offset.
    if candidate is None:
        return best is None
    return best is None or candidate >= best


class LocalEngine:
    def find_survivors(self, plans: list[PartitionPlan]) -> None:
        for plan in plans:
            plan.survivors = self._survivors(plan)

    def _survivors(self, plan: PartitionPlan) -> np.ndarray:
        strategy = plan.strategy
        empty = plan.rules.empty_value_is_tombstone
        history: dict[bytes, list[Record]] = {}
        deleted = load_deleted(plan.clean)
        below = plan.rules.deleted_below  # DeleteRecords: not in the view, so never a survivor
        for item in plan.inputs:
            gone = set(deleted.get(str(item.path), np.empty(0, np.int64)).tolist())
            for record in table_to_records(pq.read_table(item.path)):
                if (record.key is not None and record.offset not in gone
                        and record.offset >= max(below, item.from_offset)):
                    history.setdefault(record.key, []).append(record)

        def is_tombstone(record: Record) -> bool:
            return record.value is None or (empty and record.value == b"")

        chosen = []
        keep_left = strategy.load_function() if strategy.kind == "function" else None
        for records in history.values():
            records.sort(key=lambda r: r.offset)
            if keep_left is not None:
                chosen.append(surviving_record(records, keep_left, is_tombstone).offset)
                continue
            last_tombstone = max(
                (i for i, r in enumerate(records) if is_tombstone(r)), default=-1
            )
            competing = records[last_tombstone + 1 :]
            if not competing:
                chosen.append(records[last_tombstone].offset)
            elif strategy.kind == "latest":
                chosen.append(competing[-1].offset)
            elif strategy.kind == "first":
                chosen.append(competing[0].offset)
            else:
                best = competing[0]
                for record in competing[1:]:
                    if _beats(_order_value(record, strategy), _order_value(best, strategy)):
                        best = record
                chosen.append(best.offset)
        return np.array(sorted(chosen), dtype=np.int64)

    def write_ledgers(
        self, plans: list[PartitionPlan], run_id: str
    ) -> dict[int, list[PieceResult]]:
        results: dict[int, list[PieceResult]] = {}
        for plan in plans:
            results[plan.partition] = [
                write_ledger_piece(
                    piece.piece_inputs(),
                    piece.survivors,
                    plan.rules,
                    plan.ledger_dir,
                    ledger_file_name(run_id, piece.sequence, piece.inputs[0].info.base_offset),
                    plan.compression,
                )
                for piece in split_pieces(plan)
            ]
        return results


class InlineArrowEngine(LocalEngine):
    """The Arrow tasks of the Spark service (deletion vectors included), run in this
    process without Spark; the strategies they do not run take LocalEngine's path."""

    def find_survivors(self, plans: list[PartitionPlan]) -> None:
        super().find_survivors([plan for plan in plans if not uses_arrow(plan)])

    def write_ledgers(
        self, plans: list[PartitionPlan], run_id: str
    ) -> dict[int, list[PieceResult]]:
        results = super().write_ledgers([p for p in plans if not uses_arrow(p)], run_id)
        results.update(compact_inline([p for p in plans if uses_arrow(p)], run_id))
        return results


class LocalCompactionService(LedgerReads, TopicCompactionService):
    """Settings: `clock`; `engine`: "local" (default) or "arrow" (InlineArrowEngine)."""

    def __init__(self, store: LogStore, topic: str, settings: Mapping[str, Any]) -> None:
        super().__init__(store, topic)
        self.clock: Callable[[], float] = settings.get("clock", time.time)
        self.engine = InlineArrowEngine() if settings.get("engine") == "arrow" else LocalEngine()

    def compact(self, partitions: Sequence[int] | None = None) -> CompactionReport:
        return run_compaction(self.store, self.topic, self.engine, partitions, self.clock)


class LocalCompactionServiceFactory:
    def new_service(
        self, store: LogStore, topic: str, settings: Mapping[str, Any]
    ) -> LocalCompactionService:
        return LocalCompactionService(store, topic, settings)
