"""A throwaway OpenSSH server on 127.0.0.1 with generated host and user keys (for Fabric/Ansible)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tests.ports import free_port as _free_port

SSHD = Path("/usr/sbin/sshd")


@dataclass(frozen=True)
class Sshd:
    root: Path
    port: int
    user: str
    user_key: Path
    known_hosts: Path
    host_public_key: str
    pid: int

    def stop(self) -> None:
        try:
            os.kill(self.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)


def _keygen(path: Path, comment: str) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)], check=True
    )


def start_sshd(root: Path, env: dict[str, str] | None = None) -> Sshd:
    """Start sshd -D on a free loopback port; only our user key may log in (as this user).
    `env` is set in every session (sshd's SetEnv): a test machine's tools ahead on PATH."""
    if not SSHD.is_file() or shutil.which("ssh-keygen") is None:
        raise FileNotFoundError("openssh-server is not installed (apt-get install openssh-server)")
    root.mkdir(parents=True, exist_ok=True)
    _keygen(root / "host_ed25519", "kimideploy-test-host")
    _keygen(root / "user_ed25519", "kimideploy-test-user")
    (root / "authorized_keys").write_text((root / "user_ed25519.pub").read_text())
    port = _free_port()
    config = root / "sshd_config"
    # sshd takes the first SetEnv line only: every variable goes on that one line.
    pairs = " ".join(f'{key}="{value}"' for key, value in (env or {}).items())
    set_env = f"SetEnv {pairs}\n" if pairs else ""
    config.write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {root / 'host_ed25519'}\n"
        f"AuthorizedKeysFile {root / 'authorized_keys'}\nPidFile {root / 'sshd.pid'}\n"
        "UsePAM no\nStrictModes no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        "PermitRootLogin prohibit-password\nSubsystem sftp internal-sftp\nLogLevel ERROR\n"
        + set_env
    )
    Path("/run/sshd").mkdir(exist_ok=True)
    log = (root / "sshd.log").open("w")
    process = subprocess.Popen(
        [str(SSHD), "-D", "-e", "-f", str(config)], stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    host_key = (root / "host_ed25519.pub").read_text().split()[:2]
    known = root / "known_hosts"
    known.write_text(f"[127.0.0.1]:{port} {' '.join(host_key)}\n")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.05)
    import getpass

    return Sshd(
        root, port, getpass.getuser(), root / "user_ed25519", known, " ".join(host_key), process.pid
    )
