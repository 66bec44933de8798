"""A Runner over Fabric/Paramiko: host keys checked against known_hosts, never added silently."""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kimideploy.remote.runner import CommandResult, RemoteError, SudoError, quote


@dataclass(frozen=True)
class SshTarget:
    host: str
    address: str
    port: int
    user: str
    identity_file: str | None = None
    known_hosts: str | None = None
    connect_timeout: float = 10


class FabricRunner:
    def __init__(self, target: SshTarget) -> None:
        import paramiko
        from fabric import Config, Connection

        self.host = target.host
        self.target = target
        known = Path(target.known_hosts or Path.home() / ".ssh" / "known_hosts").expanduser()
        connect: dict[str, Any] = {
            "look_for_keys": target.identity_file is None,
            "allow_agent": True,
        }
        if target.identity_file:
            connect["key_filename"] = [str(Path(target.identity_file).expanduser())]
        config = Config(
            overrides={"load_ssh_configs": False, "runners": {"remote": _remote_runner_class()}}
        )
        self.connection = Connection(
            host=target.address,
            port=target.port,
            user=target.user,
            config=config,
            connect_timeout=target.connect_timeout,
            connect_kwargs=connect,
        )
        client = self.connection.client
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        if known.is_file():
            client.load_host_keys(str(known))
        self.known_hosts = known

    def _open(self) -> None:
        import paramiko

        where = f"{self.target.user}@{self.target.address}:{self.target.port} ({self.host})"
        try:
            self.connection.open()
        except paramiko.AuthenticationException as exc:
            raise RemoteError(
                f"{where}: authentication failed ({exc})",
                hint="check the host's `identity_file` in kimideploy.yaml, your ssh-agent, and "
                "the user's authorized_keys on the host",
            ) from exc
        except paramiko.SSHException as exc:
            if "not found in known_hosts" in str(exc) or (
                "Server" in str(exc) and "not found" in str(exc)
            ):
                raise RemoteError(
                    f"{where}: the host key is not in {self.known_hosts}; refusing to connect",
                    hint="verify the key out of band, then add it: "
                    f"ssh-keyscan -p {self.target.port} "
                    f"{self.target.address} >> {self.known_hosts} (compare the fingerprint first)",
                ) from exc
            raise RemoteError(f"{where}: SSH failed: {exc}") from exc
        except TimeoutError as exc:
            raise RemoteError(
                f"{where}: timed out after {self.target.connect_timeout:.0f}s",
                hint="is the host up and the address right?",
            ) from exc
        except OSError as exc:
            raise RemoteError(
                f"{where}: unreachable ({exc.strerror or exc})",
                hint="is the host up, and sshd listening on that port?",
            ) from exc

    def run(
        self, argv: list[str], sudo: bool = False, timeout: float = 60, stdin: str | None = None
    ) -> CommandResult:
        command = quote(argv)
        if sudo:
            self._check_sudo()
            command = "sudo -n -- " + command
        return self._run(command, timeout, stdin)

    def run_script(
        self, script: str, args: list[str] | None = None, timeout: float = 60
    ) -> CommandResult:
        return self._run(quote(["sh", "-s", "--", *(args or [])]), timeout, script)

    def run_streaming(
        self,
        argv: list[str],
        on_line: Callable[[str], None],
        stdin: str | None = None,
        timeout: float | None = None,
    ) -> CommandResult:
        """Like run, calling on_line for each stdout line as it arrives (long downloads)."""
        return self._run(quote(argv), timeout, stdin, _LineStream(on_line))

    def _run(
        self, command: str, timeout: float | None, stdin: str | None, out: io.StringIO | None = None
    ) -> CommandResult:
        self._open()
        out, err = out or io.StringIO(), io.StringIO()
        try:
            result = self.connection.run(
                command,
                hide=True,
                warn=True,
                timeout=timeout,
                out_stream=out,
                err_stream=err,
                in_stream=io.StringIO(stdin) if stdin is not None else False,
            )
        except Exception as exc:
            if type(exc).__name__ == "CommandTimedOut":
                raise RemoteError(
                    f"{self.host}: `{command}` did not finish within {timeout:.0f}s"
                ) from exc
            raise
        return CommandResult(command, result.exited, out.getvalue(), err.getvalue())

    def _check_sudo(self) -> None:
        probe = self._run("sudo -n true", 15, None)
        if not probe.ok:
            raise SudoError(
                f"{self.host}: user {self.target.user} cannot use sudo without a password "
                f"({probe.stderr.strip() or 'exit ' + str(probe.exit_code)})",
                hint="grant passwordless sudo for provisioning (e.g. a sudoers.d entry), or "
                "connect as a user that has it",
            )

    def put(self, local: Path, remote: str) -> None:
        self._open()
        self.connection.put(str(local), remote)

    def get(self, remote: str, local: Path) -> None:
        self._open()
        self.connection.get(remote, str(local))

    def close(self) -> None:
        self.connection.close()


def _remote_runner_class() -> type:
    """Fabric's remote runner, sending the command's input in one piece.

    Invoke copies `in_stream` from a thread while the command runs, one byte per 10 ms when the
    stream is not a terminal (a 4 KB script: 40 s). And a command that exits before reading all
    of it (a script that stops early, a probe that fails at once) closes the channel under that
    thread, whose write then raises "Socket is closed"; Invoke re-raises it after the command as
    a ThreadException and the command's own exit status is lost. Here the input goes out whole,
    and input the command has ended without reading is dropped: nobody can read it any more."""
    from fabric.runners import Remote

    class WholeInputRemote(Remote):  # type: ignore[misc]
        def handle_stdin(self, input_: Any, output: Any, echo: Any) -> None:
            data = input_.read()
            try:
                if data:
                    self.channel.sendall(data.encode() if isinstance(data, str) else data)
                self.channel.shutdown_write()
            except OSError:
                if not (self.channel.closed or self.channel.exit_status_ready()):
                    raise

    return WholeInputRemote


class _LineStream(io.StringIO):
    """A stdout sink that hands each complete line to a callback and keeps the text."""

    def __init__(self, on_line: Callable[[str], None]) -> None:
        super().__init__()
        self.on_line = on_line
        self.pending = ""

    def write(self, text: str) -> int:
        self.pending += text
        while "\n" in self.pending:
            line, self.pending = self.pending.split("\n", 1)
            self.on_line(line)
        return super().write(text)
