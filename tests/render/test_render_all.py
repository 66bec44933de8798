"""Every workload x cluster x drafter renders, validates strictly, and keeps the house rules."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from kimideploy.config.loading import LoadedProject
from kimideploy.plan.model import PlanRequest
from kimideploy.render.manifests import to_yaml
from kimideploy.services.rendering import render_workload

WORKLOADS = ("datagen", "extract", "vocab", "train", "bench", "serve")
CLUSTERS = ("rtx6000", "b200", "b300")
DRAFTERS = ("none", "v1", "v2", "v3")
STANDARD_LABELS = (
    "app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/component",
    "app.kubernetes.io/version", "app.kubernetes.io/managed-by", "app.kubernetes.io/part-of",
)  # fmt: skip


def combos() -> Iterator[tuple[str, str, str | None]]:
    for workload, cluster in itertools.product(WORKLOADS, CLUSTERS):
        drafters = DRAFTERS if workload in ("serve", "bench") else ("v2", "v3")
        for drafter in drafters:
            yield workload, cluster, drafter


def containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    pod = obj.get("spec", {}).get("template", {}).get("spec", {})
    return list(pod.get("containers", [])) + list(pod.get("initContainers", []))


@pytest.mark.parametrize(("workload", "cluster", "drafter"), list(combos()))
def test_renders_and_validates(
    example: LoadedProject, workload: str, cluster: str, drafter: str | None
) -> None:
    rendered = render_workload(example, PlanRequest(workload, cluster, drafter))
    kinds = [o["kind"] for o in rendered.objects]
    order = ["NetworkPolicy", "ConfigMap", "PersistentVolumeClaim", "Service", "Deployment", "Job"]
    assert kinds == sorted(kinds, key=order.index)
    assert kinds[0] == "NetworkPolicy"  # before any pod it selects exists
    for obj in rendered.objects:
        labels = obj["metadata"]["labels"]
        assert all(label in labels for label in STANDARD_LABELS), obj["metadata"]["name"]
        assert labels["app.kubernetes.io/managed-by"] == "kimideploy"
        assert obj["metadata"]["namespace"] == "kimi"
        for container in containers(obj):
            assert "@sha256:" in container["image"], "images are referenced by digest only"
            for entry in container.get("env", []):
                assert entry["name"] != "HF_TOKEN" or "secretKeyRef" in entry["valueFrom"]
    assert list(yaml.safe_load_all(rendered.yaml)) == rendered.objects


def test_output_is_byte_identical_across_runs(example: LoadedProject) -> None:
    for workload in WORKLOADS:
        first = render_workload(example, PlanRequest(workload, "b300")).yaml
        second = render_workload(example, PlanRequest(workload, "b300")).yaml
        assert first == second


def test_serve_pod_shape(example: LoadedProject) -> None:
    objects = render_workload(example, PlanRequest("serve", "rtx6000", "v3")).objects
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    [vllm] = pod["containers"]
    assert vllm["resources"]["limits"]["nvidia.com/gpu"] == "8"
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["medium"] == "Memory"
    models = next(m for m in vllm["volumeMounts"] if m["name"] == "models")
    assert models["readOnly"] is True
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert set(deployment["spec"]["selector"]["matchLabels"]) == {
        "app.kubernetes.io/instance", "app.kubernetes.io/component"
    }  # fmt: skip


def test_indexed_jobs_have_per_index_retries_and_the_spec_mounted(example: LoadedProject) -> None:
    for workload in ("datagen", "extract"):
        objects = render_workload(example, PlanRequest(workload, "b300")).objects
        job = next(o for o in objects if o["kind"] == "Job")
        assert job["spec"]["completionMode"] == "Indexed"
        assert job["spec"]["completions"] >= 1 and job["spec"]["backoffLimitPerIndex"] >= 1
        spec_cm = next(o for o in objects if o["kind"] == "ConfigMap")
        assert "spec.json" in spec_cm["data"]
        mounts = job["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
        assert {"name": "spec", "mountPath": "/etc/kimideploy", "readOnly": True} in mounts


def test_vocab_and_bench_request_no_gpu(example: LoadedProject) -> None:
    for workload in ("vocab", "bench", "datagen"):
        job = next(
            o for o in render_workload(example, PlanRequest(workload, "b300")).objects if o["kind"] == "Job"
        )  # fmt: skip
        [container] = job["spec"]["template"]["spec"]["containers"]
        assert "nvidia.com/gpu" not in to_yaml([container["resources"]])
        assert "nvidia.com/gpu.product" not in job["spec"]["template"]["spec"]["nodeSelector"]


def test_bench_targets_the_serve_service(example: LoadedProject) -> None:
    objects = render_workload(example, PlanRequest("bench", "rtx6000")).objects
    spec = next(o for o in objects if o["kind"] == "ConfigMap")["data"]["spec.json"]
    assert '"endpoint": "http://kimi-k25-serve.kimi.svc:8000"' in spec


def test_pvcs_are_marked_to_be_kept(example: LoadedProject) -> None:
    objects = render_workload(example, PlanRequest("train", "b200")).objects
    claims = [o for o in objects if o["kind"] == "PersistentVolumeClaim"]
    assert {c["metadata"]["name"] for c in claims} == {
        "kimi-k25-models", "kimi-k25-datasets", "kimi-k25-hidden-states", "kimi-k25-checkpoints",
        "kimi-k25-compile-cache",
    }  # fmt: skip
    assert all(c["metadata"]["annotations"]["kimideploy.io/keep"] == "true" for c in claims)
    assert {c["spec"]["accessModes"][0] for c in claims} == {"ReadWriteMany"}
