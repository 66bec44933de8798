"""`kimideploy run calibrate` (called by `run`) and `kimideploy calibrate show`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from kimideploy.cli.options import cluster_option, cluster_options, output_option
from kimideploy.cli.state import CliState
from kimideploy.cli.table import MACHINE_FORMATS, format_table, machine
from kimideploy.cli.terminal import TerminalReporter

if TYPE_CHECKING:
    from kimideploy.config.loading import LoadedProject
    from kimideploy.plan.calibration import Calibration
    from kimideploy.services.calibrate.sweep import CalibrateOptions
    from kimideploy.services.release.deploy import ApplyOptions


def numbers(kind: type, option: str) -> Any:
    """A click callback for comma-separated lists (`--k 1,2,3`)."""

    def parse(_ctx: Any, _param: Any, value: str | None) -> tuple[Any, ...] | None:
        if value is None:
            return None
        try:
            return tuple(kind(part) for part in value.split(",") if part.strip())
        except ValueError as exc:
            raise click.BadParameter(f"{option}: expected comma-separated numbers") from exc

    return parse


def run_calibrate(
    state: CliState,
    cluster: str | None,
    drafter: str | None,
    overrides: tuple[str, ...],
    *,
    context: str | None,
    namespace: str | None,
    options: CalibrateOptions,
    apply: ApplyOptions,
    quiet: bool = False,
) -> Calibration:
    """Measure and store; `quiet` leaves stdout to the caller's outcome document."""
    from kimideploy.services import calibration_copies as calibrations
    from kimideploy.services.calibrate.report import cannot_pay
    from kimideploy.services.calibrate.sweep import (
        calibrate,
        calibration_requests,
        plan_calibration,
    )
    from kimideploy.services.connection import open_session
    from kimideploy.services.rendering import refuse_before_contact

    loaded = state.project("run calibrate deploys serve revisions on a cluster")
    _, requests, base = calibration_requests(loaded, cluster, drafter, overrides, options=options)
    refuse_before_contact(loaded, [*requests.values(), base])
    session = open_session(loaded, cluster, context, namespace)
    reporter = TerminalReporter()
    plan = plan_calibration(
        session, loaded, session.cluster, drafter, overrides=overrides, options=options
    )
    result = calibrate(session, loaded, plan, options, apply, reporter)
    calibrations.stored(session, loaded, result.cluster)  # refresh the local copy
    if quiet:
        return result
    for line in cannot_pay(result):
        click.echo(line)
    click.echo("`kimideploy calibrate show` prints the whole curve")
    return result


@click.group()
def calibrate() -> None:
    """Measured step cost per cluster (`kimideploy run calibrate` measures it)."""


@calibrate.command()
@cluster_option
@cluster_options
@output_option("table", "png")
@click.option(
    "--file",
    "png_file",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Where -o png writes (default: calibration-CLUSTER.png).",
)
@click.option(
    "--acceptance-rate",
    "per_token",
    callback=numbers(float, "--acceptance-rate"),
    help="Per-token acceptance rates to name the best k for (default 0.6,0.7,0.8).",
)
@click.option(
    "--offline",
    is_flag=True,
    help="Contact no cluster: the local copy of its last calibration, else the prior the plan "
    "uses until one is measured.",
)
@click.pass_obj
def show(
    state: CliState,
    *,
    cluster: str | None,
    context: str | None,
    namespace: str | None,
    output: str,
    png_file: Path | None,
    per_token: tuple[float, ...] | None,
    offline: bool,
) -> None:
    """Break-even acceptance length per k and concurrency, the best k, where nothing pays."""
    from kimideploy.errors import UsageError
    from kimideploy.services import calibration_copies as calibrations
    from kimideploy.services.calibrate import report
    from kimideploy.services.connection import open_session

    loaded = state.project()
    if offline:
        _show_offline(loaded, loaded.project.cluster_name(cluster), output, per_token)
        return
    session = open_session(loaded, cluster, context, namespace)
    name = session.cluster
    stored = session.calibrations(name)
    calibrations.stored(session, loaded, name)
    measured = [(cid, c) for cid, c in stored if c.points]
    if not measured:
        raise UsageError(
            f"cluster {name} has no calibration in namespace {session.namespace}",
            hint=f"`kimideploy run calibrate --cluster {name}` measures one",
        )
    calibration_id, calibration = measured[-1]
    rates = per_token or report.DEFAULT_PER_TOKEN
    if output in MACHINE_FORMATS:
        document = {
            "id": calibration_id,
            **calibration.to_dict(),
            "table": report.rows(calibration, rates),
            "cannot_pay": report.cannot_pay(calibration),
        }
        click.echo(machine(document, output))
        return
    click.echo(report.header(calibration_id, calibration))
    click.echo(format_table(report.rows(calibration, rates)))
    for line in report.cannot_pay(calibration):
        click.echo(line)
    if output == "png":
        target = png_file or Path(f"calibration-{name}.png")
        report.write_png(calibration, target)
        click.echo(f"wrote {target}")


def _show_offline(
    loaded: LoadedProject, name: str, output: str, per_token: tuple[float, ...] | None
) -> None:
    """`calibrate show --offline`: the last calibration read from the cluster (its local copy),
    or the prior, in the same table; png needs a measured calibration."""
    from kimideploy.errors import UsageError
    from kimideploy.plan.calibration import DEFAULT_KS
    from kimideploy.plan.step_cost import uncalibrated
    from kimideploy.services import calibration_copies as calibrations
    from kimideploy.services.calibrate import report

    rates = per_token or report.DEFAULT_PER_TOKEN
    measured = [c for c in calibrations.cached(loaded, name) if c.points]
    if measured:
        calibration = measured[-1]
        rows = report.rows(calibration, rates)
        title = report.header("(local copy)", calibration)
    else:
        if output == "png":
            raise UsageError(
                f"cluster {name} has no calibration here to plot",
                hint=f"`kimideploy run calibrate --cluster {name}` measures one",
            )
        costs = uncalibrated(loaded.project, name)
        levels = sorted(set(loaded.project.clusters[name].workloads.bench.concurrency))
        rows = report.prior_rows(costs, DEFAULT_KS, levels, rates)
        title = f"cluster {name}, nothing measured: the prior the plan uses, {costs.source}"
    if output in MACHINE_FORMATS:
        click.echo(machine({"source": title, "table": rows}, output))
        return
    click.echo(title)
    click.echo(format_table(rows))
