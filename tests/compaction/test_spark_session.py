"""Starting the compaction session (compaction/spark_session.py): the order of its
settings (--spark-conf, then the user's spark-defaults.conf, then compactlog's
defaults), its master (the one given, else the file's spark.master, else local[*]),
the user's configuration directory, and the session's workers on the private socket
directory (spark_sockets.py).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from compactlog.compaction.spark_service import SparkCompactionService
from compactlog.compaction.spark_session import (
    DEFAULT_CONF,
    DEFAULT_MASTER,
    LOCAL_CONF,
    default_master,
    session_settings,
    spark_environment,
    user_spark_defaults,
)
from compactlog.compaction.spark_sockets import UNIX_SOCKET_DIR, UNIX_SOCKET_ENABLED
from compactlog.server.compaction_processes import ProcessSettings


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




def test_the_users_spark_defaults_win_over_compactlogs_and_spark_conf_over_both() -> None:
    users = {"spark.sql.shuffle.partitions": "64", "spark.ui.enabled": "true",
             "spark.driver.host": "10.0.0.5"}
    settings = session_settings("local[2]", {"spark.ui.enabled": "false"}, users)
    assert "spark.sql.shuffle.partitions" not in settings  # the file's 64 applies
    assert "spark.driver.host" not in settings
    assert settings["spark.ui.enabled"] == "false"  # --spark-conf, over the file
    assert {key: settings[key] for key in DEFAULT_CONF.keys() - users.keys()} == {
        key: DEFAULT_CONF[key] for key in DEFAULT_CONF.keys() - users.keys()}
    assert session_settings("local[2]", {}, {}) == {**DEFAULT_CONF, **LOCAL_CONF}
    assert session_settings("spark://host:7077", {}, {}) == DEFAULT_CONF


def test_spark_defaults_are_read_as_spark_reads_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "spark-defaults.conf").write_text(
        "# a comment\n"
        "! another\n"
        "spark.sql.shuffle.partitions   64  \n"
        "spark.python.unix.domain.socket.enabled=false\n"
        "spark.driver.extraJavaOptions: -Dmine=1 \\\n"
        "    -Dother=2\n")
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    assert user_spark_defaults() == {
        "spark.sql.shuffle.partitions": "64",
        "spark.python.unix.domain.socket.enabled": "false",
        "spark.driver.extraJavaOptions": "-Dmine=1 -Dother=2"}
    (tmp_path / "spark-defaults.conf").write_bytes(b"\xff\xfe not text")
    assert user_spark_defaults() == {}
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path / "missing"))
    assert user_spark_defaults() == {}


def test_a_spark_homes_own_configuration_is_the_users(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """$SPARK_HOME/conf with settings in it is what Spark's launcher would read: it is
    not hidden behind compactlog's empty directory; one with only Spark's templates is."""
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "spark-defaults.conf.template").write_text("spark.master local\n")
    monkeypatch.setenv("SPARK_HOME", str(tmp_path))
    monkeypatch.delenv("SPARK_CONF_DIR", raising=False)
    assert spark_environment() is True
    assert os.environ["SPARK_CONF_DIR"] != str(conf)
    monkeypatch.delenv("SPARK_CONF_DIR")
    (conf / "spark-defaults.conf").write_text("spark.sql.shuffle.partitions 64\n")
    assert spark_environment() is False
    assert os.environ["SPARK_CONF_DIR"] == str(conf)
    assert user_spark_defaults() == {"spark.sql.shuffle.partitions": "64"}


def test_the_master_is_the_given_one_else_the_files_else_local(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As spark-submit takes it: a master given wins; without one, spark.master of the
    user's spark-defaults.conf (in SPARK_CONF_DIR, or $SPARK_HOME/conf); else local[*].
    A spark-defaults.conf in the working directory is nobody's configuration."""
    monkeypatch.delenv("SPARK_CONF_DIR", raising=False)
    monkeypatch.delenv("SPARK_HOME", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "spark-defaults.conf").write_text("spark.master local[5]\n")
    assert default_master() == DEFAULT_MASTER == "local[*]"
    home_conf = tmp_path / "home" / "conf"
    home_conf.mkdir(parents=True)
    (home_conf / "spark-defaults.conf").write_text("spark.master local[3]\n")
    monkeypatch.setenv("SPARK_HOME", str(tmp_path / "home"))
    assert default_master() == "local[3]"
    conf_dir = tmp_path / "conf"
    conf_dir.mkdir()
    (conf_dir / "spark-defaults.conf").write_text("spark.master   spark://10.0.0.9:7077 \n")
    monkeypatch.setenv("SPARK_CONF_DIR", str(conf_dir))
    assert default_master() == "spark://10.0.0.9:7077"
    # Where a run's tasks go is decided from the same master before any session starts.
    (conf_dir / "spark-defaults.conf").write_text("spark.master local[3]\n")
    assert SparkCompactionService.local_cores(_service({})) == 3
    assert SparkCompactionService.local_cores(_service({"spark.master": "local[2]"})) == 2


def _service(settings: dict[str, str]) -> SparkCompactionService:
    """A service object holding only `settings`, for the methods that read nothing else."""
    service = SparkCompactionService.__new__(SparkCompactionService)
    service.settings = dict(settings)
    return service


def test_the_servers_runs_pass_a_master_only_when_it_has_one(tmp_path: Path) -> None:
    """The server's compaction processes get --spark-master only when its spark_master
    is set; otherwise each process takes the default, spark-defaults.conf's first."""
    unset = ProcessSettings(tmp_path, "", {}, None, 60.0)
    assert "--spark-master" not in unset.engine_args()
    given = ProcessSettings(tmp_path, "local[1]", {}, None, 60.0)
    assert given.engine_args()[:2] == ["--spark-master", "local[1]"]


SHOW_SETTINGS = """
import json, sys
from pathlib import Path
from compactlog.compaction.spark_session import start_session
log_file = Path(sys.argv[1]) if len(sys.argv) > 1 else None
session = start_session(None, {"spark.ui.enabled": "false"}, log_file=log_file)
conf = session.sparkContext.getConf()
names = ["spark.sql.shuffle.partitions", "spark.python.unix.domain.socket.enabled",
         "spark.ui.enabled", "spark.driver.extraJavaOptions", "spark.master"]
print(json.dumps({name: conf.get(name) for name in names}))
session.stop()
"""


@pytest.mark.slow
@pytest.mark.parametrize("to_log_file", [False, True])
def test_a_real_session_takes_the_users_spark_defaults(tmp_path: Path,
                                                      to_log_file: bool) -> None:
    """A JVM started by start_session (with the console's builder, or launched with its
    output in a log file, as the CLI does) has the user's spark-defaults.conf values
    where compactlog has defaults of its own, and --spark-conf's over the file's; with
    no master given, it runs on the file's spark.master."""
    import json
    import subprocess
    import sys

    conf_dir = tmp_path / "conf"
    conf_dir.mkdir()
    (conf_dir / "spark-defaults.conf").write_text(
        "spark.master local[1]\n"
        "spark.sql.shuffle.partitions 13\n"
        "spark.python.unix.domain.socket.enabled false\n"
        "spark.ui.enabled true\n"
        "spark.driver.extraJavaOptions -Dcompactlog.test=1\n")
    env = {**os.environ, "SPARK_CONF_DIR": str(conf_dir)}
    argv = [sys.executable, "-c", SHOW_SETTINGS] + (
        [str(tmp_path / "spark.log")] if to_log_file else [])
    done = subprocess.run(argv, env=env, check=True, timeout=300, capture_output=True,
                          text=True)
    shown = json.loads(done.stdout.strip().splitlines()[-1])
    # Spark puts its own module options before the user's.
    assert shown.pop("spark.driver.extraJavaOptions").endswith(" -Dcompactlog.test=1")
    assert shown == {"spark.master": "local[1]", "spark.sql.shuffle.partitions": "13",
                     "spark.python.unix.domain.socket.enabled": "false",
                     "spark.ui.enabled": "false"}  # the caller's, over the file's
