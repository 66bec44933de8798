"""`kimideploy plan lifecycle|requirements`: the hours, GPUs and money of a drafter's lifecycle on
a cluster before it starts, and what a cluster of the project needs."""

from __future__ import annotations

from pathlib import Path

import click

from kimideploy.cli.options import cluster_option, cluster_options, output_option
from kimideploy.cli.state import CliState
from kimideploy.cli.table import format_table, machine


@click.group()
def plan() -> None:
    """Plans that span runs: the lifecycle's time and money, a cluster's requirements."""


@plan.command()
@cluster_option
@cluster_options
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="WORKLOAD.KEY=VALUE",
    help="Override a workload setting of the cluster, e.g. datagen.samples=20000 (repeatable).",
)
@click.option(
    "--measured",
    is_flag=True,
    help="Ask the cluster for what its finished runs measured and its storage read (otherwise "
    "no cluster is contacted: the priors and the local copy of its calibrations).",
)
@click.option(
    "--chart",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Also write the stages on a time axis as an SVG file (default: no chart).",
)
@output_option()
@click.pass_obj
def lifecycle(
    state: CliState,
    *,
    cluster: str | None,
    context: str | None,
    namespace: str | None,
    overrides: tuple[str, ...],
    measured: bool,
    chart: Path | None,
    output: str,
) -> None:
    """Each stage of a drafter's lifecycle on the cluster (the weights where a Job downloads them,
    datagen, extraction where training is offline, vocab, train, bench), one after another:
    how long (with its spread), on how many GPUs, GPU-hours and money at the cluster's
    price_per_gpu_hour, each figure with its source (a prior, or the run that measured it)."""
    from kimideploy.services import calibration_copies
    from kimideploy.services.lifecycle import lifecycle as plan_lifecycle

    loaded = state.project()
    name = loaded.project.cluster_name(cluster)
    if measured:
        from kimideploy.services.connection import open_session

        answers = open_session(loaded, name, context, namespace).answers
    else:
        answers = calibration_copies.offline_answers(loaded, name, namespace)
    planned = plan_lifecycle(loaded, name, answers, overrides)
    if chart is not None:
        chart.parent.mkdir(parents=True, exist_ok=True)
        chart.write_text(planned.svg(), encoding="utf-8")
    document = planned.to_dict()
    text = machine(document, output)
    if text is not None:
        click.echo(text)
        return
    click.echo(format_table(planned.rows()))
    for stage in planned.stages:
        click.echo(f"{stage.workload}: {stage.detail}; {stage.source}")
    click.echo(planned.held())
    for note in planned.notes:
        click.echo(f"note: {note}")
    if planned.price is None:
        click.echo(f"money: set clusters.{name}.price_per_gpu_hour to add it up")
    if chart is not None:
        click.echo(f"chart: {chart}")


@plan.command()
@cluster_option
@output_option()
@click.pass_obj
def requirements(state: CliState, *, cluster: str | None, output: str) -> None:
    """What the cluster needs, from the plans `up` and `run` make: GPUs and their driver,
    Kubernetes, host RAM (the serve pod's page cache), every claim and the storage in all, the
    operators, and this workstation's tools."""
    from kimideploy.services.requirements import requirements as needs

    loaded = state.project()
    name = loaded.project.cluster_name(cluster)
    rows = [r.row() for r in needs(loaded, name)]
    click.echo(machine(rows, output) or format_table(rows))
