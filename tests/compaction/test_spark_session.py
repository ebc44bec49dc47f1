"""The session's JVM-to-Python sockets (compaction/spark_session.py, `unix_socket_conf`):
on a local master, Unix-domain sockets in a directory of mode 0700; TCP, with Spark's
shared secret, for any other master, or when the user chose either setting.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from compactlog.compaction.spark_session import (
    UNIX_SOCKET_DIR,
    UNIX_SOCKET_DIR_MAX,
    UNIX_SOCKET_ENABLED,
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
        folder.rmdir()


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


def test_the_sessions_workers_talk_over_the_private_directory(spark: SparkSession) -> None:
    """The test session (started by start_session on local[2], as the product starts
    it) runs Python tasks, and their sockets are in its directory."""
    conf = spark.sparkContext.getConf()
    assert conf.get(UNIX_SOCKET_ENABLED) == "true"
    folder = Path(conf.get(UNIX_SOCKET_DIR) or "")
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert spark.sparkContext.parallelize(range(4), 2).map(lambda n: n * 2).collect() == [
        0, 2, 4, 6]
    assert any(name.endswith(".sock") for name in os.listdir(folder))


def test_no_writable_temporary_directory_keeps_tcp(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(*_: object, **__: object) -> str:
        raise PermissionError(13, "Permission denied", str(tmp_path))

    monkeypatch.setattr(tempfile, "mkdtemp", refused)
    assert unix_socket_conf("local[2]", {}) == {}
