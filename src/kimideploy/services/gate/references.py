"""A promoted drafter's reference acceptance: what the gate measured when it kept the drafter,
with the engine it was measured on (the serve image by digest, its vLLM model runner), kept in
the cluster beside the other measurements (`kimideploy.measured.CLUSTER.references`).

An acceptance is a property of the drafter and of the engine that serves it: a new image or a
changed runner can lower it with no error (vllm#40551, vllm#41838). The reference is what a
later engine change is compared with, per level and per position; the training run's held-out
interval at the served k travels with it where the registry has one.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from kimideploy.cluster.session import ClusterSession
from kimideploy.config.drafters import HeldOutAcceptance
from kimideploy.plan.model_runner import RUNNER_ENV
from kimideploy.render.manifests import Manifest
from kimideploy.services.gate.verdict import Verdict

REFERENCES = "references"
"""The measurement kind the references are kept under (cluster/measurements.py)."""


def reference(
    objects: list[Manifest],
    *,
    drafter: str,
    revision: int,
    k: int | None,
    verdict: Verdict,
    held_out: HeldOutAcceptance | None,
) -> dict[str, Any]:
    """The reference of `drafter` as revision `revision` serves it at `k` (`objects`: its
    render, whose serve container says the image and the runner)."""
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container.get("env") or []}
    runner = {"1": "v2", "0": "v1"}.get(str(env.get(RUNNER_ENV)), "engine default")
    levels = [
        {
            "prompt_set": row["prompt_set"],
            "concurrency": row["concurrency"],
            "acceptance_rate": row.get("acceptance_rate"),
            "mean_acceptance_length": row.get("mean_acceptance_length"),
            "per_position_acceptance": row.get("per_position_acceptance"),
            "counted_by": row.get("counted_by"),
        }
        for row in verdict.levels
    ]
    entry: dict[str, Any] = {
        "drafter": drafter,
        "revision": revision,
        "image": container["image"],
        "model_runner": runner,
        "kernels": verdict.kernels,
        "bench_run": verdict.run_id,
        "measured_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "levels": levels,
    }
    if k is not None:
        entry["num_speculative_tokens"] = k
    if held_out is not None and k is not None and k in held_out.mean_acceptance_length:
        entry["held_out"] = {
            "mean_acceptance_length": held_out.mean_acceptance_length[k],
            "ci95": held_out.ci95.get(k),
            "samples": held_out.samples,
        }
    return entry


def record(session: ClusterSession, entry: dict[str, Any]) -> None:
    session.record_measurement(REFERENCES, entry)


def recorded(session: ClusterSession) -> list[dict[str, Any]]:
    """Every reference kept on the session's cluster, oldest first."""
    return session.measurements(REFERENCES)
