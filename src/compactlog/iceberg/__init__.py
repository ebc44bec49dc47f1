"""Every compacted topic as an Iceberg table, zero-copy: the compacted *state table*.

The state table of a compacted topic holds, for each partition, the latest record of
every live key up to the partition's horizon: the rows of the compacted view
(storage/view_rows.py) at or below the horizon, less its tombstones. Any Iceberg reader
(DuckDB's iceberg extension, pyiceberg, Polars' `scan_iceberg`) reads it without
knowing anything of compactlog. Each compaction commit gets a snapshot, so an engine
can time-travel to any past horizon.

Invariant: every snapshot of the state table shows a state that committed partition
manifests showed, never one ahead of them. The manifests' compare-and-swap stays the
only commit point of the data (DESIGN.md, "Decisions"); the table is a function of
committed manifests and the instant its time rules were evaluated at, so a crash
anywhere between a compaction commit and the table's own commit leaves the table behind,
and the next sync catches it up. The data files are the ledger files themselves.

Mapping onto the ledger (zero-copy)
  - Data files: the ledger files the committed manifests list, by their absolute path
    (an `s3://` URL on S3), never copied, never rewritten; a test compares them byte for
    byte. Iceberg has no relative paths: a table whose `location` is not where it now
    is (a moved or copied data directory) is started afresh by the next sync, with one
    snapshot, its history dropped and its holds released (relocate.py).
  - Schema (`schema.py`): partition int (id 1), offset long (2), timestamp long (3, epoch
    milliseconds as in the files), key binary (4), value binary (5), headers
    list<struct<key string, value binary>> (6; element 7, key 8, value 9). Identity
    partitioned by `partition` (spec 0, partition field 1000). `partition` is not a
    column of the files: readers take it from each data file's partition tuple, as the
    Iceberg spec says for identity partitions (which is why it is optional).
  - Field IDs: ledger files carry none, old and new alike, and the table property
    `schema.name-mapping.default` maps the columns' names to the ids above. A name
    mapping serves files that exist today, so no ledger writer changes and every file
    reads the same way. The ledger's other columns (value_size, the batch columns,
    tombstone_since_ms) are mapped to ids from 100 that the schema does not use:
    pyiceberg refuses a file whose columns the mapping does not all name.

Deletes: Iceberg v2 position deletes, never equality deletes
  What a ledger file holds that the state does not is exactly what view_rows.py removes
  from the view, plus tombstones: the offsets of the file's deletion vector, offsets
  below `deleted_below` (DeleteRecords), on `compact,delete` records older than
  retention.ms at the snapshot's instant (`RowCondition`, from `partition_rows`), and
  every tombstone (a null value, or an empty one under empty.value.is.tombstone): the
  view shows a tombstone until delete.retention.ms has passed, the state has no row for
  a deleted key. These rows are written as positions (the row's index in its file) in
  a position-delete file of that one ledger file (`deletes.py`): a reader drops them
  while it scans the file, and pays no merge or join on keys, as equality deletes would
  make it. One delete file per ledger file that has deleted rows, bounded to it
  (lower = upper bound on `file_path`, which Polars' native reader needs: so not one
  per partition, though DuckDB would open fewer files), named by a hash of its
  positions and reused by every later snapshot while they are the same.
  Why v2 position deletes and not v3 deletion vectors: DuckDB 1.5.5, pyiceberg 0.12 and
  Polars 2.1 all read both (checked here), but a v3 table also needs row lineage
  (first-row-id on every data file) that pyiceberg 0.12 cannot write (it writes v1 and
  v2 manifests only), and v2 is what every other engine in the field reads. Nor would
  v3 make reads cheaper: DuckDB read a v3 copy of a 1M-row state table with the same
  positions as deletion vectors at 1.8x the plain files, against 1.65x for these
  files, because it pays per 2,048-row vector that holds a deleted row, and tombstones
  spread one in a hundred rows touch every vector (docs/benchmarks.md, "Deletion
  vectors, and where DuckDB pays for deletes"). A position delete file is a few bytes
  per deleted row, read once per data file.

Where the files are: beside the data
  The table's location is `<topic>/iceberg/state`: `<data dir>/topics/<topic>/iceberg/
  state` locally, `PREFIX/topics/<topic>/<topic id>/iceberg/state` on S3 (under the topic
  id, so that deleting a topic deletes its table with it). In it:
    metadata/v<N>.metadata.json   table metadata version N, created only if absent
    metadata/version-hint.text    "N": how DuckDB's `iceberg_scan(dir)` and pyiceberg's
                                  `StaticTable.from_metadata(dir)` find the current one
    metadata/snap-<id>-<uuid>.avro                 a snapshot's manifest list
    metadata/<uuid>-data.avro, -deletes.avro       the snapshot's two manifests
    deletes/<n>/<ledger file stem>.<hash>.parquet  a position-delete file
  Each snapshot has one data and one delete manifest for all partitions, in which the
  entries of a partition whose files did not change are carried as they were: a reader
  opens two manifests however many partitions there are (DuckDB pays a fixed cost per
  manifest), and a commit writes a bounded number of files: two manifests, the delete
  files of the changed ledger files, one manifest list and one metadata file (plus the
  hint), made durable together with one directory fsync per folder. (Tables written
  before, with two manifests per partition, are read and carried on the same way.)

Commit: `sync(topic)`, never ahead of the compaction commit
  1. load the table's current version N: version-hint.text, then v<N+1>... while one
     exists (a crash after step 5 leaves the hint behind), and its metadata; one written
     at another location (a moved data directory) is taken as no table, and the
     snapshot of step 5 starts it afresh (relocate.py);
  2. load each partition's committed manifest (after 1);
  3. per partition, its ledger files and each one's deleted positions, at one instant
     (`now_ms`); a partition whose data and delete files equal those of the current
     snapshot keeps its entries; the current snapshot's manifest version of a
     partition must not be newer than the one loaded in 2 (else back to 1);
  4. if no partition changed, stop; else write the new delete files, manifests and the
     manifest list, under new names;
  4b. hold, in each changed partition's hold document, the data files the snapshot
     lists (storage/holds.py), so that no sweep deletes them while it is retained;
  4c. load the changed partitions' committed manifests again: a data file of the
     snapshot that a commit retired since step 2 may have been deleted before its hold
     (file.delete.delay.ms may be 0), so the sync starts again from 1; a file read in
     step 3 that is already gone does the same, and so does a deletion vector gone
     once a commit has replaced it since step 2 (one gone while still listed is
     missing, and fails the sync: tests/iceberg/test_iceberg_dv_positions.py);
  5. create v<N+1>.metadata.json only if absent (a hard link locally, `If-None-Match:
     *` on S3): the table's commit point. Another sync that created it first makes
     this one start again from 1, a bounded number of times;
  6. replace version-hint.text with N+1. A stale hint only shows an older snapshot.
  A snapshot is made only from manifests loaded after they committed, so it never shows
  a state ahead of them; each sync loads them after the table version it builds on, and
  manifests only move forward, so snapshots never go back either. A crash between a
  compaction's commit and step 5 leaves the table one state behind until the next sync
  (the next run, the server's upkeep, or `sync` called by hand) makes a snapshot of the
  manifests as they are then: a state that a later commit overtook before any sync
  ran gets no snapshot of its own. Files of a sync that died before 5 are orphans of
  the table.

Who syncs (the hooks)
  - The compaction runner, after its commits (compaction/runner.py, step 5b): one
    sync, with the run id, so that each compaction commit gets one snapshot (a run that
    committed several partitions makes one snapshot of them all). A failed sync is
    logged and never fails the run, whose commits stand; the next sync repairs it.
  - The server's upkeep (server/upkeep.py), for each compacted topic: a sync when a
    partition's committed manifest changed since the last one it made (DeleteRecords,
    a compaction whose own sync failed), and on `compact,delete` once a minute, since
    retention.ms takes records out of the state as time passes. Retention of raw
    segments never changes the state, and makes no snapshot.

Snapshot summary: besides Iceberg's counts, `compactlog.cause` (compaction, upkeep,
sync), `compactlog.run-id` (the compaction's), `compactlog.evaluated-at-ms` (the time
rules' instant) and, per partition n, `compactlog.partition.<n>.horizon`,
`.run-id`, `.manifest-version` and `.deleted-below`. Time travel by snapshot id and
by timestamp is Iceberg's own; by horizon, a reader finds the snapshot whose summary
gives partition p horizon H (docs/querying.md).

Snapshot expiry and file deletion (DESIGN.md's reachability rule, widened)
  A ledger file is deleted only when no committed manifest lists it and no retained
  snapshot references it: each partition's hold document (storage/holds.py) lists the
  files that snapshots reference, a sync holds its snapshot's files before committing
  it (step 4b), and the sweep keeps every held file. Snapshots older than the topic's
  `iceberg.history.expire.max-snapshot-age-ms` (Iceberg's name; one hour, not its 5 days,
  since a kept snapshot keeps the ledger files compaction replaced)
  expire, keeping the current one and the newest
  `iceberg.history.expire.min-snapshots-to-keep`; expiry (expiry.py) commits a new
  metadata version without them, and only then releases the files no retained snapshot
  references, and deletes the table's own files that none references. It runs in the
  server's upkeep and after each compaction's sync.

The raw table (kinds.RAW, `<topic>/iceberg/raw`, for topics with iceberg.raw.enabled):
the sealed segments of the raw view as an append-only table, tombstones included,
made by the same steps 1 to 6 (a seal appends, a merge of small segments replaces,
retention and DeleteRecords overwrite with position deletes), synced by the server's
upkeep at most once per iceberg.raw.target.lag.ms; its snapshots hold their segments
and expire as the state table's do. Turning iceberg.raw.enabled off drops the table
(drop.py): its files, then its holds, so that it no longer keeps segments.

Modules: `schema.py` (schema, partition spec, name mapping), `deletes.py` (deleted
positions from the view's definition, position-delete files), `files.py` (the table's
files on a disk or a bucket), `avro.py` (manifests and manifest lists, through
pyiceberg's writers), `kinds.py` (the state table and the raw table: which files and
rows each shows), `state.py` (sync: steps 1 to 6, for either kind), `relocate.py` (a
table found where it was not written, started afresh), `expiry.py`
(snapshot expiry and the holds), `drop.py` (a table the topic no longer keeps),
`catalog.py` (what the read-only REST catalog on the admin listener answers: namespace
`state`, one table per compacted topic, and `raw`).
pyiceberg is a dependency; in an install that left it out nothing here runs and
compaction goes on.
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from compactlog.iceberg.drop import DropResult
    from compactlog.iceberg.expiry import ExpiryResult
    from compactlog.iceberg.state import Current
    from compactlog.storage import LogStore

log = logging.getLogger(__name__)

STATE_TABLE = "state"
RAW_TABLE = "raw"


def available() -> bool:
    """Whether pyiceberg can be imported: a dependency, so False only in an install
    that left it out; the table is then not written, and the store works on."""
    return importlib.util.find_spec("pyiceberg") is not None


@dataclass
class SyncResult:
    """What one sync did: the snapshot it committed (None: the table was current)."""

    topic: str
    snapshot_id: int | None = None
    version: int | None = None
    metadata: str | None = None  # the metadata file's path or URL
    changed_partitions: list[int] = field(default_factory=list)
    files_written: int = 0
    seconds: float = 0.0
    # The table's metadata as this sync left it (committed, or found current), so that
    # the expiry after it need not load it again.
    current: Current | None = None


def sync_state_table(store: LogStore, topic: str, cause: str = "sync", run_id: str = "",
                     now_ms: int | None = None) -> SyncResult:
    """Bring `topic`'s state table up to its partitions' committed manifests (steps 1-6
    of the module's commit); a snapshot only if the state changed."""
    from compactlog.iceberg.state import sync

    return sync(store, topic, cause=cause, run_id=run_id, now_ms=now_ms)


def sync_raw_table(store: LogStore, topic: str, cause: str = "sync",
                   now_ms: int | None = None) -> SyncResult:
    """Bring `topic`'s raw table (its sealed segments, iceberg/kinds.py) up to its
    partitions' committed manifests; a snapshot only if they changed."""
    from compactlog.iceberg.kinds import RAW
    from compactlog.iceberg.state import sync

    return sync(store, topic, cause=cause, now_ms=now_ms, kind=RAW)


def expire_snapshots(store: LogStore, topic: str, now_ms: int | None = None,
                     table: str = STATE_TABLE, repair: bool = True) -> ExpiryResult:
    """Expire the snapshots of `topic`'s table `table` ("state" or "raw") past
    `iceberg.history.expire.max-snapshot-age-ms`, then let the sweep delete the data
    files only they held (expiry.py). `repair`: also give the table's holds to a
    partition whose hold document has none (a table made before holds existed)."""
    from compactlog.iceberg.expiry import expire
    from compactlog.iceberg.kinds import KINDS

    return expire(store, topic, now_ms, KINDS[table], repair=repair)


def drop_table(store: LogStore, topic: str, table: str = RAW_TABLE) -> DropResult:
    """Drop `topic`'s table `table` (the raw table when `iceberg.raw.enabled` is turned
    off): its files first, then its holds, so that it stops keeping data files
    (drop.py)."""
    from compactlog.iceberg.drop import drop
    from compactlog.iceberg.kinds import KINDS

    return drop(store, topic, KINDS[table])


def state_table_location(store: LogStore, topic: str, table: str = STATE_TABLE) -> str:
    """Where `topic`'s state table (or its raw table, `table="raw"`) is: the directory
    (or s3:// URL) that DuckDB's `iceberg_scan` and pyiceberg's
    `StaticTable.from_metadata` open."""
    from compactlog.iceberg.files import table_files

    return table_files(store, topic, table).url("")


def sync_after_compaction(store: LogStore, topic: str, run_id: str) -> SyncResult | None:
    """The compaction hook (runner step 5b): sync, and log rather than raise a failure,
    since the run's commits stand whatever happens here."""
    if not available():
        return None
    try:
        result = sync_state_table(store, topic, cause="compaction", run_id=run_id)
    except Exception as error:  # the next sync repairs it
        log.warning("%s: the Iceberg state table was not synced after compaction run %s "
                    "(the next sync catches it up): %s", topic, run_id, error)
        return None
    try:  # the metadata the sync left, and no repair: no request when none expires
        from compactlog.iceberg.expiry import expire

        expire(store, topic, current=result.current, repair=False)
    except Exception as error:  # expiry only frees space: the next one does it
        log.warning("%s: the Iceberg state table's snapshots were not expired after "
                    "compaction run %s (the next expiry does it): %s", topic, run_id, error)
    return result
