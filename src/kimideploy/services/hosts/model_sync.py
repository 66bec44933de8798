"""`kimideploy host sync-model`: download the pinned model (and hub drafters) onto each host with a
stdlib downloader that resumes and verifies."""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from kimideploy.cluster.session import ClusterSession
from kimideploy.config.loading import LoadedProject
from kimideploy.config.project import Project
from kimideploy.errors import KimiDeployError
from kimideploy.formats.hub_download import downloader_command
from kimideploy.plan.model import PlanRequest
from kimideploy.provision.inventory import require_hosts
from kimideploy.remote.runner import Runner
from kimideploy.services.hosts.connect import Connect, hosts_of, ssh_connect
from kimideploy.services.reporting import Reporter
from kimideploy.services.runs import batch_runs
from kimideploy.services.runs.progress import duration, parse_events

HUB_ENDPOINT_ENV = "HF_ENDPOINT"


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
        for drafter in project.eagle_drafters.values():
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
    setup = require_hosts(project, cluster_name).host_setup
    streams = setup.download_streams if setup is not None else 1
    for host in hosts_of(project, cluster_name, only):
        runner = connect(host)
        remote = f"/tmp/kimideploy-hub-sync-{secrets.token_hex(4)}.py"
        try:
            runner.put(payload, remote)
            sync = _HostSync(runner, host.name, remote, endpoint, token, reporter, streams)
            for target in sync_targets(project, cluster_name, drafters):
                sync.fetch(target)
        finally:
            runner.run(["rm", "-f", remote])
            runner.close()


@dataclass(frozen=True)
class _HostSync:
    """One host's downloads: where the downloader was put, the hub it reads, the token it gets
    on stdin, and where progress goes."""

    runner: Runner
    host: str
    script: str
    endpoint: str
    token: str
    reporter: Reporter
    streams: int

    def fetch(self, target: SyncTarget) -> None:
        def on_line(line: str) -> None:
            for event in parse_events(line):
                if event["event"] == "progress":
                    done, total = event["done"] / 1e9, event["total"] / 1e9
                    eta = event.get("eta_s")
                    left = f", ETA {duration(eta)}" if isinstance(eta, int | float) else ""
                    self.reporter.status(
                        f"{self.host}: {target.repo}: {done:,.1f}/{total:,.1f} GB, "
                        f"{event['rate'] / 1e6:,.0f} MB/s over {self.streams} streams{left}"
                    )

        argv = downloader_command(
            "python3",
            self.script,
            endpoint=self.endpoint,
            repo=target.repo,
            revision=target.revision,
            dest=target.dest,
            streams=self.streams,
        )
        result = self.runner.run_streaming(argv, on_line, stdin=self.token + "\n", timeout=None)
        if not result.ok:
            raise KimiDeployError(
                f"{self.host}: syncing {target.repo}@{target.revision[:12]} failed "
                f"(exit {result.exit_code}): "
                f"{result.stderr.strip()}",
                hint="run the same command again: finished files are kept and partial ones resume",
            )
        done = [e for e in parse_events(result.stdout) if e["event"] == "result"]
        summary = json.dumps(done[-1]) if done else "done"
        where = f"{self.host}: {target.repo}@{target.revision[:12]}"
        self.reporter.info(f"{where} verified in {target.dest} ({summary})")


def sync_weights_job(
    session: ClusterSession, loaded: LoadedProject, reporter: Reporter, poll_s: float = 2.0
) -> list[dict[str, str]]:
    """The download Job into the cluster's shared models claim, followed to its end; what it
    synced (repo, revision, the folder the pods read)."""
    request = PlanRequest("weights", session.cluster)
    started = batch_runs.start_run(session, loaded, request, reporter)
    snapshot = batch_runs.follow_run(session, started.job, started.run_id, reporter, poll_s=poll_s)
    result = batch_runs.run_results(snapshot).get("0") or {}
    synced = [dict(one) for one in result.get("synced") or [] if isinstance(one, dict)]
    if not synced:
        raise KimiDeployError(
            f"the weights Job {started.job} ended without reporting what it downloaded",
            hint=f"`kimideploy logs {started.run_id}` shows what the pod did",
        )
    for one in synced:
        reporter.info(
            f"{one.get('repo')}@{str(one.get('revision'))[:12]} verified in {one.get('dest')}"
        )
    return synced
