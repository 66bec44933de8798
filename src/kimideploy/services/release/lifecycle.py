"""The serve release's lifecycle as pure decisions over its history
(docs/reference/release-lifecycle.md).

A revision's status changes only through `change_status`, and only along `TRANSITIONS`; which
revision serves, which one a rollback returns to and what the next number is are functions of the
history alone. Storing records is cluster/records.py's job and orchestrating a change is
deploy.py's: neither decides anything here, so every branch is tested without a cluster.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Protocol

from kimideploy.errors import KimiDeployError, UsageError


class RevisionStatus(StrEnum):
    """Where a revision stands. Stored as its value (a plain string) in the release record."""

    PENDING = "pending"
    """Recorded, being applied and rolled out."""
    DEPLOYED = "deployed"
    """Serving now; at most one revision of a release is."""
    FAILED = "failed"
    """Rejected while applied, or its rollout failed; never a rollback target."""
    SUPERSEDED = "superseded"
    """Served, then a newer `up` replaced it."""
    ROLLED_BACK = "rolled-back"
    """Served, then a rollback replaced it."""
    REMOVED = "removed"
    """Served until `down` removed the release's objects."""


TRANSITIONS: dict[RevisionStatus, frozenset[RevisionStatus]] = {
    RevisionStatus.PENDING: frozenset({RevisionStatus.DEPLOYED, RevisionStatus.FAILED}),
    RevisionStatus.DEPLOYED: frozenset(
        {RevisionStatus.SUPERSEDED, RevisionStatus.ROLLED_BACK, RevisionStatus.REMOVED}
    ),
    RevisionStatus.FAILED: frozenset(),
    RevisionStatus.SUPERSEDED: frozenset(),
    RevisionStatus.ROLLED_BACK: frozenset(),
    RevisionStatus.REMOVED: frozenset(),
}
GOOD = frozenset({RevisionStatus.DEPLOYED, RevisionStatus.SUPERSEDED})
"""Served successfully and replaced by a newer revision, or serving: what a failed rollout falls
back to."""
RETURNABLE = GOOD | {RevisionStatus.ROLLED_BACK, RevisionStatus.REMOVED}
"""What `rollback` may return to: every revision that once served."""


class Revisioned(Protocol):
    """What the decisions read of a release record (cluster/records.ReleaseRecord)."""

    revision: int
    status: str
    details: dict[str, Any]
    note: str


class LifecycleError(KimiDeployError):
    """A status change the lifecycle does not allow: a bug, or a record changed by hand."""


def status_of(record: Revisioned) -> RevisionStatus:
    try:
        return RevisionStatus(record.status)
    except ValueError as exc:
        raise LifecycleError(
            f"revision {record.revision} has an unknown status {record.status!r}",
            hint="a newer kimideploy may have written it; `kimideploy history serve` shows it",
        ) from exc


def change_status(
    record: Revisioned,
    to: RevisionStatus,
    details: dict[str, Any] | None = None,
    note: str | None = None,
) -> None:
    """The one way a revision's status changes (the caller stores the record afterwards)."""
    now = status_of(record)
    if to not in TRANSITIONS[now]:
        raise LifecycleError(f"revision {record.revision}: {now} cannot become {to}")
    record.status = to.value
    if details is not None:
        record.details = details
    if note is not None:
        record.note = note


def is_good(record: Revisioned) -> bool:
    return status_of(record) in GOOD


def next_revision(history: list[Any]) -> int:
    """Revisions are numbered on from the newest kept (older ones may have been trimmed)."""
    return max((r.revision for r in history), default=0) + 1


def deployed(history: list[Any]) -> list[Any]:
    """Every revision recorded as serving: one, unless a record was changed by hand."""
    return [r for r in history if status_of(r) is RevisionStatus.DEPLOYED]


def serving(history: list[Any]) -> Any | None:
    """The revision serving now, or None (nothing deployed, or removed by `down`)."""
    return next((r for r in reversed(history) if status_of(r) is RevisionStatus.DEPLOYED), None)


def last_applied(history: list[Any]) -> Any | None:
    """What the release's objects were last set to, which a swap is decided against: the newest
    revision when it failed after it was applied (a swap that timed out may have reached some
    pods; going back is then a swap too), else the serving one. A revision the API server
    rejected half-way was put back to the serving one's objects."""
    newest = max(history, key=lambda r: r.revision, default=None)
    if (
        newest is not None
        and status_of(newest) is RevisionStatus.FAILED
        and newest.details.get("failure") != "ApplyRejected"
    ):
        return newest
    return serving(history)


def current(history: list[Any]) -> Any:
    """The serving revision, else the newest one: what a rollback starts from."""
    found = serving(history)
    return found if found is not None else history[-1]


def replaced_by(action: str) -> RevisionStatus:
    """What the serving revision becomes when `action` deploys another."""
    return RevisionStatus.ROLLED_BACK if action == "rollback" else RevisionStatus.SUPERSEDED


def fallback_after_failure(history: list[Any]) -> Any | None:
    """Where a failed rollout returns automatically: the newest good revision, or None."""
    good = [r for r in history if is_good(r)]
    return good[-1] if good else None


def rollback_target(history: list[Any], to: int | None) -> Any:
    """`rollback --to N`, else the newest revision before the serving one that once served
    (when nothing serves, the newest that once served: `down` then `rollback`)."""
    if to is not None:
        found = next((r for r in history if r.revision == to), None)
        if found is None:
            known = ", ".join(str(r.revision) for r in history)
            raise UsageError(f"--to {to}: no such revision (kept: {known})")
        if status_of(found) not in RETURNABLE:
            raise UsageError(
                f"--to {to}: revision {to} {found.status}; pick a revision that served"
            )
        return found
    now = serving(history)
    candidates = [
        r
        for r in history
        if status_of(r) in RETURNABLE and (now is None or r.revision < now.revision)
    ]
    if not candidates:
        raise UsageError(
            "no earlier good revision to roll back to", hint="`kimideploy history serve`"
        )
    return candidates[-1]
