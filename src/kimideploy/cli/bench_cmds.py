"""`kimideploy bench list|report`: the bench runs stored in the cluster, and their charts."""

from __future__ import annotations

from pathlib import Path

import click

from kimideploy.cli.options import cluster_option, cluster_options, output_option
from kimideploy.cli.state import CliState
from kimideploy.cli.table import format_table, machine


@click.group()
def bench() -> None:
    """Stored bench runs (from `run bench` and `up serve --gate`)."""


@bench.command("list")
@cluster_option
@cluster_options
@output_option()
@click.pass_obj
def list_runs(
    state: CliState, *, cluster: str | None, context: str | None, namespace: str | None, output: str
) -> None:
    """Every stored run of the serve release, oldest first."""
    from kimideploy.services.connection import open_session
    from kimideploy.services.gate.bench_reports import list_rows

    loaded = state.project()
    session = open_session(loaded, cluster, context, namespace)
    release = loaded.project.release_name("serve")
    rows = list_rows(session, release)
    click.echo(machine(rows, output) or format_table(rows))
    for problem in session.ignored_bench_results.get(release, []):
        click.echo(f"warning: ignored a stored bench result: {problem}", err=True)


@bench.command()
@click.argument("run_id")
@cluster_option
@cluster_options
@click.option(
    "--file",
    "output",
    type=click.Path(path_type=Path, dir_okay=False),
    help="PNG to write (default: bench-RUN_ID.png).",
)
@click.pass_obj
def report(
    state: CliState,
    *,
    run_id: str,
    cluster: str | None,
    context: str | None,
    namespace: str | None,
    output: Path | None,
) -> None:
    """Chart a drafter run's speedup against concurrency, over its non-speculative baseline."""
    from kimideploy.services.connection import open_session
    from kimideploy.services.gate.bench_reports import report as write_report

    loaded = state.project()
    session = open_session(loaded, cluster, context, namespace)
    profile = loaded.project.clusters[session.cluster]
    target = output or Path(f"bench-{run_id}.png")
    lines = write_report(
        session, loaded.project.release_name("serve"), run_id, target, profile.gate.min_speedup
    )
    click.echo("\n".join(lines))
    click.echo(f"wrote {target}")
