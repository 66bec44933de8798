"""Config values reach Ansible as data, never as templates or options (issue: safety). Real
ansible-inventory and ansible-playbook (on localhost, connection local) read the generated inventory."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from kimideploy.cli.main import main
from kimideploy.config.loading import load_project
from kimideploy.provision.inventory import inventory, inventory_yaml, ssh_args
from kimideploy.provision.runner import ansible_playbook


def hostile_config(edited_config: Callable[..., Path], marker: Path) -> Path:
    lookup = f"{{{{ lookup('pipe', 'touch {marker}') }}}}"
    return edited_config(
        ("      model_path: /mnt/nvme/models ", f'      model_path: "/mnt/{lookup}" '),
        ("{name: gpu-host, address: 192.0.2.10, user: ops}",
         f'{{name: gpu-host, address: 192.0.2.10, user: ops, known_hosts: "/tmp/k h -o '
         f'ProxyCommand=touch {marker}"}}'),
    )  # fmt: skip


def test_host_inventory_shows_what_ansible_sees_and_jinja_stays_literal(
    edited_config: Callable[..., Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    marker = tmp_path / "executed"
    config = hostile_config(edited_config, marker)
    assert main(["--config", str(config), "host", "inventory", "rtx6000"]) == 0
    listing = json.loads(capsys.readouterr().out)
    path = listing["all"]["vars"]["gpu_host_model_path"]
    assert path == {"__ansible_unsafe": f"/mnt/{{{{ lookup('pipe', 'touch {marker}') }}}}"}
    # A real play that uses the variable: templated, it would run the command.
    play = tmp_path / "play.yml"
    play.write_text("- hosts: all\n  gather_facts: false\n  tasks:\n"
                    "    - ansible.builtin.debug: {msg: '{{ gpu_host_model_path }}'}\n")  # fmt: skip
    inv = tmp_path / "inventory.yml"
    inv.write_text(inventory_yaml(inventory(load_project(config).project, "rtx6000")))
    done = subprocess.run([ansible_playbook(), "-i", str(inv), str(play), "-e",
                           "ansible_connection=local", "-e", f"ansible_python_interpreter={sys.executable}"],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "ANSIBLE_NOCOLOR": "1"})  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "lookup('pipe'" in done.stdout and not marker.exists()


def test_a_known_hosts_path_cannot_add_ssh_options(
    edited_config: Callable[..., Path], tmp_path: Path
) -> None:
    project = load_project(hostile_config(edited_config, tmp_path / "x")).project
    words = shlex.split(ssh_args(project.clusters["rtx6000"].hosts[0]))
    assert words == ["-o", "StrictHostKeyChecking=yes", "-o",
                     f"UserKnownHostsFile=/tmp/k h -o ProxyCommand=touch {tmp_path / 'x'}",
                     "-o", "ConnectTimeout=10"]  # fmt: skip
