"""`-o json|yaml` on the commands that change something: one outcome document per invocation.

A script that runs `up`, `rollback`, `down` or `run` reads one document on stdout, whatever
happened: success, a failed rollout, a gate rollback, a refusal. Progress stays on stderr. The
document (schema kimideploy.outcome.v1, documented in docs/reference/outcomes.md) always has the
same keys for a command, null where a fact does not apply, so a script never needs `get` with a
default.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import click

from kimideploy.cli.table import MACHINE_FORMATS, machine
from kimideploy.errors import ExitCode

if TYPE_CHECKING:
    from kimideploy.services.gate.verdict import Verdict
    from kimideploy.services.release.canary import CanaryVerdict
    from kimideploy.services.release.deploy import Outcome

OUTCOME_SCHEMA = "kimideploy.outcome.v1"

RELEASE_KEYS = ("release", "revision", "serving_revision", "verdict", "change", "startup")
"""up, rollback: the revision made, what serves afterwards, the gate's verdict (up --gate), how
it reached the pods (rollout, swap, speculation off/on) and the new pods' start-up by phase."""
RUN_PLAN_KEYS = ("plan", "lifecycle")
"""run --dry-run: the plan document (kimideploy.plan.v1) with its `estimate`; the bake-off and
calibrate: the serve loads and benches they would run, as a lifecycle (stages and total)."""
PLAN_KEYS = ("release", "plan")
"""up --dry-run: the release it would change and the plan document (kimideploy.plan.v1:
decisions, predictions, warnings, the drafter's findings, objects, and the refusal, if any)."""
DOWN_KEYS = ("release", "removed")
RUN_KEYS = ("run", "results", "comparison", "calibration", "bakeoff", "estimate", "actual")
"""run: the Job's state; results: each index's result line; comparison: run bench's table
(with --baseline, the speedup per level); calibration: what run calibrate stored; bakeoff: run
bench --drafters' rows, recommended method per concurrency, and candidates it could not judge;
estimate: what the plan predicted (time, GPU-hours, money, source); actual: what it took."""

STATUS_FOR_EXIT = {
    ExitCode.RUNTIME: "error",
    ExitCode.USAGE: "refused",
    ExitCode.CLUSTER: "unreachable",
    ExitCode.ROLLOUT: "failed",
    ExitCode.INTERRUPTED: "interrupted",
}
"""The status of a failure that did not name its own (a refusal names nothing it changed)."""


@dataclass
class PendingOutcome:
    """A command asked for a machine outcome; main prints it if the command fails."""

    command: str
    output: str
    keys: tuple[str, ...]
    known: dict[str, Any] = field(default_factory=dict)

    def document(
        self, exit_code: int, status: str, reason: str, hint: str | None, *, facts: dict[str, Any]
    ) -> dict[str, Any]:
        unknown = set(facts) - set(self.keys)
        if unknown:  # a typo here would silently change the documented shape
            raise ValueError(f"outcome keys {sorted(unknown)} are not among {self.keys}")
        merged = {**self.known, **facts}
        return {
            "schema": OUTCOME_SCHEMA,
            "command": self.command,
            "ok": exit_code == ExitCode.OK,
            "exit_code": int(exit_code),
            "status": status,
            "reason": reason,
            "hint": hint,
            **{key: merged.get(key) for key in self.keys},
        }

    def print(
        self,
        exit_code: int,
        status: str,
        reason: str,
        hint: str | None = None,
        *,
        facts: dict[str, Any] | None = None,
    ) -> None:
        document = self.document(exit_code, status, reason, hint, facts=facts or {})
        click.echo(machine(document, self.output))


def expect(command: str, output: str, keys: tuple[str, ...], **known: Any) -> PendingOutcome | None:
    """The pending outcome for `-o json|yaml`; None for the prose form."""
    if output not in MACHINE_FORMATS:
        return None
    return PendingOutcome(command, output, keys, dict(known))


def failure_status(exit_code: int, facts: Mapping[str, Any]) -> str:
    named = facts.get("status")
    if isinstance(named, str):
        return named
    return STATUS_FOR_EXIT.get(ExitCode(exit_code), "error")


def print_release(
    pending: PendingOutcome, outcome: Outcome, verdict: Verdict | CanaryVerdict | None = None
) -> None:
    """A revision that is ready (or applied, under --no-wait) and, with --gate, its verdict."""
    pending.print(
        ExitCode.OK,
        "deployed" if outcome.waited else "applied",
        outcome.message,
        facts={
            "release": outcome.release,
            "revision": outcome.revision,
            "serving_revision": outcome.revision if outcome.waited else None,
            "verdict": verdict.details() if verdict is not None else None,
            "change": outcome.change,
            "startup": outcome.startup,
        },
    )
