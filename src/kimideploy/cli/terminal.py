"""The Reporter for people: a live status line on a TTY, timestamped lines otherwise."""

from __future__ import annotations

import sys
import time

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
