"""The JVM-to-Python sockets (compaction/spark_sockets.py): on a local master,
Unix-domain sockets in a directory of mode 0700; TCP, with Spark's shared secret, for
any other master, or when the user chose either setting; and the sweep of directories
whose processes are gone (steps 1-3 of the module's protocol).
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from compactlog.compaction.spark_sockets import (
    OWNER_FILE,
    PREFIX,
    UNIX_SOCKET_DIR,
    UNIX_SOCKET_DIR_MAX,
    UNIX_SOCKET_ENABLED,
    sweep_abandoned,
    unix_socket_conf,
)


@pytest.mark.parametrize("master", ["local", "local[2]", "local[*]", "local[2,3]"])
def test_a_local_master_gets_sockets_in_a_private_directory(master: str) -> None:
    conf = unix_socket_conf(master, {})
    assert conf[UNIX_SOCKET_ENABLED] == "true"
    folder = Path(conf[UNIX_SOCKET_DIR])
    try:
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        assert folder.stat().st_uid == os.getuid()
        assert len(str(folder)) <= UNIX_SOCKET_DIR_MAX
    finally:
        shutil.rmtree(folder)


@pytest.mark.parametrize("master", ["spark://127.0.0.1:7077", "spark://host:7077", "yarn",
                                    "k8s://https://host:6443"])
def test_another_master_keeps_tcp(master: str) -> None:
    assert unix_socket_conf(master, {}) == {}


@pytest.mark.parametrize("users", [{UNIX_SOCKET_ENABLED: "false"},
                                   {UNIX_SOCKET_DIR: "/run/mine"}])
def test_the_users_setting_is_left_alone(users: dict[str, str]) -> None:
    assert unix_socket_conf("local[2]", users) == {}


def test_a_temporary_directory_too_long_for_a_socket_keeps_tcp(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    deep = tmp_path / ("d" * (UNIX_SOCKET_DIR_MAX + 1))
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    assert unix_socket_conf("local[2]", {}) == {}


def test_no_writable_temporary_directory_keeps_tcp(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(*_: object, **__: object) -> str:
        raise PermissionError(13, "Permission denied", str(tmp_path))

    monkeypatch.setattr(tempfile, "mkdtemp", refused)
    assert unix_socket_conf("local[2]", {}) == {}


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A directory with a path short enough for sockets (pytest's tmp_path is not)."""
    folder = Path(tempfile.mkdtemp(prefix="cl-sock-test-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _directory_of_a_process(folder: Path) -> tuple[subprocess.Popen[str], Path]:
    """A Python process that made its socket directory in `folder` and still runs."""
    code = ("import sys, tempfile\n"
            "tempfile.tempdir = sys.argv[1]\n"
            "from compactlog.compaction.spark_sockets import UNIX_SOCKET_DIR, unix_socket_conf\n"
            "print(unix_socket_conf('local[2]', {})[UNIX_SOCKET_DIR], flush=True)\n"
            "sys.stdin.read()\n")
    process = subprocess.Popen([sys.executable, "-c", code, str(folder)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    made = Path(process.stdout.readline().strip())
    assert made.is_absolute() and made.parent == folder, made  # not "" when it failed
    return process, made


def test_a_killed_processs_directory_is_swept_and_a_living_ones_is_not(
        short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Steps 1-3: SIGKILL skips the atexit removal; the next directory made removes the
    dead process' one (its lock went with it), never a living process' one, nor one
    without an owner file (being made, or from before the protocol)."""
    monkeypatch.setattr(tempfile, "tempdir", str(short_tmp))
    killed, killed_dir = _directory_of_a_process(short_tmp)
    living, living_dir = _directory_of_a_process(short_tmp)
    ownerless = short_tmp / f"{PREFIX}older"
    ownerless.mkdir(mode=0o700)
    try:
        (killed_dir / "stale.sock").touch()
        assert (killed_dir / OWNER_FILE).exists() and (living_dir / OWNER_FILE).exists()
        os.kill(killed.pid, signal.SIGKILL)
        killed.wait(timeout=30)
        assert killed_dir.exists()  # no atexit ran
        mine = Path(unix_socket_conf("local[2]", {})[UNIX_SOCKET_DIR])
        assert not killed_dir.exists()
        assert living_dir.exists() and ownerless.exists() and mine.exists()
        assert sweep_abandoned(str(short_tmp)) == []  # mine is owned too
    finally:
        for process in (killed, living):
            if process.poll() is None:
                process.kill()
            process.wait(timeout=30)
    # The living one was killed too: its directory is now abandoned.
    assert sweep_abandoned(str(short_tmp)) == [str(living_dir)]


def test_a_directory_that_ends_normally_is_removed_at_exit(short_tmp: Path) -> None:
    """Step 2: a process that exits removes its own directory."""
    process, directory = _directory_of_a_process(short_tmp)
    assert directory.exists()
    process.communicate("", timeout=30)
    assert process.returncode == 0
    assert not directory.exists()


def test_the_sweep_leaves_what_is_not_a_socket_directory(tmp_path: Path) -> None:
    (tmp_path / f"{PREFIX}file").write_text("not a directory")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / OWNER_FILE).touch()
    assert sweep_abandoned(str(tmp_path)) == []
    assert sweep_abandoned(str(tmp_path / "missing")) == []
    assert (tmp_path / f"{PREFIX}file").exists() and (tmp_path / "other").exists()
