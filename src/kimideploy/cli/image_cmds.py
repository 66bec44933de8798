"""`kimideploy image list|render|verify|kernels|build|lock`."""

from __future__ import annotations

from pathlib import Path

import click

from kimideploy.cli.options import complete_clusters, output_option
from kimideploy.cli.state import CliState
from kimideploy.cli.table import format_table, machine
from kimideploy.cli.terminal import TerminalReporter


@click.group()
def image() -> None:
    """Pinned CUDA/vLLM images with verified patches."""


@image.command("list")
@output_option()
@click.pass_obj
def list_images(state: CliState, output: str) -> None:
    """Name, base, vLLM, torch, speculators, patches, digest, and which clusters use it."""
    from kimideploy.services.images.operations import image_rows

    rows = image_rows(state.project().project)
    click.echo(machine(rows, output) or format_table(rows))


@image.command()
@click.argument("name")
@output_option("dockerfile")
@click.pass_obj
def render(state: CliState, name: str, output: str) -> None:
    """The image's Dockerfile on stdout (json and yaml: the image's name and its Dockerfile)."""
    from kimideploy.services.images.operations import dockerfile

    text = dockerfile(state.project().project, name)
    document = machine({"image": name, "dockerfile": text}, output)
    click.echo(document if document is not None else text, nl=document is not None)


@image.command()
@click.argument("name")
@click.option("--skip-pins", is_flag=True, help="Do not ask pip's resolver (it needs PyPI).")
@click.pass_obj
def verify(state: CliState, name: str, skip_pins: bool) -> None:
    """Pins resolve; patches apply (fuzz 0) and work; vLLM accepts every rendered serve flag."""
    from kimideploy.errors import KimiDeployError
    from kimideploy.services.images.operations import verify_image

    steps = verify_image(state.project(), name, TerminalReporter(), pins=not skip_pins)
    click.echo(
        format_table(
            [
                {"check": s.name, "status": "pass" if s.ok else "FAIL", "detail": s.detail}
                for s in steps
            ]
        )
    )
    failed = [s for s in steps if not s.ok]
    if failed:
        raise KimiDeployError(
            f"{len(failed)} check(s) failed for {name}",
            hint="each row says what vLLM or patch reported",
        )


@image.command()
@click.argument("name")
@click.option("--write", is_flag=True, help="Store it in docker/kernel-plans.json.")
@output_option()
@click.pass_obj
def kernels(state: CliState, name: str, write: bool, output: str) -> None:
    """The attention kernels the image's vLLM selects on each GPU it claims, derived from its
    pinned sources, and whether a speculative verification runs on the decode path there."""
    from kimideploy.services.images.operations import kernel_plans

    derived = kernel_plans(state.project(), name, write, TerminalReporter())
    rows = [
        {
            "arch": arch,
            "engine": engine,
            "backend": found["backend"],
            "query lengths": found["query_len_support"],
            "CUDA graphs": found["cudagraph_support"],
            "not decidable on CPU": ", ".join(found["undetermined_ahead"]),
        }
        for arch, per_engine in sorted(derived["archs"].items())
        for engine, found in sorted(per_engine.items())
    ]
    click.echo(machine(rows, output) or format_table(rows))
    if output == "table":
        click.echo(f"evaluated under {derived['evaluated_with']}")


@image.command()
@click.argument("name")
@click.option("--push", is_flag=True, help="Push and record the digest for `image lock`.")
@click.option(
    "--cluster",
    "--on",
    "on_cluster",
    help="Build on this cluster's first host over SSH (--on: the old spelling).",
    shell_complete=complete_clusters,
)
@click.option(
    "--context-only",
    type=click.Path(path_type=Path, file_okay=False),
    help="Write the build context tar here and stop.",
)
@click.pass_obj
def build(
    state: CliState, *, name: str, push: bool, on_cluster: str | None, context_only: Path | None
) -> None:
    """Build from a deterministic context; the tag is the context's content hash."""
    from kimideploy.services.images.operations import build_image

    result = build_image(
        state.project().project,
        name,
        push,
        on_cluster,
        context_only=context_only,
        reporter=TerminalReporter(),
    )
    click.echo(result)


@image.command()
@click.argument("name")
@click.option("--digest", help="sha256:... (default: the digest the last `build --push` recorded)")
@click.pass_obj
def lock(state: CliState, name: str, digest: str | None) -> None:
    """Write the pushed digest into kimideploy.yaml so manifests pin it."""
    from kimideploy.services.images.operations import lock_image

    loaded = state.project("image lock edits the project file")
    click.echo(lock_image(loaded.path, loaded.project, name, digest))
