"""`kimideploy gate serve`: the promotion gate for a release that GitOps applied."""

from __future__ import annotations

import click

from kimideploy.cli.options import cluster_options, levels_option, outcome_option, plan_options
from kimideploy.cli.outcome import RELEASE_KEYS, expect
from kimideploy.cli.state import CliState
from kimideploy.cli.terminal import TerminalReporter
from kimideploy.errors import ExitCode


@click.command()
@click.argument("workload", type=click.Choice(["serve"]))
@plan_options
@cluster_options
@click.option("--min-speedup", type=float, help="Gate threshold (default: gate.min_speedup).")
@levels_option
@click.option("--poll", default=5.0, show_default=True, hidden=True)
@outcome_option
@click.pass_obj
def gate(
    state: CliState,
    *,
    workload: str,
    cluster: str | None,
    drafter: str | None,
    overrides: tuple[str, ...],
    context: str | None,
    namespace: str | None,
    min_speedup: float | None,
    at_concurrency: tuple[int, ...] | None,
    poll: float,
    output: str,
) -> None:
    """Bench the drafter serving now against the stored baseline and print the verdict, changing
    nothing: for releases that Argo CD or Flux apply from `render --kustomize`.

    The live Deployment must be the render of --drafter/--set/--cluster and rolled out. Exit 0:
    keep; exit 4: the gate would roll it back (revert the commit); the verdict is the same as
    `up --gate`'s, and a failure to measure counts as a roll back unless gate.fail_open. With
    `--drafter none` (the non-speculative render synced) it measures and stores the baseline."""
    from kimideploy.config.drafters import NO_DRAFTER
    from kimideploy.plan.asks import ServeAsk
    from kimideploy.plan.model import PlanRequest
    from kimideploy.services.connection import open_session
    from kimideploy.services.gate.gating import GateOptions, judge_serving, measure_serving_baseline
    from kimideploy.services.gate.verdict import KEEP

    state.outcome = pending = expect(f"gate {workload}", output, RELEASE_KEYS)
    loaded = state.project()
    session = open_session(loaded, cluster, context, namespace)
    options = GateOptions(min_speedup=min_speedup, concurrency=at_concurrency, bench_poll_s=poll)
    ask = ServeAsk(gate_levels=at_concurrency)
    request = PlanRequest(workload, session.cluster, drafter or NO_DRAFTER, overrides, ask=ask)
    if request.drafter == NO_DRAFTER:
        stored = measure_serving_baseline(
            session, loaded, request, options, reporter=TerminalReporter()
        )
        message = f"baseline stored: bench run {stored.run_id}"
        if pending:
            released = {"release": stored.release}
            pending.print(ExitCode.OK, "baseline-stored", message, None, facts=released)
        else:
            click.echo(message)
        return
    release, verdict = judge_serving(session, loaded, request, options, reporter=TerminalReporter())
    kept = verdict.decision == KEEP
    code = ExitCode.OK if kept else ExitCode.ROLLOUT
    facts = {"release": release, "verdict": verdict.details()}
    if pending:
        status = "gate-keep" if kept else "gate-would-roll-back"
        pending.print(code, status, verdict.summary(), None, facts=facts)
    else:
        click.echo(f"gate: {verdict.summary()}")
    if not kept:
        raise click.exceptions.Exit(int(code))
