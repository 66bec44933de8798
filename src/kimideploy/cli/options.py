"""Every option shared by more than one command, in one place: a command's signature reads as
the list of these it takes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click
from click.decorators import FC

from kimideploy.cli.table import MACHINE_FORMATS, WHOLE_CELLS, WIDE

CLUSTER_HELP = "Cluster profile (default: default_cluster)."


def _project_names(ctx: click.Context, which: str, incomplete: str) -> list[str]:
    """The project's cluster or drafter names for shell completion, read from the file the
    command line (or KIMIDEPLOY_CONFIG, or ./kimideploy.yaml, or the example) names; nothing
    where it cannot be read: completion never fails the shell."""
    import os
    from pathlib import Path

    from kimideploy.config.loading import default_config_path, load_project
    from kimideploy.errors import KimiDeployError

    given = ctx.find_root().params.get("config_path") or os.environ.get("KIMIDEPLOY_CONFIG")
    try:
        project = load_project(Path(given) if given else default_config_path()).project
    except (KimiDeployError, OSError):
        return []
    names = {
        "clusters": list(project.clusters),
        "drafters": list(project.drafters),
        "speculation": [*project.drafters, "none"],
    }[which]
    return sorted(n for n in names if n.startswith(incomplete))


def complete_clusters(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[str]:
    return _project_names(ctx, "clusters", incomplete)


def complete_drafters(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[str]:
    """The registry's drafters and methods."""
    return _project_names(ctx, "drafters", incomplete)


def complete_speculation(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[str]:
    """What --drafter takes: the registry's names and `none`."""
    return _project_names(ctx, "speculation", incomplete)


cluster_option = click.option("--cluster", help=CLUSTER_HELP, shell_complete=complete_clusters)
poll_option = click.option("--poll", default=2.0, hidden=True)
"""Seconds between polls of a Job or a rollout (the tests shorten it)."""


def _use_kubeconfig(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    """kubectl's --kubeconfig: the connection reads KUBECONFIG when it opens (cluster/api.py),
    so the file given here is what every connection of this command uses, and what the tools it
    starts (kubectl, Ansible) see."""
    if value:
        import os

        os.environ["KUBECONFIG"] = value


def cluster_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """--context, --namespace and --kubeconfig, accepted by every command that talks to a
    cluster."""
    func = click.option(
        "--kubeconfig",
        type=click.Path(exists=True, dir_okay=False),
        expose_value=False,
        callback=_use_kubeconfig,
        help="kubeconfig file (default: $KUBECONFIG, else ~/.kube/config).",
    )(func)
    func = click.option("--namespace", "-n", help="Namespace (default: the cluster profile's).")(
        func
    )
    return click.option(
        "--context", help="kubeconfig context (default: the cluster profile's kube_context)."
    )(func)


def plan_options(func: FC) -> FC:
    """--cluster, --drafter and --set, shared by every command that resolves a plan."""
    func = click.option(
        "--set",
        "overrides",
        multiple=True,
        metavar="WORKLOAD.KEY=VALUE",
        help="Override a workload setting of the cluster, e.g. train.epochs=3 (repeatable).",
    )(func)
    func = click.option(
        "--drafter",
        help="Drafter name from the registry, or 'none' for no speculation.",
        shell_complete=complete_speculation,
    )(func)
    return cluster_option(func)


def publish_options(source: str, default_to: str) -> Callable[..., Any]:
    """--cluster (required), --to, --set, the cluster options and the hidden --poll of `drafter
    publish` and `data publish`."""

    def add(func: Callable[..., Any]) -> Callable[..., Any]:
        func = poll_option(func)
        func = cluster_options(func)
        func = click.option(
            "--set",
            "overrides",
            multiple=True,
            metavar="W.K=V",
            help="Override a workload setting of that cluster, e.g. publish.resources.cpu=2.",
        )(func)
        func = click.option(
            "--to", "to", default=None, help=f"Repository (default: {default_to})."
        )(func)
        return click.option(
            "--cluster", "cluster", required=True, help=source, shell_complete=complete_clusters
        )(func)

    return add


def output_option(human: str = "table", *more: str) -> Callable[[FC], FC]:
    """`-o/--output` of a read command: the human form first (the default), then json and yaml,
    then `more`. A table command also takes `wide`: the table with every cell whole (the command
    sees "table")."""
    wide = (WIDE,) if human == "table" else ()
    return click.option(
        "-o",
        "--output",
        type=click.Choice([human, *wide, *MACHINE_FORMATS, *more]),
        default=human,
        show_default=True,
        callback=_wide_is_a_table,
        help="json and yaml print the same document, for scripts"
        + ("; a table fits the terminal, wide shows every cell whole." if wide else "."),
    )


def _wide_is_a_table(ctx: click.Context, param: click.Parameter, value: str) -> str:
    if value == WIDE:
        ctx.meta[WHOLE_CELLS] = True
        return "table"
    return value


def outcome_option(func: Any) -> Any:
    """`-o prose|json|yaml` for a command that changes something."""
    return click.option(
        "-o",
        "--output",
        type=click.Choice(["prose", *MACHINE_FORMATS]),
        default="prose",
        show_default=True,
        help="json and yaml print one outcome document on stdout (kimideploy.outcome.v1), "
        "success or failure; progress stays on stderr.",
    )(func)


def levels_option(func: FC) -> FC:
    """--at-concurrency: the gate's concurrency levels (up --gate and gate serve)."""
    return click.option(
        "--at-concurrency",
        "at_concurrency",
        callback=lambda _ctx, _param, value: concurrency_levels(value),
        help="Comma-separated concurrency levels the gate decides on, e.g. 1,8.",
    )(func)


def concurrency_levels(value: str | None) -> tuple[int, ...] | None:
    if value is None:
        return None
    try:
        levels = tuple(int(part) for part in value.split(",") if part.strip())
    except ValueError:
        message = f"{value!r}: expected comma-separated integers, e.g. 1,8"
        raise click.BadParameter(message) from None
    if not levels or min(levels) < 1:
        raise click.BadParameter(f"{value!r}: expected positive integers, e.g. 1,8")
    return levels
