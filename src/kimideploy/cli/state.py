"""State shared by every command: the global options, and loading the project once."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from kimideploy.cli import start_up
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
        self._unedited_example = False
        self.outcome: PendingOutcome | None = None
        """Set by a command run with `-o json|yaml`; main prints it when the command fails."""

    def project(self, changes: str | None = None, *, pulls: bool = False) -> LoadedProject:
        """Load (once) the --config / KIMIDEPLOY_CONFIG file, ./kimideploy.yaml, or the built-in
        example. A command that changes a cluster or a host names the change in `changes`: it
        refuses to run on the example picked implicitly (its hosts, contexts and pins are
        placeholders); read-only commands say on stderr that they use it. A command whose pods
        pull what the pins name (`pulls`) refuses a file that still holds the example's
        placeholder pins, wherever it lives (config/placeholders.py)."""
        from kimideploy.config.loading import default_config_path, load_project
        from kimideploy.config.placeholders import is_unedited_example
        from kimideploy.errors import UsageError
        from kimideploy.paths import example_config_path

        path = self.config_path or default_config_path()
        implicit_example = (
            self.config_path is None and path.resolve() == example_config_path().resolve()
        )
        if self._loaded is None:
            loaded = load_project(path)
            # Judged by content: the example edited in place (./kimideploy.yaml in a checkout)
            # is the user's file as soon as one of its placeholder pins is replaced.
            self._unedited_example = implicit_example and is_unedited_example(loaded.document)
            self._loaded = loaded
            start_up.end()
        if self._unedited_example:
            if changes:
                raise UsageError(
                    f"{changes}, and no project file was given: this would use the built-in "
                    f"example ({path}), whose contexts, hosts and pins are placeholders",
                    hint="create ./kimideploy.yaml (`kimideploy init`, or copy the example and "
                    "edit it) or pass --config PATH (or set KIMIDEPLOY_CONFIG)",
                )
            if not self._noted:
                click.echo(
                    f"(using the built-in example {path}; pass --config for yours)", err=True
                )
                self._noted = True
        if changes and pulls:
            refuse_placeholders(self._loaded, changes)
        return self._loaded

    @property
    def unedited_example(self) -> bool:
        """The loaded file is the built-in example, picked implicitly and not made anyone's."""
        return self._unedited_example


def pins_judged(state: CliState) -> bool:
    """Whether a dry run judges placeholder pins as the real command would: not on the built-in
    example picked implicitly (the demo), whose real command is refused before its pins."""
    return not state.unedited_example


def refuse_placeholders(loaded: LoadedProject, changes: str) -> None:
    """A change made with the example's placeholder pins would pull images and weights that do
    not exist (after the pods are scheduled): refused before anything is contacted. For the
    commands that render no pods first; those that do judge only the pins their pods would pull
    (services/rendering.placeholder_refusal)."""
    from kimideploy.config.placeholders import placeholders_of, refusal

    refused = refusal(placeholders_of(loaded.document), loaded.path, f"{changes}, with")
    if refused is not None:
        raise refused
