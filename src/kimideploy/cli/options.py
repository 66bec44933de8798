"""Every option shared by more than one command, in one place: a command's signature reads as
the list of these it takes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click
from click.decorators import FC

from kimideploy.cli.table import MACHINE_FORMATS

CLUSTER_HELP = "Cluster profile (default: default_cluster)."
cluster_option = click.option("--cluster", help=CLUSTER_HELP)
poll_option = click.option("--poll", default=2.0, hidden=True)
"""Seconds between polls of a Job or a rollout (the tests shorten it)."""


def cluster_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """--context and --namespace, accepted by every command that talks to a cluster."""
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
        "--drafter", help="Drafter name from the registry, or 'none' for no speculation."
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
        return click.option("--cluster", "cluster", required=True, help=source)(func)

    return add


def output_option(human: str = "table", *more: str) -> Callable[[FC], FC]:
    """`-o/--output` of a read command: the human form first (the default), then json and yaml,
    then `more`."""
    return click.option(
        "-o",
        "--output",
        type=click.Choice([human, *MACHINE_FORMATS, *more]),
        default=human,
        show_default=True,
        help="json and yaml print the same document, for scripts.",
    )


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
