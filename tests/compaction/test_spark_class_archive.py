"""The Spark driver JVM's class-data-sharing archive (compaction/spark_class_archive.py):
its protocol's steps on part files, and (slow) two real JVMs, the first writing the
archive at its exit and the second loading Spark's classes from it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from compactlog.compaction import spark_class_archive
from compactlog.compaction.spark_session import (
    LOG4J2_SETTINGS,
    driver_java_options,
    spark_environment,
)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path / "compactlog" / "spark"


def dead_pid() -> int:
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)
    return int(child.stdout)


def part_file(cache: Path, pid: int, age_s: float, whole: bool = True) -> Path:
    """A part file as a dump leaves it: whole (its header's magic written last), or
    cut short (the header still blank)."""
    key = spark_class_archive.archive_key()
    cache.mkdir(parents=True, exist_ok=True)
    part = cache / f"{key}.jsa.{pid}.part"
    header = spark_class_archive.DYNAMIC_ARCHIVE_MAGIC if whole else bytes(4)
    part.write_bytes(header + b"x" * 96)
    stamp = time.time() - age_s
    os.utime(part, (stamp, stamp))
    return part


def test_with_no_archive_the_jvm_writes_one_of_its_own_at_exit(cache: Path) -> None:
    options = spark_class_archive.java_options()
    key = spark_class_archive.archive_key()
    assert options == ["-XX:+IgnoreUnrecognizedVMOptions", "-Xlog:cds*=off",
                       f"-XX:ArchiveClassesAtExit={cache / f'{key}.jsa.{os.getpid()}.part'}"]


def test_a_part_file_still_being_written_is_not_used_and_no_second_is_started(
        cache: Path) -> None:
    alive = part_file(cache, os.getpid(), age_s=3600)  # its process runs: maybe writing
    young = part_file(cache, dead_pid(), age_s=1)  # its JVM may still be dumping
    assert spark_class_archive.java_options() == []
    assert alive.exists() and young.exists()
    assert not list(cache.glob("*.jsa"))


def test_a_finished_part_file_is_promoted_and_handed_to_the_next_jvm(cache: Path) -> None:
    part = part_file(cache, dead_pid(), age_s=spark_class_archive.PROMOTE_AFTER_S + 1)
    cut = part_file(cache, dead_pid() + 100_000, age_s=3600, whole=False)  # a dump cut short
    key = spark_class_archive.archive_key()
    assert spark_class_archive.java_options() == [
        "-XX:+IgnoreUnrecognizedVMOptions", "-Xlog:cds*=off",
        f"-XX:SharedArchiveFile={cache / f'{key}.jsa'}", "-Xshare:auto"]
    assert not part.exists() and not cut.exists()
    # A later part file of the same key is removed once done: the archive stands.
    later = part_file(cache, dead_pid(), age_s=spark_class_archive.PROMOTE_AFTER_S + 1)
    spark_class_archive.java_options()
    assert not later.exists()
    assert (cache / f"{key}.jsa").read_bytes()[:4] == spark_class_archive.DYNAMIC_ARCHIVE_MAGIC


def test_only_the_most_recently_used_archives_are_kept(cache: Path) -> None:
    cache.mkdir(parents=True)
    others = [cache / f"other-{number}.jsa" for number in range(5)]
    for age, path in enumerate(others):
        path.write_bytes(spark_class_archive.DYNAMIC_ARCHIVE_MAGIC)
        stamp = time.time() - 3600 * (age + 1)
        os.utime(path, (stamp, stamp))
    part_file(cache, dead_pid(), age_s=spark_class_archive.PROMOTE_AFTER_S + 1)
    spark_class_archive.java_options()
    key = spark_class_archive.archive_key()
    kept = sorted(path.name for path in cache.glob("*.jsa"))
    assert kept == sorted([f"{key}.jsa", "other-0.jsa", "other-1.jsa"])


def test_a_dump_cut_short_is_never_promoted(cache: Path) -> None:
    cut = part_file(cache, dead_pid(), age_s=spark_class_archive.PROMOTE_AFTER_S + 1,
                    whole=False)
    options = spark_class_archive.java_options()
    assert not cut.exists() and not list(cache.glob("*.jsa"))
    assert any(option.startswith("-XX:ArchiveClassesAtExit=") for option in options)


def test_the_users_options_come_first_and_a_setting_turns_the_archive_off(
        cache: Path) -> None:
    settings = {"spark.driver.extraJavaOptions": "-Xmx1g"}
    options = driver_java_options(settings, our_conf_dir=True)
    assert options.startswith(f'-Xmx1g "-Dlog4j2.configurationFile={LOG4J2_SETTINGS}"')
    assert "ArchiveClassesAtExit" in options
    off = driver_java_options({**settings, spark_class_archive.ENABLED_CONF: "false"}, True)
    assert off == f'-Xmx1g "-Dlog4j2.configurationFile={LOG4J2_SETTINGS}"'
    # A user's own SPARK_CONF_DIR: their log4j2 settings, no archive.
    assert driver_java_options(settings, our_conf_dir=False) == "-Xmx1g"


def processes_naming(text: str) -> list[int]:
    """Pids of the processes whose command line holds `text` (the JVM writing a part)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and text.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def test_an_unwritable_cache_leaves_sparks_configuration_as_it_was(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")  # a file where the cache directory would be
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    monkeypatch.delenv("SPARK_CONF_DIR", raising=False)
    assert spark_environment() is False
    assert os.environ["SPARK_CONF_DIR"] == str(LOG4J2_SETTINGS.parent)
    assert spark_class_archive.java_options() == []


START = """
import sys
from compactlog.compaction import spark_class_archive
from compactlog.compaction.spark_session import start_session
spark_class_archive.PROMOTE_AFTER_S = 1.0
session = start_session("local[1]", {"spark.driver.extraJavaOptions":
                                     "-Xlog:class+load=info:file=" + sys.argv[1]})
session.range(0, 4, 1, 2).collect()
session.stop()
"""


@pytest.mark.slow
def test_the_second_jvm_loads_sparks_classes_from_the_archive_the_first_wrote(
        cache: Path, tmp_path: Path) -> None:
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    env.pop("SPARK_CONF_DIR", None)
    first, second = tmp_path / "first.log", tmp_path / "second.log"
    with (tmp_path / "first.out").open("w") as out:  # what a terminal would show
        subprocess.run([sys.executable, "-c", START, str(first)], env=env, check=True,
                       timeout=300, stdout=out, stderr=subprocess.STDOUT)
    key = spark_class_archive.archive_key()
    deadline = time.monotonic() + 180  # the JVM dumps after the Python process ended
    while time.monotonic() < deadline and processes_naming(f"{key}.jsa."):
        time.sleep(1)
    assert list(cache.glob(f"{key}.jsa.*.part")), "the first JVM wrote no archive"
    assert "[cds]" not in (tmp_path / "first.out").read_text()  # nor said so
    time.sleep(2)  # past the second start's PROMOTE_AFTER_S (1 s)
    subprocess.run([sys.executable, "-c", START, str(second)], env=env, check=True,
                   timeout=300)
    assert (cache / f"{key}.jsa").exists()
    shared = [line for line in second.read_text().splitlines()
              if "org.apache.spark" in line and "shared objects file (top)" in line]
    assert len(shared) > 1000, "Spark's classes were not loaded from the archive"
