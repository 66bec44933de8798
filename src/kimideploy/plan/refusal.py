"""The one judgement of a drafter on the cluster it would serve on, as a refusal.

`up`, both of its dry runs (and their plan document), `render`, `render --kustomize` and
`drafter check` raise this same error for the same blocking findings, with the same exit code
(2), so a check that passes is one the real command passes.
"""

from __future__ import annotations

from collections.abc import Sequence

from kimideploy.errors import UsageError
from kimideploy.formats.check_result import CheckResult
from kimideploy.plan.model import Plan


def drafter_refusal(plan: Plan, force: bool) -> UsageError | None:
    """The plan's judgement of its drafter on the cluster deployed to (the same the plan's
    warnings and predicted speedup come from) as the refusal `up` raises; --force deploys
    anyway. The one judgement `up`, its dry runs, `render` and the plan document show."""
    return findings_refusal(plan.drafter, plan.drafter_findings, force)


def findings_refusal(
    drafter: str, findings: Sequence[CheckResult], force: bool = False
) -> UsageError | None:
    """A drafter's blocking findings as one refusal (exit 2): `up`, its dry runs, `render` and
    `drafter check` raise this same error for the same findings."""
    blocking = [f for f in findings if not f.ok and f.blocking]
    if not blocking or force:
        return None
    reasons = "; ".join(f"{f.name}: {f.detail}" for f in blocking)
    return UsageError(
        f"drafter {drafter} fails its check: {reasons}",
        hint=f"`kimideploy drafter check {drafter}` explains; --force deploys it anyway",
    )
