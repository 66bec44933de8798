"""`kimideploy drafter ...`: the drafter registry."""

from __future__ import annotations

from pathlib import Path

import click

from kimideploy.cli.state import CliState
from kimideploy.cli.table import MACHINE_FORMATS, format_table, machine, output_option
from kimideploy.cli.terminal import TerminalReporter, publish_options


@click.group()
def drafter() -> None:
    """Inspect the drafter registry."""


@drafter.command("list")
@output_option()
@click.pass_obj
def list_drafters(state: CliState, output: str) -> None:
    """Name, method, source, tokens, layer ids with their convention, and status."""
    from kimideploy.services.drafters.listing import drafter_rows

    rows = drafter_rows(state.project().project)
    if output in MACHINE_FORMATS:
        click.echo(machine(rows, output))
        return
    click.echo(format_table(rows))


@drafter.command("check")
@click.argument("name")
@click.option(
    "--dir",
    "folder",
    type=click.Path(path_type=Path, file_okay=False, exists=True),
    help="A local copy of the drafter (config.json + safetensors) to check too.",
)
@click.option(
    "--cluster",
    default=None,
    help="Judge for serving there: its serve image's vLLM and its step cost (default cluster).",
)
@output_option()
@click.pass_obj
def check(
    state: CliState, name: str, folder: Path | None, cluster: str | None, output: str
) -> None:
    """Offline compatibility check: architecture, sizes, vocab maps, layer ids, lineage, tokens."""
    from kimideploy.errors import KimiDeployError, UsageError
    from kimideploy.plan.resolve import serve_cost_model
    from kimideploy.services.calibrate.calibrations import cached
    from kimideploy.services.drafters.drafter_check import check as run

    loaded = state.project()
    project = loaded.project
    if name not in project.drafters:
        raise UsageError(f"unknown drafter '{name}' (valid: {', '.join(sorted(project.drafters))})")
    if cluster is not None and cluster not in project.clusters:
        valid = ", ".join(sorted(project.clusters))
        raise UsageError(f"--cluster {cluster}: no such cluster profile (valid: {valid})")
    # Offline: the local copy of the cluster's calibrations (left by the last command that read
    # them); the findings say whether the step cost is measured or the default constant.
    costs, _, level = serve_cost_model(
        loaded, cluster, cached(loaded, cluster or project.default_cluster)
    )
    findings = run(project, name, folder, cluster, costs, level)
    rows = [
        {"check": f.name, "status": f.status, "detail": f.detail, "fix": "" if f.ok else f.fix}
        for f in findings
    ]
    click.echo(machine(rows, output) or format_table(rows))
    if folder is None and name in project.eagle_drafters:
        click.echo(
            "(registry checks only: pass --dir with a copy of the drafter to check its files)",
            err=True,
        )
    failed = [f for f in findings if not f.ok and f.blocking]
    if failed:
        raise KimiDeployError(
            f"drafter {name}: {len(failed)} blocking problem(s)", hint="each row says how to fix it"
        )


@drafter.command("publish")
@click.argument("name")
@publish_options(
    "The cluster whose models volume holds the drafter (where it was trained).",
    "registry.repository/drafters/NAME",
)
@click.pass_obj
def publish(state: CliState, name: str, cluster: str, to: str | None,
            overrides: tuple[str, ...], context: str | None, namespace: str | None,
            poll: float) -> None:  # fmt: skip
    """Push a trained drafter from CLUSTER's volume to the registry as one OCI artifact, pinned
    by digest, and write its source, checksums and held-out figures into kimideploy.yaml."""
    from kimideploy.services.connection import open_session
    from kimideploy.services.drafters.publishing import publish_drafter

    loaded = state.project(f"drafter publish {name} runs a Job and edits kimideploy.yaml")
    session = open_session(loaded, cluster, context, namespace)
    done = publish_drafter(session, loaded, name, cluster, to, TerminalReporter(), poll,
                           overrides)  # fmt: skip
    click.echo(f"{done.reference}")
    lengths = ", ".join(f"k={k} {v}" for k, v in sorted((done.held_out or {}).items()))
    what = "added to" if done.created else "updated in"
    click.echo(f"drafters.{name} {what} {loaded.path}: source.oci pinned, status trained, "
               f"{len(done.files)} file checksums" + (f", held-out {lengths}" if lengths else ""),
               err=True)  # fmt: skip
