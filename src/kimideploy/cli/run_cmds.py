"""`kimideploy run WORKLOAD` and `kimideploy logs serve|RUN_ID`."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import click

from kimideploy.cli.calibrate_cmds import numbers, run_calibrate
from kimideploy.cli.options import (
    cluster_option,
    cluster_options,
    outcome_option,
    plan_options,
    poll_option,
)
from kimideploy.cli.outcome import RUN_KEYS, RUN_PLAN_KEYS, expect
from kimideploy.cli.run_plan import RunToPlan, plan_run
from kimideploy.cli.state import CliState
from kimideploy.cli.table import format_table
from kimideploy.cli.terminal import TerminalReporter
from kimideploy.config.workload_names import JOB_WORKLOADS
from kimideploy.errors import ExitCode

if TYPE_CHECKING:
    from kimideploy.config.loading import LoadedProject
    from kimideploy.services.connection import ClusterSession, JobSnapshot, StoredBench
    from kimideploy.services.release.deploy import WaitOptions
    from kimideploy.services.runs.batch_runs import RunStarted

JOB_CHOICE = click.Choice([*JOB_WORKLOADS, "calibrate"])
CALIBRATE_ONLY = ("--k", "--acceptance-length", "--concurrency", "--image", "--again", "--yes")
SHARED_WITH_BAKEOFF = ("--concurrency", "--image", "--yes")


@click.command()
@click.argument("workload", type=JOB_CHOICE)
@plan_options
@cluster_options
@click.option("--detach", is_flag=True, help="Create the Job and return; follow later with `logs`.")
@click.option(
    "--baseline",
    is_flag=False,
    flag_value="latest",
    default=None,
    metavar="[RUN_ID]",
    help="bench only: report the speedup per level over a stored non-speculative bench run "
    "(alone: the newest comparable one, as the gate picks it).",
)
@click.option(
    "--drafters",
    "candidates",
    metavar="A,B,...",
    help="bench only: the bake-off; serve each candidate in turn (one model load each, `none` "
    "always included), bench them alike, print them side by side with the method to serve per "
    "concurrency, then restore what served.",
)
@click.option(
    "--rounds",
    type=click.IntRange(min=1),
    default=None,
    help="bench --drafters only: bench the candidates the running server can swap among "
    "themselves N times, in alternating order (A/B on one server, no reload between them), and "
    "judge them by their mean.",
)
@click.option(
    "--k",
    "ks",
    callback=numbers(int, "--k"),
    help="calibrate only: draft token counts to measure, one model load each (default 1,2,3,4).",
)
@click.option(
    "--acceptance-length",
    "lengths",
    callback=numbers(float, "--acceptance-length"),
    help="calibrate only: synthetic mean acceptance lengths, each within [1, k+1] "
    "(default 1.5,2,2.5,3).",
)
@click.option(
    "--concurrency",
    "levels",
    callback=numbers(int, "--concurrency"),
    help="calibrate only: concurrency levels (default: bench.concurrency).",
)
@click.option("--image", help="calibrate only: calibrate this serve image's stack instead.")
@click.option("--again", is_flag=True, help="calibrate only: measure a calibrated plan anew.")
@click.option("--yes", is_flag=True, help="calibrate only: do not ask before deploying.")
@click.option(
    "--dry-run",
    type=click.Choice(["client", "server"]),
    is_flag=False,
    flag_value="client",
    default=None,
    help="client (plain --dry-run): resolve, render and validate the run and print its plan "
    "(GPUs, claims, checks, the estimate: time, GPU-hours, money), contacting no cluster. "
    "server: with the cluster's measured rates and storage, its prerequisites checked and "
    "every object validated by the API server; nothing is created.",
)
@click.option(
    "--force",
    is_flag=True,
    help="Start a run whose upper estimate reaches into the rental's last margin_hours.",
)
@click.option("--timeout", default=3600, type=click.IntRange(min=1), hidden=True)
@click.option("--scheduling-grace", default=120, hidden=True)
@poll_option
@outcome_option
@click.pass_obj
def run(
    state: CliState,
    *,
    workload: str,
    cluster: str | None,
    drafter: str | None,
    overrides: tuple[str, ...],
    context: str | None,
    namespace: str | None,
    detach: bool,
    baseline: str | None,
    candidates: str | None,
    rounds: int | None,
    ks: tuple[int, ...] | None,
    lengths: tuple[float, ...] | None,
    levels: tuple[int, ...] | None,
    image: str | None,
    again: bool,
    yes: bool,
    dry_run: str | None,
    force: bool,
    timeout: int,
    scheduling_grace: int,
    poll: float,
    output: str,
) -> None:
    """Start WORKLOAD as a new Job and follow its progress (Ctrl-C detaches; the Job runs on).

    `run calibrate` measures the cluster's speculation cost instead: output tokens/s without a
    drafter, then per k (one model load each) at synthetic acceptance lengths and concurrencies;
    the fitted step cost is stored in the cluster, predictions use it, and the revision that
    served before is restored. `run bench --drafters none,ngram,suffix,k25` is the bake-off:
    every candidate served and benched in turn, side by side, the serving revision restored."""
    from kimideploy.errors import UsageError
    from kimideploy.services.release.deploy import WaitOptions

    if dry_run is not None:
        if detach or baseline is not None or rounds is not None:
            raise UsageError("--dry-run plans the run; drop --detach, --baseline and --rounds")
        state.outcome = expect(f"run {workload}", output, RUN_PLAN_KEYS)
        plan_run(
            state,
            RunToPlan(workload, cluster, drafter, overrides, candidates),
            where=dry_run,
            context=context,
            namespace=namespace,
            force=force,
        )
        return
    state.outcome = expect(f"run {workload}", output, RUN_KEYS)
    waits = WaitOptions(timeout_s=timeout, poll_s=poll, scheduling_grace_s=scheduling_grace)
    values = (ks, lengths, levels, image, again or None, yes or None)
    given = [n for n, v in zip(CALIBRATE_ONLY, values, strict=True) if v is not None]
    if workload == "calibrate":
        if detach or baseline is not None:
            raise UsageError("run calibrate follows its runs to the end; drop --detach/--baseline")
        _calibrate(
            state,
            cluster,
            drafter,
            overrides,
            context=context,
            namespace=namespace,
            ks=ks,
            lengths=lengths,
            levels=levels,
            image=image,
            again=again,
            yes=yes,
            waits=waits,
        )
        return
    if rounds is not None and candidates is None:
        raise UsageError(
            "--rounds interleaves the candidates of a bake-off",
            hint="use it as `kimideploy run bench --drafters a,b --rounds 4`",
        )
    if candidates is not None:
        if workload != "bench" or detach or baseline is not None or drafter is not None:
            raise UsageError(
                "--drafters is the bench bake-off; it follows every candidate to the end",
                hint="use it as `kimideploy run bench --drafters none,ngram,k25`, without "
                "--drafter, --detach or --baseline",
            )
        other = [g for g in given if g not in SHARED_WITH_BAKEOFF]
        if other:
            raise UsageError(f"{', '.join(other)} only apply to `run calibrate`")
        names = tuple(n.strip() for n in candidates.split(",") if n.strip())
        run_bakeoff_command(
            state,
            cluster,
            names,
            overrides,
            context=context,
            namespace=namespace,
            image=image,
            levels=levels,
            yes=yes,
            waits=waits,
            rounds=rounds or 1,
        )
        return
    if given:
        raise UsageError(f"{', '.join(given)} only apply to `run calibrate`")
    if baseline is not None and (workload != "bench" or detach):
        raise UsageError(
            "--baseline compares a bench run that this command follows to its end",
            hint="use it as `kimideploy run bench --baseline [RUN_ID]`, without --detach",
        )
    _job(
        state,
        workload,
        cluster,
        drafter,
        overrides=overrides,
        context=context,
        namespace=namespace,
        detach=detach,
        baseline=baseline,
        poll=poll,
        force=force,
    )


def _calibrate(
    state: CliState,
    cluster: str | None,
    drafter: str | None,
    overrides: tuple[str, ...],
    *,
    context: str | None,
    namespace: str | None,
    ks: tuple[int, ...] | None,
    lengths: tuple[float, ...] | None,
    levels: tuple[int, ...] | None,
    image: str | None,
    again: bool,
    yes: bool,
    waits: WaitOptions,
) -> None:
    from kimideploy.plan.calibration import DEFAULT_KS, DEFAULT_LENGTHS
    from kimideploy.services.calibrate.sweep import CalibrateOptions
    from kimideploy.services.release import deploy

    pending = state.outcome
    options = CalibrateOptions(
        ks=ks or DEFAULT_KS,
        lengths=lengths or DEFAULT_LENGTHS,
        concurrency=levels,
        image=image,
        again=again,
        bench_poll_s=waits.poll_s,
    )
    apply = deploy.ApplyOptions(change=deploy.ChangeOptions(yes=yes), wait=waits)
    result = run_calibrate(
        state,
        cluster,
        drafter,
        overrides,
        context=context,
        namespace=namespace,
        options=options,
        apply=apply,
        quiet=pending is not None,
    )
    if pending:
        done = "complete" if result.complete else "incomplete"
        pending.print(
            ExitCode.OK,
            done,
            f"calibration of {result.cluster} is {done}",
            facts={"calibration": result.to_dict()},
        )


def _job(
    state: CliState,
    workload: str,
    cluster: str | None,
    drafter: str | None,
    *,
    overrides: tuple[str, ...],
    context: str | None,
    namespace: str | None,
    detach: bool,
    baseline: str | None,
    poll: float,
    force: bool = False,
) -> None:
    """One workload as a new Job: started, then followed (or left running with --detach)."""
    from kimideploy.plan.model import PlanRequest
    from kimideploy.services.connection import open_session
    from kimideploy.services.rendering import refuse_before_contact
    from kimideploy.services.runs import batch_runs

    pending = state.outcome
    loaded = state.project(f"run {workload} creates a Job on a cluster")
    refuse_before_contact(loaded, [PlanRequest(workload, cluster, drafter, overrides)], force=force)
    session = open_session(loaded, cluster, context, namespace)
    reporter = TerminalReporter()
    request = PlanRequest(workload, session.cluster, drafter, overrides)
    chosen = None
    if baseline is not None:
        from kimideploy.services.gate.gating import choose_bench_baseline

        chosen, why = choose_bench_baseline(session, loaded, request, baseline)
        reporter.info(f"comparing with {why}")
    started = batch_runs.start_run(session, loaded, request, reporter, force=force)
    follow_hint = f"kimideploy logs {started.run_id} --follow"
    if detach:
        if pending:
            snapshot = session.job(started.job)
            pending.print(
                ExitCode.OK,
                "started",
                f"run {started.run_id} started",
                f"follow with: {follow_hint}",
                facts={"run": batch_runs.run_facts(snapshot, started.run_id)},
            )
            return
        click.echo(f"{started.run_id}\nfollow with: {follow_hint}")
        return
    try:
        resume = None
        if workload == "train":
            resume = f"kimideploy run train --set train.resume_run={started.run_id}"
        snapshot = batch_runs.follow_run(
            session,
            started.job,
            started.run_id,
            reporter,
            poll_s=poll,
            resume=resume,
            engine=started.rendered.plan.engine_start,
        )
        rows = _after_the_run(session, loaded, started, snapshot, chosen=chosen, reporter=reporter)
        actual = _the_truth(session, started, snapshot, reporter)
        if pending:
            facts = {
                "run": batch_runs.run_facts(snapshot, started.run_id),
                "results": batch_runs.run_results(snapshot),
                "comparison": rows,
                "estimate": _estimate_facts(started),
                "actual": actual,
            }
            pending.print(
                ExitCode.OK, "complete", f"run {started.run_id} complete", None, facts=facts
            )
        elif rows is not None:
            click.echo(format_table(rows))
    except KeyboardInterrupt:
        reporter.info(f"detached; Job {started.job} keeps running. Re-attach: {follow_hint}")
        raise


def _estimate_facts(started: RunStarted) -> dict[str, Any] | None:
    plan = started.rendered.plan
    stage = plan.stage_estimate
    return None if stage is None else stage.to_dict(plan.price_per_gpu_hour)


def _the_truth(
    session: ClusterSession, started: RunStarted, snapshot: JobSnapshot, reporter: TerminalReporter
) -> dict[str, Any] | None:
    """What the run measured, said against its estimate and kept on the cluster for the next."""
    from kimideploy.services.runs import run_rates

    plan = started.rendered.plan
    gpus = plan.stage_estimate.gpus if plan.stage_estimate is not None else 0
    rate = run_rates.measured_rate(snapshot, plan.workload, started.run_id, gpus)
    if rate is None:
        return None
    if plan.stage_estimate is not None:
        rate = dataclasses.replace(rate, predicted_s=round(plan.stage_estimate.seconds, 1))
    line, facts = run_rates.against_prediction(plan.stage_estimate, rate, plan.price_per_gpu_hour)
    reporter.info(line)
    problem = run_rates.record(session, rate)
    if problem:
        reporter.info(f"note: {problem}")
    return facts


def _after_the_run(
    session: ClusterSession,
    loaded: LoadedProject,
    started: RunStarted,
    snapshot: JobSnapshot,
    *,
    chosen: StoredBench | None,
    reporter: TerminalReporter,
) -> list[dict[str, Any]] | None:
    """A finished training run's held-out figures against each cluster's break-even; a bench
    run stored for the gate, and its table (with the baseline's columns when one was chosen)."""
    from kimideploy.services.runs import batch_runs

    workload = started.rendered.plan.workload
    if workload == "train":
        from kimideploy.services.calibration_copies import cached
        from kimideploy.services.drafters.held_out import held_out_lines

        final = batch_runs.run_results(snapshot).get("0") or {}
        known = {c: cached(loaded, c) for c in loaded.project.clusters}
        known[started.rendered.plan.cluster] = session.answers.calibrations
        for line in held_out_lines(loaded, started.rendered.plan.drafter or "", final, known):
            reporter.info(line)
    if workload != "bench":
        return None
    from kimideploy.services.gate.gating import bench_comparison, finished_bench, record_bench_run

    result = finished_bench(snapshot)
    record_bench_run(session, started, result, reporter)
    rows: list[dict[str, Any]] = bench_comparison(result, chosen)
    if chosen is None:
        rows = [
            {k: v for k, v in r.items() if "baseline" not in k and k != "speedup"} for r in rows
        ]
    return rows


def run_bakeoff_command(
    state: CliState,
    cluster: str | None,
    names: tuple[str, ...],
    overrides: tuple[str, ...],
    *,
    context: str | None,
    namespace: str | None,
    image: str | None,
    levels: tuple[int, ...] | None,
    yes: bool,
    waits: WaitOptions,
    rounds: int = 1,
) -> None:
    from kimideploy.services.connection import open_session
    from kimideploy.services.gate.bakeoff import table_rows
    from kimideploy.services.gate.bakeoff_run import bakeoff_requests, plan_bakeoff, run_bakeoff
    from kimideploy.services.release import deploy
    from kimideploy.services.rendering import refuse_before_contact

    pending = state.outcome
    loaded = state.project("run bench --drafters deploys serve revisions on a cluster")
    refuse_before_contact(loaded, list(bakeoff_requests(cluster, names, overrides, image).values()))
    session = open_session(loaded, cluster, context, namespace)
    reporter = TerminalReporter()
    plan = plan_bakeoff(
        session,
        loaded,
        session.cluster,
        names,
        overrides=overrides,
        image=image,
        concurrency=levels,
        rounds=rounds,
    )
    apply = deploy.ApplyOptions(change=deploy.ChangeOptions(yes=yes), wait=waits)
    result = run_bakeoff(session, loaded, plan, apply, reporter=reporter, bench_poll_s=waits.poll_s)
    picks = ", ".join(f"c={c}: {m}" for c, m in sorted(result.recommended.items()))
    if pending:
        pending.print(
            ExitCode.OK,
            "complete",
            f"bake-off on {plan.cluster}: serve {picks}",
            facts={"bakeoff": result.as_dict()},
        )
        return
    click.echo(format_table(table_rows(result)))
    for name, why in result.unmeasured.items():
        click.echo(f"{name}: not judged: {why}")
    click.echo(
        f"recommended per concurrency (the gate's rule, min speedup "
        f"{plan.gate.settings.min_speedup:.2f}x on every prompt set): {picks}"
    )
    for name, schedule in result.k_schedules.items():
        click.echo(f"{name}: {schedule}")
    for line in result.rounds:
        click.echo(line)


@click.command()
@click.argument("target")
@cluster_option
@cluster_options
@click.option(
    "--follow", "-f", is_flag=True, help="Stream; for a run, follow its progress to the end."
)
@click.option("--tail", type=int, default=None, help="Only the last N lines of each pod.")
@click.pass_obj
def logs(
    state: CliState,
    *,
    target: str,
    cluster: str | None,
    context: str | None,
    namespace: str | None,
    follow: bool,
    tail: int | None,
) -> None:
    """Logs of the serve release (`serve`) or of a run (its run id)."""
    from kimideploy.services.connection import open_session
    from kimideploy.services.runs import batch_runs

    loaded = state.project()
    session = open_session(loaded, cluster, context, namespace)
    if follow and target != "serve":
        job = batch_runs.find_job(session, target)
        batch_runs.follow_run(session, job, target, TerminalReporter())
        return
    pods = batch_runs.pods_of(session, target, loaded.project.name)
    if follow:
        for line in session.follow(pods[-1]):
            click.echo(line)
        return
    for pod in pods:
        if len(pods) > 1:
            click.echo(f"==> {pod} <==")
        click.echo(session.log(pod, tail=tail), nl=False)
