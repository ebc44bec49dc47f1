"""What a compaction run's report looks like to a user: the summary table after
`compactlog compact` (and the demo), and the JSON of `--json` and the worker protocol.

Invariant: both are made from the CompactionReport alone, so the table, the JSON and
the admin API's report of one run never disagree.
"""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.filesize import decimal
from rich.text import Text

from compactlog.cli.output import narrow_table
from compactlog.compaction import CompactionReport


def report_json(report: CompactionReport) -> dict[str, Any]:
    return {
        "topic": report.topic,
        "run_id": report.run_id,
        "duration_s": round(report.duration_s, 3),
        "startup_s": round(report.startup_s, 3),
        "engine": report.engine,
        "stages": {name: round(seconds, 3) for name, seconds in report.stages.items()},
        "mb_per_s": round(report.mb_per_s, 2),
        "io_read_bytes": report.io_read_bytes,
        "io_written_bytes": report.io_written_bytes,
        "throttled_s": round(report.throttled_s, 3),
        "partitions": [
            {**vars(p), "records_removed": p.records_removed} for p in report.partitions
        ],
    }


def summary_table(report: CompactionReport) -> RenderableType:
    """The run's summary, in 80 columns: one row per partition (and their total), what
    this run read and wrote, the keys the compacted ledger holds after it (for a
    partition with nothing new: the ledger it keeps), and why a partition had nothing to
    do. A run that did nothing says so in its title."""
    ran = [p for p in report.partitions if p.skipped is None]
    if ran:
        title = f"Compacted {report.topic} in {report.duration_s:.1f}s, run {report.run_id}"
    else:
        title = f"Nothing to compact in {report.topic} (run {report.run_id})"
    table = narrow_table(title, "partition", "records\nin", "records\nout", "keys",
                         "tombstones\nkept", "size\nin", "size\nout", "horizon")
    for p in report.partitions:
        horizon = "-" if p.horizon is None else str(p.horizon)
        if p.old_horizon != p.horizon:
            horizon = f"{'-' if p.old_horizon is None else p.old_horizon}→{horizon}"
        if p.skipped is not None:
            table.add_row(str(p.partition), "-", "-", f"{p.keys:,}", "-", "-", "-", horizon)
            continue
        table.add_row(
            str(p.partition), f"{p.records_in:,}", f"{p.records_out:,}", f"{p.keys:,}",
            f"{p.tombstones_kept:,}", decimal(p.bytes_in), decimal(p.bytes_out), horizon)
    if len(report.partitions) > 1:
        work = ([f"{report.total('records_in'):,}", f"{report.total('records_out'):,}"]
                if ran else ["-", "-"])
        sizes = ([decimal(report.total("bytes_in")), decimal(report.total("bytes_out"))]
                 if ran else ["-", "-"])
        table.add_row("all", *work, f"{report.total('keys'):,}",
                      f"{report.total('tombstones_kept'):,}" if ran else "-", *sizes, "",
                      style="bold")
    notes: list[RenderableType] = [table]
    if ran:
        removed = report.total("records_in") - report.total("records_out")
        tombstones = report.total("tombstones_removed")
        adopted = report.total("segments_adopted")
        notes.append(Text(
            f"{removed:,} record{'' if removed == 1 else 's'} removed ({tombstones:,} "
            f"tombstone{'' if tombstones == 1 else 's'}) · "
            + (f"{adopted:,} segment{'' if adopted == 1 else 's'} adopted as "
               f"{'it is' if adopted == 1 else 'they are'} · " if adopted else "")
            + f"ledger files {report.total('ledger_files_in'):,} → "
            f"{report.total('ledger_files_out'):,} · "
            + " · ".join(f"{name} {seconds:.1f}s" for name, seconds in report.stages.items())
            + f" · {report.mb_per_s:.1f} MB/s after start-up"
            + (f" · I/O throttled {report.throttled_s:.1f}s" if report.throttled_s else ""),
            style="dim"))
        if report.engine:
            notes.append(Text(f"ran on: {report.engine}", style="dim"))
    reasons: dict[str, list[str]] = {}
    for p in report.partitions:
        if p.skipped is not None:
            reasons.setdefault(p.skipped, []).append(str(p.partition))
        if p.rolled_unsealed:
            reasons.setdefault("the writer had not sealed its rolled segments in time: the "
                               "next run covers them", []).append(str(p.partition))
    for reason, indexes in reasons.items():
        which = "partition" if len(indexes) == 1 else "partitions"
        notes.append(Text(f"{which} {', '.join(indexes)}: {reason}"))
    return Group(*notes)
