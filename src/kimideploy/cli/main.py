"""Entry point: global options, command registration and the one error boundary."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping
from typing import Any

import click

from kimideploy import __version__
from kimideploy.cli.root_help import MAX_HELP_WIDTH, terminal_width
from kimideploy.cli.state import CliState
from kimideploy.cli.terminal import printable_output
from kimideploy.errors import ExitCode, KimiDeployError, exit_codes_sentence

COMMANDS: dict[str, tuple[str, str]] = {
    "init": ("init_cmd", "Write a project file for your clusters, from the example."),
    "prepare": ("prepare_cmd", "Create or check what a cluster needs before the first up or run."),
    "render": ("render_cmd", "Render a workload's validated manifests (or a Kustomize tree)."),
    "up": ("up_cmd", "Deploy the serve release as a new revision (optionally gated)."),
    "drafter": ("drafter_cmd", "Inspect, check and publish the drafter registry."),
    "config": ("config_cmd", "The project file: validate it, print its schema."),
    "rollback": ("release_cmds", "Back to a previous revision or to non-speculative serving."),
    "history": ("release_cmds", "Revisions of the serve release."),
    "status": ("release_cmds", "The serving release, its phase, and recent jobs."),
    "down": ("release_cmds", "Remove the release."),
    "watch": ("release_cmds", "Watch live acceptance against the break-even rate."),
    "run": ("run_cmds", "Start a workload as a Job and follow its progress."),
    "plan": ("plan_cmds", "The lifecycle's hours, GPUs and money; what a cluster needs."),
    "logs": ("run_cmds", "Logs of the serve release or of a run."),
    "host": ("host_cmds", "The GPU machines behind a cluster profile, over SSH."),
    "image": ("image_cmds", "Pinned CUDA/vLLM images with verified patches."),
    "data": ("data_cmds", "Datasets on a data volume."),
    "bench": ("bench_cmds", "Stored bench runs and their reports."),
    "calibrate": ("calibrate_cmds", "Measured step cost per cluster."),
    "gate": ("gate_cmd", "Judge a release applied elsewhere (GitOps), changing nothing."),
    "completion": ("completion_cmd", "Print the shell completion script (bash, zsh, fish)."),
}
"""Each top-level command: its module under kimideploy.cli (the function has the command's name)
and the one-line summary `kimideploy --help` lists (the command's own docstring is its full help).
A command's module is imported only when that command runs, so `--help` and shell completion do
not pay for every command's imports."""


class LazyGroup(click.Group):
    """The top-level group: commands are loaded from COMMANDS on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module = importlib.import_module(f"kimideploy.cli.{COMMANDS[name][0]}")
        command: click.Command = getattr(module, name)
        command.short_help = COMMANDS[name][1]
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(len(n) for n in names)
        # The same text get_command gives each command, without importing them all.
        rows = [(n, _shortened(COMMANDS[n][1], limit)) for n in names]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def _shortened(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


@click.group(
    cls=LazyGroup,
    context_settings={
        "help_option_names": ["-h", "--help"],
        "max_content_width": MAX_HELP_WIDTH,
        "terminal_width": terminal_width(),
    },
    epilog=f"Exit codes: {exit_codes_sentence()}.",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    envvar="KIMIDEPLOY_CONFIG",
    help="Project file (also $KIMIDEPLOY_CONFIG; default: ./kimideploy.yaml, else the built-in "
    "example, which commands that change a cluster or host refuse).",
)
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
@click.version_option(__version__, prog_name="kimideploy")
@click.pass_context
def cli(ctx: click.Context, config_path: str | None, debug: bool) -> None:
    """Deploy, train and measure EAGLE-3 speculative decoding for Kimi-K2.5 on Kubernetes."""
    # pathlib is imported here, not at start-up: `kimideploy --help` never reaches this.
    from pathlib import Path

    path = Path(config_path) if config_path else None
    if isinstance(ctx.obj, CliState):  # main() made it, to read a pending outcome on failure
        ctx.obj.config_path, ctx.obj.debug = path, debug
    else:
        ctx.obj = CliState(config_path=path, debug=debug)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; KimiDeployError becomes a message, a hint and its documented exit code (and,
    where the command was asked for `-o json|yaml`, the outcome document on stdout). Control
    characters in anything printed are escaped (cli/terminal.py)."""
    with printable_output():
        return _main(argv)


def _main(argv: list[str] | None) -> int:
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
        return _failed(state, exc.exit_code, exc.message, exc.hint, facts=exc.outcome)
    except (click.exceptions.Abort, KeyboardInterrupt):
        click.echo("interrupted", err=True)
        return _failed(state, ExitCode.INTERRUPTED, "interrupted", None, facts={})
    except click.ClickException as exc:
        exc.show()
        return int(ExitCode.USAGE)
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    return status if isinstance(status, int) else int(ExitCode.OK)


def _failed(
    state: CliState, code: ExitCode, reason: str, hint: str | None, *, facts: Mapping[str, Any]
) -> int:
    pending = state.outcome
    if pending is not None:
        from kimideploy.cli.outcome import failure_status

        status = failure_status(code, facts)
        known = {k: v for k, v in facts.items() if k in pending.keys}
        pending.print(code, status, reason, hint, facts=known)
    return int(code)


def root_help_text() -> str:
    """What `kimideploy --help` prints: click's own rendering of the group's help."""
    with cli.make_context("kimideploy", [], resilient_parsing=True) as ctx:
        return ctx.get_help() + "\n"
