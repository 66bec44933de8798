"""A revision that did not serve, in one shape (services/release/deploy.py's RevisionFailure): the
record's details, the message with the pod's last log lines, and the `-o json` outcome. The
rollback loop itself, on the control plane: tests/integration/test_deploy_engine.py."""

from __future__ import annotations

from kimideploy.services.release.deploy import RevisionFailure


def test_a_failed_revision_says_the_same_thing_everywhere() -> None:
    failed = RevisionFailure(
        release="kimi-k25-serve",
        revision=4,
        failure="CrashLoop",
        reason="container vllm restarted 3 times",
        log_tail="loading weights\nCUDA out of memory\n",
    )
    assert failed.record_details() == {
        "failure": "CrashLoop",
        "reason": "container vllm restarted 3 times",
    }
    assert failed.message == (
        "revision 4 failed: container vllm restarted 3 times\n  last log lines:\n"
        "    loading weights\n    CUDA out of memory\n"
        "  what to do (CrashLoop): the server exits again and again: the log lines say why "
        "(`kimideploy logs serve` for all of them); killed for memory, the plan's `memory` and "
        "`page cache` lines say what the pod holds (`kimideploy up serve --dry-run`)"
    )
    assert failed.outcome("failed") == {
        "status": "failed",
        "release": "kimi-k25-serve",
        "revision": 4,
    }
    # Where the caller knows what serves, it is stated, None included (nothing serves).
    assert failed.outcome_serving("rolled-back", 5)["serving_revision"] == 5
    assert failed.outcome_serving("failed", None)["serving_revision"] is None
    quiet = RevisionFailure(release="r", revision=1, failure=None, reason="not ready")
    assert quiet.message == "revision 1 failed: not ready"
