"""`kimideploy up serve`: deploy a new revision of the serve release and follow it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from kimideploy.cli.options import (
    cluster_options,
    levels_option,
    outcome_option,
    plan_options,
    poll_option,
)
from kimideploy.cli.outcome import PLAN_KEYS, RELEASE_KEYS, expect, print_release
from kimideploy.cli.state import CliState, pins_judged
from kimideploy.cli.terminal import TerminalReporter

if TYPE_CHECKING:
    from kimideploy.cli.outcome import PendingOutcome
    from kimideploy.config.loading import LoadedProject
    from kimideploy.plan.model import ClusterAnswers, PlanRequest
    from kimideploy.services.connection import ClusterSession
    from kimideploy.services.gate.gating import GateOptions
    from kimideploy.services.gate.verdict import Verdict
    from kimideploy.services.release.canary import CanaryVerdict
    from kimideploy.services.release.deploy import ApplyOptions


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
@click.option(
    "--force",
    is_flag=True,
    help="Take over fields owned by other field managers, and serve a drafter whose check "
    "fails (predicted slower, a stack where speculation cannot pay).",
)
@click.option("--no-wait", is_flag=True, help="Apply and return without following the rollout.")
@click.option(
    "--timeout",
    default=3600,
    show_default=True,
    type=click.IntRange(min=1),
    help="Seconds to wait for readiness (at least 1; 0 would fail every healthy rollout).",
)
@click.option("--no-auto-rollback", is_flag=True, help="Leave a failed revision in place.")
@click.option(
    "--no-swap",
    is_flag=True,
    help="Replace the pods even where only the drafter changes (or, with --drafter none, "
    "speculation) and the running server could swap it in or switch it off without a reload "
    "(docs/usage/serving-and-rollback.md).",
)
@click.option(
    "--canary",
    "canary_percent",
    type=click.IntRange(1, 99),
    default=None,
    metavar="PERCENT",
    help="Serve the drafter as a canary pool taking PERCENT of the gateway route's traffic "
    "beside the serving revision, judge both on live traffic, then move the route to 100 or 0 "
    "(clusters.<name>.gateway; docs/usage/serving-and-rollback.md, 'A canary').",
)
@click.option(
    "--gate",
    is_flag=True,
    help="After the drafter is ready, benchmark it against no drafter and keep it only when it "
    "pays (clusters.<name>.gate); otherwise roll back to non-speculative serving.",
)
@click.option("--min-speedup", type=float, help="Gate threshold (default: gate.min_speedup).")
@levels_option
@click.option(
    "--gate-fail-open/--gate-fail-closed",
    "gate_fail_open",
    default=None,
    help="When the gate cannot measure (bench failed, counters missing): keep the drafter "
    "(open) or roll back (closed, the default unless gate.fail_open).",
)
@click.option(
    "--gate-baseline",
    type=click.Choice(["auto", "same-server", "separate"]),
    default=None,
    help="Where the non-speculative baseline is measured when no fresh stored one compares: "
    "same-server (the drafter's pods with speculation switched off, rounds interleaved, no "
    "second load), separate (a revision of its own, one more load), auto (same-server where "
    "the pods can switch; default gate.baseline).",
)
@click.option(
    "--watch",
    "watch_after",
    is_flag=True,
    help="After a kept drafter, keep watching live acceptance (see `kimideploy watch`).",
)
@click.option("--scheduling-grace", default=120, show_default=True, hidden=True)
@poll_option
@click.option("--watch-windows", type=int, default=None, hidden=True)
@outcome_option
@click.pass_obj
def up(
    state: CliState,
    *,
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
    no_swap: bool,
    canary_percent: int | None,
    gate: bool,
    min_speedup: float | None,
    at_concurrency: tuple[int, ...] | None,
    gate_fail_open: bool | None,
    gate_baseline: str | None,
    watch_after: bool,
    scheduling_grace: int,
    poll: float,
    watch_windows: int | None,
    output: str,
) -> None:
    """Deploy the serve release as a new revision, follow it to Ready, roll back if it fails."""
    from kimideploy.plan.asks import ServeAsk
    from kimideploy.plan.model import PlanRequest
    from kimideploy.services import calibration_copies as calibrations
    from kimideploy.services.connection import open_session
    from kimideploy.services.release import deploy
    from kimideploy.services.rendering import refuse_before_contact

    if dry_run == "client":
        state.outcome = pending = expect(f"up {workload} --dry-run", output, PLAN_KEYS)
    else:
        state.outcome = pending = expect(f"up {workload}", output, RELEASE_KEYS)
    if canary_percent is not None and gate:
        from kimideploy.errors import UsageError

        raise UsageError(
            "--canary and --gate are two verdicts: the canary is judged on live traffic",
            hint="drop --gate (a canary's verdict moves the route), or --canary (the gate "
            "benchmarks the whole release)",
        )
    _refuse_mixed(
        output if pending else None,
        dry_run,
        watch_after,
        gate,
        min_speedup=min_speedup,
        at_concurrency=at_concurrency,
        gate_fail_open=gate_fail_open,
        gate_baseline=gate_baseline,
    )
    loaded = state.project(None if dry_run == "client" else "up changes a cluster")
    cluster_name = loaded.project.cluster_name(cluster)  # decided once, passed on as the name
    request = PlanRequest(
        workload,
        cluster_name,
        drafter,
        overrides,
        ask=ServeAsk(
            gate_levels=at_concurrency, gate_min_speedup=min_speedup, canary_percent=canary_percent
        ),
    )
    if dry_run == "client":
        offline = calibrations.offline_answers(loaded, cluster_name, namespace)
        _dry_run_client(
            loaded, request, offline, force=force, pending=pending, pins=pins_judged(state)
        )
        return
    refuse_before_contact(loaded, [request])
    session = open_session(loaded, cluster_name, context, namespace)
    if dry_run == "server":
        _dry_run_server(session, loaded, request, force)
        return
    apply = deploy.ApplyOptions(
        change=deploy.ChangeOptions(
            yes=yes, force=force, auto_rollback=not no_auto_rollback, swap=not no_swap
        ),
        wait=deploy.WaitOptions(
            wait=not no_wait, timeout_s=timeout, poll_s=poll, scheduling_grace_s=scheduling_grace
        ),
    )
    gate_options = None
    if gate:
        from kimideploy.services.gate.gating import GateOptions

        gate_options = GateOptions(
            min_speedup=min_speedup,
            concurrency=at_concurrency,
            fail_open=gate_fail_open,
            baseline=gate_baseline,
            bench_poll_s=poll,
        )
    _deploy(
        session,
        loaded,
        request,
        apply=apply,
        gate=gate_options,
        pending=pending,
        watch_windows=watch_windows if watch_after else None,
        watch_after=watch_after,
    )


def _refuse_mixed(
    machine_output: str | None, dry_run: str | None, watch_after: bool, gate: bool, **gate_only: Any
) -> None:
    """Flags that do not go together, refused before anything is read or sent."""
    from kimideploy.errors import UsageError

    if machine_output and (dry_run == "server" or watch_after):
        raise UsageError(
            f"-o {machine_output} reports what up changed, or what it would (--dry-run), once; "
            + ("--dry-run=server prints a diff" if dry_run else "--watch streams prose"),
            hint="`kimideploy up serve --dry-run -o json` prints the plan document; "
            "`kimideploy watch serve` watches",
        )
    names = {
        "min_speedup": "--min-speedup",
        "at_concurrency": "--at-concurrency",
        "gate_fail_open": "--gate-fail-open/--gate-fail-closed",
        "gate_baseline": "--gate-baseline",
    }
    given = [names[key] for key, value in gate_only.items() if value is not None]
    if given and not gate:
        raise UsageError(f"{', '.join(given)} only apply with --gate")


def _dry_run_client(
    loaded: LoadedProject,
    request: PlanRequest,
    answers: ClusterAnswers,
    *,
    force: bool,
    pending: PendingOutcome | None,
    pins: bool = True,
) -> None:
    """The plan as `up` would apply it, and `up`'s own refusals (a failing drafter; with `pins`,
    the example's placeholder pins it would pull), exit 2 with the same message: a dry run that
    passes is one the real command passes. With -o, the plan document (kimideploy.plan.v1) in
    the outcome, the refusal in both."""
    from kimideploy.errors import ExitCode
    from kimideploy.plan.refusal import drafter_refusal
    from kimideploy.services.rendering import (
        describe_plan,
        placeholder_refusal,
        plan_document,
        render_workload,
    )

    rendered = render_workload(loaded, request, answers)
    refusal = drafter_refusal(rendered.plan, force)
    if refusal is None and pins:
        refusal = placeholder_refusal(loaded, [rendered.plan])
    if pending:
        pending.known.update(release=rendered.plan.release, plan=plan_document(rendered, refusal))
        if refusal is not None:
            raise refusal
        pending.print(ExitCode.OK, "planned", "dry run (client): nothing was sent to a cluster")
        return
    click.echo(describe_plan(rendered))
    if refusal is not None:
        raise refusal
    click.echo("Dry run (client): nothing was sent to a cluster.")


def _dry_run_server(
    session: ClusterSession, loaded: LoadedProject, request: PlanRequest, force: bool
) -> None:
    from kimideploy.services.preflight import require_prerequisites
    from kimideploy.services.release.deploy import refuse_failing_drafter
    from kimideploy.services.rendering import describe_plan, render_workload

    session.require_namespace()
    rendered = render_workload(loaded, request, session.answers)
    # The plan as this cluster's answers decide it (its calibrations, its measured storage), on
    # stderr: stdout stays the diff, for a pipe.
    click.echo(describe_plan(rendered), err=True)
    refuse_failing_drafter(rendered.plan, force)
    # What the API server's dry run cannot see (a PriorityClass, the API-key Secret).
    require_prerequisites(session, rendered.objects, rendered.plan.cluster)
    click.echo(session.dry_run_diff(rendered.objects, force=force) or "no changes", nl=False)
    click.echo(
        "\nDry run (server): the API server validated the change; nothing was persisted.",
        err=True,
    )


def _deploy(
    session: ClusterSession,
    loaded: LoadedProject,
    request: PlanRequest,
    *,
    apply: ApplyOptions,
    gate: GateOptions | None,
    pending: PendingOutcome | None,
    watch_windows: int | None,
    watch_after: bool,
) -> None:
    """The use case: a plain `up`, or a gated one; then the outcome, and the watch if asked."""
    from kimideploy.plan.asks import ServeAsk
    from kimideploy.services.release import deploy

    reporter = TerminalReporter()
    verdict: Verdict | CanaryVerdict | None = None
    if request.asked(ServeAsk).canary_percent is not None:
        from kimideploy.services.release.canary import run_canary

        rendered = deploy.plan_up(session, loaded, request, apply.change.force)
        outcome, verdict = run_canary(session, loaded, rendered, options=apply, reporter=reporter)
    elif gate is None:
        outcome = deploy.up(session, loaded, request, apply, reporter)
    else:
        from kimideploy.services.gate.gating import up_gated

        outcome, verdict = up_gated(
            session, loaded, request, apply, options=gate, reporter=reporter
        )
    if pending:
        print_release(pending, outcome, verdict)
        return
    click.echo(
        outcome.message
        if verdict is None
        else f"{outcome.message}; {verdict.kind}: {verdict.summary()}"
    )
    if watch_after:
        _watch(session, loaded, reporter, watch_windows)


def _watch(
    session: ClusterSession, loaded: LoadedProject, reporter: TerminalReporter, windows: int | None
) -> None:
    from kimideploy.services.release.watch import watch_release

    click.echo(watch_release(session, loaded, reporter, max_windows=windows))
