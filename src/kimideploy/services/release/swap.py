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

Switching speculation off and on is the same kind of revision (vLLM 0.32 with kimideploy's patch
0002, plan/serve.py `switches_speculation`): the spec says `speculation: false`, the Deployment
stays, and the keeper switches the running engine off within seconds; the drafter it serves stays
loaded, so switching back on (`up serve --drafter X`) is as quick. A non-speculative revision is
rendered in that form (`Revision.switch_off`, deploy.py) only where the pods last applied can
switch (`loaded_drafter`); elsewhere it replaces the pods, as before.
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
    SPEC_SPECULATION_KEY,
    SPECULATION_SWITCH_ENV,
    STARTED_WITH_ENV,
    drafter_version,
    folder_id,
)
from kimideploy.plan.inputs import MODELS_MOUNT
from kimideploy.plan.pods import LABEL_PREFIX
from kimideploy.plan.serve import SPEC_SHA256_ANNOTATION

DRAFTER_LABEL = f"{LABEL_PREFIX}/drafter"
UNREACHABLE_POLLS = 3
"""Polls in a row on which no pod's keeper answered through the pod proxy before a swap or a
switch gives way to replacing the pods (a Ready pod's keeper answers at once)."""
KEEPER_SILENT_S = 60.0
"""How long every pod's keeper may answer "starting" (it has never looked: the route is served but
no keeper loop runs, as in a server started without the keeper's variables) before a swap or a
switch gives way to replacing the pods. A running keeper writes its state within its first
period (KEEPER_PERIOD_S, 1 s), so a minute is generous; waiting out --timeout instead held
`watch`'s rollback for the whole startup budget."""
DRAFTER_IDENTITY_SPEC_KEYS = ("drafter", "drafter_path", "drafter_sha256", SPEC_SPECULATION_KEY)
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
    speculation: bool = True
    """False: the keepers switch speculation off (the drafter `wanted` stays loaded)."""
    was_speculating: bool = True

    @property
    def record_key(self) -> str:
        """Where the record keeps how it went: "swap" (a drafter into a speculating server),
        "switch" (speculation switched, a swap after it or not)."""
        return "swap" if self.speculation and self.was_speculating else "switch"

    @property
    def what(self) -> str:
        """The change in words, for the confirmation and the record."""
        if not self.speculation:
            return f"switch speculation off in the running pods ({self.wanted} stays loaded)"
        if not self.was_speculating and self.serving == self.wanted:
            return f"switch speculation on in the running pods ({self.wanted})"
        switch = "switch speculation on and " if not self.was_speculating else ""
        return f"{switch}swap the drafter in the running pods: {self.serving} -> {self.wanted}"


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
    was_on, now_on = _speculating(was), _speculating(now)
    if serving_version == wanted_version and was_on == now_on:
        return SwapDecision(None)
    if not allowed:
        return SwapDecision(None, "--no-swap")
    if now.get("drafter") in (None, "none") or _keeper_container(after) is None:
        return SwapDecision(None, "the new revision does not serve a swappable drafter")
    if not now_on and not can_switch(before):
        return SwapDecision(None, "the serving pods cannot switch speculation off")
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
        SwapPlan(
            kept,
            serving_version,
            wanted_version,
            before["metadata"]["name"],
            port,
            speculation=now_on,
            was_speculating=was_on,
        )
    )


def _speculating(spec: dict[str, Any]) -> bool:
    return spec.get(SPEC_SPECULATION_KEY, True) is not False


def can_switch(deployment: dict[str, Any]) -> bool:
    """Whether the Deployment's serve container was started able to switch speculation."""
    container = _keeper_container(deployment)
    env = {e.get("name"): e.get("value") for e in (container or {}).get("env") or []}
    return env.get(SPECULATION_SWITCH_ENV) == "1"


def loaded_drafter(applied: list[dict[str, Any]] | None) -> str | None:
    """The drafter the pods last applied keep loaded, where they can switch speculation off
    (None: they cannot, or serve none): what a non-speculative revision keeps loaded."""
    deployment = _deployment(applied or [])
    spec = _spec(applied or [])
    if deployment is None or spec is None or not can_switch(deployment):
        return None
    drafter = spec.get("drafter")
    return None if drafter in (None, "none") else str(drafter)


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
    speculation: str = "on"

    def done(self, wanted: str, speculation: bool = True) -> bool:
        if not speculation:
            return self.state == "off"
        return self.state == "serving" and self.serving == wanted


FOREIGN = "foreign"
"""A keeper serving the wanted name from another folder than the release's: its spec ConfigMap
was changed outside kimideploy."""


def pod_swap(
    pod: str,
    answer: dict[str, Any],
    wanted: str,
    speculation: bool = True,
    folder: str | None = None,
) -> PodSwap:
    """One keeper's answer, read for the version (and speculation state) a revision wants, and,
    where the record names it, the folder the revision's drafter is read from."""
    state = str(answer.get("state"))
    served_from = answer.get("folder_id")
    wanted_from = folder_id(folder, MODELS_MOUNT) if folder else None
    # Only a keeper that has the release's spec (it wants what the release wants) and says it
    # serves that name from another folder: one whose volume still holds the previous spec is
    # waiting for the kubelet, not foreign.
    claims_wanted = answer.get("wanted") == wanted and answer.get("serving") == wanted
    if wanted_from and served_from and served_from != wanted_from and claims_wanted:
        reason = (
            f"serves {answer.get('serving')} from another folder than the release's {folder}: "
            "the spec ConfigMap was changed outside kimideploy; `kimideploy up serve` or "
            "`rollback serve` puts the release's back"
        )
        return PodSwap(pod, FOREIGN, answer.get("serving"), reason, None,
                       str(answer.get("speculation") or "on"))  # fmt: skip
    if speculation:
        changes = [s for s in answer.get("swaps") or [] if s.get("to") == wanted]
        seconds = changes[-1].get("total_s") if changes else None
    else:
        changes = [s for s in answer.get("switches") or [] if s.get("to") == "off"]
        seconds = changes[-1].get("seconds") if changes else None
    if answer.get("wanted") not in (None, wanted) and state in ("refused", "failed", "serving"):
        # The pod's volume still holds the previous spec (kubelet syncs it within about a minute).
        state = "waiting"
    if not speculation and state == "serving":  # the spec that switches off is not synced yet
        state = "waiting"
    reason = str(answer.get("reason") or "")
    speculating = str(answer.get("speculation") or "on")
    return PodSwap(pod, state, answer.get("serving"), reason, seconds, speculating)


def summary(pods: list[PodSwap], wanted: str, speculation: bool = True) -> str:
    done = sum(1 for p in pods if p.done(wanted, speculation))
    waiting = [
        f"{p.pod}: {p.state}{' (' + p.reason + ')' if p.reason else ''}"
        for p in pods
        if not p.done(wanted, speculation)
    ]
    what = f"serve {wanted}" if speculation else f"serve without speculation ({wanted} loaded)"
    return f"{done}/{len(pods)} pods {what}" + (f"; {'; '.join(waiting)}" if waiting else "")


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
        failed = "unreachable" if self.state.failure == "KeepersUnreachable" else "refused"
        return {
            "outcome": failed if self.refused else self.state.phase,
            "reason": self.refused or (self.state.message if self.state.phase != "ready" else ""),
            "waited_s": round(self.seconds, 1),
            "pods": {p.pod: p.seconds for p in self.pods},
        }

    def switch_details(self, plan: SwapPlan) -> dict[str, Any]:
        """The same for a revision that switches speculation (history, status)."""
        switched = "on" if plan.speculation else "off"
        return {**self.details(), "speculation": switched, "loaded": plan.wanted}


def follow(session: ClusterSession, plan: SwapPlan, following: Following) -> SwapOutcome:
    """Ask every running serve pod's keeper (through the API server's pod proxy) until each serves
    `plan.wanted`, one refuses it, or the time is up. The keeper sees the new spec once the
    kubelet has synced the pod's ConfigMap volume: up to about a minute after the apply."""
    deployment = next(o for o in plan.manifests if o.get("kind") == "Deployment")
    began = time.monotonic()
    renewed = began
    word = "swap" if plan.speculation else "switch"
    unreachable = 0
    while True:
        pods = ask_keepers(session, deployment, plan.port, plan.wanted,
                           speculation=plan.speculation,
                           folder=(_spec(plan.manifests) or {}).get("drafter_path"))  # fmt: skip
        elapsed = time.monotonic() - began
        line = summary(pods, plan.wanted, plan.speculation)
        following.show(f"[{elapsed:5.0f}s] {word}: {line}")
        refused = next((p for p in pods if p.state == "refused"), None)
        if refused is not None:
            why = f"{refused.pod}: {refused.reason}"
            state = RolloutState("failed", line, "SwapRefused", refused.pod)
            return SwapOutcome(state, pods, refused=why, seconds=elapsed)
        unreachable = unreachable + 1 if pods and all(p.state == "unreachable" for p in pods) else 0
        silent = bool(pods) and all(p.state == "starting" for p in pods)
        if unreachable >= UNREACHABLE_POLLS or (silent and elapsed > KEEPER_SILENT_S):
            # The API server cannot reach any keeper (a NetworkPolicy, no server behind the
            # pods), or none has ever looked: what the pods do cannot be known, so the revision
            # is rolled out instead.
            why = (
                f"no keeper answers through the API server's pod proxy ({pods[0].reason})"
                if not silent
                else f"no keeper has looked in {elapsed:.0f}s ({pods[0].reason})"
            )
            state = RolloutState("failed", line, "KeepersUnreachable", pods[0].pod)
            return SwapOutcome(state, pods, refused=why, seconds=elapsed)
        if pods and all(p.done(plan.wanted, plan.speculation) for p in pods):
            message = f"every serve pod: {plan.what} ({len(pods)} pods, no reload)"
            return SwapOutcome(RolloutState("ready", message), pods, seconds=elapsed)
        if elapsed > following.timeout_s:
            state = RolloutState(
                "failed",
                f"{plan.what}: not done within --timeout {following.timeout_s:.0f}s: {line}",
                "SwapTimeout",
                next((p.pod for p in pods if not p.done(plan.wanted, plan.speculation)), None),
            )
            return SwapOutcome(state, pods, seconds=elapsed)
        if time.monotonic() - renewed > 30:
            following.keep_alive()
            renewed = time.monotonic()
        time.sleep(following.poll_s)


def ask_keepers(
    session: ClusterSession,
    deployment: dict[str, Any],
    port: int,
    wanted: str,
    *,
    speculation: bool = True,
    folder: str | None = None,
) -> list[PodSwap]:
    """Each running pod of `deployment`: what its keeper serves, read for `wanted` (and, where
    given, the release's drafter `folder`)."""
    match = deployment["spec"]["selector"].get("matchLabels") or {}
    selector = ",".join(f"{k}={v}" for k, v in sorted(match.items()))
    return [
        _ask(session, pod["metadata"]["name"], port, (wanted, speculation, folder))
        for pod in session.pods(selector)
        if pod.get("status", {}).get("phase") == "Running"
        and not pod["metadata"].get("deletionTimestamp")
    ]


def keepers_now(session: ClusterSession, manifests: list[dict[str, Any]], wanted: str) -> str:
    """For `status`: which drafter the serve pods' keepers serve, and whether speculation is on
    ("" where none runs one)."""
    deployment = _deployment(manifests)
    container = _keeper_container(deployment) if deployment else None
    spec = _spec(manifests) or {}
    if deployment is None or container is None:
        return ""
    speculation = _speculating(spec)
    wanted = _version(spec) if spec.get("drafter") else wanted  # a switched-off record says none
    pods = ask_keepers(session, deployment, _port(container), wanted, speculation=speculation,
                       folder=spec.get("drafter_path"))  # fmt: skip
    return summary(pods, wanted, speculation)


def _ask(
    session: ClusterSession, pod: str, port: int, want: tuple[str, bool, str | None]
) -> PodSwap:
    wanted, speculation, folder = want
    try:
        answer = json.loads(session.scrape_pod(pod, port, KEEPER_PATH.lstrip("/")))
    except KimiDeployError as exc:
        return PodSwap(pod, "unreachable", None, exc.message, None)
    except ValueError as exc:
        return PodSwap(pod, "unreachable", None, f"{KEEPER_PATH} answered no JSON ({exc})", None)
    return pod_swap(pod, answer, wanted, speculation, folder)
