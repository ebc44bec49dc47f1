"""Phase 1 in plain pyarrow: one partition's surviving offsets, within a memory budget.

Invariant: `partition_survivors` returns exactly the offsets that the Spark SQL
formulation (spark_pipeline.find_survivors) returns for the same input files and
strategy: per non-null key, compared byte for byte, the record its strategy keeps
(tombstones included), among the input rows that are in the view (`NotInView`: a
deletion vector's rows and rows below DeleteRecords' deleted_below are never seen, so a
survivor is never a row that phase 2 drops for its position, and a key whose best row
was deleted keeps its best live one). Null-key records are never survivors; phase 2
applies the null-key policy to them, as with the SQL formulation. A hash of the key
only ever chooses which bucket a key is processed in; within a bucket keys are grouped
by their bytes, so a collision can put two keys in one bucket but never merge them.

Memory: the columns phase 1 needs (key, offset, value_size and the ordering value) are
estimated from the Parquet footers before anything is read. When the estimate, times
the grouping's overhead, exceeds the budget, the key space is split into N buckets by
a hash of the key and the input is read N times, keeping one bucket's rows each time
(a row group at a time), so at most one bucket's columns are held at once.

`order:header:NAME:long` and `function:` strategies are not handled here (the SQL
formulation runs them; see `supports`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.acero  # group_by's engine (0.2 s to import): the worker preload pays it
import pyarrow.compute as pc
import pyarrow.parquet as pq

from compactlog.compaction.io_throttle import observe_row_group
from compactlog.compaction.strategies import Strategy, parse_strategy
from compactlog.storage import drop_deleted, tombstones_by_size

# Grouping (hash table or sort indices, plus the numpy work arrays) holds about this
# many times the bytes of the columns it groups, measured with pa.total_allocated_bytes.
GROUPING_OVERHEAD = 3.0
ROW_BYTES = 8 + 4 + 2  # offset, value_size, validity bits and slack, per row
HASH_SLICE_ROWS = 1 << 16
Deleted = dict[str, np.ndarray]  # per input path: offsets a deletion vector deleted
LATEST = parse_strategy("latest")


@dataclass(frozen=True)
class NotInView:
    """The input rows that phase 1 never sees: those not in the view, which phase 2
    would drop whatever phase 1 chose (so choosing one would lose its key's live rows),
    and a dirty segment's rows that the ledger covers already (`starts`).
    (Records past retention.ms on compact,delete are seen: a record's age is no order,
    and leaving out a late record of a key would bring an earlier value of it back.)"""

    deleted: Deleted = field(default_factory=dict)  # per ledger file path: its DV's offsets
    below: int = 0  # DeleteRecords' deleted_below: every offset under it is gone
    # Per input path, its first offset that is input (plan.InputFile.from_offset: the
    # rows of a dirty segment up to the old horizon are the ledger's already).
    starts: dict[str, int] = field(default_factory=dict)

    def needs_offsets(self, path: str) -> bool:
        return self.below > 0 or path in self.deleted or path in self.starts

    def visible(self, path: str, group: pa.Table) -> pa.Table:
        """The rows of `group` (a row group of `path`, with its offsets) in the view."""
        group = drop_deleted(group, self.deleted.get(path))
        start = max(self.below, self.starts.get(path, 0))
        if start and group.num_rows:
            offsets = group.column("offset")
            if pc.min(offsets).as_py() < start:
                group = group.filter(pc.greater_equal(offsets, start))
        return group


EVERYTHING = NotInView()


def supports(strategy: Strategy) -> bool:
    """Whether this module computes `strategy` (else the SQL formulation does)."""
    if strategy.kind in ("latest", "first"):
        return True
    return strategy.kind == "order" and not strategy.order_as_long


@dataclass
class Phase1Stats:
    """What phase 1 of one task did, for the report."""

    buckets: int = 1
    estimated_bytes: int = 0
    read_s: float = 0.0
    group_s: float = 0.0
    rows: int = 0


def needed_columns(strategy: Strategy) -> list[str]:
    if strategy.kind == "latest":
        return ["key", "offset"]  # the greatest offset wins, tombstone or not
    columns = ["key", "offset", "value_size"]
    if strategy.kind == "order":
        columns.append("timestamp" if strategy.order_header is None else "headers")
    return columns


def estimate_bytes(paths: list[str], columns: list[str]) -> int:
    """Bytes the phase-1 columns of `paths` take in memory, grouping included."""
    total = 0
    for path in paths:
        meta = pq.read_metadata(path)
        names = [meta.schema.column(i).path for i in range(meta.num_columns)]
        variable = [i for i, name in enumerate(names)
                    if name.split(".")[0] in columns and name.split(".")[0] in ("key", "headers")]
        for group in range(meta.num_row_groups):
            row_group = meta.row_group(group)
            total += row_group.num_rows * ROW_BYTES
            total += sum(row_group.column(i).total_uncompressed_size for i in variable)
    return int(total * GROUPING_OVERHEAD)


def key_buckets(keys: pa.Array, buckets: int) -> np.ndarray:
    """A bucket number in [0, buckets) per (non-null) binary key, from all its bytes."""
    out = np.empty(len(keys), np.uint64)
    for start in range(0, len(keys), HASH_SLICE_ROWS):
        out[start:start + HASH_SLICE_ROWS] = _hash_slice(keys.slice(start, HASH_SLICE_ROWS))
    return (out % np.uint64(buckets)).astype(np.uint16 if buckets <= 1 << 16 else np.uint32)


_WEIGHTS = np.random.default_rng(0x5EED).integers(1, 2**63, size=64, dtype=np.uint64) | 1


def _hash_slice(keys: pa.Array) -> np.ndarray:
    """A 64-bit hash of each key's bytes (byte i weighted by a constant chosen by i mod
    64, summed, then mixed): it spreads keys over buckets, it is not cryptographic."""
    n = len(keys)
    width = np.int64 if pa.types.is_large_binary(keys.type) else np.int32
    _, offsets_buf, data_buf = keys.buffers()
    offsets = np.frombuffer(offsets_buf, width, n + 1, keys.offset * np.dtype(width).itemsize)
    offsets = np.asarray(offsets, dtype=np.int64)
    begin, end = int(offsets[0]), int(offsets[-1])
    lengths = np.diff(offsets)
    with np.errstate(over="ignore"):
        hashes = lengths.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        if end > begin and data_buf is not None:
            data = np.frombuffer(data_buf, np.uint8, end - begin, begin)
            starts = (offsets[:-1] - begin).astype(np.intp)
            position = np.arange(end - begin, dtype=np.int64)
            position -= np.repeat(starts, lengths)
            terms = _WEIGHTS[position & 63]
            terms *= data + np.uint64(1)
            nonempty = lengths > 0
            hashes[nonempty] += np.add.reduceat(terms, starts[nonempty])
        hashes ^= hashes >> np.uint64(31)
        hashes *= np.uint64(0xBF58476D1CE4E5B9)
        hashes ^= hashes >> np.uint64(29)
    return hashes


def _read_groups(paths: list[str], columns: list[str], page_checksums: bool,
                 hidden: NotInView = EVERYTHING) -> Iterator[pa.Table]:
    """Every row group of `paths`, in order, its rows with a null key left out, and
    those not in the view (`hidden`)."""
    for path in paths:
        wanted = (columns if not hidden.needs_offsets(path) or "offset" in columns
                  else [*columns, "offset"])
        handle = pq.ParquetFile(path, page_checksum_verification=page_checksums)
        try:
            for index in range(handle.metadata.num_row_groups):
                group = handle.read_row_group(index, columns=wanted)
                observe_row_group(handle.metadata, index, wanted)
                group = hidden.visible(path, group).select(columns)
                # A filter copies every column: only for a group that has null keys.
                keys = group.column("key")
                yield group.filter(pc.is_valid(keys)) if keys.null_count else group
        finally:
            handle.close()


def bucket_ids(paths: list[str], buckets: int, page_checksums: bool,
               hidden: NotInView = EVERYTHING) -> list[np.ndarray]:
    """Per row group of `paths` (in `_read_groups` order), each row's bucket: the hash
    is computed once per run, 2 bytes per row, whatever the number of passes."""
    return [key_buckets(group.column("key").combine_chunks(), buckets)
            for group in _read_groups(paths, ["key"], page_checksums, hidden)]


def read_phase1(paths: list[str], strategy: Strategy, bucket: int = 0,
                ids: list[np.ndarray] | None = None, page_checksums: bool = True,
                hidden: NotInView = EVERYTHING) -> pa.Table:
    """The phase-1 columns of the rows with a non-null key (of one bucket when `ids`
    gives each row's bucket), with the tombstone flag left to `survivors` (value_size)."""
    parts = []
    for number, group in enumerate(_read_groups(paths, needed_columns(strategy),
                                                page_checksums, hidden)):
        if ids is not None:
            group = group.filter(pa.array(ids[number] == bucket))
        if strategy.kind == "order" and strategy.order_header is not None:
            group = group.append_column("order", header_values(group, strategy.order_header))
            group = group.drop_columns(["headers"])
        elif strategy.kind == "order":
            group = group.rename_columns(["order" if name == "timestamp" else name
                                          for name in group.column_names])
        parts.append(group)
    if not parts:
        return pa.table({"key": pa.array([], pa.binary()), "offset": pa.array([], pa.int64()),
                         "value_size": pa.array([], pa.int32())})
    return pa.concat_tables(parts)


def header_values(table: pa.Table, name: str) -> pa.Array:
    """Per row, the value of its first header called `name` (null when none)."""
    headers = table.column("headers").combine_chunks()
    result = np.full(len(headers), -1, np.int64)
    flat = pc.list_flatten(headers)
    if len(flat):
        parents = pc.list_parent_indices(headers).to_numpy()
        match = pc.fill_null(pc.equal(flat.field("key"), name), False).to_numpy(
            zero_copy_only=False)
        where = np.flatnonzero(match)
        first_parents, first = np.unique(parents[where], return_index=True)
        result[first_parents] = where[first]
    values = flat.field("value") if len(flat) else pa.array([], pa.binary())
    present = result >= 0
    taken = values.take(pa.array(np.where(present, result, 0))) if len(values) else (
        pa.nulls(len(headers), pa.binary()))
    return pc.if_else(pa.array(present), taken, pa.scalar(None, pa.binary()))


def survivors(table: pa.Table, strategy: Strategy, empty_is_tombstone: bool) -> np.ndarray:
    """The sorted surviving offsets of `table` (non-null keys only) by `strategy`."""
    if not table.num_rows:
        return np.empty(0, np.int64)
    if strategy.kind == "latest":
        return np.sort(latest_per_key(table).column("offset_max").to_numpy())
    # Each key's exact group number (dictionary encoding compares the bytes), then the
    # rows sorted by (group, offset) with numpy: no sort of the binary keys themselves.
    codes = pc.dictionary_encode(_keys(table)).indices.to_numpy()
    all_offsets = table.column("offset").to_numpy()
    order = np.lexsort((all_offsets, codes))
    codes, offsets = codes[order], all_offsets[order]
    n = len(order)
    new_key = np.ones(n, bool)
    new_key[1:] = codes[1:] != codes[:-1]
    starts = np.flatnonzero(new_key)
    group = np.cumsum(new_key) - 1
    index = np.arange(n, dtype=np.int64)
    tomb_np = tombstones_by_size(table.column("value_size"), empty_is_tombstone)[order]
    last_tomb = np.maximum.reduceat(np.where(tomb_np, index, -1), starts)
    candidate = (index >= last_tomb[group]) & ~tomb_np
    if strategy.kind == "first":
        best = np.minimum.reduceat(np.where(candidate, index, n), starts)
        chosen = np.where(best == n, last_tomb, best)
    else:
        rank = _dense_rank(table.column("order").combine_chunks())[order]
        score = np.where(candidate, rank * n + index, -1)
        best = np.maximum.reduceat(score, starts)
        chosen = np.where(best < 0, last_tomb, best % n)
    return np.sort(offsets[chosen])


def latest_per_key(table: pa.Table) -> pa.Table:
    """Each distinct key of `table` (non-null keys, compared byte for byte) and its
    greatest offset, as columns key and offset_max, in no particular order. Arrow's
    hash group-by on one thread (two tasks share the two cores): with pyarrow 26, 111 ms
    for 2.5M rows of 250k keys, where dictionary encoding then numpy's maximum.at took
    155 ms and DuckDB's one-thread group-by 127 ms (docs/benchmarks.md)."""
    # The key column as it was read, one chunk per row group: the group-by takes chunks
    # (combining them first copied every key, 0.12 s a partition). Its output, the
    # distinct keys, needs 64-bit offsets past 2 GiB of key bytes.
    keys = table.column("key")
    if keys.nbytes >= 2**31 - 1:
        keys = keys.cast(pa.large_binary())
    keyed = pa.table({"key": keys, "offset": table.column("offset")})
    return keyed.group_by("key", use_threads=False).aggregate([("offset", "max")])


def _keys(table: pa.Table) -> pa.Array:
    """The key column as one array (64-bit offsets past 2 GiB of key bytes)."""
    keys = table.column("key")
    if keys.nbytes >= 2**31 - 1:
        keys = keys.cast(pa.large_binary())
    return keys.combine_chunks()


def _dense_rank(values: pa.Array) -> np.ndarray:
    """Ranks 1.. by ascending value (bytes compare unsigned), equal values equal; 0 for
    nulls, which lose to any value (as Spark orders a struct's null field first)."""
    if pa.types.is_integer(values.type) and not values.null_count:
        inverse = np.unique(values.to_numpy(), return_inverse=True)[1]
        return np.asarray(inverse, dtype=np.int64).reshape(-1) + 1
    ranked = pc.rank(values, sort_keys="ascending", tiebreaker="dense")
    ranks: np.ndarray = np.asarray(ranked.to_numpy(), dtype=np.int64).copy()
    if values.null_count:
        ranks[pc.is_null(values).to_numpy(zero_copy_only=False)] = 0
    return ranks


def partition_survivors(paths: list[str], strategy: Strategy, empty_is_tombstone: bool,
                        budget_bytes: int, stats: Phase1Stats | None = None,
                        page_checksums: bool = True,
                        hidden: NotInView = EVERYTHING) -> np.ndarray:
    """The sorted surviving offsets of one partition's input files (see the module).
    `page_checksums=False` when the caller has proven the files whole (CRC32C);
    `hidden`: the input rows not in the view."""
    stats = stats if stats is not None else Phase1Stats()
    stats.estimated_bytes = estimate_bytes(paths, needed_columns(strategy))
    stats.buckets = max(1, math.ceil(stats.estimated_bytes / max(budget_bytes, 1)))
    found = []
    started = time.monotonic()
    ids = (bucket_ids(paths, stats.buckets, page_checksums, hidden)
           if stats.buckets > 1 else None)
    stats.read_s += time.monotonic() - started
    for bucket in range(stats.buckets):
        started = time.monotonic()
        table = read_phase1(paths, strategy, bucket, ids, page_checksums, hidden)
        read_done = time.monotonic()
        stats.rows += table.num_rows
        found.append(survivors(table, strategy, empty_is_tombstone))
        del table
        stats.read_s += read_done - started
        stats.group_s += time.monotonic() - read_done
    if len(found) == 1:
        return found[0]
    return np.sort(np.concatenate(found)) if found else np.empty(0, np.int64)


def latest_over_ledger(ledger_paths: list[str], dirty_paths: list[str], budget_bytes: int,
                       stats: Phase1Stats, page_checksums: bool,
                       hidden: NotInView) -> np.ndarray | None:
    """`latest` survivors when the input is a previous ledger plus dirty segments, with
    no grouping of the ledger's keys: every dirty offset is above every ledger offset,
    and a ledger's live rows hold each key once, so a ledger row survives exactly when
    its key (compared byte for byte, by a hash set of the dirty keys) is not in the
    dirty part; the dirty part's own latest per key survives too. The same offsets as
    `partition_survivors`. None when the dirty part's keys would not fit the budget
    (the caller then takes the general path)."""
    estimated = estimate_bytes(dirty_paths, ["key", "offset"])
    if estimated > budget_bytes:
        return None
    stats.estimated_bytes = estimated
    started = time.monotonic()
    dirty = read_phase1(dirty_paths, LATEST, page_checksums=page_checksums, hidden=hidden)
    read_done = time.monotonic()
    # The dirty part's own latest per key, and its distinct keys, from one group-by.
    grouped = latest_per_key(dirty)
    distinct = grouped.column("key").combine_chunks()
    # Sorted now, while small: appended after the ledger's (sorted, all lower) offsets.
    found = [np.sort(grouped.column("offset_max").to_numpy())]
    stats.group_s += time.monotonic() - read_done
    stats.read_s += read_done - started
    stats.rows += dirty.num_rows
    started = time.monotonic()
    groups = list(_read_groups(ledger_paths, ["key", "offset"], page_checksums, hidden))
    read_done = time.monotonic()
    stats.read_s += read_done - started
    if groups:
        # One call over the row groups' chunks: is_in builds its hash set of the dirty
        # keys once per call.
        ledger = pa.concat_tables(groups)
        stats.rows += ledger.num_rows
        keys = ledger.column("key")
        superseded = pc.is_in(keys, value_set=distinct.cast(keys.type))
        found.insert(0, ledger.column("offset").filter(pc.invert(superseded)).to_numpy())
    result = np.concatenate(found)
    # Ledger files in offset order, each in offset order, then the dirty part above
    # them: sorted already, which one pass proves (a full sort costs 10 times more).
    if len(result) > 1 and not bool(np.all(result[1:] > result[:-1])):
        result = np.sort(result)
    stats.group_s += time.monotonic() - read_done
    return result
