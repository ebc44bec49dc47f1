"""Starting the Spark session that runs compaction.

The master is the one given (`--spark-master`, COMPACTLOG_SPARK_MASTER, the server's
`spark_master`), else `spark.master` of the user's spark-defaults.conf, else `local[*]`
(`default_master`): `spark://host:7077` for a standalone cluster, or any master Spark
accepts. Settings pass through unchanged (`--spark-conf KEY=VALUE`). The defaults
below are the ones measured fastest for this job on small machines
(shared/notes/spark.md): few shuffle partitions, no UI, 127.0.0.1.

Settings, highest first, as Spark orders its own (code over spark-defaults.conf):
`--spark-conf` (the `conf` given), then the user's spark-defaults.conf (in their
SPARK_CONF_DIR, or $SPARK_HOME/conf; read by `user_spark_defaults`), then compactlog's
defaults below. A setting the user's file holds is not set here, so the file's value is
the one Spark uses (a setting made in code would override it).

On a local master, the JVM talks to its Python workers over Unix-domain sockets in a
directory of mode 0700 (spark_sockets.py), unless the user chose either of their
settings.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from compactlog.compaction import spark_class_archive
from compactlog.compaction.spark_sockets import unix_socket_conf

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[*]"
# What --spark-master's help says of its default (default_master).
MASTER_DEFAULT_TEXT = "spark.master in your spark-defaults.conf, else local[*]"
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
    # A Spark distribution's $SPARK_HOME/conf is the user's when it holds more than
    # Spark's templates: its launcher would read it (load-spark-env.sh's default).
    if "SPARK_CONF_DIR" not in os.environ and (found := user_conf_dir()) is not None:
        os.environ["SPARK_CONF_DIR"] = str(found)
        return False
    empty = spark_class_archive.empty_conf_dir()
    if empty is None:
        os.environ.setdefault("SPARK_CONF_DIR", str(LOG4J2_SETTINGS.parent))
        return False
    return os.environ.setdefault("SPARK_CONF_DIR", str(empty)) == str(empty)


def _holds_settings(directory: Path) -> bool:
    try:
        return any(not entry.name.endswith(".template") for entry in directory.iterdir())
    except OSError:
        return False


def user_conf_dir() -> Path | None:
    """The Spark configuration directory, found as Spark's launcher finds it
    (load-spark-env.sh): SPARK_CONF_DIR, else $SPARK_HOME/conf when it holds more than
    Spark's templates; None when neither. Once `spark_environment` has run, this may be
    one of compactlog's own directories, which hold no spark-defaults.conf."""
    given = os.environ.get("SPARK_CONF_DIR")
    if given:
        return Path(given)
    home = os.environ.get("SPARK_HOME")
    if home and _holds_settings(Path(home) / "conf"):
        return Path(home) / "conf"
    return None


def user_spark_defaults() -> dict[str, str]:
    """The settings of spark-defaults.conf in the Spark configuration directory
    (`user_conf_dir`): the user's, since compactlog's own directories hold none. Empty
    when there is no such file or it cannot be read."""
    directory = user_conf_dir()
    if directory is None:
        return {}
    path = directory / "spark-defaults.conf"
    try:
        with path.open(encoding="utf-8") as text:
            # Imported only for a file to read: it imports xml and urllib (45 ms).
            import javaproperties

            found = javaproperties.load(text)
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, ValueError) as error:
        # Spark's launcher would stumble on it too; say so rather than drop it silently.
        logging.getLogger(__name__).warning(
            "%s: not read (%s); compactlog's Spark defaults apply", path, error)
        return {}
    # Spark trims each value (Utils.getPropertiesFromFile).
    return {str(key): str(value).strip() for key, value in found.items()}


def default_master() -> str:
    """The master when none is given: spark.master of the user's spark-defaults.conf, as
    spark-submit takes it, else local[*]."""
    return user_spark_defaults().get("spark.master") or DEFAULT_MASTER


def session_settings(master: str, conf: Mapping[str, str],
                     user_defaults: Mapping[str, str]) -> dict[str, str]:
    """The settings the session builder is given (see the module for their order):
    compactlog's defaults less those the user's spark-defaults.conf holds, then `conf`."""
    settings = dict(DEFAULT_CONF)
    if master.startswith("local") or master.startswith("spark://127.") or (
        master.startswith("spark://localhost")
    ):
        settings.update(LOCAL_CONF)
    settings = {key: value for key, value in settings.items() if key not in user_defaults}
    settings.update(conf)
    return settings


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


def start_session(
    master: str | None = None,
    conf: Mapping[str, str] | None = None,
    app_name: str = "compactlog-compaction",
    log_file: Path | None = None,
) -> SparkSession:
    """The session on `master` (None: `default_master`); with `log_file`, everything
    Spark's side prints goes there instead of this process' stdout and stderr (see
    launch_jvm_logging_to)."""
    user_defaults = user_spark_defaults()
    master = master or user_defaults.get("spark.master") or DEFAULT_MASTER
    our_conf_dir = spark_environment()
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app_name)
    settings = session_settings(master, conf or {}, user_defaults)
    # PySpark keeps its gateway (the JVM) in a class attribute: only a JVM about to
    # start takes options.
    if getattr(SparkContext, "_gateway", None) is None:
        # Set only when there is something to add: an empty value set here would
        # override the user's own in spark-defaults.conf.
        options = driver_java_options({**user_defaults, **settings}, our_conf_dir)
        if options:
            settings["spark.driver.extraJavaOptions"] = options
        settings.update(unix_socket_conf(master, {**user_defaults, **settings}))
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
