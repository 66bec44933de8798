"""The only importer of Fabric: running commands and copying files on hosts over SSH."""

from __future__ import annotations

from kimideploy.config.clusters import SshHost
from kimideploy.remote.fabric_runner import FabricRunner, SshTarget
from kimideploy.remote.runner import Runner


def connect(host: SshHost) -> Runner:
    """A Fabric runner for a host of the config (host keys checked against known_hosts)."""
    target = SshTarget(
        host.name, host.address, host.port, host.user, host.identity_file, host.known_hosts
    )
    return FabricRunner(target)
