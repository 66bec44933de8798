"""`kimideploy config ...`: the project file's schema and validation."""

from __future__ import annotations

import click

from kimideploy.cli.state import CliState


@click.group()
def config() -> None:
    """The project file (kimideploy.yaml)."""


@config.command()
def schema() -> None:
    """Print the JSON Schema of kimideploy.yaml (for editors and CI)."""
    from kimideploy.services.rendering import config_json_schema

    click.echo(config_json_schema(), nl=False)


@config.command()
@click.pass_obj
def validate(state: CliState) -> None:
    """Validate the project file and every cross-reference in it."""
    loaded = state.project()
    project = loaded.project
    click.echo(
        f"{loaded.path}: valid ({len(project.clusters)} clusters, {len(project.images)} images, "
        f"{len(project.drafters)} drafters)"
    )
