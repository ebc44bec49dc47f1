"""A class-data-sharing archive for the Spark driver JVM that compactlog starts, so that
a cold `compactlog compact` does not spend seconds loading Spark's classes again.

A JVM that starts Spark loads and verifies some thousands of classes from Spark's jars;
HotSpot's application class-data sharing (JDK 13+, JEP 350 "Dynamic CDS Archives") maps
them from an archive instead (about 120 MB, written once per JDK and PySpark). Measured
here (bench/cli_warm_worker.py, docs/benchmarks.md), a local[2] session and its first
job started in roughly half the time with the archive.

Invariant: a JVM is only ever handed an archive that a JVM finished writing, or none,
and the archive can never stop a JVM from starting. The protocol:
  1. The archive is named by what it depends on (`archive_key`: the java binary, the
     PySpark version, its jars and where they are): a new JDK, PySpark or virtualenv
     gets a new archive, the old one is never used for it.
  2. No archive yet, and none being written: this JVM writes one when it exits
     (-XX:ArchiveClassesAtExit) to a file of its own, `<key>.jsa.<pid>.part`, named by
     this process' pid (the JVM outlives this process by the seconds the dump takes).
     JVMs started while a part file may still be written go without an archive.
  3. The next start promotes a part file to `<key>.jsa` (a rename, atomic) once its
     process is gone, the file has not changed for PROMOTE_AFTER_S (the dump has
     ended) and it opens with the dynamic archive's magic number, which HotSpot writes
     last, over the header it left blank (a dump cut short has none: it is removed);
     other part files of that key are removed.
  4. An archive is handed to a JVM as -XX:SharedArchiveFile with -Xshare:auto (and
     marked used: only the ARCHIVES_KEPT most recently used stay, so virtualenvs
     that come and go, as CI's clones do, cannot fill the disk): one that
     does not match (a changed class path, a dump cut short, which leaves its header
     unwritten) is refused by the JVM, which then starts without it. Options a JVM does
     not know (a JDK older than 13) are ignored (-XX:+IgnoreUnrecognizedVMOptions),
     and the JVM's lines about the archive are not printed (-Xlog:cds*=off).
HotSpot refuses to archive with a class path that holds a non-empty directory, so the
JVM's Spark configuration directory is an empty one, and compactlog's log4j2 settings
are passed by their file's path (spark_session.py); a user's own SPARK_CONF_DIR turns
the archive off. `spark.compactlog.driver.class.archive=false` turns it off too.
Tests: tests/compaction/test_spark_class_archive.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

ENABLED_CONF = "spark.compactlog.driver.class.archive"
PROMOTE_AFTER_S = 120.0
# Archives kept, the most recently used first (one per JDK, PySpark and virtualenv):
# about 120 MB each.
ARCHIVES_KEPT = 3
# CDS_DYNAMIC_ARCHIVE_MAGIC (HotSpot's cds/filemap.hpp, JDK 13 on), as the file holds it.
DYNAMIC_ARCHIVE_MAGIC = (0xF00BABA8).to_bytes(4, "little")


def cache_dir() -> Path:
    """Where the archive is kept: $XDG_CACHE_HOME (or ~/.cache)/compactlog/spark."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "compactlog" / "spark"


def archive_key() -> str | None:
    """What the archive depends on, hashed (step 1); None when no java is found."""
    import pyspark

    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if java is None or not Path(java).exists():
        return None
    java_path = Path(java).resolve()
    # The jars' directory by its path too: an archive records the class path it was
    # written with, and HotSpot skips it for any other (another virtualenv's PySpark).
    jars = (Path(pyspark.__file__).parent / "jars").resolve()
    names = sorted(path.name for path in jars.glob("*.jar")) if jars.is_dir() else []
    decided_by = [str(java_path), java_path.stat().st_mtime_ns, pyspark.__version__,
                  str(jars), names]
    return hashlib.sha256(json.dumps(decided_by).encode()).hexdigest()[:16]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _promote(directory: Path, key: str, now: float) -> tuple[Path | None, bool]:
    """Step 3: the finished archive of `key`, promoting a part file if one is done, and
    whether a part file may still be being written (then no other JVM writes one)."""
    final = directory / f"{key}.jsa"
    writing = False
    for part in sorted(directory.glob(f"{key}.jsa.*.part")):
        try:
            pid = int(part.name.split(".")[-2])
            stat = part.stat()
        except (ValueError, OSError):
            continue
        if _alive(pid) or now - stat.st_mtime < PROMOTE_AFTER_S:
            writing = True  # its JVM may still be writing it
            continue
        with part.open("rb") as opened:
            whole = opened.read(4) == DYNAMIC_ARCHIVE_MAGIC
        if final.exists() or not whole:
            part.unlink(missing_ok=True)
        else:
            os.replace(part, final)
    return (final if final.exists() else None), writing


def _keep_recent(directory: Path, used: Path) -> None:
    """Mark `used` as just used, and remove all but the ARCHIVES_KEPT most recently used
    archives (step 4)."""
    try:
        os.utime(used)
        archives = sorted(directory.glob("*.jsa"), key=lambda path: path.stat().st_mtime,
                          reverse=True)
        for old in archives[ARCHIVES_KEPT:]:
            old.unlink(missing_ok=True)  # a JVM that has it mapped reads on
    except OSError:
        pass  # another start pruned it meanwhile: nothing to do


def java_options(now: float | None = None) -> list[str]:
    """The options for the driver JVM about to start: use the archive (step 4), or
    write it at exit (step 2). None of them when there is no java to key it by, the
    cache directory cannot be written, or another JVM may be writing the archive."""
    key = archive_key()
    if key is None:
        return []
    directory = cache_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        archive, writing = _promote(directory, key, time.time() if now is None else now)
    except OSError:
        return []
    # The JVM's own lines about the archive (classes it leaves out, a mismatch) would
    # reach the user's terminal, even after the command ended (the dump runs at exit).
    options = ["-XX:+IgnoreUnrecognizedVMOptions", "-Xlog:cds*=off"]
    if archive is not None:
        _keep_recent(directory, archive)
        return [*options, f"-XX:SharedArchiveFile={archive}", "-Xshare:auto"]
    if writing:  # one archive at a time: JVMs started meanwhile go without
        return []
    return [*options, f"-XX:ArchiveClassesAtExit={directory / f'{key}.jsa.{os.getpid()}.part'}"]


def empty_conf_dir() -> Path | None:
    """An empty directory for SPARK_CONF_DIR (the archive needs one: see the module);
    None when the cache directory cannot be written (then no archive either)."""
    path = cache_dir() / "conf-empty"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return path
