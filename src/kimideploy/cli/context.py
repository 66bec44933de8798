"""State shared by every command: the global options, and loading the project once."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from kimideploy.config.loading import LoadedProject

WORKLOAD_CHOICE = click.Choice(["datagen", "extract", "vocab", "train", "bench", "serve"])


@dataclass
class CliState:
    config_path: Path | None
    debug: bool
    _loaded: LoadedProject | None = field(default=None, repr=False)

    def project(self) -> LoadedProject:
        """Load (once) the --config file, ./kimideploy.yaml, or the built-in example."""
        if self._loaded is None:
            from kimideploy.config.loading import default_config_path, load_project

            self._loaded = load_project(self.config_path or default_config_path())
        return self._loaded


def plan_options(func: click.decorators.FC) -> click.decorators.FC:
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
    return click.option("--cluster", help="Cluster profile (default: default_cluster).")(func)
