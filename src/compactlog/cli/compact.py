"""`compactlog compact` (and the server's `compact-worker`): where a run goes (the
server, a warm worker, or this process) and its progress; the summary it prints is
cli/compaction_report.py's."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import click
from click.core import ParameterSource
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from compactlog.cli import Context
from compactlog.cli.admin_client import AdminClient, BusyServerError, report_from_json
from compactlog.cli.compaction_report import report_json, summary_table
from compactlog.cli.output import stderr_console, stdout_console
from compactlog.compaction import (
    CompactionReport,
    CompactionServiceFactory,
    PartitionSummary,
    load_factory,
)
from compactlog.compaction.daemon import WorkerGone, WorkerInfo, ask, running_worker
from compactlog.compaction.rolled import RollThrough
from compactlog.compaction.runner import chosen_partitions
from compactlog.compaction.spark_jobs import SPARK_START, SPARK_TASKS
from compactlog.compaction.spark_session import MASTER_DEFAULT_TEXT, default_master
from compactlog.compaction.status import CompactionStatus, is_locked, read_status
from compactlog.compaction.worker import CompactionWorker, protocol_stdout
from compactlog.compaction.worker import serve as serve_requests
from compactlog.config import parse_assignments
from compactlog.errors import CompactlogError
from compactlog.server.info import running_server
from compactlog.storage import LogStore, Partition

console = stderr_console()


class CompactionFailedError(CompactlogError):
    """A run the server started failed (the message carries its error)."""
POLL_S = 0.5
STAGES = ["plan", "phase 1: find survivors", "phase 2: write ledgers", "commit", "done"]


@click.command()
@click.argument("topic")
@click.option("--partition", "-p", "partitions", type=int, multiple=True,
              help="Compact only this partition (repeatable). Default: every partition.")
@click.option("--spark-master", envvar="COMPACTLOG_SPARK_MASTER", default=default_master,
              show_default=MASTER_DEFAULT_TEXT,
              help="Where Spark runs: local[*], local[N], spark://HOST:7077, or any master "
                   "Spark accepts (or set COMPACTLOG_SPARK_MASTER).")
@click.option("--spark-conf", "spark_conf", multiple=True, metavar="KEY=VALUE",
              help="A Spark setting, passed through (repeatable), e.g. "
                   "spark.driver.memory=2g. It wins over your spark-defaults.conf (in "
                   "SPARK_CONF_DIR or $SPARK_HOME/conf), which wins over compactlog's "
                   "defaults.")
@click.option("--service", envvar="COMPACTLOG_COMPACTION_SERVICE", default=None,
              metavar="MODULE:NAME",
              help="The compaction service factory to use, by import path (PIP-278). "
                   "Default: the Spark service.")
@click.option("--server", "server_url", envvar="COMPACTLOG_SERVER", default=None,
              metavar="URL",
              help="Ask a running server to compact, through its admin API (the URL of "
                   "`serve --admin-listen`, or set COMPACTLOG_SERVER); the server's own "
                   "compaction settings apply.")
@click.option("--local", "local", is_flag=True,
              help="Compact in this process (Spark starts here) even when a server with an "
                   "admin API runs on the data directory.")
@click.option("--without-spark", is_flag=True,
              help="Run the compaction's tasks in this process without Spark (no JVM): "
                   "the same task code, files and commit as a Spark job, for tests and "
                   "embedded use (as the topic config compaction.without.spark=true). "
                   "Implies --local.")
@click.option("--no-wait", is_flag=True,
              help="On a server (--server, or the one running on the data directory): print "
                   "the run's id and return without waiting for it.")
@click.option("--roll/--no-roll", default=True, show_default=True,
              help="Roll the active segment first, so that the run covers every record "
                   "produced until now (as Pulsar's compaction); --no-roll leaves it, as "
                   "Kafka's cleaner does. min.compaction.lag.ms applies either way.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.pass_obj
def compact(
    ctx: Context,
    topic: str,
    partitions: tuple[int, ...],
    spark_master: str,
    spark_conf: tuple[str, ...],
    service: str | None,
    server_url: str | None,
    local: bool,
    without_spark: bool,
    no_wait: bool,
    roll: bool,
    as_json: bool,
) -> None:
    """Compact TOPIC: keep the surviving record per key in a new compacted ledger.

    Covers every record produced until now, as Pulsar's compaction does: the active
    segment is rolled first (by the server when one runs), then every segment whose
    records are older than min.compaction.lag.ms is compacted with the previous ledger.
    Finds the survivors with Spark, writes new ledger files and commits the new
    (horizon, ledger) pair atomically. The raw log is not changed. The server's
    automatic compaction leaves the active segment, as Kafka's cleaner does; so does
    --no-roll. Works while a producer or server writes the same data directory; if
    another process (the server's cleaner) is compacting the same partitions, waits for
    that run and reports it.

    When `compactlog serve` runs on the data directory with an admin API, the run goes
    to the server's warm compaction worker (no Spark start-up here); else, when a
    worker left by `compactlog worker start` runs there, to that one; unless --local or
    a Spark option (--spark-master, --spark-conf, --service) or --without-spark is
    given. Every run is a Spark job unless --without-spark (or the topic's
    compaction.without.spark) says otherwise. A run here writes Spark's own output (its
    JVM's log, its Python workers' output) to a file in the temporary directory, not to
    the terminal; --debug names the file. Starting Spark's JVM is shown apart from the
    run.

    \b
    Examples:
      compactlog compact prices
      compactlog compact prices --partition 0 --partition 3
      compactlog compact prices --spark-master spark://127.0.0.1:7077 \\
          --spark-conf spark.executor.memory=4g
      compactlog compact prices --server http://127.0.0.1:9093
      compactlog compact prices --local     # here, even beside a running server
      compactlog compact prices --without-spark   # here, in this process, no JVM
    """
    spark_options = _spark_options_given(spark_conf, service) or without_spark
    if server_url is not None:
        if spark_options or local:
            raise click.UsageError("--spark-master, --spark-conf, --service, --without-spark "
                                   "and --local do not go with --server: the server's "
                                   "compaction settings apply")
        _compact_on_server(AdminClient(server_url), topic, list(partitions) or None,
                           no_wait, as_json, roll)
        return
    if not local and not spark_options:
        server = running_server(ctx.data_dir)
        if server is not None and server.admin is not None:
            # The server's worker is warm: no Spark start-up, and its settings apply.
            console.print(f"compacting on the running server's compaction worker "
                          f"({server.admin}); --local runs it here")
            _compact_on_server(AdminClient(server.admin), topic, list(partitions) or None,
                               no_wait, as_json, roll)
            return
        warm = running_worker(ctx.data_dir)
        if warm is not None and not no_wait:
            report = _compact_on_worker(warm, topic, list(partitions) or None, roll)
            if report is not None:
                _print_report(report, as_json)
                return
    if no_wait:
        raise click.UsageError("--no-wait needs a server to run the compaction: --server URL, "
                               "or a server with an admin API on the data directory")
    settings: dict[str, Any] = {
        "spark.master": spark_master,
        "spark.conf": parse_assignments(spark_conf),
        # Spark's JVM, its Python workers and py4j print into a file, not over the
        # progress bar and the summary (created only if the run starts Spark).
        "spark.log.file": spark_log_path(),
        "compaction.without.spark": without_spark,
    }
    if ctx.debug:
        console.print(f"Spark's output (JVM, Python workers, py4j), if this run starts "
                      f"Spark: {settings['spark.log.file']}")
    with LogStore.open(ctx.target, read_only=True) as store:
        # Fail fast on a bad topic or partition, before Spark starts.
        chosen = chosen_partitions(store, topic, list(partitions) if partitions else None)
        held = _wait_for_other_runs(chosen)
        if held is not None:
            report = held  # another process' run covered every partition: report it
        else:
            report = compact_with_progress(
                store, topic, load_factory(service), settings,
                list(partitions) if partitions else None, transient=as_json,
                roll=roll, roll_through=_roll_through_server(ctx),
            )
    _print_report(report, as_json)


def _roll_through_server(ctx: Context) -> RollThrough:
    """How a run here gets a running server's active segments rolled: through its
    admin API (the server is their writer); False when it has none."""

    def ask_server(topic: str, partitions: list[int]) -> bool:
        server = running_server(ctx.data_dir)
        if server is None or server.admin is None:
            return False
        AdminClient(server.admin).post(f"/v1/topics/{quote(topic, safe='')}/roll",
                                       {"partitions": partitions})
        return True

    return ask_server


def _print_report(report: CompactionReport, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(report_json(report), indent=2))
        return
    stdout_console().print(summary_table(report))
    if report.startup_s:
        console.print(f"started Spark (its JVM and session) in {report.startup_s:.1f}s, apart "
                      "from the run; `compactlog worker start` keeps one warm for the next "
                      "runs", markup=False)
    kept = [str(p.partition) for p in report.partitions if p.active_not_rolled]
    if kept:
        console.print(f"partition(s) {', '.join(kept)}: the active segment was not rolled "
                      "(another process writes it, and it has no admin API to ask): this "
                      "run covered the rolled segments only")


def _compact_on_worker(worker: WorkerInfo, topic: str, partitions: list[int] | None,
                       roll: bool) -> CompactionReport | None:
    """The run, on the warm worker `compactlog worker start` left (compaction/daemon.py);
    None if the worker went away before it answered (then the CLI runs it itself)."""
    console.print(f"compacting on the warm compaction worker (pid {worker.pid}, "
                  f"{worker.spark_master}); --local runs it here")
    with Progress(SpinnerColumn(), TextColumn("[bold]{task.description}"),
                  TimeElapsedColumn(), console=console, transient=True) as progress:
        progress.add_task(f"compaction of {topic} on the worker")
        try:
            answer = ask(worker, {"op": "compact", "topic": topic, "partitions": partitions,
                                  "roll": roll})
        except WorkerGone as gone:
            console.print(f"{gone}; compacting here instead")
            return None
    if "error" in answer:
        raise CompactionFailedError(f"compaction of {topic} on the worker failed: "
                                    f"{answer['error']}")
    return report_from_json(answer["report"])


def _spark_options_given(spark_conf: tuple[str, ...], service: str | None) -> bool:
    """Whether the user chose where or how Spark runs (on the command line or through
    its environment variables): then the run is theirs, not the server's."""
    source = click.get_current_context().get_parameter_source("spark_master")
    return bool(spark_conf or service) or source in (ParameterSource.COMMANDLINE,
                                                      ParameterSource.ENVIRONMENT)


def _wait_for_other_runs(chosen: list[Partition]) -> CompactionReport | None:
    """A run of another process (the server's cleaner, another `compact`) holds some of
    the partitions: wait for it, as `compact --server` waits for the server's own run.
    When it held all of them, return its report (from the status files) rather than
    start a run that would find nothing new; raise if it failed."""
    locked = [p for p in chosen if is_locked(p.directory)]
    if not locked:
        return None
    names = ", ".join(str(p.index) for p in locked)
    with Progress(SpinnerColumn(), TextColumn("[bold]{task.description}"),
                  TimeElapsedColumn(), console=console, transient=True) as progress:
        progress.add_task(f"partition(s) {names} are being compacted by another process; "
                          "waiting for that run")
        while any(is_locked(p.directory) for p in locked):
            time.sleep(POLL_S)
    if len(locked) < len(chosen):
        return None
    statuses = {p.index: read_status(p.directory) for p in chosen}
    failed = {index: s for index, s in statuses.items() if s.state != "SUCCESS"}
    if failed:
        index, status = next(iter(failed.items()))
        raise CompactionFailedError(f"the other process' compaction of partition {index} "
                                    f"failed: {status.error}")
    return _report_from_statuses(chosen[0].topic, statuses)


def _report_from_statuses(topic: str, statuses: dict[int, CompactionStatus]
                          ) -> CompactionReport:
    fields = {f.name for f in dataclasses.fields(PartitionSummary)}
    summaries = [PartitionSummary(**{k: v for k, v in s.last_success.items() if k in fields})
                 for s in statuses.values()]
    first = next(iter(statuses.values()))
    started = min(s.last_success.get("started_ms") or 0 for s in statuses.values())
    finished = max(s.last_success.get("finished_ms") or 0 for s in statuses.values())
    return CompactionReport(topic, first.run_id or "?", (finished - started) / 1000,
                            summaries)


def _compact_on_server(client: AdminClient, topic: str, partitions: list[int] | None,
                       no_wait: bool, as_json: bool, roll: bool = True) -> None:
    body: dict[str, Any] = {"partitions": partitions} if partitions else {}
    if not roll:
        body["roll"] = False  # the server rolls by default, as `compact` does
    try:
        run = client.post(f"/v1/topics/{quote(topic, safe='')}/compaction", body)
    except BusyServerError as error:
        if no_wait or len(error.runs) != 1:
            raise  # held by another process, or by several runs: say so
        # The server's own cleaner got there first: report that run instead.
        console.print(f"{error}: waiting for run {error.runs[0]}")
        run = client.get(f"/v1/compactions/{error.runs[0]}")
    if no_wait:
        click.echo(json.dumps(run, indent=2) if as_json
                   else f"compaction run {run['id']} started on {client.url}")
        return
    with Progress(SpinnerColumn(), TextColumn("[bold]{task.description}"),
                  TimeElapsedColumn(), console=console, transient=True) as progress:
        progress.add_task(f"compaction run {run['id']} of {topic} on the server")
        while run["state"] == "RUNNING":
            time.sleep(POLL_S)
            run = client.get(f"/v1/compactions/{run['id']}")
    if run["state"] != "SUCCESS":
        raise CompactionFailedError(f"compaction run {run['id']} of {topic} failed: "
                                    f"{run['error']}")
    if as_json:
        click.echo(json.dumps(run["report"], indent=2))
    else:
        stdout_console().print(summary_table(report_from_json(run["report"])))


def compact_with_progress(
    store: LogStore,
    topic: str,
    factory: CompactionServiceFactory,
    settings: dict[str, Any],
    partitions: list[int] | None = None,
    transient: bool = False,
    roll: bool = False,
    roll_through: RollThrough | None = None,
) -> CompactionReport:
    """Run one compaction of `topic` with a progress bar on stderr; stops the service.
    With `roll`, a manual compaction: the active segments are rolled first (trigger)."""
    with Progress(
        SpinnerColumn(), TextColumn("[bold]{task.description}"), BarColumn(),
        TimeElapsedColumn(), console=console, transient=transient,
    ) as progress:
        task = progress.add_task("plan", total=len(STAGES) - 1)

        current = ["plan"]

        def report_progress(stage: str, done: int, total: int) -> None:
            if stage == SPARK_TASKS:  # from the engine's thread, while its jobs run
                progress.update(task, description=f"{current[0]} · Spark tasks {done}/{total}")
                return
            if stage == SPARK_START:
                progress.update(task, description=f"{current[0]} · starting Spark (a JVM)")
                return
            current[0] = stage
            position = STAGES.index(stage) if stage in STAGES else 0
            progress.update(task, description=stage, completed=position)

        compaction = factory.new_service(store, topic, {**settings, "progress": report_progress})
        try:
            if roll:
                return compaction.trigger(partitions, roll_through)
            return compaction.compact(partitions)
        finally:
            stop = getattr(compaction, "stop", None)
            if callable(stop):
                stop()


def spark_log_path() -> Path:
    """Where this command's Spark writes its output: a new file name in the temporary
    directory, the process id and time in it."""
    return Path(tempfile.gettempdir()) / (
        f"compactlog-spark-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log")


@click.command("compact-worker", hidden=True)
@click.option("--spark-master", default=default_master, show_default=MASTER_DEFAULT_TEXT,
              help="Where Spark runs, as for `compact`.")
@click.option("--spark-conf", "spark_conf", multiple=True, metavar="KEY=VALUE",
              help="A Spark setting, passed through (repeatable).")
@click.option("--service", default=None, metavar="MODULE:NAME",
              help="The compaction service factory, by import path. Default: Spark.")
@click.option("--without-spark", is_flag=True,
              help="Run the Spark service's tasks in this process, no JVM, as for `compact`.")
@click.pass_obj
def compact_worker(ctx: Context, spark_master: str, spark_conf: tuple[str, ...],
                   service: str | None, without_spark: bool) -> None:
    """A long-lived compaction process for the server (JSON lines on stdin and stdout).

    The server starts it; it is not meant to be run by hand. Each input line
    {"id": N, "topic": T, "partitions": [..] | null} gets one output line with the run's
    report (as `compact --json` prints it) or its error. Spark stays up between runs.

    \b
    Example:
      echo '{"id": 1, "topic": "prices", "partitions": null}' | compactlog compact-worker
    """
    answers = protocol_stdout()
    settings: dict[str, Any] = {"spark.master": spark_master,
                                "spark.conf": parse_assignments(spark_conf),
                                "compaction.without.spark": without_spark}
    worker = CompactionWorker(ctx.data_dir, load_factory(service), settings, ctx.target)
    serve_requests(worker, sys.stdin, answers, report_json)
