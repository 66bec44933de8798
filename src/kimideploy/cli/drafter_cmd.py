"""`kimideploy drafter ...`: the drafter registry."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from kimideploy.cli.options import (
    cluster_options,
    complete_clusters,
    complete_drafters,
    output_option,
    poll_option,
    publish_options,
)
from kimideploy.cli.state import CliState
from kimideploy.cli.table import MACHINE_FORMATS, format_table, machine
from kimideploy.cli.terminal import TerminalReporter

if TYPE_CHECKING:
    from kimideploy.plan.drafter_doctor import Diagnosis


@click.group()
def drafter() -> None:
    """Inspect the drafter registry."""


@drafter.command("list")
@output_option()
@click.pass_obj
def list_drafters(state: CliState, output: str) -> None:
    """Name, method, source, tokens, layer ids with their convention, and status."""
    from kimideploy.services.drafters.listing import drafter_rows

    rows = drafter_rows(state.project().project)
    if output in MACHINE_FORMATS:
        click.echo(machine(rows, output))
        return
    click.echo(format_table(rows, keep=("method", "tokens", "status")))


@drafter.command("check")
@click.argument("name", shell_complete=complete_drafters)
@click.option(
    "--dir",
    "folder",
    type=click.Path(path_type=Path, file_okay=False, exists=True),
    help="A local copy of the drafter (config.json + safetensors) to check too.",
)
@click.option(
    "--cluster",
    default=None,
    help="Judge for serving there: its serve image's vLLM and its step cost (default cluster).",
    shell_complete=complete_clusters,
)
@click.option(
    "--replay",
    "replay_file",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    help="Your prompts (JSON Lines or Parquet, as the bench reads them): predict the drafter's "
    "acceptance and speedup on them with one replay Job on CLUSTER's engine, before any serve.",
)
@output_option()
@cluster_options
@poll_option
@click.pass_obj
def check(
    state: CliState,
    *,
    name: str,
    folder: Path | None,
    cluster: str | None,
    replay_file: Path | None,
    output: str,
    context: str | None,
    namespace: str | None,
    poll: float,
) -> None:
    """Offline compatibility check: architecture, sizes, vocab maps, layer ids, lineage, tokens.
    With --replay, the predicted acceptance on your prompts, measured on the cluster."""
    from kimideploy.errors import UsageError

    if replay_file is not None:
        _predict(
            state,
            name,
            cluster,
            replay_file,
            output=output,
            context=context,
            namespace=namespace,
            poll=poll,
        )
        return
    from kimideploy.plan.refusal import findings_refusal
    from kimideploy.plan.resolve import serve_cost_model
    from kimideploy.services.calibration_copies import cached
    from kimideploy.services.drafters.drafter_check import check as run

    loaded = state.project()
    project = loaded.project
    if name not in project.drafters:
        raise UsageError(f"unknown drafter '{name}' (valid: {', '.join(sorted(project.drafters))})")
    if cluster is not None and cluster not in project.clusters:
        valid = ", ".join(sorted(project.clusters))
        raise UsageError(f"--cluster {cluster}: no such cluster profile (valid: {valid})")
    # Offline: the local copy of the cluster's calibrations (left by the last command that read
    # them); the findings say whether the step cost is measured or the default constant.
    costs, _, level = serve_cost_model(
        loaded, cluster, cached(loaded, project.cluster_name(cluster))
    )
    findings = run(project, name, folder, cluster, costs, level)
    rows = [
        {"check": f.name, "status": f.status, "detail": f.detail, "fix": "" if f.ok else f.fix}
        for f in findings
    ]
    click.echo(machine(rows, output) or format_table(rows))
    if folder is None and name in project.eagle_drafters:
        click.echo(
            "(registry checks only: pass --dir with a copy of the drafter to check its files)",
            err=True,
        )
    refusal = findings_refusal(name, findings)
    if refusal is not None:  # the refusal `up` and `render` raise for the same findings
        raise refusal


def _predict(
    state: CliState,
    name: str,
    cluster: str | None,
    prompts: Path,
    *,
    output: str,
    context: str | None,
    namespace: str | None,
    poll: float,
) -> None:
    """`drafter check NAME --replay FILE`: one replay Job, no serve load."""
    from kimideploy.services.drafters.doctor import USER_PROMPTS, read_prompts

    result = _replay(
        state,
        (name,),
        cluster,
        read_prompts(prompts),
        context=context,
        namespace=namespace,
        poll=poll,
        why="drafter check --replay runs a replay Job on the cluster",
    )
    diagnosis = result[0]
    prediction = {
        "drafter": name,
        "cluster": diagnosis.cluster,
        "k": diagnosis.k,
        "prompts": str(prompts),
        "prompt_set": USER_PROMPTS,
        **diagnosis.prediction,
    }
    text = machine(prediction, output)
    if text is not None:
        click.echo(text)
        return
    click.echo(_prediction_lines(diagnosis.prediction, diagnosis.k))


def _replay(
    state: CliState,
    names: tuple[str, ...],
    cluster: str | None,
    prompts: tuple[dict[str, Any], ...],
    *,
    context: str | None,
    namespace: str | None,
    poll: float,
    why: str,
) -> list[Any]:
    from kimideploy.errors import UsageError
    from kimideploy.plan.resolve import serve_cost_model
    from kimideploy.services.connection import open_session
    from kimideploy.services.drafters.doctor import USER_PROMPTS, diagnoses, measured, run_replay

    loaded = state.project(why, pulls=True)
    project = loaded.project
    unknown = [n for n in names if n not in project.drafters]
    if unknown:
        raise UsageError(
            f"unknown drafter(s) {', '.join(unknown)} "
            f"(valid: {', '.join(sorted(project.drafters))})"
        )
    session = open_session(loaded, cluster, context, namespace)
    where = session.cluster
    outcome = run_replay(
        session, loaded, names, where, prompts=prompts, reporter=TerminalReporter(), poll_s=poll
    )
    calibrations = session.calibrations_of(where)
    level = serve_cost_model(loaded, where, calibrations)[2]
    found = {n: measured(session, loaded, n, where, level) for n in names}
    return diagnoses(
        loaded,
        where,
        outcome,
        found,
        calibrations=calibrations,
        prompt_set=USER_PROMPTS if prompts else None,
    )


def _prediction_lines(prediction: dict[str, Any], k: int) -> str:
    if not prediction:
        return "no prediction: the replay judged no position"
    rows = [
        {
            "k": f"{d}{' (served)' if int(d) == k else ''}",
            "mean acceptance length": f"{v['mean_acceptance_length']:.2f}",
            "speedup": f"{v['speedup']:.2f}x",
            "from": v.get("basis", ""),
        }
        for d, v in prediction["by_k"].items()
    ]
    rates = " ".join(f"{r:.2f}" for r in prediction["per_position"])
    elsewhere = prediction.get("measured_elsewhere")
    beside = (
        [
            f"measured elsewhere, not on these prompts: {elsewhere['mean_acceptance_length']:.2f} "
            f"({elsewhere['source']}; per position {elsewhere['per_position_basis']}: "
            + " ".join(f"{r:.2f}" for r in elsewhere["per_position"])
            + ")"
        ]
        if elsewhere
        else []
    )
    return "\n".join(
        [
            f"on your prompts, replayed ({prediction['source']}); per-position acceptance "
            f"({prediction.get('per_position_basis', '')}): {rates}",
            format_table(rows),
            f"best k {prediction['best_k']} at c={prediction['concurrency']}; step cost "
            f"{prediction['cost_source']}",
            *beside,
        ]
    )


@drafter.command("doctor")
@click.argument("names", nargs=-1, required=True, shell_complete=complete_drafters)
@click.option(
    "--cluster",
    default=None,
    help="Where the drafter serves (default cluster).",
    shell_complete=complete_clusters,
)
@click.option(
    "--prompts",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    help="Your prompts (JSON Lines or Parquet): replayed beside the drafter's own, to see "
    "whether they are the cause.",
)
@output_option()
@cluster_options
@poll_option
@click.pass_context
def doctor(
    ctx: click.Context,
    *,
    names: tuple[str, ...],
    cluster: str | None,
    prompts: Path | None,
    output: str,
    context: str | None,
    namespace: str | None,
    poll: float,
) -> None:
    """Why is acceptance low? Replays the drafter on CLUSTER's serving engine under controlled
    alternatives (features, template, layer ids, prompts, k) and names the cause with the
    figures side by side and the fix. Exit 0: every drafter healthy; 5: a cause was found (or
    nothing to judge one on)."""
    from kimideploy.errors import ExitCode
    from kimideploy.services.drafters.doctor import read_prompts

    rows = read_prompts(prompts) if prompts else ()
    found = _replay(
        ctx.obj,
        names,
        cluster,
        rows,
        context=context,
        namespace=namespace,
        poll=poll,
        why="drafter doctor runs a replay Job on the cluster",
    )
    text = machine([d.as_dict() for d in found], output)
    click.echo(text if text is not None else "\n\n".join(_report(d) for d in found))
    if any(not d.healthy for d in found):
        ctx.exit(int(ExitCode.UNHEALTHY))


def _report(diagnosis: Diagnosis) -> str:
    lines = [
        f"drafter {diagnosis.drafter} on {diagnosis.cluster} (k={diagnosis.k}): {diagnosis.verdict}"
    ]
    table = [
        {
            "scenario": r["scenario"],
            "what": r["what"],
            "length": "-" if r["length"] is None else f"{r['length']:.2f}",
            "per position": " ".join(f"{p:.2f}" for p in r["per_position"]),
        }
        for r in diagnosis.rows
    ]
    lines.append(format_table(table))
    for finding in diagnosis.findings:
        lines += [
            f"cause {finding.cause}: {finding.summary}",
            f"  evidence: {finding.evidence}",
            f"  fix: {finding.fix}",
        ]
    if diagnosis.prediction:
        lines.append(_prediction_lines(diagnosis.prediction, diagnosis.k))
    lines += [f"note: {note}" for note in diagnosis.notes]
    return "\n".join(lines)


@drafter.command("new")
@click.argument("name")
@click.option(
    "--cluster",
    shell_complete=complete_clusters,
    help="The cluster that will train it: its training drafter gives the shape (default: the "
    "default cluster).",
)
@click.option(
    "--base",
    shell_complete=complete_drafters,
    help="Fine-tune from this drafter (its shape is taken; recorded as lineage.base_drafter).",
)
@click.pass_obj
def new(state: CliState, *, name: str, cluster: str | None, base: str | None) -> None:
    """Declare drafter NAME in kimideploy.yaml before training it: the entry `run train
    --drafter NAME` writes into (drafters/NAME on the models volume, status planned)."""
    from kimideploy.services.drafters.declaring import NewDrafter, declare

    loaded = state.project(f"drafter new {name} edits kimideploy.yaml")
    cluster_name = loaded.project.cluster_name(cluster)
    written = declare(loaded, NewDrafter(name, cluster_name, base))
    click.echo(
        f"drafters.{name} added to {loaded.path}: {written['source']['path']}, k="
        f"{written['num_speculative_tokens']}, layers {written['aux_layer_ids']} "
        f"({written['layer_id_convention']}), status planned"
    )
    click.echo(f"next: kimideploy run train --drafter {name} --cluster {cluster_name}", err=True)


@drafter.command("refresh")
@click.argument("name", shell_complete=complete_drafters)
@click.option(
    "--capture",
    "capture",
    required=True,
    type=click.Path(path_type=Path, file_okay=False),
    help="A release's captured day files (capture/<release>/ of the datasets volume).",
)
@click.option(
    "--out",
    required=True,
    type=click.Path(path_type=Path, file_okay=False),
    help="Where prompts.jsonl, held-out.jsonl and refresh.json are written (a new folder).",
)
@click.option("--max-prompts", type=click.IntRange(1, 1_000_000), default=2000, show_default=True)
@click.option(
    "--held-out-fraction", type=click.FloatRange(0.05, 0.5), default=0.2, show_default=True
)
@output_option()
@click.pass_obj
def refresh(
    state: CliState,
    *,
    name: str,
    capture: Path,
    out: Path,
    max_prompts: int,
    held_out_fraction: float,
    output: str,
) -> None:
    """Choose what a refresh of drafter NAME learns from its served traffic: the captured
    conversations where it rejected the most draft tokens (low acceptance times how often they
    were sent), written with their lineage for datagen to answer again on the non-speculative
    target, and a held-out share (by a hash of each conversation) kept for the judgement."""
    from kimideploy.services.drafters.refreshing import RefreshAsk, choose

    loaded = state.project()
    chosen = choose(loaded, RefreshAsk(name, capture, out, max_prompts, held_out_fraction))
    text = machine(chosen, output)
    if text:
        click.echo(text)
        return
    click.echo(
        f"{chosen['chosen']} of {chosen['conversations']} conversations chosen "
        f"({chosen['requests']} requests; {chosen['rejected_draft_tokens_covered']:.0%} of the "
        f"rejected draft tokens), {chosen['held_out']} held out, {chosen['unranked']} without "
        f"acceptance; written to {out}"
    )
    click.echo(format_table(chosen["top"]))
    click.echo(
        f"next: kimideploy data put {out}/prompts.jsonl --cluster CLUSTER --as refresh/{name}.jsonl"
        f", then datagen on the non-speculative target, `kimideploy drafter new {name}-r "
        f"--base {name}` and a train run with train.anchor_weight (the pull toward {name})",
        err=True,
    )


@drafter.command("publish")
@click.argument("name", shell_complete=complete_drafters)
@publish_options(
    "The cluster whose models volume holds the drafter (where it was trained).",
    "registry.repository/drafters/NAME",
)
@click.pass_obj
def publish(
    state: CliState,
    *,
    name: str,
    cluster: str,
    to: str | None,
    overrides: tuple[str, ...],
    context: str | None,
    namespace: str | None,
    poll: float,
) -> None:
    """Push a trained drafter from CLUSTER's volume to the registry as one OCI artifact, pinned
    by digest, and write its source, checksums and held-out figures into kimideploy.yaml."""
    from kimideploy.services.connection import open_session
    from kimideploy.services.drafters.publishing import publish_drafter

    loaded = state.project(
        f"drafter publish {name} runs a Job and edits kimideploy.yaml", pulls=True
    )
    session = open_session(loaded, cluster, context, namespace)
    done = publish_drafter(
        session,
        loaded,
        name,
        session.cluster,
        to=to,
        reporter=TerminalReporter(),
        poll_s=poll,
        overrides=overrides,
    )
    click.echo(f"{done.reference}")
    lengths = ", ".join(f"k={k} {v}" for k, v in sorted((done.held_out or {}).items()))
    what = "added to" if done.created else "updated in"
    click.echo(
        f"drafters.{name} {what} {loaded.path}: source.oci pinned, status trained, "
        f"{len(done.files)} file checksums" + (f", held-out {lengths}" if lengths else ""),
        err=True,
    )


@drafter.command("pull")
@click.argument("names", nargs=-1, required=True, shell_complete=complete_drafters)
@click.option(
    "--cluster",
    default=None,
    help="Where it will serve (default cluster).",
    shell_complete=complete_clusters,
)
@output_option()
@cluster_options
@poll_option
@click.pass_obj
def pull(
    state: CliState,
    *,
    names: tuple[str, ...],
    cluster: str | None,
    output: str,
    context: str | None,
    namespace: str | None,
    poll: float,
) -> None:
    """Fetch published drafters onto CLUSTER's models volume ahead of serving: a Job runs the
    serve pod's own artifact-pull (verified blob by blob and file by file against the digest
    and checksums kimideploy.yaml pins), so `up serve` later finds them there."""
    from kimideploy.plan.asks import PullAsk
    from kimideploy.plan.model import PlanRequest
    from kimideploy.services.connection import open_session
    from kimideploy.services.drafters.pulling import pull_drafters
    from kimideploy.services.rendering import refuse_before_contact

    loaded = state.project("drafter pull runs a Job on a cluster")
    pull = PlanRequest("pull", cluster, names[0], ask=PullAsk(drafters=names))
    refuse_before_contact(loaded, [pull])
    session = open_session(loaded, cluster, context, namespace)
    done = pull_drafters(
        session, loaded, names, session.cluster, reporter=TerminalReporter(), poll_s=poll
    )
    rows = [
        {"drafter": d.name, "state": d.state, "reference": d.reference, "path": d.dest}
        for d in done
    ]
    click.echo(machine(rows, output) or format_table(rows))
