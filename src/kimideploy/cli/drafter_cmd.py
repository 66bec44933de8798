"""`kimideploy drafter ...`: the drafter registry."""

from __future__ import annotations

import json

import click

from kimideploy.cli.context import CliState
from kimideploy.cli.table import format_table


@click.group()
def drafter() -> None:
    """Inspect the drafter registry."""


@drafter.command("list")
@click.option("-o", "--output", type=click.Choice(["table", "json"]), default="table")
@click.pass_obj
def list_drafters(state: CliState, output: str) -> None:
    """Name, method, source, tokens, layer ids with their convention, and status."""
    from kimideploy.services.drafters import drafter_rows

    rows = drafter_rows(state.project().project)
    if output == "json":
        click.echo(json.dumps(rows, indent=2))
        return
    click.echo(format_table(rows))
