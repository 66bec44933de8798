"""`kimideploy prepare`: the prerequisites a cluster needs before the first `up` or `run`."""

from __future__ import annotations

from pathlib import Path

import click

from kimideploy.cli.options import cluster_option, cluster_options, output_option
from kimideploy.cli.state import CliState
from kimideploy.cli.table import format_table, machine


@click.command()
@cluster_option
@cluster_options
@click.option("--dry-run", is_flag=True, help="Check only: say what would be created.")
@click.option(
    "--registry-auth",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    help="A Docker/ORAS auth file (`oras login` writes ~/.docker/config.json): the registry push "
    "and pull Secrets are created with its entry for the project registry's host only.",
)
@click.option(
    "--registry-pull-auth",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    help="A separate auth file with pull rights only, for the pull Secret (the push Secret then "
    "takes --registry-auth's).",
)
@output_option()
@click.pass_obj
def prepare(
    state: CliState,
    *,
    cluster: str | None,
    context: str | None,
    namespace: str | None,
    dry_run: bool,
    registry_auth: Path | None,
    registry_pull_auth: Path | None,
    output: str,
) -> None:
    """Check, and create where missing, what the cluster must hold before the first `up` or `run`:
    the namespace, the PriorityClasses, and every Secret and key its workloads name (hub token
    from $HF_TOKEN, registry credentials from --registry-auth, a random API key). Existing
    Secrets are never read or replaced. Exit 1 while something is still missing."""
    from kimideploy.services.connection import open_session
    from kimideploy.services.prerequisites import RegistryAuth, unready
    from kimideploy.services.prerequisites import prepare as run

    loaded = state.project(None if dry_run else "prepare creates objects on a cluster")
    auth = RegistryAuth(push=registry_auth, pull=registry_pull_auth)
    auth.check(loaded)  # the files' own faults before any cluster is asked
    session = open_session(loaded, cluster, context, namespace)
    rows = run(session, loaded, dry_run=dry_run, registry_auth=auth)
    table = [r.row() for r in rows]
    click.echo(machine(table, output) or format_table(table))
    problem = unready(rows)
    if problem is not None:
        raise problem
