"""`kimideploy init [DIR]`: a project file for the user's clusters."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from kimideploy.cli.state import CliState


@click.command()
@click.argument("directory", type=click.Path(path_type=Path, file_okay=False), default=".")
@click.option(
    "--cluster",
    "clusters",
    multiple=True,
    metavar="NAME",
    help="A cluster you run, as the example describes it: rtx6000 (one 8x RTX PRO 6000 PCIe "
    "host), b200 / b300 (rented 8x B200 / B300 NVL8 nodes). Repeatable; the first is the "
    "default cluster. Asked for on a terminal when not given.",
)
@click.pass_obj
def init(state: CliState, directory: Path, clusters: tuple[str, ...]) -> None:
    """Write DIRECTORY/kimideploy.yaml (default: here) for your clusters, from the example.

    Every placeholder stays marked (EXAMPLE PIN, EXAMPLE); commands whose pods pull what the pins
    name refuse the file, naming each one, until you replace them. An existing file is never
    replaced. Next: docs/usage/getting-started.md.
    """
    from kimideploy.errors import UsageError
    from kimideploy.services.project_init import example_clusters, init_project

    if not clusters:
        kinds = example_clusters()
        if not sys.stdin.isatty():
            listed = "; ".join(f"{name}: {what}" for name, what in kinds.items())
            raise UsageError(
                f"which clusters? ({listed})",
                hint="pass --cluster NAME once per cluster, e.g. `kimideploy init --cluster "
                "rtx6000`",
            )
        for name, what in kinds.items():
            click.echo(f"  {name}: {what}", err=True)
        answer = click.prompt(
            "Clusters you run (comma-separated, the first is the default)",
            default=next(iter(kinds)),
            err=True,
        )
        clusters = tuple(part.strip() for part in answer.split(",") if part.strip())
    result = init_project(directory, clusters)
    click.echo(f"wrote {result.path} for {', '.join(result.clusters)}")
    if result.placeholders:
        click.echo(
            f"{len(result.placeholders)} placeholder pin(s) to replace before `up` or `run` "
            "(each line: where, what):"
        )
        for placeholder in result.placeholders:
            click.echo(f"  {result.path.name}:{placeholder.line}: {placeholder.path}")
    click.echo("next: docs/usage/getting-started.md (hosts, prerequisites, first serve)")
