"""Which hosts a host command talks to, and how it connects (Fabric by default; tests pass their
own connector)."""

from __future__ import annotations

from collections.abc import Callable

from kimideploy.config.clusters import SshHost
from kimideploy.config.project import Project
from kimideploy.errors import UsageError
from kimideploy.provision.inventory import require_hosts
from kimideploy.remote import connect as ssh_connect
from kimideploy.remote.runner import Runner

Connect = Callable[[SshHost], Runner]

__all__ = ["Connect", "hosts_of", "ssh_connect"]


def hosts_of(project: Project, cluster_name: str, only: str | None) -> list[SshHost]:
    cluster = require_hosts(project, cluster_name)
    hosts = [h for h in cluster.hosts if only is None or h.name == only]
    if not hosts:
        raise UsageError(
            f"--host {only}: not a host of {cluster_name} "
            f"(hosts: {', '.join(h.name for h in cluster.hosts)})"
        )
    return hosts
