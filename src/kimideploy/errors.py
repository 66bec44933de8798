"""The one error hierarchy: every user-facing failure carries a hint and a documented exit code."""

from __future__ import annotations

from enum import IntEnum
from typing import Any, TypedDict


class ExitCode(IntEnum):
    """Process exit codes; scripts may rely on them. Their meanings are EXIT_CODE_MEANINGS, which
    `--help`, the README and docs/reference/cli.md render."""

    OK = 0
    RUNTIME = 1
    USAGE = 2
    CLUSTER = 3
    ROLLOUT = 4
    UNHEALTHY = 5
    """`drafter doctor`: the replay ran and named a cause (a verdict, not a failure)."""
    INTERRUPTED = 130


EXIT_CODE_MEANINGS: dict[ExitCode, str] = {
    ExitCode.OK: "ok",
    ExitCode.RUNTIME: "runtime failure",
    ExitCode.USAGE: "usage or config error, or bad input",
    ExitCode.CLUSTER: "cluster unreachable or forbidden, or another run holds the release's lock",
    ExitCode.ROLLOUT: "a rollout or a Job failed, or the gate rolled a drafter back",
    ExitCode.UNHEALTHY: "the drafter doctor named a cause of low acceptance (a verdict, not a "
    "failure)",
    ExitCode.INTERRUPTED: "interrupted",
}
"""The one list of what each exit code means."""


def exit_codes_sentence() -> str:
    """The meanings in one line, as `kimideploy --help` ends."""
    return "; ".join(f"{int(code)} {meaning}" for code, meaning in EXIT_CODE_MEANINGS.items())


class OutcomeFacts(TypedDict, total=False):
    """What a failure leaves behind, as the `-o json` outcome (kimideploy.outcome.v1,
    docs/reference/outcomes.md) carries it; the CLI renders these keys and no others."""

    status: str
    release: str
    revision: int
    serving_revision: int | None
    verdict: dict[str, Any]
    run: dict[str, Any]
    results: dict[str, Any]


class KimiDeployError(Exception):
    """Base of every error the CLI reports without a traceback."""

    exit_code: ExitCode = ExitCode.RUNTIME

    def __init__(
        self, message: str, hint: str | None = None, outcome: OutcomeFacts | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        # What a failure leaves behind, for `-o json` outcomes: the failed revision, what serves
        # now, a gate verdict, a run's state (keys of kimideploy.outcome.v1).
        self.outcome: OutcomeFacts = outcome or {}

    def restated(
        self, message: str, hint: str | None = None, outcome: OutcomeFacts | None = None
    ) -> KimiDeployError:
        """The same error (its class, exit code and own fields, such as a ConfigError's issues)
        with the message a caller knows more about; hint and outcome kept unless given."""
        import copy  # not at the top: `kimideploy --help` imports this module

        again = copy.copy(self)
        again.args = (message,)
        again.message = message
        again.hint = self.hint if hint is None else hint
        again.outcome = {**self.outcome, **(outcome or {})}
        return again


class ConfigError(KimiDeployError):
    """The project file is unreadable, invalid, or references something that does not exist."""

    exit_code = ExitCode.USAGE

    def __init__(self, message: str, hint: str | None = None, issues: list[str] | None = None):
        super().__init__(message, hint)
        self.issues = issues or []


class UsageError(KimiDeployError):
    """A command-line argument is wrong (an unknown drafter, a malformed --set)."""

    exit_code = ExitCode.USAGE


class MethodNotServedError(UsageError):
    """The serve image cannot run the method named (suffix without Arctic Inference, an MLA
    drafter on vLLM < 0.32): refused by the plan; golden files and `image verify` skip exactly
    these combinations, and nothing else."""


class ManifestError(KimiDeployError):
    """A rendered object failed schema or semantic validation; nothing was applied."""

    exit_code = ExitCode.USAGE


class ClusterError(KimiDeployError):
    """The cluster is unreachable, the context is missing, or an action is forbidden."""

    exit_code = ExitCode.CLUSTER


class RolloutError(KimiDeployError):
    """A rollout or a job failed on the cluster."""

    exit_code = ExitCode.ROLLOUT
