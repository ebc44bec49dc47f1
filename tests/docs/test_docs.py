"""Documentation stays true: generated references are current, every command has examples."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator

import click
import pytest
from click.testing import CliRunner

from compactlog.cli import COMMANDS, cli
from compactlog.config import TOPIC_KEYS
from support.paths import ROOT


def commands(command: click.Command, path: tuple[str, ...] = ()) -> Iterator[
    tuple[tuple[str, ...], click.Command]
]:
    yield path, command
    if isinstance(command, click.Group):
        ctx = click.Context(command)
        for name in command.list_commands(ctx):  # the CLI's group imports them here
            sub = command.get_command(ctx, name)
            assert sub is not None, name
            yield from commands(sub, (*path, name))


ALL_COMMANDS = list(commands(cli))


def test_generated_docs_are_current() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_docs.py"), "--check"],
        capture_output=True, text=True,
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(("path", "command"), ALL_COMMANDS, ids=lambda v: " ".join(v)
                         if isinstance(v, tuple) else "")
def test_every_command_has_help_with_an_example(
    path: tuple[str, ...], command: click.Command
) -> None:
    # Through the CLI's entry: a help rendered from a bare click.Context would also make
    # click cache a help option without the group's `-h` on the command.
    result = CliRunner().invoke(cli, [*path, "--help"], prog_name="compactlog")
    assert result.exit_code == 0, result.output
    text = result.output
    assert "Example" in text, f"`compactlog {' '.join(path)} --help` shows no example"
    for param in command.params:
        if isinstance(param, click.Option) and not param.hidden:
            assert param.help, f"option {param.opts} of {path} has no help text"


def reference_blocks() -> dict[str, str]:
    """docs/cli.md's help blocks by heading: `compactlog topics create` -> its text."""
    text = (ROOT / "docs" / "cli.md").read_text()
    blocks = re.findall(r"^## `([^`]+)`\n\n```\n(.*?)\n```$", text, re.S | re.M)
    return dict(blocks)


def test_the_cli_reference_is_the_live_help_of_every_command() -> None:
    """Each block of docs/cli.md is what `compactlog ... --help` prints at 100 columns,
    run through the CLI's entry (so the group's `-h` is in it: a help rendered from a
    bare click.Context left it out, and the generator's --check compared that rendering
    with itself)."""
    blocks = reference_blocks()
    assert set(blocks) == {" ".join(("compactlog", *path)) for path, _ in ALL_COMMANDS}
    for path, _ in ALL_COMMANDS:
        result = CliRunner().invoke(cli, [*path, "--help"], prog_name="compactlog",
                                    terminal_width=100)
        assert result.exit_code == 0, result.output
        name = " ".join(("compactlog", *path))
        assert blocks[name] == result.output.rstrip("\n"), f"docs/cli.md's `{name}` is stale"
        assert "-h, --help" in blocks[name], name


def test_the_help_of_a_real_process_matches_the_reference() -> None:
    """The same, for the installed entry point in a process of its own."""
    blocks = reference_blocks()
    for path in ((), ("topics",), ("topics", "create")):
        result = subprocess.run(
            [sys.executable, "-m", "compactlog", *path, "-h"], capture_output=True, text=True,
            env={**os.environ, "COLUMNS": "100"}, check=True)
        assert result.stdout.rstrip("\n") == blocks[" ".join(("compactlog", *path))]


def test_the_lazy_command_list_shows_each_commands_own_help() -> None:
    """`compactlog --help` lists the commands from COMMANDS without importing them; each
    line there is the command's own first line."""
    for name, (_, short_help) in COMMANDS.items():
        command = cli.get_command(click.Context(cli), name)
        assert command is not None
        expected = "" if command.hidden else command.get_short_help_str(limit=1000)
        assert short_help == expected, f"COMMANDS[{name!r}] differs from its docstring"


def test_every_command_and_option_is_in_the_cli_reference() -> None:
    reference = (ROOT / "docs" / "cli.md").read_text()
    for path, command in ALL_COMMANDS:
        assert f"## `{' '.join(('compactlog', *path))}`" in reference
        for param in command.params:
            for opt in getattr(param, "opts", []):
                if opt.startswith("--"):
                    assert opt in reference, f"{opt} of {path} missing from docs/cli.md"


def test_every_config_key_is_documented() -> None:
    reference = (ROOT / "docs" / "configuration.md").read_text()
    for key in TOPIC_KEYS:
        assert f"## `{key.name}`" in reference
        assert key.doc


def test_readme_names_the_two_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "scripts/demo.sh" in readme and "scripts/test.sh" in readme
    ci = (ROOT / ".ci" / "run").read_text()
    assert "scripts/test.sh" in ci


def test_every_server_security_setting_is_documented() -> None:
    from compactlog.cli.serve import AUTHORIZATION_SETTINGS, COMPACTION_SETTINGS
    from compactlog.config import SERVER_SECURITY_KEYS

    declared = {key.name for key in SERVER_SECURITY_KEYS}
    assert "allowed_strategy_functions" in COMPACTION_SETTINGS
    assert declared == {f"authorization.{name}" for name in AUTHORIZATION_SETTINGS} | {
        "compaction.allowed_strategy_functions"}
    reference = (ROOT / "docs" / "configuration.md").read_text()
    for name in declared:
        assert f"## `{name}`" in reference
