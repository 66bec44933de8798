"""`kimideploy run WORKLOAD --dry-run [client|server]`: the run's plan, with its estimate of time,
GPU-hours and money, judged as the run itself would be (the same refusals, the same exit codes),
creating nothing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import click

from kimideploy.cli.state import CliState
from kimideploy.cli.table import format_table
from kimideploy.errors import ExitCode, KimiDeployError

if TYPE_CHECKING:
    from kimideploy.config.loading import LoadedProject
    from kimideploy.plan.model import ClusterAnswers, PlanRequest


@dataclass(frozen=True)
class RunToPlan:
    workload: str
    cluster: str | None
    drafter: str | None
    overrides: tuple[str, ...]
    candidates: str | None
    """`--drafters A,B`: the bake-off."""


def plan_run(
    state: CliState,
    asked: RunToPlan,
    *,
    where: str,
    context: str | None,
    namespace: str | None,
    force: bool,
) -> None:
    """The plan of one run: client (no cluster; the local copy of its calibrations) or server
    (the cluster's measured rates and storage, its prerequisites, the API server's validation)."""
    from kimideploy.plan.model import PlanRequest
    from kimideploy.services import calibration_copies
    from kimideploy.services.rendering import refuse_before_contact

    loaded = state.project(None if where == "client" else f"run {asked.workload} --dry-run=server")
    cluster = loaded.project.cluster_name(asked.cluster)
    if asked.workload == "calibrate" or asked.candidates is not None:
        _plan_serve_loads(state, asked, cluster, namespace)
        return
    request = PlanRequest(asked.workload, cluster, asked.drafter, asked.overrides)
    if where == "client":
        answers = calibration_copies.offline_answers(loaded, cluster, namespace)
        _show(state, loaded, request, answers, force=force, where="client")
        return
    from kimideploy.services.connection import open_session
    from kimideploy.services.preflight import require_prerequisites
    from kimideploy.services.rendering import refuse_past_the_rental, render_workload

    refuse_before_contact(loaded, [request], force=force)
    session = open_session(loaded, cluster, context, namespace)
    session.require_namespace()
    rendered = render_workload(loaded, request, session.answers)
    if not force:
        refuse_past_the_rental(loaded, rendered.plan)
    require_prerequisites(session, rendered.objects, rendered.plan.cluster)
    session.validate(rendered.objects)
    _show(state, loaded, request, session.answers, force=True, where="server")


def _show(
    state: CliState,
    loaded: LoadedProject,
    request: PlanRequest,
    answers: ClusterAnswers,
    *,
    force: bool,
    where: str,
) -> None:
    from kimideploy.cli.state import pins_judged
    from kimideploy.services.rendering import (
        describe_plan,
        placeholder_refusal,
        plan_document,
        refuse_past_the_rental,
        render_workload,
    )

    rendered = render_workload(loaded, request, answers)
    refusal: KimiDeployError | None = None
    if not force:
        try:
            refuse_past_the_rental(loaded, rendered.plan)
        except KimiDeployError as exc:  # what the real run raises, in the -o document too
            refusal = exc
    if refusal is None and pins_judged(state):
        refusal = placeholder_refusal(loaded, [rendered.plan])
    done = (
        "Dry run (client): nothing was sent to a cluster."
        if where == "client"
        else "Dry run (server): the API server accepted every object; nothing was created."
    )
    pending = state.outcome
    if pending:
        pending.known.update(plan=plan_document(rendered, refusal))
        if refusal is not None:
            raise refusal
        pending.print(ExitCode.OK, "planned", done)
        return
    click.echo(describe_plan(rendered))
    if refusal is not None:
        raise refusal
    click.echo(done)


def _plan_serve_loads(
    state: CliState, asked: RunToPlan, cluster: str, namespace: str | None
) -> None:
    """The bake-off and the calibration: a sequence of serve loads and benches, planned as a
    lifecycle of one stage (their prerequisites are `up`'s: `up --dry-run` shows them)."""
    from kimideploy.services import calibration_copies
    from kimideploy.services.lifecycle import serve_loads

    loaded = state.project()
    answers = calibration_copies.offline_answers(loaded, cluster, namespace)
    candidates = (
        tuple(n.strip() for n in asked.candidates.split(",") if n.strip())
        if asked.candidates is not None
        else None
    )
    planned = serve_loads(
        loaded, cluster, answers, candidates=candidates, overrides=asked.overrides
    )
    pending = state.outcome
    if pending:
        pending.known.update(lifecycle=planned.to_dict())
        pending.print(ExitCode.OK, "planned", "dry run: nothing was sent to a cluster")
        return
    click.echo(format_table(planned.rows()))
    for stage in planned.stages:
        click.echo(f"{stage.workload}: {stage.line(planned.price)}")
    click.echo("Dry run (client): nothing was sent to a cluster.")
