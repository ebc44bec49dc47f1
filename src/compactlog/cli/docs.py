"""`compactlog config-docs`: the config reference, generated from config.py."""

from __future__ import annotations

import click

from compactlog.config_docs import render_docs


@click.command(name="config-docs")
def config_docs() -> None:
    """Print the reference of every topic config key as Markdown.

    \b
    Example:
      compactlog config-docs > docs/configuration.md
    """
    click.echo(render_docs(), nl=False)
    click.echo()
