"""Config values reach Ansible as data, never as templates or options. Real
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
    assert main(["--config", str(config), "host", "inventory", "--cluster", "rtx6000"]) == 0
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


def test_a_value_cannot_add_documents_to_the_yaml_ansible_writes(
    edited_config: Callable[..., Path], tmp_path: Path
) -> None:
    """The models PV and the k3s config are YAML that k3s applies by itself: a value with a newline
    and `---` would otherwise append a document (say, a ClusterRoleBinding)."""
    import yaml

    from tests.conftest import REPO

    hostile = "/mnt/x\\n---\\napiVersion: rbac.authorization.k8s.io/v1\\nkind: ClusterRoleBinding"
    config = edited_config(
        ("      model_path: /mnt/nvme/models ", f'      model_path: "{hostile}" '),
        ("      storage_path: /mnt/nvme/k3s-storage", f'      storage_path: "{hostile}/k3s"'),
    )
    inv = tmp_path / "inventory.yml"
    inv.write_text(inventory_yaml(inventory(load_project(config).project, "rtx6000")))
    templates = REPO / "ansible" / "roles" / "gpu_host" / "templates"
    play = tmp_path / "play.yml"
    play.write_text(yaml.safe_dump([{"hosts": "all", "gather_facts": False, "tasks": [
        {"ansible.builtin.template": {"src": str(templates / name), "dest": str(tmp_path / name),
                                      "mode": "0600"}}
        for name in ("models-pv.yaml.j2", "k3s-config.yaml.j2")]}]))  # fmt: skip
    done = subprocess.run([ansible_playbook(), "-i", str(inv), str(play), "-e",
                           "ansible_connection=local", "-e", f"ansible_python_interpreter={sys.executable}"],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "ANSIBLE_NOCOLOR": "1"})  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    value = hostile.replace("\\n", "\n")
    [pv] = list(yaml.safe_load_all((tmp_path / "models-pv.yaml.j2").read_text()))
    assert pv["kind"] == "PersistentVolume" and pv["spec"]["hostPath"]["path"] == value
    [k3s] = list(yaml.safe_load_all((tmp_path / "k3s-config.yaml.j2").read_text()))
    assert k3s["default-local-storage-path"] == f"{value}/k3s"
