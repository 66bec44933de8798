"""`kimideploy host check|provision|sync-model CLUSTER`."""

from __future__ import annotations

import json

import click

from kimideploy.cli.options import cluster_options, output_option, poll_option
from kimideploy.cli.state import CliState
from kimideploy.cli.table import format_table, machine
from kimideploy.cli.terminal import TerminalReporter


@click.group()
def host() -> None:
    """The GPU machines behind a cluster profile, over SSH."""


@host.command("check")
@click.argument("cluster")
@click.option("--host", "only", help="Only this host of the cluster.")
@output_option()
@click.pass_obj
def check(state: CliState, cluster: str, only: str | None, output: str) -> None:
    """Is the host ready? GPUs, driver, CUDA, disk, runtime, k3s, device plugin, fabric."""
    from kimideploy.errors import KimiDeployError
    from kimideploy.services.hosts.provision import check_hosts, check_rows

    results = check_hosts(state.project().project, cluster, only=only)
    rows = check_rows(results)
    click.echo(machine(rows, output) or format_table(rows))
    blocking = [r for r in rows if r["status"] == "FAIL"]
    if blocking:
        raise KimiDeployError(
            f"{len(blocking)} blocking check(s) failed", hint="each row says how to fix it"
        )


@host.command("inventory")
@click.argument("cluster")
@click.pass_obj
def inventory(state: CliState, cluster: str) -> None:
    """The Ansible inventory `host provision` generates, as `ansible-inventory --list` sees it."""
    from kimideploy.services.hosts.provision import ansible_inventory

    click.echo(json.dumps(ansible_inventory(state.project().project, cluster), indent=2))


@host.command()
@click.argument("cluster")
@click.option("--check", "dry", is_flag=True, help="Ansible check mode: report, change nothing.")
@click.option(
    "--tags", default="", help="Comma-separated: driver, toolkit, k3s, device-plugin, base."
)
@click.pass_obj
def provision(state: CliState, cluster: str, dry: bool, tags: str) -> None:
    """Run the cluster's Ansible role on its hosts (idempotent; --check is a true dry run)."""
    from kimideploy.errors import RolloutError
    from kimideploy.services.hosts.provision import provision as run

    result = run(
        state.project(None if dry else "host provision changes hosts").project,
        cluster,
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
@click.argument("cluster")
@click.option("--host", "only", help="Only this host of the cluster.")
@click.option("--no-drafters", is_flag=True, help="Only the target model, not the drafters.")
@cluster_options
@poll_option
@click.pass_obj
def sync_model(
    state: CliState,
    cluster: str,
    only: str | None,
    no_drafters: bool,
    context: str | None,
    namespace: str | None,
    poll: float,
) -> None:
    """Download the pinned revision (and the hub drafters) onto the host's NVMe: resumable,
    verified, marked complete; then fetch the published drafters (pinned by digest) onto the
    cluster's models volume with the serve pod's own pull, run as a Job on the host's k3s.

    The token comes from HF_TOKEN in the environment and reaches the host on stdin only.
    """
    from kimideploy.services.hosts.model_sync import sync_model as run

    loaded = state.project("host sync-model writes to hosts")
    reporter = TerminalReporter()
    run(loaded.project, cluster, reporter, drafters=not no_drafters, only=only)
    if no_drafters:
        return
    from kimideploy.services.drafters.pulling import published_drafters, pull_drafters

    published = published_drafters(loaded.project)
    if published:
        from kimideploy.services.connection import open_session

        reporter.info(f"published drafters {', '.join(published)}: pulled by a Job on {cluster}")
        session = open_session(loaded, cluster, context, namespace)
        for done in pull_drafters(session, loaded, published, session.cluster, reporter, poll):
            reporter.info(f"drafter {done.name}: {done.reference} {done.state} at {done.dest}")
