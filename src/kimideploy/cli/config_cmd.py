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
    """Validate the project file and every cross-reference in it; name the example's placeholder
    pins it still holds (valid, but `up`, `run` and their dry runs refuse those they would pull)."""
    from kimideploy.config.placeholders import describe, placeholders_of

    loaded = state.project()
    project = loaded.project
    pins = placeholders_of(loaded.document)
    document = {
        "file": str(loaded.path),
        "valid": True,
        "clusters": sorted(project.clusters),
        "images": sorted(project.images),
        "drafters": sorted(project.drafters),
        "placeholder_pins": [{"path": p.path, "line": p.line} for p in pins],
    }
    text = (
        f"{loaded.path}: valid ({len(project.clusters)} clusters, {len(project.images)} "
        f"images, {len(project.drafters)} drafters)"
    )
    if pins:
        text += (
            f"; {len(pins)} of the example's placeholder pins remain (`up`, `run` and their dry "
            f"runs refuse those their pods would pull):\n{describe(pins, loaded.path)}"
        )
    click.echo(machine(document, output) or text)
