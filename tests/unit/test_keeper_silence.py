"""A swap or a switch whose pods' keepers never look gives way to replacing the pods within a
minute, instead of holding the revision (and `watch`'s rollback) until --timeout."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kimideploy.services.release import swap

DEPLOYMENT = {"kind": "Deployment", "spec": {"selector": {"matchLabels": {"app": "serve"}}}}


class Session:
    """The two calls `follow` makes: the running pods, and each keeper's answer."""

    def __init__(self, answer: dict[str, Any]) -> None:
        self.answer = answer

    def pods(self, selector: str) -> list[dict[str, Any]]:
        return [{"metadata": {"name": "serve-0"}, "status": {"phase": "Running"}}]

    def scrape_pod(self, pod: str, port: int, path: str) -> str:
        return json.dumps(self.answer)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def follow(answer: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> swap.SwapOutcome:
    clock = Clock()
    monkeypatch.setattr(swap, "time", clock)
    plan = swap.SwapPlan([DEPLOYMENT], serving="good", wanted="good", deployment="serve",
                         port=8000, speculation=False)  # fmt: skip
    following = swap.Following(timeout_s=2700, poll_s=2, show=lambda _: None,
                               keep_alive=lambda: None)  # fmt: skip
    return swap.follow(Session(answer), plan, following)  # type: ignore[arg-type]


def test_keepers_that_never_look_give_way_to_a_rollout_within_a_minute(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    outcome = follow({"state": "starting", "reason": "the keeper has not looked yet"}, monkeypatch)
    assert outcome.state.failure == "KeepersUnreachable"
    assert swap.KEEPER_SILENT_S < outcome.seconds <= swap.KEEPER_SILENT_S + 2
    assert "no keeper has looked in" in outcome.refused


def test_a_keeper_that_looked_and_waits_is_followed_to_the_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A keeper that answers "serving" still has the previous spec (the kubelet syncs it within
    about a minute): that is waiting, not silence, and is never cut short."""
    outcome = follow({"state": "serving", "serving": "good", "wanted": "good"}, monkeypatch)
    assert outcome.state.failure == "SwapTimeout"
    assert outcome.seconds > 2700
