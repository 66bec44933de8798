"""`kimideploy config ...`: the project file's schema and validation."""

from __future__ import annotations

import click

from kimideploy.cli.options import output_option
from kimideploy.cli.state import CliState
from kimideploy.cli.table import machine


@click.group()
def config() -> None:
    """The project file (kimideploy.yaml)."""


@config.command()
def schema() -> None:
    """Print the JSON Schema of kimideploy.yaml (for editors and CI)."""
    from kimideploy.services.rendering import config_json_schema

    click.echo(config_json_schema(), nl=False)


@config.command()
@output_option("text")
@click.pass_obj
def validate(state: CliState, output: str) -> None:
    """Validate the project file and every cross-reference in it."""
    loaded = state.project()
    project = loaded.project
    document = {
        "file": str(loaded.path),
        "valid": True,
        "clusters": sorted(project.clusters),
        "images": sorted(project.images),
        "drafters": sorted(project.drafters),
    }
    click.echo(
        machine(document, output)
        or f"{loaded.path}: valid ({len(project.clusters)} clusters, {len(project.images)} "
        f"images, {len(project.drafters)} drafters)"
    )
