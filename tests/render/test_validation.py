"""Validation catches what the API server would reject, including what the schema misses."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from kimideploy.config.loading import LoadedProject
from kimideploy.errors import ManifestError
from kimideploy.plan.model import PlanRequest
from kimideploy.render.validate import validate_objects
from kimideploy.services.rendering import render_workload
from tests.conftest import REPO


@pytest.fixture
def job(example: LoadedProject) -> dict[str, Any]:
    objects = render_workload(example, PlanRequest("datagen", "rtx6000")).objects
    return copy.deepcopy(next(o for o in objects if o["kind"] == "Job"))


def errors_for(obj: dict[str, Any], version: str = "1.33") -> str:
    with pytest.raises(ManifestError) as info:
        validate_objects([obj], version)
    return info.value.message


def test_unknown_field_is_rejected_in_strict_mode(job: dict[str, Any]) -> None:
    job["spec"]["ttlSecondAfterFinished"] = 60
    message = errors_for(job)
    assert "Job/kimi-k25-datagen-" in message and "ttlSecondAfterFinished" in message


def test_bad_enum_that_the_schema_accepts(job: dict[str, Any]) -> None:
    job["spec"]["completionMode"] = "Indexd"
    assert "spec.completionMode: 'Indexd' is not one of Indexed, NonIndexed" in errors_for(job)


def test_bad_quantity_that_the_schema_accepts(job: dict[str, Any]) -> None:
    job["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["memory"] = "lots"
    message = errors_for(job)
    assert (
        "spec.template.spec.containers[0].resources.requests.memory: 'lots' is not a resource quantity"
        in message
    )


def test_wrong_type(job: dict[str, Any]) -> None:
    job["spec"]["completions"] = "four"
    assert "spec.completions" in errors_for(job)


def test_invalid_label_value(job: dict[str, Any]) -> None:
    job["metadata"]["labels"]["kimideploy.io/drafter"] = "not valid!"
    assert "label value 'not valid!' is invalid" in errors_for(job)


def test_too_long_job_name(job: dict[str, Any]) -> None:
    job["metadata"]["name"] = "x" * 64
    assert "must be a DNS label" in errors_for(job)


def test_unsupported_kubernetes_version(job: dict[str, Any]) -> None:
    message = errors_for(job, "1.99")
    assert "no OpenAPI schema for Kubernetes 1.99" in message


def test_validation_uses_the_declared_version(job: dict[str, Any]) -> None:
    # backoffLimitPerIndex only exists from Kubernetes 1.28 on.
    validate_objects([job], "1.33")
    assert "backoffLimitPerIndex" in errors_for(job, "1.27")


def test_config_value_reaching_a_manifest_is_checked(example: LoadedProject) -> None:
    rendered = render_workload(example, PlanRequest("serve", "rtx6000", "v3"))
    deployment = copy.deepcopy(rendered.objects[-1])
    deployment["spec"]["strategy"]["type"] = "Rolling"
    assert "spec.strategy.type: 'Rolling' is not one of Recreate, RollingUpdate" in errors_for(
        deployment
    )


@pytest.mark.parametrize(
    "path", sorted((REPO / "k8s" / "base").glob("*.yaml")), ids=lambda p: p.name
)
def test_base_manifests_validate_strictly(path: Path) -> None:
    import yaml

    objects = [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    assert objects
    for version in ("1.33", "1.34"):
        validate_objects(objects, version)


def test_pod_monitor_follows_the_setting_and_the_cluster(example: LoadedProject) -> None:
    def monitors(request: PlanRequest) -> list[dict[str, Any]]:
        objects = render_workload(example, request).objects
        return [o for o in objects if o["kind"] == "PodMonitor"]

    assert monitors(PlanRequest("serve", "rtx6000", "v3")) == []  # offline: unknown, not rendered
    assert monitors(PlanRequest("serve", "rtx6000", "v3", monitoring_crd=False)) == []
    [monitor] = monitors(PlanRequest("serve", "rtx6000", "v3", monitoring_crd=True))
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == "http"
    forced = PlanRequest("serve", "b300", "v3", ("serve.pod_monitor=always",))
    assert len(monitors(forced)) == 1
    never = PlanRequest("serve", "b300", "v3", ("serve.pod_monitor=never",), monitoring_crd=True)
    assert monitors(never) == []
    bad = copy.deepcopy(monitor)
    bad["spec"]["podMetricsEndpoints"][0]["intervall"] = "15s"
    bad["spec"]["podMetricsEndpoints"][0]["path"] = "metrics"
    message = errors_for(bad)
    assert "PodMonitor/kimi-k25-serve: spec.podMetricsEndpoints[0]" in message
    assert "'intervall' was unexpected" in message and "'metrics' does not match '^/'" in message
