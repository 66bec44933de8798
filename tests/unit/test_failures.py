"""Each way a revision fails to serve has its fix line, printed under the failure and listed in
docs/usage/troubleshooting.md."""

from __future__ import annotations

import re

from kimideploy.services.release import failures
from kimideploy.services.release.deploy import RevisionFailure
from tests.conftest import REPO

SOURCES = ("src/kimideploy/cluster/rollout.py", "src/kimideploy/services/release/swap.py",
           "src/kimideploy/services/release/deploy.py")  # fmt: skip


def test_every_failure_the_watchers_name_has_a_fix() -> None:
    named: set[str] = set()
    for source in SOURCES:
        text = (REPO / source).read_text()
        named |= set(re.findall(r'"(FailedScheduling|ImagePull|CrashLoop|InitFailed|StartupBudget|'
                                r'ProgressDeadline|Deleted|Timeout|SwapRefused|KeepersUnreachable|'
                                r'ApplyRejected)"', text))  # fmt: skip
        named |= set(re.findall(r'RolloutState\([^)]*?"([A-Z][A-Za-z]+)"', text, re.DOTALL))
    named -= {"Deployment"}
    assert named and named <= set(failures.FIXES), sorted(named - set(failures.FIXES))


def test_the_failure_message_says_what_to_do() -> None:
    failed = RevisionFailure(release="r", revision=3, failure="StartupBudget", reason="too slow")
    assert "what to do (StartupBudget): the server did not answer" in failed.message
    assert "what to do" not in RevisionFailure(release="r", revision=3, failure=None,
                                               reason="x").message  # fmt: skip


def test_the_troubleshooting_page_carries_the_table() -> None:
    page = (REPO / "docs" / "usage" / "troubleshooting.md").read_text()
    assert failures.with_fixes(page) == page, "run scripts/update-golden"
