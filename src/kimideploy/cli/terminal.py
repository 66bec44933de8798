"""The Reporter for people: a live status line on a TTY, timestamped lines otherwise."""

from __future__ import annotations

import contextlib
import io
import re
import sys
import time
from collections.abc import Iterator
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
            _raw(sys.stderr).write(CLEAR_LINE)  # the one control sequence kimideploy writes
            click.echo(message[:width], err=True, nl=False)
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


CLEAR_LINE = "\r\033[2K"
CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
"""C0 controls but tab and newline, DEL, and C1 controls: what a terminal acts on instead of
showing (ESC starts OSC 52, which writes the clipboard; others clear the screen or retitle it)."""


def printable(text: str) -> str:
    """Text as a terminal shows it, controls written as escapes (\\x1b)."""
    return CONTROLS.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


class PrintableStream(io.TextIOBase):
    """A text stream that escapes controls before they reach the terminal or log. Every human
    output of the CLI goes through it: names, notes and details come from drafter files,
    release records and bench results that anyone with access to a volume or a ConfigMap wrote.
    JSON and YAML outputs escape controls themselves, so they pass through unchanged."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def write(self, text: str | bytes) -> int:
        # click writes bytes (shell completion's script) where a stream has no binary buffer.
        shown = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
        self.inner.write(printable(shown))
        return len(text)

    def flush(self) -> None:
        self.inner.flush()

    def isatty(self) -> bool:
        return bool(self.inner.isatty())

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return str(getattr(self.inner, "encoding", "utf-8"))

    @property
    def errors(self) -> str | None:  # type: ignore[override]
        return getattr(self.inner, "errors", "strict")

    def fileno(self) -> int:
        return int(self.inner.fileno())


def _raw(stream: Any) -> Any:
    return stream.inner if isinstance(stream, PrintableStream) else stream


@contextlib.contextmanager
def printable_output() -> Iterator[None]:
    """stdout and stderr escape controls for the duration of one command."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = PrintableStream(saved[0]), PrintableStream(saved[1])
    try:
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(ValueError, OSError):
                stream.flush()
        sys.stdout, sys.stderr = saved
