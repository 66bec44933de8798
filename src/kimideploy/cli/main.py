"""Entry point: global options, command registration and the one error boundary."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from kimideploy import __version__
from kimideploy.cli import (
    bench_cmds,
    calibrate_cmds,
    config_cmd,
    data_cmds,
    drafter_cmd,
    gate_cmd,
    host_cmds,
    image_cmds,
    release_cmds,
    render_cmd,
    run_cmds,
    up_cmd,
)
from kimideploy.cli.context import CliState
from kimideploy.cli.outcome import failure_status
from kimideploy.errors import ExitCode, KimiDeployError


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path, dir_okay=False),
    envvar="KIMIDEPLOY_CONFIG",
    help="Project file (also $KIMIDEPLOY_CONFIG; default: ./kimideploy.yaml, else the built-in "
    "example, which commands that change a cluster or host refuse).",
)
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
@click.version_option(__version__, prog_name="kimideploy")
@click.pass_context
def cli(ctx: click.Context, config_path: Path | None, debug: bool) -> None:
    """Deploy, train and measure EAGLE-3 speculative decoding for Kimi-K2.5 on Kubernetes.

    Exit codes: 0 ok, 1 runtime failure, 2 usage or config error, 3 cluster unreachable or
    forbidden, 4 rollout or job failed (or the gate rolled a drafter back), 130 interrupted.
    """
    if isinstance(ctx.obj, CliState):  # main() made it, to read a pending outcome on failure
        ctx.obj.config_path, ctx.obj.debug = config_path, debug
    else:
        ctx.obj = CliState(config_path=config_path, debug=debug)


cli.add_command(render_cmd.render)
cli.add_command(up_cmd.up)
cli.add_command(drafter_cmd.drafter)
cli.add_command(config_cmd.config)
cli.add_command(release_cmds.rollback)
cli.add_command(release_cmds.history)
cli.add_command(release_cmds.status)
cli.add_command(release_cmds.down)
cli.add_command(release_cmds.watch)
cli.add_command(run_cmds.run)
cli.add_command(run_cmds.logs)
cli.add_command(host_cmds.host)
cli.add_command(image_cmds.image)
cli.add_command(data_cmds.data)
cli.add_command(bench_cmds.bench)
cli.add_command(calibrate_cmds.calibrate)
cli.add_command(gate_cmd.gate)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; KimiDeployError becomes a message, a hint and its documented exit code (and,
    where the command was asked for `-o json|yaml`, the outcome document on stdout)."""
    debug = "--debug" in (argv if argv is not None else sys.argv[1:])
    state = CliState(config_path=None, debug=debug)
    try:
        # A command's own exit status (`gate serve` says 4 without an error) comes back here.
        status = cli.main(args=argv, prog_name="kimideploy", standalone_mode=False, obj=state)
    except KimiDeployError as exc:
        if debug:
            raise
        click.echo(f"error: {exc.message}", err=True)
        if exc.hint:
            click.echo(f"hint: {exc.hint}", err=True)
        return _failed(state, exc.exit_code, exc.message, exc.hint, exc.outcome)
    except (click.exceptions.Abort, KeyboardInterrupt):
        click.echo("interrupted", err=True)
        return _failed(state, ExitCode.INTERRUPTED, "interrupted", None, {})
    except click.ClickException as exc:
        exc.show()
        return int(ExitCode.USAGE)
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    return status if isinstance(status, int) else int(ExitCode.OK)


def _failed(
    state: CliState, code: ExitCode, reason: str, hint: str | None, facts: dict[str, Any]
) -> int:
    pending = state.outcome
    if pending is not None:
        status = failure_status(code, facts)
        known = {k: v for k, v in facts.items() if k in pending.keys}
        pending.print(code, status, reason, hint, known)
    return int(code)


def entrypoint() -> None:
    sys.exit(main())
