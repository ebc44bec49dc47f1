"""`compactlog worker start/status/stop`: a warm compaction worker left running for the
CLI, so that `compactlog compact` pays Spark's start-up once, not on every run.

Invariant: `start` returns only once the worker has published itself
(compaction-worker.json, compaction/daemon.py) with its engine warm, or with a one-line
error (and the worker's log) if it could not start; it never leaves a second worker on a
data directory that has a live one. The worker stops by itself after its idle timeout.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

import click
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from compactlog.cli import Context
from compactlog.cli.output import stderr_console, stdout_console
from compactlog.compaction import load_factory
from compactlog.compaction.daemon import (
    DEFAULT_IDLE_TIMEOUT_S,
    WorkerGone,
    WorkerInfo,
    ask,
    running_worker,
    serve,
)
from compactlog.compaction.spark_session import MASTER_DEFAULT_TEXT, default_master
from compactlog.compaction.worker import CompactionWorker
from compactlog.config import parse_assignments
from compactlog.errors import CompactlogError
from compactlog.pids import is_alive

LOG_FILE = "compaction-worker.log"
START_TIMEOUT_S = 180.0
console = stderr_console()


class WorkerStartError(CompactlogError):
    """The worker process exited, or did not get ready in time."""


def spark_options(command: Any) -> Any:
    """The Spark options `start` and the hidden `run` share with `compact`."""
    for option in reversed([
        click.option("--spark-master", envvar="COMPACTLOG_SPARK_MASTER",
                     default=default_master, show_default=MASTER_DEFAULT_TEXT,
                     help="Where Spark runs, as for `compact`."),
        click.option("--spark-conf", "spark_conf", multiple=True, metavar="KEY=VALUE",
                     help="A Spark setting, passed through (repeatable)."),
        click.option("--service", envvar="COMPACTLOG_COMPACTION_SERVICE", default=None,
                     metavar="MODULE:NAME",
                     help="The compaction service factory, by import path. Default: Spark."),
        click.option("--idle-timeout", "idle_timeout_s", type=float,
                     default=DEFAULT_IDLE_TIMEOUT_S, show_default=True, metavar="SECONDS",
                     help="Stop after this long without a compaction or status request."),
    ]):
        command = option(command)
    return command


@click.group()
def worker() -> None:
    """A warm compaction worker for `compactlog compact` (Spark kept running).

    `compactlog compact` on a data directory with a running worker sends the run to it
    (unless a server with an admin API runs there: then to the server's worker), so it
    pays no Spark start-up. The worker stops after its idle timeout (10 minutes by
    default), on `worker stop`, or on SIGTERM; its log is <data dir>/compaction-worker.log.

    \b
    Examples:
      compactlog worker start
      compactlog worker start --idle-timeout 3600 --spark-master local[2]
      compactlog compact prices          # goes to the worker
      compactlog worker status
      compactlog worker stop
    """


@worker.command()
@spark_options
@click.pass_obj
def start(ctx: Context, spark_master: str, spark_conf: tuple[str, ...], service: str | None,
          idle_timeout_s: float) -> None:
    """Start a worker in the background and wait until it is warm.

    \b
    Examples:
      compactlog worker start
      compactlog worker start --idle-timeout 3600 --spark-conf spark.driver.memory=4g
    """
    if idle_timeout_s <= 0:
        raise click.BadParameter("must be more than 0", param_hint="--idle-timeout")
    existing = running_worker(ctx.data_dir)
    if existing is not None:
        click.echo(f"a compaction worker already runs on {ctx.data_dir} (pid {existing.pid}, "
                   f"{existing.spark_master}); `compactlog worker stop` stops it")
        return
    ctx.data_dir.mkdir(parents=True, exist_ok=True)
    log_path = ctx.data_dir / LOG_FILE
    args = [sys.executable, "-m", "compactlog", "--data-dir", str(ctx.data_dir),
            "--log-level", "info", "worker", "run", "--spark-master", spark_master,
            "--idle-timeout", str(idle_timeout_s),
            *(arg for item in spark_conf for arg in ("--spark-conf", item)),
            *(["--service", service] if service else [])]
    with log_path.open("ab") as log_file:
        process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log_file,
                                   stderr=log_file, start_new_session=True)
    info = _wait_until_ready(ctx.data_dir, process, log_path)
    click.echo(f"compaction worker ready: pid {info.pid}, {info.spark_master}, stops after "
               f"{info.idle_timeout_s:g} s idle (log: {log_path})")


def _wait_until_ready(data_dir: Path, process: subprocess.Popen[bytes],
                      log_path: Path) -> WorkerInfo:
    deadline = time.monotonic() + START_TIMEOUT_S
    with Progress(SpinnerColumn(), TextColumn("[bold]{task.description}"),
                  TimeElapsedColumn(), console=console, transient=True) as progress:
        progress.add_task("starting the compaction worker (Spark warm-up)")
        while True:
            info = running_worker(data_dir)
            if info is not None and info.pid == process.pid:
                return info
            if process.poll() is not None:
                raise WorkerStartError(f"the compaction worker exited with status "
                                       f"{process.returncode} before it was ready; its "
                                       f"log ({log_path}) ends:\n{_tail(log_path)}")
            if time.monotonic() > deadline:
                process.terminate()
                raise WorkerStartError(f"the compaction worker was not ready after "
                                       f"{START_TIMEOUT_S:g} s; stopped it. Its log: "
                                       f"{log_path}")
            time.sleep(0.1)


def _tail(path: Path, lines: int = 10) -> str:
    try:
        with path.open(errors="replace") as text:
            return "".join(deque(text, lines)).rstrip()
    except OSError:
        return "(no log)"


@worker.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def status(ctx: Context, as_json: bool) -> None:
    """Show the worker of the data directory: pid, runs, idle time.

    Exits with status 3 when no worker runs.

    \b
    Examples:
      compactlog worker status
      compactlog worker status --json
    """
    info = running_worker(ctx.data_dir)
    if info is None:
        click.echo(f"no compaction worker runs on {ctx.data_dir}", err=True)
        sys.exit(3)
    answer = ask(info, {"op": "status"}, timeout_s=10)
    if as_json:
        click.echo(json.dumps(answer, indent=2))
        return
    table = Table("pid", "spark master", "runs", "idle", "stops after idle", "warm-up",
                  title=f"Compaction worker of {ctx.data_dir}")
    table.add_row(str(answer["pid"]), answer["spark_master"], str(answer["runs"]),
                  f"{answer['idle_s']:.0f} s", f"{answer['idle_timeout_s']:g} s",
                  f"{answer['warm_up_s']:.1f} s")
    stdout_console().print(table)


@worker.command()
@click.pass_obj
def stop(ctx: Context) -> None:
    """Stop the worker (after the run in progress, if any).

    \b
    Example:
      compactlog worker stop
    """
    info = running_worker(ctx.data_dir)
    if info is None:
        click.echo(f"no compaction worker runs on {ctx.data_dir}")
        return
    try:
        ask(info, {"op": "stop"}, timeout_s=None)
    except WorkerGone:
        os.kill(info.pid, signal.SIGTERM)  # it did not answer
    deadline = time.monotonic() + 60
    while is_alive(info.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    click.echo(f"stopped the compaction worker (pid {info.pid})")


@worker.command("run", hidden=True)
@spark_options
@click.pass_obj
def run(ctx: Context, spark_master: str, spark_conf: tuple[str, ...], service: str | None,
        idle_timeout_s: float) -> None:
    """The worker process itself (`worker start` runs it in the background).

    \b
    Example:
      compactlog worker run --idle-timeout 60
    """
    from compactlog.cli.compaction_report import report_json

    settings: dict[str, Any] = {"spark.master": spark_master,
                                "spark.conf": parse_assignments(spark_conf)}
    compaction = CompactionWorker(ctx.data_dir, load_factory(service), settings, ctx.target)
    serve(compaction, ctx.data_dir, idle_timeout_s, spark_master, report_json)
