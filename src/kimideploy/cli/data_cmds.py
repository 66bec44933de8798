"""`kimideploy data inspect PATH`, `data put FILE`, `data publish NAME --cluster CLUSTER`."""

from __future__ import annotations

from pathlib import Path

import click

from kimideploy.cli.options import (
    cluster_option,
    cluster_options,
    output_option,
    poll_option,
    publish_options,
)
from kimideploy.cli.state import CliState
from kimideploy.cli.table import MACHINE_FORMATS, machine
from kimideploy.cli.terminal import TerminalReporter


@click.group()
def data() -> None:
    """Datasets on a data volume (generated conversations, extracted hidden states)."""


@data.command()
@click.argument("path", type=click.Path(path_type=Path))
@output_option("text")
@click.option(
    "--sample",
    "number",
    type=click.IntRange(min=0),
    default=None,
    help="Print sample N (from 0) as the target sees it, the trained span marked.",
)
@click.option(
    "--model",
    type=click.Path(path_type=Path, exists=True, file_okay=False),
    default=None,
    help="The synced model revision: its tokenizer and chat template render the sample.",
)
def inspect(path: Path, output: str, number: int | None, model: Path | None) -> None:
    """Manifest, fingerprint, sample and token counts, layer convention, storage use; corrupt
    files named. With --sample N, one sample as the target sees it."""
    from kimideploy.errors import KimiDeployError
    from kimideploy.services.data.inspection import inspect as run
    from kimideploy.services.data.inspection import sample_view, summary

    if number is not None:
        view = sample_view(path, number, model)
        if output in MACHINE_FORMATS:
            click.echo(machine(view, output))
            return
        for key, value in view.items():
            if key in ("text", "token ids"):
                click.echo(f"{key}:\n{value}")
            else:
                click.echo(f"{key:16} {value}")
        return
    report = summary(run(path))
    if output in MACHINE_FORMATS:
        click.echo(machine(report, output))
    else:
        for key, value in report.items():
            if key != "problems" and value is not None:
                click.echo(f"{key:16} {value}")
        for problem in report["problems"]:
            click.echo(f"problem          {problem}")
    if report["problems"]:
        raise KimiDeployError(
            f"{len(report['problems'])} corrupt or truncated file(s)",
            hint="delete them and re-run the stage: it resumes and rewrites them",
        )


@data.command("publish")
@click.argument("name")
@publish_options(
    "The cluster that generated them: its pipeline's conversations (its train drafter's).",
    "registry.repository/datasets/NAME",
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
    """Push CLUSTER's generated conversations (with their fingerprint) to the registry as one OCI
    artifact, pinned by digest, and record them as datasets.NAME in kimideploy.yaml; another
    cluster's pipeline then takes them with `workloads.train.conversations: NAME`. Hidden states
    are not published: they are extracted again from the conversations (or computed online)."""
    from kimideploy.services.connection import open_session
    from kimideploy.services.data.publishing import publish_dataset

    loaded = state.project(f"data publish {name} runs a Job and edits kimideploy.yaml", pulls=True)
    session = open_session(loaded, cluster, context, namespace)
    done = publish_dataset(
        session,
        loaded,
        name,
        session.cluster,
        to=to,
        reporter=TerminalReporter(),
        poll_s=poll,
        overrides=overrides,
    )
    click.echo(done.reference)
    what = "added to" if done.created else "updated in"
    click.echo(
        f"datasets.{name} {what} {loaded.path}: {done.samples:,} conversations, "
        f"fingerprint {done.fingerprint}, {done.files} files",
        err=True,
    )


@data.command()
# exists: a missing file is named before the project or the cluster is asked anything.
@click.argument("source", type=click.Path(path_type=Path, dir_okay=False, exists=True))
@cluster_option
@click.option(
    "--as",
    "relative",
    metavar="PATH",
    help="Where on the datasets volume (default: the cluster's workloads.datagen.prompts).",
)
@click.option("--replace", is_flag=True, help="Replace a file of other content there.")
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="W.K=V",
    help="Override a workload setting of that cluster, e.g. datagen.pod_annotations=....",
)
@output_option()
@cluster_options
@poll_option
@click.pass_obj
def put(
    state: CliState,
    *,
    source: Path,
    cluster: str | None,
    relative: str | None,
    replace: bool,
    overrides: tuple[str, ...],
    output: str,
    context: str | None,
    namespace: str | None,
    poll: float,
) -> None:
    """Put SOURCE (datagen's prompt file, a bench prompt set) onto the cluster's datasets volume,
    as the pods will read it: verified by sha256 there, renamed into place; the same file there
    already is left as it is, another is never replaced without --replace."""
    from kimideploy.services.connection import open_session
    from kimideploy.services.data.putting import put_file

    loaded = state.project("data put writes to a cluster's datasets volume")
    session = open_session(loaded, cluster, context, namespace)
    done = put_file(
        session,
        loaded,
        source,
        relative=relative,
        replace=replace,
        overrides=overrides,
        reporter=TerminalReporter(),
        poll_s=poll,
    )
    row = {"path": done.destination, "state": done.state, "sha256": done.sha256, "bytes": done.size}
    click.echo(machine(row, output) or f"{done.state} {done.destination} (sha256 {done.sha256})")
