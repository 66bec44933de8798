"""`kimideploy data inspect PATH`."""

from __future__ import annotations

import json
from pathlib import Path

import click


@click.group()
def data() -> None:
    """Datasets on a data volume (generated conversations, extracted hidden states)."""


@data.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text")
def inspect(path: Path, output: str) -> None:
    """Manifest, sample and token counts, layer convention, storage use; corrupt files named."""
    from kimideploy.errors import KimiDeployError
    from kimideploy.services.data import inspect as run
    from kimideploy.services.data import summary

    report = summary(run(path))
    if output == "json":
        click.echo(json.dumps(report, indent=2))
    else:
        for key, value in report.items():
            if key != "problems" and value is not None:
                click.echo(f"{key:16} {value}")
        for problem in report["problems"]:
            click.echo(f"problem          {problem}")
    if report["problems"]:
        raise KimiDeployError(
            f"{len(report['problems'])} corrupt or truncated file(s)",
            hint="delete them and re-run the stage: it resumes and rewrites them",
        )
