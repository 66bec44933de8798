"""`kimideploy up serve`: deploy a new revision of the serve release and follow it."""

from __future__ import annotations

from dataclasses import replace

import click

from kimideploy.cli.context import CliState, plan_options
from kimideploy.cli.terminal import TerminalReporter, cluster_options


@click.command()
@click.argument("workload", type=click.Choice(["serve"]))
@plan_options
@cluster_options
@click.option(
    "--dry-run",
    "dry_run",
    is_flag=False,
    flag_value="client",
    default=None,
    type=click.Choice(["client", "server"]),
    help="client (plain --dry-run): resolve, render, validate and print the plan, contacting no "
    "cluster. server: the API server's own dry run, printed as a diff against the live objects.",
)
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.option("--force", is_flag=True, help="Take over fields owned by other field managers.")
@click.option("--no-wait", is_flag=True, help="Apply and return without following the rollout.")
@click.option("--timeout", default=3600, show_default=True, help="Seconds to wait for readiness.")
@click.option("--no-auto-rollback", is_flag=True, help="Leave a failed revision in place.")
@click.option("--scheduling-grace", default=120, show_default=True, hidden=True)
@click.option("--poll", default=2.0, show_default=True, hidden=True)
@click.pass_obj
def up(
    state: CliState,
    workload: str,
    cluster: str | None,
    drafter: str | None,
    overrides: tuple[str, ...],
    context: str | None,
    namespace: str | None,
    dry_run: str | None,
    yes: bool,
    force: bool,
    no_wait: bool,
    timeout: int,
    no_auto_rollback: bool,
    scheduling_grace: int,
    poll: float,
) -> None:
    """Deploy the serve release as a new revision, follow it to Ready, roll back if it fails."""
    from kimideploy.plan.model import PlanRequest
    from kimideploy.services import deploy
    from kimideploy.services.connection import open_session
    from kimideploy.services.rendering import describe_plan, render_workload

    loaded = state.project()
    request = PlanRequest(workload, cluster, drafter, overrides, namespace=namespace)
    if dry_run == "client":
        click.echo(describe_plan(render_workload(loaded, request)))
        click.echo("Dry run (client): nothing was sent to a cluster.")
        return
    session = open_session(loaded, cluster, context, namespace)
    if dry_run == "server":
        session.require_namespace()
        rendered = render_workload(loaded, replace(request, namespace=session.namespace))
        click.echo(session.dry_run_diff(rendered.objects, force=force) or "no changes", nl=False)
        click.echo(
            "\nDry run (server): the API server validated the change; nothing was persisted.",
            err=True,
        )
        return
    change = deploy.ChangeOptions(yes=yes, force=force, auto_rollback=not no_auto_rollback)
    wait = deploy.WaitOptions(not no_wait, timeout, poll, scheduling_grace)
    outcome = deploy.up(session, loaded, request, change, wait, TerminalReporter())
    click.echo(outcome.message)
