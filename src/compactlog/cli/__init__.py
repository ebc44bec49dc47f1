"""The `compactlog` command: a thin layer over the library.

Errors print one line, `error: ...`, with no traceback unless --debug is given.
Start-up imports only click: each command's module (and the store, server, Spark it
needs) is imported when that command runs (`LazyGroup`), so `--version` and `--help`
stay fast; tests/cli/test_cli_imports.py checks which modules `--version` loads.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from compactlog.errors import CompactlogError, UnknownTopicError

if TYPE_CHECKING:
    from compactlog.backend import Document

DEFAULT_DATA_DIR = "./compactlog-data"


class Context:
    """What every command needs: where the data is, and whether to show tracebacks.

    `target` is what the store opens: the data directory, or an s3:// URL. `data_dir` is
    always local: the data directory itself, or for an s3:// URL the local directory of
    its log segments, locks and read cache (COMPACTLOG_LOCAL_DIR, else one under
    ~/.cache/compactlog; storage/store.py's default_local_dir). The files a running
    server or worker leaves for the CLI (server.json, compaction-worker.json) are
    there; the credentials and the ACLs are with the topics (`state_document`)."""

    def __init__(self, data_dir: str | Path, debug: bool) -> None:
        self.debug = debug
        self.set_data_dir(data_dir)

    def set_data_dir(self, value: str | Path) -> None:
        # Imported here, not at start-up: the store's modules bring pyarrow.
        from compactlog.backend import Location

        self.location = Location.parse(value)
        self.target: str | Path = str(self.location) if self.location.is_s3 else Path(value)
        if self.location.is_s3:
            from compactlog.storage import default_local_dir

            self.data_dir = default_local_dir(self.location)
        else:
            self.data_dir = Path(value)

    def state_document(self, name: str) -> Document:
        """The store's document `name` (credentials, ACLs), without opening the store."""
        from compactlog.backend import state_document

        return state_document(self.location, self.data_dir, name)


class LazyGroup(click.Group):
    """A group whose subcommands are imported when one runs, not when the CLI starts.

    `lazy` maps each command name to "module:attribute" and its one-line help; the
    help is kept here so `compactlog --help` lists every command without importing
    any (tests/docs/test_docs.py checks it against each command's own help)."""

    def __init__(self, *args: Any, lazy: dict[str, tuple[str, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = lazy

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in self.lazy:
            module, attribute = self.lazy[cmd_name][0].split(":")
            command: click.Command = getattr(import_module(module), attribute)
            _accept_data_dir_everywhere(command)
            self.add_command(command, cmd_name)
        return self.commands.get(cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # A command with no help here is hidden (compact-worker, run by the server).
        rows = [(name, self.lazy[name][1]) for name in self.list_commands(ctx)
                if name in self.lazy and self.lazy[name][1]]
        rows += [(name, command.get_short_help_str()) for name, command in self.commands.items()
                 if name not in self.lazy and not command.hidden]
        rows.sort()
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


# Every command: where it lives and its one-line help as `compactlog --help` shows it.
COMMANDS: dict[str, tuple[str, str]] = {
    "acls": ("compactlog.cli.acl_commands:acls",
             'Manage the server\'s ACLs (docs/server.md, "Authorization").'),
    "compact": ("compactlog.cli.compact:compact",
                "Compact TOPIC: keep the surviving record per key in a new compacted ledger."),
    "compaction-status": ("compactlog.cli.compaction_status:compaction_status",
                          "Show the compaction status of each partition of TOPIC."),
    "compact-worker": ("compactlog.cli.compact:compact_worker", ""),
    "config-docs": ("compactlog.cli.docs:config_docs",
                    "Print the reference of every topic config key as Markdown."),
    "consume": ("compactlog.cli.consume:consume",
                "Print the records of TOPIC, partition by partition, in offset order."),
    "groups": ("compactlog.cli.group_commands:groups",
               "List, describe, delete consumer groups and reset their offsets."),
    "produce": ("compactlog.cli.produce_command:produce",
                "Append records to TOPIC, one per input line."),
    "serve": ("compactlog.cli.serve:serve",
              "Serve the data directory over the Kafka wire protocol."),
    "topics": ("compactlog.cli.topic_commands:topics",
               "Create, list, describe, alter and delete topics."),
    "users": ("compactlog.cli.users:users",
              "Manage the SASL users (SCRAM-SHA-256, SCRAM-SHA-512 and PLAIN) of the server."),
    "worker": ("compactlog.cli.worker_command:worker",
               "A warm compaction worker for `compactlog compact` (Spark kept running)."),
}


@click.group(
    cls=LazyGroup,
    lazy=COMMANDS,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog="""\b
Examples:
  compactlog topics create prices --partitions 4 --config cleanup.policy=compact
  printf 'AAPL\\t189.5\\nMSFT\\t410.2\\n' | compactlog produce prices
  compactlog consume prices --from earliest --format json
""",
)
@click.option(
    "--data-dir",
    envvar="COMPACTLOG_DATA_DIR",
    default=DEFAULT_DATA_DIR,
    show_default=True,
    help="The data directory, or s3://BUCKET/PREFIX (or set COMPACTLOG_DATA_DIR).",
)
@click.option("--debug", is_flag=True, help="Show tracebacks and debug logs.")
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="warning",
    show_default=True,
    help="What the logs on stderr include.",
)
@click.version_option(package_name="compactlog")
@click.pass_context
def cli(ctx: click.Context, data_dir: str, debug: bool, log_level: str) -> None:
    """compactlog: a message log with key-compacted topics.

    Producers append keyed records; a null value (a tombstone) deletes a key. Sealed
    segments are Parquet files, readable by Spark, DuckDB and Polars.
    """
    level = logging.DEBUG if debug else getattr(logging, log_level.upper())
    logging.basicConfig(
        level=level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    quiet_secret_loggers()
    ctx.obj = Context(data_dir, debug)
    global _current
    _current = ctx.obj


# The command's Context, once the group has run: main() names its data location in
# errors that concern it.
_current: Context | None = None


def where(context: Context) -> str:
    """The data location, as an error names it: `the data directory DIR` or the URL."""
    if context.location.is_s3:
        return str(context.location)
    return f"the data directory {context.data_dir}"


def error_line(error: CompactlogError) -> str:
    """The one line an error prints: an unknown topic names where it was looked for,
    since a mistyped --data-dir or COMPACTLOG_DATA_DIR is the usual cause."""
    if isinstance(error, UnknownTopicError) and _current is not None:
        return f"{error} in {where(_current)}"
    return str(error)


# Their DEBUG logs print signed requests: the session token and the signing material.
SECRET_LOGGERS = ("botocore", "boto3", "s3transfer", "urllib3")


def quiet_secret_loggers() -> None:
    """Never log what the AWS libraries log at DEBUG, whatever --log-level says."""
    for name in SECRET_LOGGERS:
        logger = logging.getLogger(name)
        logger.setLevel(max(logger.getEffectiveLevel(), logging.INFO))


def _set_data_dir(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if value is not None:
        ctx.find_object(Context).set_data_dir(value)  # type: ignore[union-attr]


def _accept_data_dir_everywhere(command: click.Command) -> None:
    """`--data-dir` after the command name too (`compactlog serve --data-dir DIR`), as
    the README's "pass --data-dir to each command" reads."""
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            _accept_data_dir_everywhere(sub)
    elif not any("--data-dir" in getattr(p, "opts", ()) for p in command.params):
        command.params.append(click.Option(
            ["--data-dir"], default=None, expose_value=False, callback=_set_data_dir,
            help="The data directory or s3:// URL (as `compactlog --data-dir DIR ...`)."))


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the CLI and turn compactlog errors into one-line messages."""
    debug = "--debug" in (argv if argv is not None else sys.argv[1:])
    try:
        cli.main(args=argv, prog_name="compactlog", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as error:
        error.show()
        sys.exit(error.exit_code)
    except CompactlogError as error:
        if debug:
            raise
        click.echo(f"error: {error_line(error)}", err=True)
        sys.exit(1)
    except BrokenPipeError:
        sys.stderr.close()  # the reader went away (e.g. `| head`); not an error
        sys.exit(0)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as error:  # the last line of defence: one line, not a traceback
        if debug:
            raise
        click.echo(
            f"error: unexpected {type(error).__name__}: {error} (run with --debug for a traceback)",
            err=True,
        )
        sys.exit(1)


def pass_context(func: Callable[..., Any]) -> Callable[..., Any]:
    return click.pass_obj(func)
