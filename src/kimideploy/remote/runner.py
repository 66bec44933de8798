"""The Runner protocol services use, and the results and errors it produces."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from kimideploy.errors import ClusterError, KimiDeployError


class RemoteError(ClusterError):
    """The host cannot be reached, refuses us, or is not who known_hosts says (exit 3)."""


class SudoError(KimiDeployError):
    """The user cannot run sudo without a password on the host."""


@dataclass(frozen=True)
class CommandResult:
    command: str
    exit_code: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


class Runner(Protocol):
    """What the services may do on a host."""

    host: str

    def run(
        self, argv: list[str], sudo: bool = False, timeout: float = 60, stdin: str | None = None
    ) -> CommandResult:
        """Run argv (each element quoted) and return its result; never raises on exit codes."""

    def run_streaming(
        self,
        argv: list[str],
        on_line: Callable[[str], None],
        stdin: str | None = None,
        timeout: float | None = None,
    ) -> CommandResult:
        """Run argv, handing each stdout line to on_line as it arrives."""

    def run_script(
        self, script: str, args: list[str] | None = None, timeout: float = 60
    ) -> CommandResult:
        """Run a POSIX shell script (written by kimideploy, not user input) with sh -s."""

    def put(self, local: Path, remote: str) -> None:
        """Copy a file to the host."""

    def get(self, remote: str, local: Path) -> None:
        """Copy a file from the host."""

    def close(self) -> None: ...


def quote(argv: list[str]) -> str:
    """One shell-safe command line: no argument is ever interpreted by the remote shell."""
    return " ".join(shlex.quote(a) for a in argv)
