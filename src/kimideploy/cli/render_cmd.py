"""`kimideploy render WORKLOAD`: validated manifests on stdout or one file per object."""

from __future__ import annotations

import json
from pathlib import Path

import click

from kimideploy.cli.options import plan_options
from kimideploy.cli.state import WORKLOAD_CHOICE, CliState


@click.command()
@click.argument("workload", type=WORKLOAD_CHOICE)
@plan_options
@click.option(
    "-o",
    "--output",
    type=click.Choice(["yaml", "json"]),
    default="yaml",
    show_default=True,
    help="yaml: multi-document YAML; json: one List object (both go to `kubectl apply -f -`).",
)
@click.option(
    "--dir",
    "output_dir",
    type=click.Path(path_type=Path, file_okay=False),
    help="Write one YAML file per object into this folder instead of stdout.",
)
@click.option(
    "--kustomize",
    "kustomize_dir",
    type=click.Path(path_type=Path, file_okay=False),
    help="Write a Kustomize base and one overlay per cluster into this folder (for Argo CD / "
    "Flux); --cluster is the base, --overlay limits the clusters.",
)
@click.option(
    "--overlay",
    "overlays",
    multiple=True,
    metavar="CLUSTER",
    help="With --kustomize: only these clusters (repeatable; default: every cluster).",
)
@click.option(
    "--force",
    is_flag=True,
    help="Render a drafter whose check fails (predicted slower, a stack where speculation "
    "cannot pay), as `up --force` would deploy it, or pods that would pull the example's "
    "placeholder pins.",
)
@click.pass_obj
def render(
    state: CliState,
    *,
    workload: str,
    cluster: str | None,
    drafter: str | None,
    overrides: tuple[str, ...],
    output: str,
    output_dir: Path | None,
    kustomize_dir: Path | None,
    overlays: tuple[str, ...],
    force: bool,
) -> None:
    """Render WORKLOAD's manifests, validated against the cluster's Kubernetes schema.

    Output is multi-document YAML, so `kimideploy render serve | kubectl apply -f -` works. A
    drafter `up` would refuse is refused here too (exit 2, the same message), so a GitOps tree
    never carries what the CLI would not deploy; --force renders it anyway.
    """
    from kimideploy.cli.state import pins_judged
    from kimideploy.errors import UsageError
    from kimideploy.plan.model import PlanRequest
    from kimideploy.plan.refusal import drafter_refusal
    from kimideploy.services.rendering import (
        kustomize_files,
        placeholder_refusal,
        render_workload,
        write_objects,
        write_tree,
    )

    if output == "json" and (output_dir or kustomize_dir):
        raise UsageError("-o json prints to stdout; --dir and --kustomize write YAML files")
    if overlays and kustomize_dir is None:
        raise UsageError("--overlay only applies with --kustomize")
    if kustomize_dir is not None:
        if output_dir is not None:
            raise UsageError("--kustomize and --dir exclude each other")
        loaded = state.project()
        base = loaded.project.cluster_name(cluster)
        others = [c for c in (overlays or sorted(loaded.project.clusters)) if c != base]
        files, warnings = kustomize_files(
            loaded,
            workload,
            drafter,
            overrides,
            clusters=[base, *others],
            force=force,
            pins=pins_judged(state),
        )
        for warning in warnings:
            click.echo(f"warning: {warning}", err=True)
        for path in write_tree(files, kustomize_dir):
            click.echo(str(path), err=True)
        return
    from kimideploy.services.rendering import PLAN_FACTS_SHOWN

    loaded = state.project()
    rendered = render_workload(loaded, PlanRequest(workload, cluster, drafter, overrides))
    for warning in rendered.plan.warnings:
        click.echo(f"warning: {warning}", err=True)
    for key, value in rendered.plan.facts:
        if key in PLAN_FACTS_SHOWN:
            click.echo(f"{key}: {value}", err=True)
    refusal = drafter_refusal(rendered.plan, force)
    if refusal is None and not force and pins_judged(state):
        refusal = placeholder_refusal(loaded, [rendered.plan])  # what `up` would refuse
    if refusal is not None:
        raise refusal
    if output_dir is None and output == "json":
        document = {"apiVersion": "v1", "kind": "List", "items": rendered.objects}
        click.echo(json.dumps(document, indent=2))
        return
    if output_dir is None:
        click.echo(rendered.yaml, nl=False)
        return
    for path in write_objects(rendered, output_dir):
        click.echo(str(path), err=True)
