"""`kimideploy host check|inventory|provision|sync-model`, each with `--cluster C`."""

from __future__ import annotations

import click

from kimideploy.cli.options import cluster_option, cluster_options, output_option, poll_option
from kimideploy.cli.state import CliState
from kimideploy.cli.table import MACHINE_FORMATS, format_table, machine
from kimideploy.cli.terminal import TerminalReporter


@click.group()
def host() -> None:
    """The GPU machines behind a cluster profile, over SSH."""


@host.command("check")
@cluster_option
@click.option("--host", "only", help="Only this host of the cluster.")
@click.option(
    "--allreduce",
    is_flag=True,
    help="Also run the serve pod's all-reduce on one node's GPUs (a Job; the GPUs must be free) "
    "against network.min_node_bus_gbps.",
)
@click.option(
    "--over-ssh-only",
    is_flag=True,
    help="Skip the checks that run on the cluster (the weights on a shared models claim, the "
    "storage probe).",
)
@click.option(
    "--storage",
    is_flag=True,
    help="Also measure the models claim's cold read bandwidth from a pod (a Job reading 20 GB) "
    "and record it for the serve plan's reader (`up` runs it before the first load where the "
    "reader waits on it).",
)
@click.option(
    "--timeout", "timeout_s", default=900.0, show_default=True, help="For the all-reduce Job (s)."
)
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="WORKLOAD.KEY=VALUE",
    help="Override a setting of the serve plan the probes come from (repeatable).",
)
@cluster_options
@poll_option
@output_option()
@click.pass_obj
def check(
    state: CliState,
    *,
    cluster: str | None,
    only: str | None,
    allreduce: bool,
    over_ssh_only: bool,
    storage: bool,
    timeout_s: float,
    overrides: tuple[str, ...],
    context: str | None,
    namespace: str | None,
    poll: float,
    output: str,
) -> None:
    """Is the host ready? GPUs, driver, CUDA, disk, runtime, k3s, device plugin, fabric, the
    compute HCAs, peer-to-peer (IOMMU, ACS, BAR1, topology); on a shared models claim the
    weights as the pods see them; with --allreduce one node's all-reduce."""
    from kimideploy.errors import KimiDeployError
    from kimideploy.services.hosts.provision import check_hosts, check_rows

    loaded = state.project()
    project = loaded.project
    cluster = project.cluster_name(cluster)
    results = check_hosts(project, cluster, only=only)
    profile = project.clusters[cluster]
    on_cluster = []
    shared = profile.weights_via == "job" and not over_ssh_only
    if shared or allreduce or storage:
        from kimideploy.services.connection import open_session
        from kimideploy.services.hosts import cluster_checks

        session = open_session(loaded, cluster, context, namespace)
        if shared:
            on_cluster.append(
                cluster_checks.weights_check(
                    session, loaded, cluster, overrides=overrides, poll_s=poll
                )
            )
        if storage:
            on_cluster.append(
                cluster_checks.storage_check(
                    session, loaded, cluster, overrides=overrides, poll_s=poll
                )
            )
        if allreduce:
            on_cluster.append(
                cluster_checks.allreduce_check(
                    session, loaded, cluster, overrides=overrides, timeout_s=timeout_s, poll_s=poll
                )
            )
    if on_cluster:
        results.append((f"cluster {cluster}", on_cluster))
    rows = check_rows(results)
    click.echo(machine(rows, output) or format_table(rows))
    blocking = [r for r in rows if r["status"] == "FAIL"]
    if blocking:
        raise KimiDeployError(
            f"{len(blocking)} blocking check(s) failed", hint="each row says how to fix it"
        )


@host.command("inventory")
@cluster_option
@click.option(
    "-o",
    "--output",
    type=click.Choice(MACHINE_FORMATS),
    default="json",
    show_default=True,
    help="json is what `ansible-inventory --list` prints; yaml the same document.",
)
@click.pass_obj
def inventory(state: CliState, cluster: str | None, output: str) -> None:
    """The Ansible inventory `host provision` generates, as `ansible-inventory --list` sees it."""
    from kimideploy.services.hosts.provision import ansible_inventory

    project = state.project().project
    click.echo(machine(ansible_inventory(project, project.cluster_name(cluster)), output))


@host.command()
@cluster_option
@click.option("--check", "dry", is_flag=True, help="Ansible check mode: report, change nothing.")
@click.option(
    "--tags", default="", help="Comma-separated: driver, p2p, toolkit, k3s, device-plugin, base."
)
@click.pass_obj
def provision(state: CliState, cluster: str | None, dry: bool, tags: str) -> None:
    """Run the cluster's Ansible role on its hosts (idempotent; --check is a true dry run)."""
    from kimideploy.errors import RolloutError
    from kimideploy.services.hosts.provision import provision as run

    project = state.project(None if dry else "host provision changes hosts").project
    result = run(
        project,
        project.cluster_name(cluster),
        dry,
        [t for t in tags.split(",") if t],
        TerminalReporter(),
    )
    rows = [{"host": h, **counts} for h, counts in result.recap.items()]
    click.echo(format_table(rows))
    if not result.ok:
        raise RolloutError(
            f"provisioning failed (ansible-playbook exit {result.exit_code})",
            hint="the failing task and its message are above; fix and run again",
        )


@host.command("sync-model")
@cluster_option
@click.option("--host", "only", help="Only this host of the cluster.")
@click.option("--no-drafters", is_flag=True, help="Only the target model, not the drafters.")
@cluster_options
@poll_option
@click.pass_obj
def sync_model(
    state: CliState,
    *,
    cluster: str | None,
    only: str | None,
    no_drafters: bool,
    context: str | None,
    namespace: str | None,
    poll: float,
) -> None:
    """Download the pinned revision (and the hub drafters) onto the models volume the pods
    mount: resumable, verified, marked complete. On a host-path volume (the PCIe host) over SSH
    onto the host's NVMe, the token from HF_TOKEN on stdin only; on a shared models claim (the
    rented clusters: workloads.weights.via job) by a download Job on the cluster, the token
    from the model's hf_token Secret. Then the published drafters (pinned by digest) are fetched
    with the serve pod's own pull, run as a Job.
    """
    from kimideploy.services.hosts.model_sync import sync_model as run

    loaded = state.project("host sync-model writes to hosts")
    reporter = TerminalReporter()
    cluster = loaded.project.cluster_name(cluster)
    if loaded.project.clusters[cluster].weights_via == "job":
        from kimideploy.services.connection import open_session
        from kimideploy.services.hosts.model_sync import sync_weights_job

        session = open_session(loaded, cluster, context, namespace)
        sync_weights_job(session, loaded, reporter, poll)
    else:
        run(loaded.project, cluster, reporter, drafters=not no_drafters, only=only)
    if no_drafters:
        return
    from kimideploy.services.drafters.pulling import published_drafters, pull_drafters

    published = published_drafters(loaded.project)
    if published:
        from kimideploy.services.connection import open_session

        reporter.info(f"published drafters {', '.join(published)}: pulled by a Job on {cluster}")
        session = open_session(loaded, cluster, context, namespace)
        for done in pull_drafters(
            session, loaded, published, session.cluster, reporter=reporter, poll_s=poll
        ):
            reporter.info(f"drafter {done.name}: {done.reference} {done.state} at {done.dest}")
