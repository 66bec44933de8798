"""How a revision reached the pods, in the words `history`, `status` and the outcomes use: read
from the record alone (its details and objects), so the transaction and the readers agree."""

from __future__ import annotations

from typing import Any

from kimideploy.cluster.records import ReleaseRecord
from kimideploy.plan.gateway import route_weights
from kimideploy.plan.inputs import CANARY_SUFFIX


def canary_share(manifests: list[dict[str, Any]], release: str) -> int | None:
    """The canary's share of the release's route, None without a canary."""
    for obj in manifests:
        if obj["kind"] == "HTTPRoute":
            return route_weights(obj).get(f"{release}{CANARY_SUFFIX}")
    return None


def change_summary(record: ReleaseRecord) -> str:
    """How the revision reached the pods: "swap" (the drafter swapped into the running server,
    no reload), "swap refused" (the server refused the files; the pods were replaced), "swap
    (not waited for)" (`--no-wait`), "swap failed", "speculation off" / "speculation on" (the
    running engine switched, its drafter kept loaded) or "rollout"; a revision with a canary pool
    says its share of the route ("canary 10%", "canary 0%" after a refusal)."""
    share = canary_share(record.manifests, record.release)
    if share is not None:
        return f"canary {share}%"
    switched = record.details.get("switch")
    if switched:
        word = f"speculation {switched.get('speculation', 'off')}"
        return {
            "ready": word,
            "refused": f"{word} refused",
            "unreachable": "rollout (keepers unreachable)",
            "not waited for": f"{word} (not waited for)",
        }.get(switched["outcome"], f"{word} failed")
    swapped = record.details.get("swap")
    if not swapped:
        return "rollout"
    return {
        "ready": "swap",
        "refused": "swap refused",
        "unreachable": "rollout (keepers unreachable)",
        "not waited for": "swap (not waited for)",
    }.get(swapped["outcome"], "swap failed")
