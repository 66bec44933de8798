"""The Runner protocol on this machine (local docker builds)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from kimideploy.remote.runner import CommandResult, quote


class LocalRunner:
    host = "localhost"

    def run(
        self, argv: list[str], sudo: bool = False, timeout: float = 60, stdin: str | None = None
    ) -> CommandResult:
        command = ["sudo", "-n", "--", *argv] if sudo else argv
        try:
            done = subprocess.run(
                command, input=stdin, capture_output=True, text=True, timeout=timeout
            )
        except FileNotFoundError as exc:
            return CommandResult(quote(command), 127, "", str(exc))
        return CommandResult(quote(command), done.returncode, done.stdout, done.stderr)

    def run_streaming(
        self, argv: list[str], on_line: Callable[[str], None], stdin: str | None = None,
        timeout: float | None = None,
    ) -> CommandResult:  # fmt: skip
        result = self.run(argv, timeout=timeout or 24 * 3600, stdin=stdin)
        for line in result.stdout.splitlines():
            on_line(line)
        return result

    def run_script(
        self, script: str, args: list[str] | None = None, timeout: float = 60
    ) -> CommandResult:
        return self.run(["sh", "-s", "--", *(args or [])], timeout=timeout, stdin=script)

    def put(self, local: Path, remote: str) -> None:
        shutil.copyfile(local, remote)

    def get(self, remote: str, local: Path) -> None:
        shutil.copyfile(remote, local)

    def close(self) -> None:
        pass
