"""The Runner protocol on this machine (local docker builds)."""

from __future__ import annotations

import shutil
import subprocess
import threading
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
        self,
        argv: list[str],
        on_line: Callable[[str], None],
        stdin: str | None = None,
        timeout: float | None = None,
    ) -> CommandResult:
        """Each stdout line to on_line as the command prints it (a build runs for hours);
        stderr is collected beside it."""
        try:
            process = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                bufsize=1,
            )
        except FileNotFoundError as exc:
            return CommandResult(quote(argv), 127, "", str(exc))
        errors: list[str] = []
        reader = threading.Thread(target=lambda: errors.extend(process.stderr or []), daemon=True)
        reader.start()
        if stdin is not None and process.stdin is not None:
            process.stdin.write(stdin)
            process.stdin.close()
        timer = threading.Timer(timeout, process.kill) if timeout else None
        if timer is not None:
            timer.start()
        lines = []
        try:
            for line in process.stdout or []:
                lines.append(line)
                on_line(line.rstrip("\n"))
            code = process.wait()
        finally:
            if timer is not None:
                timer.cancel()
        reader.join(timeout=5)
        return CommandResult(quote(argv), code, "".join(lines), "".join(errors))

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
