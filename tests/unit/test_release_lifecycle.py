"""The release lifecycle without a cluster: which revision serves, where a failed rollout and a
rollback go, what a status may become (services/release/lifecycle.py). The control-plane tests
(tests/integration/test_deploy_engine.py) run the same decisions through the deploy engine."""

from __future__ import annotations

import pytest

from kimideploy.cluster.records import ReleaseRecord
from kimideploy.errors import UsageError
from kimideploy.services.release import lifecycle
from kimideploy.services.release.lifecycle import LifecycleError, RevisionStatus

S = RevisionStatus


def record(revision: int, status: RevisionStatus, drafter: str = "v3") -> ReleaseRecord:
    return ReleaseRecord(
        release="kimi-k25-serve", revision=revision, status=status.value,
        created_at="2026-12-01T00:00:00Z", user="ops", cluster="rtx6000", namespace="kimi",
        drafter=drafter, image="r@sha256:" + "a" * 64, config_sha256="b" * 64, config_text="",
        overrides=[], manifests=[],
    )  # fmt: skip


def history(*statuses: RevisionStatus) -> list[ReleaseRecord]:
    return [record(number, status) for number, status in enumerate(statuses, 1)]


def test_the_serving_revision_and_the_next_number() -> None:
    assert lifecycle.serving([]) is None and lifecycle.next_revision([]) == 1
    past = history(S.SUPERSEDED, S.FAILED, S.DEPLOYED, S.FAILED)
    assert lifecycle.serving(past).revision == 3
    assert lifecycle.current(past).revision == 3
    assert lifecycle.next_revision(past) == 5
    trimmed = past[2:]  # older records trimmed: numbering goes on from the newest kept
    assert lifecycle.next_revision(trimmed) == 5
    removed = history(S.SUPERSEDED, S.REMOVED)
    assert lifecycle.serving(removed) is None and lifecycle.current(removed).revision == 2


def test_a_failed_rollout_falls_back_to_the_newest_good_revision() -> None:
    past = history(S.SUPERSEDED, S.DEPLOYED, S.PENDING)
    assert lifecycle.fallback_after_failure(past).revision == 2
    past = history(S.SUPERSEDED, S.FAILED, S.ROLLED_BACK, S.PENDING)
    assert lifecycle.fallback_after_failure(past).revision == 1  # rolled-back is not good
    assert lifecycle.fallback_after_failure(history(S.FAILED, S.PENDING)) is None


def test_a_swap_is_decided_against_what_was_last_applied() -> None:
    assert lifecycle.last_applied([]) is None
    assert lifecycle.last_applied(history(S.SUPERSEDED, S.DEPLOYED)).revision == 2
    # A swap that timed out may have reached some pods: going back is decided against it.
    timed_out = history(S.SUPERSEDED, S.DEPLOYED, S.FAILED)
    timed_out[-1].details["failure"] = "SwapTimeout"
    assert lifecycle.last_applied(timed_out).revision == 3
    # A revision the API server rejected half-way was put back to the serving one's objects.
    rejected = history(S.SUPERSEDED, S.DEPLOYED, S.FAILED)
    rejected[-1].details["failure"] = "ApplyRejected"
    assert lifecycle.last_applied(rejected).revision == 2


def test_rollback_goes_to_the_newest_revision_before_the_serving_one_that_served() -> None:
    past = history(S.SUPERSEDED, S.FAILED, S.ROLLED_BACK, S.SUPERSEDED, S.FAILED, S.DEPLOYED)
    assert lifecycle.rollback_target(past, None).revision == 4
    # After `down` nothing serves: the newest that once served, the removed one included.
    after_down = history(S.SUPERSEDED, S.REMOVED)
    assert lifecycle.rollback_target(after_down, None).revision == 2
    with pytest.raises(UsageError, match="no earlier good revision"):
        lifecycle.rollback_target(history(S.FAILED, S.DEPLOYED), None)


def test_rollback_to_a_named_revision() -> None:
    past = history(S.SUPERSEDED, S.FAILED, S.DEPLOYED)
    assert lifecycle.rollback_target(past, 1).revision == 1
    with pytest.raises(UsageError, match="--to 2: revision 2 failed; pick a revision that served"):
        lifecycle.rollback_target(past, 2)
    with pytest.raises(UsageError, match=r"--to 9: no such revision \(kept: 1, 2, 3\)"):
        lifecycle.rollback_target(past, 9)
    with pytest.raises(UsageError, match="revision 4 pending"):
        lifecycle.rollback_target([*past, record(4, S.PENDING)], 4)


@pytest.mark.parametrize(
    ("start", "to"),
    [(S.PENDING, S.DEPLOYED), (S.PENDING, S.FAILED), (S.DEPLOYED, S.SUPERSEDED),
     (S.DEPLOYED, S.ROLLED_BACK), (S.DEPLOYED, S.REMOVED)],
)  # fmt: skip
def test_the_allowed_status_changes(start: RevisionStatus, to: RevisionStatus) -> None:
    made = record(1, start)
    lifecycle.change_status(made, to, details={"reason": "x"}, note="why")
    assert made.status == to.value and made.details == {"reason": "x"} and made.note == "why"


@pytest.mark.parametrize(
    ("start", "to"),
    [(S.FAILED, S.DEPLOYED), (S.SUPERSEDED, S.DEPLOYED), (S.PENDING, S.SUPERSEDED),
     (S.REMOVED, S.DEPLOYED), (S.DEPLOYED, S.FAILED), (S.ROLLED_BACK, S.REMOVED)],
)  # fmt: skip
def test_every_other_change_is_refused(start: RevisionStatus, to: RevisionStatus) -> None:
    made = record(1, start)
    with pytest.raises(LifecycleError, match=f"revision 1: {start} cannot become {to}"):
        lifecycle.change_status(made, to)
    assert made.status == start.value  # unchanged


def test_every_status_is_covered_and_an_unknown_one_is_named() -> None:
    assert set(lifecycle.TRANSITIONS) == set(RevisionStatus)
    strange = record(7, S.DEPLOYED)
    strange.status = "canary"
    with pytest.raises(LifecycleError, match="revision 7 has an unknown status 'canary'"):
        lifecycle.serving([strange])


def test_what_replaces_the_serving_revision_says_how() -> None:
    assert lifecycle.replaced_by("rollback") is S.ROLLED_BACK
    assert lifecycle.replaced_by("up") is S.SUPERSEDED
    assert lifecycle.replaced_by("auto-rollback") is S.SUPERSEDED
    two = history(S.DEPLOYED, S.DEPLOYED)  # changed by hand: both are replaced
    assert [r.revision for r in lifecycle.deployed(two)] == [1, 2]
