"""When a new revision changes only which drafter is served, and the running server can take it:
swap it into the running pods instead of replacing them (seconds instead of a ~25-minute load).

The serving pods were started able to swap (plan/serve.py `swaps_drafters`): vLLM's draft weight
update behind kimideploy's guard, and a keeper (workloads/drafter_swap.py) that serves whatever
drafter the mounted spec ConfigMap names. A swap is therefore a revision that applies the new
spec (and every other object of the new render) but keeps the serving revision's Deployment: its
pod template names the drafter the pods started with, and changing it would replace them. The
record holds exactly what was applied, so rolling back to the revision before is the same kind
of change in the other direction, with no special case.

A revision may swap only when, once the drafter's identity is set aside, the new render's
Deployment and spec are the serving revision's: same image, target, method, k, layer ids, draft
vocabulary, resources and every other field. The drafter's identity is its name and folder: the
`model` of `--speculative-config`, the drafter label and the spec hash on the pod template, and
the keeper's start drafter. The server then applies the file rule of formats/drafter_swap.py
(config.json and tensor shapes) before it writes anything; a refusal there turns the revision into
a rollout (deploy.py).
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kimideploy.cluster.rollout import RolloutState
from kimideploy.cluster.session import ClusterSession
from kimideploy.config.specs import SPEC_FILE_NAME
from kimideploy.errors import KimiDeployError
from kimideploy.formats.drafter_swap import (
    DRAFTER_KEEPER,
    KEEPER_PATH,
    STARTED_WITH_ENV,
    drafter_version,
)
from kimideploy.plan.pods import LABEL_PREFIX
from kimideploy.plan.serve import SPEC_SHA256_ANNOTATION

DRAFTER_LABEL = f"{LABEL_PREFIX}/drafter"
DRAFTER_IDENTITY_SPEC_KEYS = ("drafter", "drafter_path")
SHOWN_DIFFERENCES = 3


@dataclass(frozen=True)
class SwapPlan:
    """A revision applied as a swap: `manifests` are the new render's objects with the serving
    Deployment in place of the new one; the keepers must then serve `wanted`."""

    manifests: list[dict[str, Any]]
    serving: str
    wanted: str
    deployment: str
    port: int


@dataclass(frozen=True)
class SwapDecision:
    plan: SwapPlan | None
    why_not: str = ""
    """Why a revision that changes the drafter of a swap-capable server is rolled out instead
    ("" where no swap was in question: nothing served, the same drafter, a server that cannot)."""


def decide(
    serving: list[dict[str, Any]] | None, wanted: list[dict[str, Any]], allowed: bool = True
) -> SwapDecision:
    """Whether applying `wanted` over the serving revision's `serving` objects is a swap."""
    if not serving:
        return SwapDecision(None)
    before, after = _deployment(serving), _deployment(wanted)
    if before is None or after is None or _keeper_container(before) is None:
        return SwapDecision(None)
    was, now = _spec(serving), _spec(wanted)
    if was is None or now is None:
        return SwapDecision(None)
    serving_version, wanted_version = _version(was), _version(now)
    if serving_version == wanted_version:
        return SwapDecision(None)
    if not allowed:
        return SwapDecision(None, "--no-swap")
    if now.get("drafter") in (None, "none") or _keeper_container(after) is None:
        return SwapDecision(None, "the new revision does not serve a swappable drafter")
    if before["metadata"]["name"] != after["metadata"]["name"]:
        return SwapDecision(None, "the new revision's Deployment has another name")
    differences = _differences(_without_identity_spec(was), _without_identity_spec(now), "spec")
    differences += _differences(
        _without_identity(before["spec"]), _without_identity(after["spec"]), "Deployment.spec"
    )
    if differences:
        shown = "; ".join(differences[:SHOWN_DIFFERENCES])
        more = len(differences) - SHOWN_DIFFERENCES
        return SwapDecision(
            None,
            "more than the drafter changes ("
            + shown
            + (f"; {more} more" if more > 0 else "")
            + ")",
        )
    kept = [before if o is after else o for o in wanted]
    port = _port(_keeper_container(before) or {})
    return SwapDecision(
        SwapPlan(kept, serving_version, wanted_version, before["metadata"]["name"], port)
    )


def _deployment(objects: list[dict[str, Any]]) -> dict[str, Any] | None:
    return next((o for o in objects if o.get("kind") == "Deployment"), None)


def _spec(objects: list[dict[str, Any]]) -> dict[str, Any] | None:
    for obj in objects:
        text = (
            (obj.get("data") or {}).get(SPEC_FILE_NAME) if obj.get("kind") == "ConfigMap" else None
        )
        if text:
            spec: dict[str, Any] = json.loads(text)
            return spec
    return None


def _version(spec: dict[str, Any]) -> str:
    return drafter_version(str(spec.get("drafter")))


def _port(container: dict[str, Any]) -> int:
    return int((container.get("ports") or [{}])[0].get("containerPort", 8000))


def _keeper_container(deployment: dict[str, Any]) -> dict[str, Any] | None:
    containers = deployment["spec"]["template"]["spec"].get("containers") or []
    return next((c for c in containers if DRAFTER_KEEPER in (c.get("args") or [])), None)


def _without_identity_spec(spec: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in spec.items() if k not in DRAFTER_IDENTITY_SPEC_KEYS}


def _without_identity(deployment_spec: dict[str, Any]) -> dict[str, Any]:
    spec = copy.deepcopy(deployment_spec)
    metadata = spec["template"].get("metadata") or {}
    (metadata.get("labels") or {}).pop(DRAFTER_LABEL, None)
    (metadata.get("annotations") or {}).pop(SPEC_SHA256_ANNOTATION, None)
    for container in spec["template"]["spec"].get("containers") or []:
        container["env"] = [
            e for e in container.get("env") or [] if e.get("name") != STARTED_WITH_ENV
        ]
        args = container.get("args") or []
        for at, arg in enumerate(args[:-1]):
            if arg == "--speculative-config":
                config = json.loads(args[at + 1])
                config.pop("model", None)
                args[at + 1] = json.dumps(config, sort_keys=True)
    return spec


def _differences(before: Any, after: Any, where: str) -> list[str]:
    if isinstance(before, dict) and isinstance(after, dict):
        out: list[str] = []
        for key in sorted(set(before) | set(after), key=str):
            out += _differences(before.get(key), after.get(key), f"{where}.{key}")
        return out
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        out = []
        for index, (was, now) in enumerate(zip(before, after, strict=True)):
            out += _differences(was, now, f"{where}[{index}]")
        return out
    if before != after:
        return [f"{where}: {_short(before)} -> {_short(after)}"]
    return []


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."


@dataclass(frozen=True)
class PodSwap:
    pod: str
    state: str
    serving: str | None
    reason: str
    seconds: float | None


def pod_swap(pod: str, answer: dict[str, Any], wanted: str) -> PodSwap:
    """One keeper's answer, read for the version a revision wants."""
    swaps = [s for s in answer.get("swaps") or [] if s.get("to") == wanted]
    seconds = swaps[-1].get("total_s") if swaps else None
    state = str(answer.get("state"))
    if answer.get("wanted") not in (None, wanted) and state in ("refused", "failed", "serving"):
        # The pod's volume still holds the previous spec (kubelet syncs it within about a minute).
        state = "waiting"
    return PodSwap(pod, state, answer.get("serving"), str(answer.get("reason") or ""), seconds)


def summary(pods: list[PodSwap], wanted: str) -> str:
    done = sum(1 for p in pods if p.state == "serving" and p.serving == wanted)
    waiting = [f"{p.pod}: {p.state}{' (' + p.reason + ')' if p.reason else ''}" for p in pods
               if not (p.state == "serving" and p.serving == wanted)]  # fmt: skip
    return f"{done}/{len(pods)} pods serve {wanted}" + (
        f"; {'; '.join(waiting)}" if waiting else ""
    )


@dataclass(frozen=True)
class Following:
    """How long and how often to ask the keepers, and what to call meanwhile."""

    timeout_s: float
    poll_s: float
    show: Callable[[str], None]
    keep_alive: Callable[[], None]


@dataclass(frozen=True)
class SwapOutcome:
    state: RolloutState
    pods: list[PodSwap]
    refused: str = ""
    seconds: float = 0.0

    def details(self) -> dict[str, Any]:
        """What the record keeps of the swap (history, status)."""
        return {
            "outcome": "refused" if self.refused else self.state.phase,
            "reason": self.refused or (self.state.message if self.state.phase != "ready" else ""),
            "waited_s": round(self.seconds, 1),
            "pods": {p.pod: p.seconds for p in self.pods},
        }


def follow(session: ClusterSession, plan: SwapPlan, following: Following) -> SwapOutcome:
    """Ask every running serve pod's keeper (through the API server's pod proxy) until each serves
    `plan.wanted`, one refuses it, or the time is up. The keeper sees the new spec once the
    kubelet has synced the pod's ConfigMap volume: up to about a minute after the apply."""
    deployment = next(o for o in plan.manifests if o.get("kind") == "Deployment")
    began = time.monotonic()
    renewed = began
    while True:
        pods = ask_keepers(session, deployment, plan.port, plan.wanted)
        elapsed = time.monotonic() - began
        line = summary(pods, plan.wanted)
        following.show(f"[{elapsed:5.0f}s] swap: {line}")
        refused = next((p for p in pods if p.state == "refused"), None)
        if refused is not None:
            why = f"{refused.pod}: {refused.reason}"
            state = RolloutState("failed", line, "SwapRefused", refused.pod)
            return SwapOutcome(state, pods, refused=why, seconds=elapsed)
        if pods and all(p.state == "serving" and p.serving == plan.wanted for p in pods):
            message = f"every serve pod serves {plan.wanted} ({len(pods)} swapped, no reload)"
            return SwapOutcome(RolloutState("ready", message), pods, seconds=elapsed)
        if elapsed > following.timeout_s:
            state = RolloutState(
                "failed",
                f"the drafter was not swapped within --timeout {following.timeout_s:.0f}s: {line}",
                "SwapTimeout",
                next((p.pod for p in pods if p.serving != plan.wanted), None),
            )
            return SwapOutcome(state, pods, seconds=elapsed)
        if time.monotonic() - renewed > 30:
            following.keep_alive()
            renewed = time.monotonic()
        time.sleep(following.poll_s)


def ask_keepers(
    session: ClusterSession, deployment: dict[str, Any], port: int, wanted: str
) -> list[PodSwap]:
    """Each running pod of `deployment`: what its keeper serves, read for `wanted`."""
    match = deployment["spec"]["selector"].get("matchLabels") or {}
    selector = ",".join(f"{k}={v}" for k, v in sorted(match.items()))
    return [
        _ask(session, pod["metadata"]["name"], port, wanted)
        for pod in session.pods(selector)
        if pod.get("status", {}).get("phase") == "Running"
        and not pod["metadata"].get("deletionTimestamp")
    ]


def keepers_now(session: ClusterSession, manifests: list[dict[str, Any]], wanted: str) -> str:
    """For `status`: which drafter the serve pods' keepers serve ("" where none runs one)."""
    deployment = _deployment(manifests)
    container = _keeper_container(deployment) if deployment else None
    if deployment is None or container is None:
        return ""
    return summary(ask_keepers(session, deployment, _port(container), wanted), wanted)


def _ask(session: ClusterSession, pod: str, port: int, wanted: str) -> PodSwap:
    try:
        answer = json.loads(session.scrape_pod(pod, port, KEEPER_PATH.lstrip("/")))
    except KimiDeployError as exc:
        return PodSwap(pod, "unreachable", None, exc.message, None)
    except ValueError as exc:
        return PodSwap(pod, "unreachable", None, f"{KEEPER_PATH} answered no JSON ({exc})", None)
    return pod_swap(pod, answer, wanted)
