"""`kimideploy render WORKLOAD`: validated manifests on stdout or one file per object."""

from __future__ import annotations

from pathlib import Path

import click

from kimideploy.cli.context import WORKLOAD_CHOICE, CliState, plan_options


@click.command()
@click.argument("workload", type=WORKLOAD_CHOICE)
@plan_options
@click.option(
    "-o",
    "--output-dir",
    type=click.Path(path_type=Path, file_okay=False),
    help="Write one file per object into this folder instead of stdout.",
)
@click.pass_obj
def render(
    state: CliState,
    workload: str,
    cluster: str | None,
    drafter: str | None,
    overrides: tuple[str, ...],
    output_dir: Path | None,
) -> None:
    """Render WORKLOAD's manifests, validated against the cluster's Kubernetes schema.

    Output is multi-document YAML, so `kimideploy render serve | kubectl apply -f -` works.
    """
    from kimideploy.plan.model import PlanRequest
    from kimideploy.services.rendering import render_workload, write_objects

    rendered = render_workload(state.project(), PlanRequest(workload, cluster, drafter, overrides))
    if output_dir is None:
        click.echo(rendered.yaml, nl=False)
        return
    for path in write_objects(rendered, output_dir):
        click.echo(str(path), err=True)
