"""`kimideploy up WORKLOAD`: resolve, render, validate and (later) apply a release."""

from __future__ import annotations

import click

from kimideploy.cli.context import CliState, plan_options


@click.command()
@click.argument("workload", type=click.Choice(["serve"]))
@plan_options
@click.option(
    "--dry-run", "dry_run", is_flag=False, flag_value="client", default=None,
    type=click.Choice(["client"]),
    help="client (the default value): resolve, render, validate and print the plan; "
    "no cluster is contacted.",
)  # fmt: skip
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_obj
def up(
    state: CliState,
    workload: str,
    cluster: str | None,
    drafter: str | None,
    overrides: tuple[str, ...],
    dry_run: str | None,
    yes: bool,
) -> None:
    """Deploy the serve release (with --dry-run: show exactly what would be applied)."""
    from kimideploy.errors import UsageError
    from kimideploy.plan.model import PlanRequest
    from kimideploy.services.rendering import describe_plan, render_workload

    rendered = render_workload(state.project(), PlanRequest(workload, cluster, drafter, overrides))
    if dry_run is None:
        raise UsageError(
            "applying to a cluster is not available in this build: only --dry-run is",
            hint="`kimideploy up serve --dry-run` shows the plan; "
            "`kimideploy render serve | kubectl apply -f -` applies it by hand",
        )
    click.echo(describe_plan(rendered))
    click.echo("Dry run (client): nothing was sent to a cluster.")
