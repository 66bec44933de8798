"""The Reporter for people: a live status line on a TTY, timestamped lines otherwise."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import click

from kimideploy.errors import UsageError


class TerminalReporter:
    def __init__(self, interactive: bool | None = None) -> None:
        self.interactive = sys.stderr.isatty() if interactive is None else interactive
        self._live = False
        self._last = ""

    def _end_live(self) -> None:
        if self._live:
            click.echo("", err=True)
            self._live = False

    def info(self, message: str) -> None:
        self._end_live()
        click.echo(message if self.interactive else f"{_stamp()} {message}", err=True)

    def status(self, message: str) -> None:
        if self.interactive:
            width = 160
            click.echo("\r\033[2K" + message[:width], err=True, nl=False)
            self._live = True
        elif message != self._last:  # plain logs get a line only when something changed
            click.echo(f"{_stamp()} {message}", err=True)
        self._last = message

    def confirm(self, question: str) -> bool:
        """Ask on a terminal; without one, refuse (as Terraform does): a script or CI job that
        means to apply says so with --yes, and one that forgot does not change a cluster."""
        self._end_live()
        if not sys.stdin.isatty():
            raise UsageError(
                f"{question} needs a yes, and there is no terminal to ask",
                hint="pass --yes to go ahead without asking (scripts and CI)",
            )
        return click.confirm(question, default=False, err=True)


def _stamp() -> str:
    return time.strftime("%H:%M:%S")


def publish_options(source: str, default_to: str) -> Callable[..., Any]:
    """--from, --to, --set, the cluster options and the hidden --poll of `drafter publish` and
    `data publish`."""

    def add(func: Callable[..., Any]) -> Callable[..., Any]:
        func = click.option("--poll", default=2.0, hidden=True)(func)
        func = cluster_options(func)
        func = click.option("--set", "overrides", multiple=True, metavar="W.K=V",
                            help="Override a workload setting of that cluster, e.g. "
                            "publish.resources.cpu=2.")(func)  # fmt: skip
        func = click.option(
            "--to", "to", default=None, help=f"Repository (default: {default_to})."
        )(func)
        return click.option("--from", "cluster", required=True, help=source)(func)

    return add


def cluster_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """--context and --namespace, accepted by every command that talks to a cluster."""
    func = click.option("--namespace", "-n", help="Namespace (default: the cluster profile's).")(
        func
    )
    return click.option(
        "--context", help="kubeconfig context (default: the cluster profile's kube_context)."
    )(func)
