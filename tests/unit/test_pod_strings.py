"""`$(NAME)` in a user string is not expanded by Kubernetes: a served name or an
extra vLLM flag cannot read HF_TOKEN or any other pod variable; kimideploy's own references stay."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from kimideploy.config.loading import load_project
from kimideploy.plan.model import PlanRequest
from kimideploy.services.rendering import render_workload


def containers(config: Path, workload: str, **request: str) -> list[dict]:  # type: ignore[type-arg]
    rendered = render_workload(load_project(config), PlanRequest(workload, **request))
    pod = next(o for o in rendered.objects if o["kind"] in ("Deployment", "Job"))["spec"][
        "template"
    ]
    spec = pod["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def test_user_strings_are_escaped_and_kimideploys_references_kept(
    edited_config: Callable[..., Path],
) -> None:
    config = edited_config(
        ("  served_name: kimi-k2.5\n", "  served_name: kimi-$(HF_TOKEN)\n"),
        ("    price_per_gpu_hour: 6.00       # what the provider charges per GPU-hour: estimates add up money\n    interconnect: nvlink\n    tolerations:\n      - {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}\n    env:\n",
         "    price_per_gpu_hour: 6.00       # what the provider charges per GPU-hour: estimates add up money\n    interconnect: nvlink\n    tolerations:\n      - {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}\n    env:\n      NCCL_SOCKET_IFNAME: $(HF_TOKEN)\n"),
    )  # fmt: skip
    serve = next(
        c for c in containers(config, "serve", cluster="b300")
        if "--served-model-name" in c.get("args", [])
    )  # fmt: skip
    assert "kimi-$$(HF_TOKEN)" in serve["args"] and "kimi-$(HF_TOKEN)" not in serve["args"]
    assert {"name": "NCCL_SOCKET_IFNAME", "value": "$$(HF_TOKEN)"} in serve["env"]
    sidecar = next(
        c for c in containers(config, "train", cluster="b300") if c["name"] == "target-server"
    )
    assert "kimi-$$(HF_TOKEN)" in sidecar["args"]
    trainer = next(
        c
        for c in containers(config, "train", cluster="b300")
        if c["name"] not in ("target-server", "memlock-check", "gpu-check")
    )
    assert any(
        "$(JOB_COMPLETION_INDEX)" in a
        for a in [*trainer.get("command", []), *trainer.get("args", [])]
    )
