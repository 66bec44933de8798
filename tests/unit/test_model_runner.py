"""The vLLM model runner is pinned in every engine pod, shown by the plan, and a V2 image asked to
serve a method V2 does not run is refused (plan/model_runner.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kimideploy.config.loading import LoadedProject, load_project
from kimideploy.errors import ConfigError
from kimideploy.plan.model import PlanRequest
from kimideploy.plan.model_runner import RUNNER_ENV, pinned
from kimideploy.services.rendering import render_workload


def runner_envs(example: LoadedProject, request: PlanRequest) -> dict[str, str]:
    """Container name -> the runner it is told, for every container that starts a vLLM engine."""
    found: dict[str, str] = {}
    for manifest in render_workload(example, request).objects:
        pod = (manifest.get("spec") or {}).get("template", {}).get("spec", {})
        for container in [*pod.get("initContainers", []), *pod.get("containers", [])]:
            env: list[dict[str, Any]] = container.get("env") or []
            values = {e["name"]: e.get("value") for e in env}
            if RUNNER_ENV in values:
                found[f"{manifest['metadata']['name']}/{container['name']}"] = values[RUNNER_ENV]
    return found


@pytest.mark.parametrize(
    ("workload", "cluster", "drafter", "expected"),
    [
        ("serve", "b300", "v3", {"serve": "1"}),
        ("serve", "b300", "none", {"serve": "1"}),  # the engine's default is pinned all the same
        ("serve", "b300", "suffix", {"serve": "0"}),  # V2 does not run suffix decoding
        ("extract", "b300", "v3", {"extract": "1"}),
        ("train", "b300", "v3", {"target-server": "1"}),  # online training's sidecar
        ("replay", "b300", "v3", {"capture": "1"}),
    ],
)
def test_every_engine_pod_is_told_its_runner(
    example: LoadedProject, workload: str, cluster: str, drafter: str, expected: dict[str, str]
) -> None:
    found = runner_envs(example, PlanRequest(workload, cluster, drafter, run_id="r1"))
    assert sorted(found.values()) == sorted(expected.values()), found
    for part in expected:
        assert any(part in name for name in found), (part, found)


def test_the_plan_shows_the_runner_and_why(example: LoadedProject) -> None:
    facts = dict(render_workload(example, PlanRequest("serve", "b300", "v3")).plan.facts)
    assert facts["model runner"] == (
        "serve: v2 (VLLM_USE_V2_MODEL_RUNNER=1: vLLM 0.32.0's default, pinned)"
    )
    suffix = dict(render_workload(example, PlanRequest("serve", "b300", "suffix")).plan.facts)
    assert suffix["model runner"] == (
        "serve: v1 (VLLM_USE_V2_MODEL_RUNNER=0: Model Runner V2 does not run suffix)"
    )
    online = dict(
        render_workload(example, PlanRequest("train", "b300", "v3", run_id="r")).plan.facts
    )
    assert online["model runner"].startswith("target server: v2 (")
    vocab = dict(
        render_workload(example, PlanRequest("vocab", "b300", "v3", run_id="r")).plan.facts
    )
    assert "model runner" not in vocab  # no engine in its pods


def test_an_images_runner_is_used_and_a_v2_image_serving_suffix_is_refused(
    edited_config: Callable[..., Path],
) -> None:
    pinned_v1 = load_project(
        edited_config(("    vllm: 0.32.0\n", "    vllm: 0.32.0\n    model_runner: v1\n"))
    )
    image = pinned_v1.project.images["vllm-0.32-kimi"]
    assert pinned(image, "vllm-0.32-kimi", None).describe() == (
        "v1 (VLLM_USE_V2_MODEL_RUNNER=0: images.vllm-0.32-kimi.model_runner)"
    )
    assert set(runner_envs(pinned_v1, PlanRequest("serve", "b300", "v3")).values()) == {"0"}
    older = load_project(edited_config())
    assert pinned(older.project.images["vllm-0.16-kimi"], "vllm-0.16-kimi").runner == "v1"
    forced = load_project(
        edited_config(("    vllm: 0.32.0\n", "    vllm: 0.32.0\n    model_runner: v2\n"))
    )
    with pytest.raises(
        ConfigError, match="Model Runner V2 does not run the suffix method"
    ) as error:
        render_workload(forced, PlanRequest("serve", "b300", "suffix"))
    assert error.value.hint == (
        "unset images.vllm-0.32-kimi.model_runner or set it to v1 to serve suffix"
    )
