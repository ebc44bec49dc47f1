"""A compaction task whose partition lives on an object store: fetch, compact, publish.

Invariant: a task reads only inputs it fetched whole from the partition's volume (each
checked against the manifest's size and CRC32C by the task body, as local inputs are)
and publishes only files it wrote itself in this attempt, under names no other task or
attempt uses for other bytes (run id, sequence, base offset; a DV's name holds its
run id): so, as on a local disk, nothing a task does is visible until the driver
commits the manifest that lists it, and a retried task's outputs are orphans of the
run for the sweep if no commit lists them. Credentials never travel in the task: the
executor builds its client from its own AWS environment (volume.volume_from_spec).

Steps of `compact_on_volume` (tests/compaction/test_compaction_s3.py):
  1. fetch every input file, and every input ledger file's deletion vector, into this
     process's read cache: the ledger files and their DVs land side by side, where the
     task body looks for a DV (next to its ledger file);
  2. run the task body on the local copies with a fresh local output directory;
  3. publish every file the body wrote there: new ledger files and DVs by a create-only
     PUT, an adopted segment (adoption.py) by a copy of the segment's object within the
     bucket (CopyObject: its bytes are not sent again; its name carries the run id and
     the segment's base offset, so another attempt can only give it the same bytes);
     then every other new deletion vector (written next to its cached ledger file; the
     inputs' own DVs are already in the bucket);
  4. remove the output directory; the cache keeps the copies for later runs.
A failure in 1-3 fails the task: Spark retries it or the run fails, and the driver
commits nothing; what 3 published is an orphan until the sweep deletes it.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from compactlog.backend import volume_from_spec
from compactlog.fsutil import TEMP_PREFIX
from compactlog.storage import LEDGER_DIR

TaskBody = Callable[[dict[str, Any]], dict[str, Any]]


def compact_on_volume(task: dict[str, Any], body: TaskBody) -> dict[str, Any]:
    """Run `body` (arrow_pipeline.compact_one) on `task`'s partition in its volume."""
    volume = volume_from_spec(task["volume"])
    local_inputs: list[list[Any]] = []
    input_dvs: set[str] = set()
    for (_, is_ledger, info), relative in zip(task["inputs"], task["relative"], strict=True):
        local = volume.fetch(relative)  # 1.
        if is_ledger and info.get("dv_file"):
            volume.fetch(f"{LEDGER_DIR}/{info['dv_file']}")
            input_dvs.add(info["dv_file"])
        local_inputs.append([str(local), is_ledger, info])
    out_dir = Path(tempfile.mkdtemp(prefix="compactlog-ledger-"))
    try:
        result = body({**task, "inputs": local_inputs, "volume": None,  # 2.
                       "out_dir": str(out_dir)})
        published: set[str] = set()
        adopted = _adopted_sources(task, result)
        for written in sorted(out_dir.iterdir()):  # 3.
            if written.name.startswith(TEMP_PREFIX):
                continue
            if written.name in adopted:
                volume.publish_copy(written, f"{LEDGER_DIR}/{written.name}",
                                    adopted[written.name])
            else:
                volume.publish(written, f"{LEDGER_DIR}/{written.name}")
            published.add(written.name)
        for piece in result["pieces"]:
            info = piece.get("info") or {}
            dv_file = info.get("dv_file")
            if dv_file and dv_file not in input_dvs | published:
                volume.publish(volume.path_of(f"{LEDGER_DIR}/{dv_file}"),
                               f"{LEDGER_DIR}/{dv_file}")
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)  # 4.
    return result


def _adopted_sources(task: dict[str, Any], result: dict[str, Any]) -> dict[str, str]:
    """Per ledger file the body adopted (adoption.py), the segment it is a copy of, by
    its relative name in the volume: the file's entry keeps the segment's base offset."""
    segments = {info["base_offset"]: relative for (_, is_ledger, info), relative
                in zip(task["inputs"], task["relative"], strict=True) if not is_ledger}
    found: dict[str, str] = {}
    for piece in result["pieces"]:
        info = piece.get("info") or {}
        if info.get("adopted_at_ms") is not None and info["base_offset"] in segments:
            found[info["file"]] = segments[info["base_offset"]]
    return found
