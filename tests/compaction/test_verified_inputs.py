"""The per-process memo of verified compaction inputs (compaction/verified.py), and the
whole-file CRC32C it checks (storage/sealed.file_crc32c): a file proven whole is not
read for its CRC32C again, and any write to it, or a new file under its name, makes the
next run check it again (and find the damage)."""

from __future__ import annotations

import os
import random
from pathlib import Path

import crc32c
import pytest

from compactlog.compaction import verified
from compactlog.errors import CorruptionError
from compactlog.storage.sealed import CHECKSUM_CHUNK, file_crc32c


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every whole-file CRC32C that verification computes, by path."""
    from compactlog.storage import sealed

    seen: list[Path] = []
    real = sealed.file_crc32c

    def counting(path: Path) -> int:
        seen.append(path)
        return real(path)

    monkeypatch.setattr(sealed, "file_crc32c", counting)
    verified.forget_all()
    return seen


def test_a_file_is_read_for_its_checksum_once(tmp_path: Path, counted: list[Path]) -> None:
    path = tmp_path / "a.parquet"
    path.write_bytes(b"x" * 1000)
    crc = file_crc32c(path)
    for _ in range(3):
        verified.verify_input(path, 1000, crc, "input")
    assert counted == [path]


def test_a_written_file_is_checked_again(tmp_path: Path, counted: list[Path]) -> None:
    path = tmp_path / "a.parquet"
    path.write_bytes(b"x" * 1000)
    crc = file_crc32c(path)
    verified.verify_input(path, 1000, crc, "input")
    stat = os.stat(path)
    with open(path, "r+b") as handle:  # same size, one byte changed
        handle.seek(10)
        handle.write(b"y")
    # A later write: its time differs (the file system's clock ticks every few ms, so
    # a write in the very tick of the check would not be seen; see the module).
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    with pytest.raises(CorruptionError, match="CRC32C mismatch"):
        verified.verify_input(path, 1000, crc, "input")
    assert counted == [path, path]


def test_a_new_file_under_the_name_is_checked_again(tmp_path: Path,
                                                     counted: list[Path]) -> None:
    path = tmp_path / "a.parquet"
    path.write_bytes(b"x" * 1000)
    crc = file_crc32c(path)
    verified.verify_input(path, 1000, crc, "input")
    other = tmp_path / "b.parquet"
    other.write_bytes(b"z" * 1000)
    os.replace(other, path)
    with pytest.raises(CorruptionError):
        verified.verify_input(path, 1000, crc, "input")


def test_a_size_that_differs_is_an_error_even_when_remembered(tmp_path: Path,
                                                                counted: list[Path]) -> None:
    path = tmp_path / "a.parquet"
    path.write_bytes(b"x" * 1000)
    crc = file_crc32c(path)
    verified.remember(path, crc)
    verified.verify_input(path, 1000, crc, "input")
    assert counted == []  # a file this process wrote counts as checked
    with pytest.raises(CorruptionError, match="bytes"):
        verified.verify_input(path, 999, crc, "input")


@pytest.mark.parametrize("size", [0, 1, CHECKSUM_CHUNK - 1, CHECKSUM_CHUNK, CHECKSUM_CHUNK + 1,
                                  2 * CHECKSUM_CHUNK + 7])
def test_file_crc32c_is_the_crc_of_the_whole_file(tmp_path: Path, size: int) -> None:
    """The file's CRC32C read through one refilled buffer equals the CRC of its bytes at
    once, at the chunk's edges too."""
    data = random.Random(size).randbytes(size)
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    assert file_crc32c(path) == crc32c.crc32c(data)
