"""Running a playbook through ansible-runner: per-task progress from its events, and the recap."""

from __future__ import annotations

import difflib
import json
import os
import shlex
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

try:
    import ansible_runner
except ImportError:  # the `provision` extra is not installed; run_playbook says how to get it
    ansible_runner = None


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
        raise KimiDeployError(
            "ansible-playbook is not installed", hint="pip install 'kimideploy[provision]'"
        )
    return found


def inventory_listing(inventory: dict[str, Any]) -> dict[str, Any]:
    """The inventory as Ansible itself reads it (`ansible-inventory --list`): what a playbook
    would get, values Ansible must not template shown as {"__ansible_unsafe": ...}."""
    with tempfile.TemporaryDirectory(prefix="kimideploy-ansible-") as tmp:
        inventory_file = Path(tmp) / "inventory.yml"
        inventory_file.write_text(inventory_yaml(inventory))
        inventory_file.chmod(0o600)
        command = [
            str(Path(ansible_playbook()).with_name("ansible-inventory")),
            "-i",
            str(inventory_file),
            "--list",
            "--export",
        ]
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "ANSIBLE_NOCOLOR": "1"},
        )
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
    *,
    on_line: Callable[[str, str], None],
) -> PlaybookResult:
    """Run it through ansible-runner, calling on_line(kind, text) for each task start and host
    result as its events arrive; the recap is the run's own stats event.

    ansible-runner's structured events (what AWX and Ansible Navigator read) replace regular
    expressions over Ansible's human output, which changes with callbacks, locales and versions.
    """
    if ansible_runner is None:
        raise KimiDeployError(
            "ansible-runner is not installed", hint="pip install 'kimideploy[provision]'"
        )
    with tempfile.TemporaryDirectory(prefix="kimideploy-ansible-") as tmp:
        inventory_file = Path(tmp) / "inventory.yml"
        inventory_file.write_text(inventory_yaml(inventory))
        inventory_file.chmod(0o600)
        options = ["--check", "--diff"] if check else []
        if tags:
            options += ["--tags", ",".join(tags)]
        binary = ansible_playbook()
        result = PlaybookResult(exit_code=0)
        tasks: dict[str, str] = {}

        def handle(event: dict[str, Any]) -> bool:
            _consume(event, result, tasks, on_line)
            return False  # nothing to keep on disk: every event was read here

        finished = ansible_runner.run(
            private_data_dir=tmp,
            project_dir=str(repository_root() / "ansible"),
            playbook=str(playbook),
            inventory=str(inventory_file),
            cmdline=shlex.join(options) if options else None,
            envvars={
                "ANSIBLE_CONFIG": str(repository_root() / "ansible" / "ansible.cfg"),
                "ANSIBLE_NOCOLOR": "1",
                # ansible-runner starts `ansible-playbook` from PATH; this one is the one found.
                "PATH": os.pathsep.join([str(Path(binary).parent), os.environ.get("PATH", "")]),
            },
            event_handler=handle,
            quiet=True,
            suppress_env_files=True,  # the inventory names keys and hosts: no copies in env/
            json_mode=False,
        )
        result.exit_code = int(finished.rc if finished.rc is not None else 1)
        return result


HOST_EVENTS = {
    "runner_on_ok": "ok",
    "runner_on_failed": "failed",
    "runner_on_skipped": "skipping",
    "runner_on_unreachable": "unreachable",
}
RECAP_KEYS = {
    "ok": "ok",
    "changed": "changed",
    "dark": "unreachable",
    "failures": "failed",
    "skipped": "skipped",
    "rescued": "rescued",
    "ignored": "ignored",
}
"""ansible's stats keys -> the PLAY RECAP's words (what `host provision` prints)."""


def _consume(
    event: dict[str, Any],
    result: PlaybookResult,
    tasks: dict[str, str],
    on_line: Callable[[str, str], None],
) -> None:
    kind, data = event.get("event", ""), event.get("event_data") or {}
    if kind == "playbook_on_task_start":
        # The name the human output shows: "role : task" for a role's tasks.
        name = data.get("name") or data.get("task") or "?"
        tasks[data.get("task_uuid", "")] = name
        on_line("task", name)
    elif kind in HOST_EVENTS:
        host, response = data.get("host", "?"), data.get("res") or {}
        status = HOST_EVENTS[kind]
        if status == "ok" and response.get("changed"):
            status = "changed"
        if status == "failed" and data.get("ignore_errors"):
            on_line("ignored", f"failed (ignored): [{host}]")
            return
        status = "fatal" if status == "failed" else status  # Ansible's word for a failed task
        on_line(status, f"{status}: [{host}]")
        for text in _diffs(response):
            on_line("diff", text)
        if data.get("task_action") in DEBUG_ACTIONS and response.get("msg"):
            on_line("message", f"[{host}] {response['msg']}")
        if status in ("fatal", "failed", "unreachable"):
            task = tasks.get(data.get("task_uuid", ""), data.get("task", "?"))
            result.failures.append(f"{status}: [{host}]: {task}: {_reason(response)}")
    elif kind == "playbook_on_stats":
        for host in data.get("processed") or {}:
            result.recap[host] = {
                word: int((data.get(key) or {}).get(host, 0)) for key, word in RECAP_KEYS.items()
            }


DEBUG_ACTIONS = {"debug", "ansible.builtin.debug"}
"""Tasks whose message is for the operator (a pending reboot): passed on as they arrive."""


def _diffs(response: dict[str, Any]) -> list[str]:
    """`--diff`'s before/after of a changed file as unified diffs (what check mode would write)."""
    found = response.get("diff") or []
    entries = found if isinstance(found, list) else [found]
    texts = []
    for entry in entries:
        if not isinstance(entry, dict) or "after" not in entry:
            continue
        before, after = str(entry.get("before", "")), str(entry.get("after", ""))
        if before == after:
            continue
        lines = difflib.unified_diff(
            before.splitlines(keepends=True),
            after.splitlines(keepends=True),
            fromfile=str(entry.get("before_header", "before")),
            tofile=str(entry.get("after_header", "after")),
        )
        texts.append("".join(lines).rstrip("\n"))
    return texts


def _reason(response: dict[str, Any]) -> str:
    """What Ansible said went wrong: its msg, else the command's stderr, else the response."""
    for key in ("msg", "stderr", "reason"):
        value = response.get(key)
        if value:
            return str(value).strip()
    shown = {k: v for k, v in response.items() if not k.startswith("_")}
    return json.dumps(shown, sort_keys=True)[:400]
