"""Starting the Spark session that runs compaction.

The master is `local[*]` unless configured: `spark://host:7077` for a standalone
cluster, or any master Spark accepts. Settings pass through unchanged (`--spark-conf
KEY=VALUE`). The defaults below are the ones measured fastest for this job on small
machines (shared/notes/spark.md): few shuffle partitions, no UI, 127.0.0.1.

On a local master, the JVM talks to its Python workers over Unix-domain sockets
(`unix_socket_conf`), in a directory only this user can enter. Over loopback TCP, each
task's input reached its Python worker about 40 ms after the task's header: the JVM's
second small write waited on the worker's delayed ACK (Nagle's algorithm), a stall the
product's job paid on every task; a Unix-domain socket has no such algorithm
(docs/benchmarks.md, "A warm Spark job's fixed cost"). Spark skips its shared-secret
handshake on those sockets, so the directory's permissions are what keep another user of
the machine from handing a worker a task: the directory is made mode 0700 and removed at
exit. A cluster master keeps TCP: its executors run on other hosts (or as another user),
which could not enter a directory made here.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from compactlog.compaction import spark_class_archive

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[*]"
DEFAULT_CONF: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "8",
    "spark.sql.adaptive.enabled": "true",
    "spark.python.worker.reuse": "true",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.session.timeZone": "UTC",
    # Phase 1 reads key, offset and value_size pages straight from the Parquet files: check
    # the CRC32C of every page read (sealed files are written with page checksums).
    "spark.hadoop.parquet.page.verify-checksum.enabled": "true",
}
LOCAL_CONF: dict[str, str] = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
}


LOG4J2_SETTINGS = Path(__file__).with_name("spark-conf") / "log4j2.properties"


def spark_environment() -> bool:
    """Environment Spark's launcher and Python workers need; set before the JVM starts.
    True when the JVM's configuration directory is compactlog's (empty) one rather
    than the user's SPARK_CONF_DIR."""
    # Workers run the first `python3` on PATH otherwise, which may lack pyarrow.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Unless the user has a Spark configuration directory of their own, an empty one
    # (the class archive needs it: spark_class_archive.py), and errors only from the
    # JVM's logging (LOG4J2_SETTINGS, passed by `driver_java_options`); where no
    # empty one can be made, LOG4J2_SETTINGS' own directory, without the archive.
    empty = spark_class_archive.empty_conf_dir()
    if empty is None:
        os.environ.setdefault("SPARK_CONF_DIR", str(LOG4J2_SETTINGS.parent))
        return False
    return os.environ.setdefault("SPARK_CONF_DIR", str(empty)) == str(empty)


def driver_java_options(settings: Mapping[str, str], our_conf_dir: bool) -> str:
    """spark.driver.extraJavaOptions for a driver JVM this process starts: the user's,
    then compactlog's log4j2 settings and class archive (spark_class_archive.py) when
    the configuration directory is compactlog's."""
    options = [settings.get("spark.driver.extraJavaOptions", "")]
    if our_conf_dir:
        options.append(f'"-Dlog4j2.configurationFile={LOG4J2_SETTINGS}"')
        if str(settings.get(spark_class_archive.ENABLED_CONF, "true")).lower() != "false":
            options += [f'"{option}"' for option in spark_class_archive.java_options()]
    return " ".join(option for option in options if option)


# Spark's own limit for spark.python.unix.domain.socket.dir: a socket's path must stay
# within 104 bytes, and Spark adds a separator, a dot, a UUID and ".sock" (43).
UNIX_SOCKET_DIR_MAX = 104 - (36 + 1 + 5 + 1)
UNIX_SOCKET_ENABLED = "spark.python.unix.domain.socket.enabled"
UNIX_SOCKET_DIR = "spark.python.unix.domain.socket.dir"


def unix_socket_conf(master: str, conf: Mapping[str, str]) -> dict[str, str]:
    """The settings that put a local master's JVM-to-Python traffic on Unix-domain
    sockets in a new directory of mode 0700 (see the module), removed at exit; none for
    another master, when the user set either setting, or when the temporary directory's
    path is too long for a socket's or a directory cannot be made there."""
    if not master.startswith("local") or UNIX_SOCKET_ENABLED in conf or UNIX_SOCKET_DIR in conf:
        return {}
    if len(tempfile.gettempdir()) + len("/compactlog-sockets-xxxxxxxx") > UNIX_SOCKET_DIR_MAX:
        return {}
    try:
        directory = tempfile.mkdtemp(prefix="compactlog-sockets-")  # mode 0700
    except OSError as error:  # no writable temporary directory: TCP, as Spark's default
        logging.getLogger(__name__).warning(
            "Spark's Python workers keep TCP sockets: no directory for Unix-domain ones "
            "in %s (%s)", tempfile.gettempdir(), error)
        return {}
    atexit.register(shutil.rmtree, directory, True)
    return {UNIX_SOCKET_ENABLED: "true", UNIX_SOCKET_DIR: directory}


def start_session(
    master: str = DEFAULT_MASTER,
    conf: Mapping[str, str] | None = None,
    app_name: str = "compactlog-compaction",
    log_file: Path | None = None,
) -> SparkSession:
    """The session; with `log_file`, everything Spark's side prints goes there instead of
    this process' stdout and stderr (see launch_jvm_logging_to)."""
    our_conf_dir = spark_environment()
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app_name)
    settings = dict(DEFAULT_CONF)
    if master.startswith("local") or master.startswith("spark://127.") or (
        master.startswith("spark://localhost")
    ):
        settings.update(LOCAL_CONF)
    settings.update(conf or {})
    # PySpark keeps its gateway (the JVM) in a class attribute: only a JVM about to
    # start takes options.
    if getattr(SparkContext, "_gateway", None) is None:
        settings["spark.driver.extraJavaOptions"] = driver_java_options(settings, our_conf_dir)
        settings.update(unix_socket_conf(master, settings))
    for key, value in settings.items():
        builder = builder.config(key, value)
    if log_file is not None:
        launch_jvm_logging_to(log_file, {"spark.master": master, "spark.app.name": app_name,
                                         **settings})
    session = builder.getOrCreate()
    # In a log file of their own, Spark's warnings trouble no one; on the console, only
    # its errors are shown.
    session.sparkContext.setLogLevel("WARN" if log_file is not None else "ERROR")
    return session


def launch_jvm_logging_to(log_file: Path, settings: Mapping[str, str]) -> None:
    """Start Spark's JVM with its stdout and stderr on `log_file` (appended to), and send
    py4j's Python logging there too; nothing if this process has a JVM already.

    The JVM's log4j lines go to its stderr (spark-conf/log4j2.properties), and the
    Python workers it forks inherit its stdout and stderr, so all of Spark's output
    lands in the file, and none on a terminal where a progress bar is drawn. PySpark
    starts the JVM with the Popen arguments given to launch_gateway (its documented
    way to capture the JVM's output); the SparkContext made here on that gateway is the
    one the session builder then finds and uses."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    # Readable by this user only, as the data directory's own files.
    os.close(os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
    py4j = logging.getLogger("py4j")
    # py4j's debug lines are every command sent to the JVM, the gateway's secret among
    # them: never written, whatever the root logger's level (--debug).
    py4j.setLevel(logging.INFO)
    if not any(isinstance(handler, logging.FileHandler) for handler in py4j.handlers):
        handler = logging.FileHandler(log_file)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        py4j.addHandler(handler)
        py4j.propagate = False
    # PySpark keeps its gateway (the JVM) in a class attribute, and has no public
    # way to ask whether one runs.
    if getattr(SparkContext, "_gateway", None) is not None:
        return
    spark_conf = SparkConf(loadDefaults=False).setAll(list(settings.items()))
    with open(log_file, "ab") as log:
        gateway = launch_gateway(  # type: ignore[no-untyped-call]
            spark_conf, {"stdout": log, "stderr": subprocess.STDOUT})
    SparkContext(conf=spark_conf, gateway=gateway)
