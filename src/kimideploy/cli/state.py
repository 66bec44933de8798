"""State shared by every command: the global options, and loading the project once."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from kimideploy.config.workload_names import WORKLOAD_NAMES

if TYPE_CHECKING:
    from pathlib import Path

    from kimideploy.cli.outcome import PendingOutcome
    from kimideploy.config.loading import LoadedProject

WORKLOAD_CHOICE = click.Choice(list(WORKLOAD_NAMES))


class CliState:
    # A plain class, not a dataclass: `kimideploy --help` imports this module (dataclasses ~1 ms).
    def __init__(self, config_path: Path | None, debug: bool) -> None:
        self.config_path = config_path
        self.debug = debug
        self._loaded: LoadedProject | None = None
        self._noted = False
        self.outcome: PendingOutcome | None = None
        """Set by a command run with `-o json|yaml`; main prints it when the command fails."""

    def project(self, changes: str | None = None) -> LoadedProject:
        """Load (once) the --config / KIMIDEPLOY_CONFIG file, ./kimideploy.yaml, or the built-in
        example. A command that changes a cluster or a host names the change in `changes`: it
        refuses to run on the example picked implicitly (its hosts, contexts and pins are
        placeholders); read-only commands say on stderr that they use it."""
        from kimideploy.config.loading import default_config_path, load_project
        from kimideploy.errors import UsageError
        from kimideploy.paths import example_config_path

        path = self.config_path or default_config_path()
        implicit_example = (
            self.config_path is None and path.resolve() == example_config_path().resolve()
        )
        if implicit_example and changes:
            raise UsageError(
                f"{changes}, and no project file was given: this would use the built-in example "
                f"({path}), whose contexts, hosts and pins are placeholders",
                hint="create ./kimideploy.yaml (copy the example and edit it) or pass --config "
                "PATH (or set KIMIDEPLOY_CONFIG)",
            )
        if self._loaded is None:
            if implicit_example and not self._noted:
                click.echo(
                    f"(using the built-in example {path}; pass --config for yours)", err=True
                )
                self._noted = True
            self._loaded = load_project(path)
        return self._loaded
