"""`kimideploy host ...`: check, provision and sync the model onto the cluster's hosts over SSH."""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from kimideploy.config.clusters import SshHost
from kimideploy.config.project import Project
from kimideploy.errors import KimiDeployError, UsageError
from kimideploy.provision.inventory import inventory, playbook_for, require_hosts
from kimideploy.provision.runner import PlaybookResult, inventory_listing, run_playbook
from kimideploy.remote.runner import Runner
from kimideploy.services import hostcheck
from kimideploy.services.progress import parse_events
from kimideploy.services.reporting import Reporter

Connect = Callable[[SshHost], Runner]


def ssh_connect(host: SshHost) -> Runner:
    """The real connector (Fabric); tests and callers may pass their own."""
    from kimideploy.remote import connect

    return connect(host)


HUB_ENDPOINT_ENV = "HF_ENDPOINT"


def _hosts(project: Project, cluster_name: str, only: str | None) -> list[SshHost]:
    cluster = require_hosts(project, cluster_name)
    hosts = [h for h in cluster.hosts if only is None or h.name == only]
    if not hosts:
        raise UsageError(
            f"--host {only}: not a host of {cluster_name} "
            f"(hosts: {', '.join(h.name for h in cluster.hosts)})"
        )
    return hosts


def check_hosts(
    project: Project, cluster_name: str, connect: Connect = ssh_connect, only: str | None = None
) -> list[tuple[str, list[hostcheck.Check]]]:
    """Run the probe on each host and evaluate it against the cluster profile and serve image."""
    cluster = require_hosts(project, cluster_name)
    assert cluster.host_setup is not None
    image = project.images[cluster.images.serve]
    results = []
    for host in _hosts(project, cluster_name, only):
        runner = connect(host)
        try:
            script = hostcheck.probe_script()
            output = runner.run_script(script, [cluster.host_setup.model_path], timeout=60)
        finally:
            runner.close()
        results.append((host.name, hostcheck.evaluate(project, cluster, image, output.stdout)))
    return results


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

    result = run_playbook(
        playbook_for(cluster), inventory(project, cluster_name), check, tags, on_line
    )
    for line in result.failures:
        reporter.info(line)
    return result


def ansible_inventory(project: Project, cluster_name: str) -> dict[str, Any]:
    """The generated inventory as `ansible-inventory --list` reads it (for `host inventory`)."""
    return inventory_listing(inventory(project, cluster_name))


@dataclass(frozen=True)
class SyncTarget:
    repo: str
    revision: str
    dest: str


def sync_targets(project: Project, cluster_name: str, drafters: bool) -> list[SyncTarget]:
    """The pinned model revision, and the hub drafters, under the host's model path."""
    cluster = require_hosts(project, cluster_name)
    assert cluster.host_setup is not None
    root = cluster.host_setup.model_path
    model = project.model_for(cluster_name)  # the checkpoint this cluster serves
    targets = [SyncTarget(model.repo, model.revision, f"{root}/hub/{model.repo}/{model.revision}")]
    if drafters:
        for drafter in project.drafters.values():
            hub = drafter.source.hub
            if hub is not None:
                targets.append(
                    SyncTarget(hub.repo, hub.revision, f"{root}/drafters/{hub.repo}/{hub.revision}")
                )
    return targets


def sync_model(
    project: Project,
    cluster_name: str,
    reporter: Reporter,
    connect: Connect = ssh_connect,
    drafters: bool = True,
    only: str | None = None,
) -> None:
    """Upload the stdlib downloader and run it on each host; the token travels on stdin only."""
    token = os.environ.get("HF_TOKEN", "")
    endpoint = os.environ.get(HUB_ENDPOINT_ENV, "https://huggingface.co")
    payload = Path(str(resources.files("kimideploy.remote.payloads") / "hub_sync.py"))
    for host in _hosts(project, cluster_name, only):
        runner = connect(host)
        remote = f"/tmp/kimideploy-hub-sync-{secrets.token_hex(4)}.py"
        try:
            runner.put(payload, remote)
            for target in sync_targets(project, cluster_name, drafters):
                _sync_one(runner, host.name, remote, endpoint, target, token, reporter)
        finally:
            runner.run(["rm", "-f", remote])
            runner.close()


def _sync_one(
    runner: Runner,
    host: str,
    script: str,
    endpoint: str,
    target: SyncTarget,
    token: str,
    reporter: Reporter,
) -> None:
    def on_line(line: str) -> None:
        for event in parse_events(line):
            if event["event"] == "progress":
                done, total = event["done"] / 1e9, event["total"] / 1e9
                reporter.status(
                    f"{host}: {target.repo}: {done:,.1f}/{total:,.1f} GB, "
                    f"{event['rate'] / 1e6:,.0f} MB/s"
                )

    argv = [
        "python3",
        script,
        "--endpoint",
        endpoint,
        "--repo",
        target.repo,
        "--revision",
        target.revision,
        "--dest",
        target.dest,
    ]
    result = runner.run_streaming(argv, on_line, stdin=token + "\n", timeout=None)
    if not result.ok:
        raise KimiDeployError(
            f"{host}: syncing {target.repo}@{target.revision[:12]} failed "
            f"(exit {result.exit_code}): "
            f"{result.stderr.strip()}",
            hint="run the same command again: finished files are kept and partial ones resume",
        )
    done = [e for e in parse_events(result.stdout) if e["event"] == "result"]
    summary = json.dumps(done[-1]) if done else "done"
    reporter.info(
        f"{host}: {target.repo}@{target.revision[:12]} verified in {target.dest} ({summary})"
    )


def check_rows(results: list[tuple[str, list[hostcheck.Check]]]) -> list[dict[str, Any]]:
    return [row for host, checks in results for row in hostcheck.rows(host, checks)]
