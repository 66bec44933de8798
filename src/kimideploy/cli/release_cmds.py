"""`rollback`, `history`, `status` and `down` of the serve release."""

from __future__ import annotations

import click

from kimideploy.cli.options import (
    cluster_option,
    cluster_options,
    outcome_option,
    output_option,
    poll_option,
)
from kimideploy.cli.outcome import DOWN_KEYS, RELEASE_KEYS, expect, print_release
from kimideploy.cli.state import CliState
from kimideploy.cli.table import MACHINE_FORMATS, format_table, machine
from kimideploy.cli.terminal import TerminalReporter
from kimideploy.errors import ExitCode

RELEASE = click.Choice(["serve"])


def _session(  # type: ignore[no-untyped-def]
    state: CliState,
    cluster: str | None,
    context: str | None,
    namespace: str | None,
    *,
    changes: str | None = None,
):
    from kimideploy.services.connection import open_session

    return open_session(state.project(changes), cluster, context, namespace)


def _release(state: CliState, workload: str) -> str:
    return state.project().project.release_name(workload)


@click.command()
@click.argument("workload", type=RELEASE)
@cluster_option
@cluster_options
@click.option("--to", "to", type=int, help="Revision to return to (see `history`).")
@click.option(
    "--no-spec",
    is_flag=True,
    help="The current revision without speculative decoding: switched off in the running pods "
    "where they can switch (seconds), else a restart.",
)
@click.option(
    "--no-swap",
    is_flag=True,
    help="Replace the pods even where the running ones could swap the drafter or switch "
    "speculation off (a reload: frees the drafter's memory for the KV cache).",
)
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.option(
    "--dry-run",
    is_flag=True,
    help="Say which revision the rollback would make, how it would reach the pods (a switch "
    "or a swap in seconds, or a rollout), and the API server's dry-run diff; change nothing.",
)
@click.option("--no-wait", is_flag=True, help="Apply and return without following the rollout.")
@click.option("--timeout", default=3600, show_default=True, type=click.IntRange(min=1))
@click.option("--scheduling-grace", default=120, hidden=True)
@poll_option
@outcome_option
@click.pass_obj
def rollback(
    state: CliState,
    *,
    workload: str,
    cluster: str | None,
    context: str | None,
    namespace: str | None,
    to: int | None,
    no_spec: bool,
    no_swap: bool,
    yes: bool,
    dry_run: bool,
    no_wait: bool,
    timeout: int,
    scheduling_grace: int,
    poll: float,
    output: str,
) -> None:
    """Return to the previous good revision, to --to N, or to non-speculative serving (--no-spec).

    The target's stored manifests are applied exactly, as a new revision.
    """
    from kimideploy.errors import UsageError
    from kimideploy.services.release import deploy

    state.outcome = pending = expect(f"rollback {workload}", output, RELEASE_KEYS)
    if no_spec and to is not None:
        raise UsageError("--no-spec and --to exclude each other")
    if dry_run:
        session = _session(state, cluster, context, namespace, changes=None)
        preview = deploy.rollback_preview(
            session,
            _release(state, workload),
            deploy.RollbackTo(to=to, no_spec=no_spec),
            deploy.ChangeOptions(swap=not no_swap),
        )
        if pending:
            pending.known.update(release=_release(state, workload), revision=preview.revision)
            pending.print(ExitCode.OK, "planned", preview.lines()[0])
            return
        click.echo("\n".join(preview.lines()))
        click.echo("Dry run (server): nothing was changed.", err=True)
        return
    session = _session(state, cluster, context, namespace, changes="rollback changes a cluster")
    apply = deploy.ApplyOptions(
        change=deploy.ChangeOptions(yes=yes, auto_rollback=False, swap=not no_swap),
        wait=deploy.WaitOptions(
            wait=not no_wait, timeout_s=timeout, poll_s=poll, scheduling_grace_s=scheduling_grace
        ),
    )
    target = deploy.RollbackTo(to=to, no_spec=no_spec)
    outcome = deploy.rollback(session, _release(state, workload), target, apply, TerminalReporter())
    if pending:
        print_release(pending, outcome)
        return
    click.echo(outcome.message)


@click.command()
@click.argument("workload", type=RELEASE)
@cluster_option
@cluster_options
@output_option()
@click.pass_obj
def history(
    state: CliState,
    *,
    workload: str,
    cluster: str | None,
    context: str | None,
    namespace: str | None,
    output: str,
) -> None:
    """Revisions of the release: time, drafter, image digest, status, how it reached the pods
    (rollout or swap), note."""
    from kimideploy.services.release.status import history_rows, ignored_records

    session, release = _session(state, cluster, context, namespace), _release(state, workload)
    rows = history_rows(session, release)
    click.echo(machine(rows, output) or format_table(rows))
    _warn_ignored(ignored_records(session, release))


@click.command()
@cluster_option
@cluster_options
@output_option()
@click.pass_obj
def status(
    state: CliState, *, cluster: str | None, context: str | None, namespace: str | None, output: str
) -> None:
    """The serving release, its phase, and running and recent jobs."""
    from kimideploy.services.release.status import ignored_records, status_report

    session, release = _session(state, cluster, context, namespace), _release(state, "serve")
    project = state.project().project
    report = status_report(session, release, project, session.cluster)
    _warn_ignored(ignored_records(session, release))
    lines = report.pop("rental_lines")
    startup_lines = report.pop("startup_lines")
    if output in MACHINE_FORMATS:
        click.echo(machine(report, output))
        return
    for line in lines:
        click.echo(line, err=True)
    width = max(len(key) for key in report["serving"])
    for key, value in report["serving"].items():
        click.echo(f"{key:<{width}}  {value}")
    if startup_lines:
        click.echo(f"\nStart-up of the serving pods (revision {report['startup']['revision']}):")
        click.echo("\n".join(startup_lines))
    click.echo("\nRuns:")
    click.echo(format_table(report["runs"]))


@click.command()
@click.argument("workload", type=RELEASE)
@cluster_option
@cluster_options
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.option("--dry-run", is_flag=True, help="List what would be removed; remove nothing.")
@outcome_option
@click.pass_obj
def down(
    state: CliState,
    *,
    workload: str,
    cluster: str | None,
    context: str | None,
    namespace: str | None,
    yes: bool,
    dry_run: bool,
    output: str,
) -> None:
    """Remove the release. PersistentVolumeClaims (models, data) and history are kept."""
    from kimideploy.services.release import deploy

    state.outcome = pending = expect(f"down {workload}", output, DOWN_KEYS)
    if dry_run:
        session = _session(state, cluster, context, namespace, changes=None)
        would = deploy.down_preview(session, _release(state, workload))
        message = f"would remove {len(would)} objects; claims and history stay"
        if pending:
            facts = {"release": _release(state, workload), "removed": [str(r) for r in would]}
            pending.print(ExitCode.OK, "planned", message, facts=facts)
            return
        click.echo("\n".join([*(f"  {r}" for r in would), message]))
        return
    session = _session(state, cluster, context, namespace, changes="down changes a cluster")
    removed = deploy.down(
        session, _release(state, workload), deploy.ChangeOptions(yes=yes), TerminalReporter()
    )
    message = f"removed {len(removed)} objects"
    if pending:
        pending.print(
            ExitCode.OK,
            "removed" if removed else "nothing-to-remove",
            message,
            facts={"release": _release(state, workload), "removed": [str(r) for r in removed]},
        )
        return
    click.echo(message)


@click.command()
@click.argument("workload", type=RELEASE)
@cluster_option
@cluster_options
@click.option("--interval", type=float, help="Seconds between scrapes (default: gate.watch).")
@click.option(
    "--act/--flag-only",
    "act",
    default=None,
    help="Roll back to non-speculative serving when acceptance stays below break-even "
    "(default: gate.watch.action).",
)
@click.option("--windows", type=int, default=None, help="Stop after N scrapes (default: never).")
@click.option(
    "-o",
    "--output",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="json: one JSON object per window on stdout as it is scraped (JSON Lines, a stream a "
    "script can follow), then one for the end; the progress lines stay on stderr.",
)
@click.pass_obj
def watch(
    state: CliState,
    *,
    workload: str,
    cluster: str | None,
    context: str | None,
    namespace: str | None,
    interval: float | None,
    act: bool | None,
    windows: int | None,
    output: str,
) -> None:
    """Watch the serving drafter's live acceptance against the cluster's break-even rate."""
    import json

    from kimideploy.services.release.watch import watch_release

    acting = "watch --act may roll a cluster back" if act else None
    session = _session(state, cluster, context, namespace, changes=acting)
    streamed = output == "json"
    ended = watch_release(
        session,
        state.project(),
        TerminalReporter(),
        windows,
        interval_s=interval,
        act=act,
        on_window=(lambda reading: click.echo(json.dumps(reading))) if streamed else None,
    )
    click.echo(json.dumps({"end": ended}) if streamed else ended)


def _warn_ignored(problems: list[str]) -> None:
    for problem in problems:
        click.echo(f"warning: ignored an untrusted release record: {problem}", err=True)
