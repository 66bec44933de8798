"""`kimideploy host check|provision|inventory`: probe the hosts against the cluster profile and run
the cluster's Ansible role."""

from __future__ import annotations

from typing import Any

from kimideploy.config.project import Project
from kimideploy.formats.check_result import CheckResult
from kimideploy.provision.inventory import inventory, playbook_for, require_hosts
from kimideploy.provision.runner import PlaybookResult, inventory_listing, run_playbook
from kimideploy.services.hosts import hostcheck
from kimideploy.services.hosts.connect import Connect, hosts_of, ssh_connect
from kimideploy.services.reporting import Reporter


def check_hosts(
    project: Project, cluster_name: str, connect: Connect = ssh_connect, only: str | None = None
) -> list[tuple[str, list[CheckResult]]]:
    """Run the probe on each host and evaluate it against the cluster profile and serve image."""
    cluster = require_hosts(project, cluster_name)
    assert cluster.host_setup is not None
    image = project.images[cluster.images.serve]
    results = []
    for host in hosts_of(project, cluster_name, only):
        runner = connect(host)
        try:
            script = hostcheck.probe_script()
            output = runner.run_script(script, [cluster.host_setup.model_path], timeout=60)
        finally:
            runner.close()
        results.append((host.name, hostcheck.evaluate(project, cluster, image, output.stdout)))
    return results


def check_rows(results: list[tuple[str, list[CheckResult]]]) -> list[dict[str, Any]]:
    return [row for host, checks in results for row in hostcheck.rows(host, checks)]


def provision(
    project: Project, cluster_name: str, check: bool, tags: list[str], reporter: Reporter
) -> PlaybookResult:
    """Run the cluster's role playbook with a generated inventory; per-task progress as it goes."""
    cluster = require_hosts(project, cluster_name)
    task = ""

    def on_line(kind: str, text: str) -> None:
        nonlocal task
        if kind == "task":
            task = text
            reporter.status(f"task: {text}")
        elif kind in ("changed", "fatal", "failed", "unreachable"):
            reporter.info(f"{text} ({task})")
        elif kind == "diff":
            reporter.info(text)
        elif kind == "message":
            reporter.info(f"note: {text} ({task})")

    result = run_playbook(
        playbook_for(cluster), inventory(project, cluster_name), check, tags, on_line=on_line
    )
    for line in result.failures:
        reporter.info(line)
    return result


def ansible_inventory(project: Project, cluster_name: str) -> dict[str, Any]:
    """The generated inventory as `ansible-inventory --list` reads it (for `host inventory`)."""
    return inventory_listing(inventory(project, cluster_name))
