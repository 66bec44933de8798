"""Running a playbook as a subprocess: per-task progress as it streams, and the PLAY RECAP."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kimideploy.errors import KimiDeployError
from kimideploy.paths import repository_root
from kimideploy.provision.inventory import inventory_yaml

TASK = re.compile(r"^TASK \[(?P<name>.+?)\] \*+$")
HOST_LINE = re.compile(
    r"^(?P<status>ok|changed|skipping|fatal|failed|unreachable): \[(?P<host>[^\]]+)\]"
)
RECAP = re.compile(r"^(?P<host>\S+)\s*:\s*(?P<counts>(?:\w+=\d+\s*)+)$")


@dataclass
class PlaybookResult:
    exit_code: int
    recap: dict[str, dict[str, int]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not any(
            c.get("failed") or c.get("unreachable") for c in self.recap.values()
        )


def ansible_playbook() -> str:
    found = shutil.which("ansible-playbook") or str(
        Path(sys.executable).with_name("ansible-playbook")
    )
    if not Path(found).exists():
        raise KimiDeployError("ansible-playbook is not installed", hint="pip install ansible-core")
    return found


def inventory_listing(inventory: dict[str, Any]) -> dict[str, Any]:
    """The inventory as Ansible itself reads it (`ansible-inventory --list`): what a playbook
    would get, values Ansible must not template shown as {"__ansible_unsafe": ...}."""
    with tempfile.TemporaryDirectory(prefix="kimideploy-ansible-") as tmp:
        inventory_file = Path(tmp) / "inventory.yml"
        inventory_file.write_text(inventory_yaml(inventory))
        inventory_file.chmod(0o600)
        command = [str(Path(ansible_playbook()).with_name("ansible-inventory")), "-i",
                   str(inventory_file), "--list", "--export"]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=120,
                              env={**os.environ, "ANSIBLE_NOCOLOR": "1"})  # fmt: skip
    if done.returncode != 0:
        raise KimiDeployError(
            "ansible-inventory could not read the generated inventory: "
            + done.stderr.strip()[-400:]
        )
    listing: dict[str, Any] = json.loads(done.stdout)
    return listing


def run_playbook(
    playbook: Path,
    inventory: dict[str, Any],
    check: bool,
    tags: list[str],
    on_line: Callable[[str, str], None],
) -> PlaybookResult:
    """Run it, calling on_line(kind, text) for each task start and host result; parse the recap."""
    with tempfile.TemporaryDirectory(prefix="kimideploy-ansible-") as tmp:
        inventory_file = Path(tmp) / "inventory.yml"
        inventory_file.write_text(inventory_yaml(inventory))
        inventory_file.chmod(0o600)
        command = [ansible_playbook(), "-i", str(inventory_file), str(playbook)]
        if check:
            command += ["--check", "--diff"]
        if tags:
            command += ["--tags", ",".join(tags)]
        env = {
            **os.environ,
            "ANSIBLE_CONFIG": str(repository_root() / "ansible" / "ansible.cfg"),
            "ANSIBLE_FORCE_COLOR": "0",
            "ANSIBLE_NOCOLOR": "1",
            "PYTHONUNBUFFERED": "1",
        }
        process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=repository_root() / "ansible",
        )
        assert process.stdout is not None
        result = PlaybookResult(exit_code=0)
        for raw in process.stdout:
            _consume(raw.rstrip("\n"), result, on_line)
        result.exit_code = process.wait()
        return result


def _consume(line: str, result: PlaybookResult, on_line: Callable[[str, str], None]) -> None:
    if match := TASK.match(line):
        on_line("task", match.group("name"))
    elif match := HOST_LINE.match(line):
        status = match.group("status")
        on_line(status, f"{status}: {match.group('host')}")
        if status in ("fatal", "failed", "unreachable"):
            result.failures.append(line)
    elif (match := RECAP.match(line)) and "ok=" in line:
        counts = dict(item.split("=") for item in match.group("counts").split())
        result.recap[match.group("host")] = {k: int(v) for k, v in counts.items()}
    elif result.failures and line.strip().startswith(("fatal", "msg", '"msg"')):
        result.failures.append(line)
