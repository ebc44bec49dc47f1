"""Documentation stays true: generated references are current, every command has examples."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from compactlog.cli import cli
from compactlog.config import TOPIC_KEYS

ROOT = Path(__file__).resolve().parent.parent


def commands(command: click.Command, path: tuple[str, ...] = ()) -> Iterator[
    tuple[tuple[str, ...], click.Command]
]:
    yield path, command
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
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
    ctx = click.Context(command, info_name="compactlog")
    text = command.get_help(ctx)
    assert "Example" in text, f"`compactlog {' '.join(path)} --help` shows no example"
    for param in command.params:
        if isinstance(param, click.Option) and not param.hidden:
            assert param.help, f"option {param.opts} of {path} has no help text"


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
