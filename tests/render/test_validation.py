"""Validation catches what the API server would reject, including what the schema misses."""

from __future__ import annotations

import copy
import json
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


def _full_registry_validator(version: tuple[int, int], kind: str, api_version: str) -> Any:
    """The package's own layout: the kind's file resolved against the whole definitions file."""
    import json
    import re

    import jsonschema
    from referencing import Registry, Resource

    from kimideploy.render.schema import _folder

    group = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    schema = json.loads((_folder(version) / f"{kind.lower()}-{group}.json").read_text())
    definitions = json.loads((_folder(version) / "_definitions.json").read_text())
    registry = Registry().with_resource("_definitions.json", Resource.from_contents(definitions))
    return jsonschema.Draft202012Validator(schema, registry=registry.crawl())


def _broken(obj: dict[str, Any]) -> dict[str, Any]:
    """Wrong types and unknown fields at every depth the object has."""
    broken = copy.deepcopy(obj)

    def spoil(node: Any, depth: int) -> None:
        if isinstance(node, dict):
            node[f"notAField{depth}"] = 1
            for key, value in list(node.items()):
                if isinstance(value, (dict, list)):
                    spoil(value, depth + 1)
                elif isinstance(value, str) and key not in ("apiVersion", "kind"):
                    node[key] = 12345
        elif isinstance(node, list):
            for value in node:
                spoil(value, depth + 1)

    spoil(broken, 0)
    return broken


@pytest.mark.parametrize("workload", ["serve", "train", "datagen", "bench"])
def test_each_kinds_reduced_schema_judges_like_the_full_definitions(
    example: LoadedProject, workload: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Validation reads one self-contained schema per kind (its definitions only, cached on
    disk); it must find exactly what the package's full definitions find, good or broken."""
    import jsonschema

    from kimideploy.render.schema import CRD_SCHEMAS, kind_schema, schema_version_for

    monkeypatch.setenv("KIMIDEPLOY_CACHE", str(tmp_path))
    drafter = "v3" if workload == "serve" else None
    objects = render_workload(example, PlanRequest(workload, "b300", drafter)).objects
    version = schema_version_for("1.33")
    for obj in objects:
        kind, api = obj["kind"], obj["apiVersion"]
        if (kind, api) in CRD_SCHEMAS:
            continue
        for _read in ("fresh", "cached"):  # the second comes from the cache file
            reduced = jsonschema.Draft202012Validator(kind_schema(version, kind, api))
            full = _full_registry_validator(version, kind, api)
            for candidate in (obj, _broken(obj)):
                found = sorted(e.message for e in reduced.iter_errors(candidate))
                assert found == sorted(e.message for e in full.iter_errors(candidate)), kind
                assert bool(found) == (candidate is not obj), kind
        assert list((tmp_path / "schemas").glob(f"{kind.lower()}-*.json"))


def test_a_damaged_schema_cache_file_is_derived_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cache file cut short (a full disk, a killed run) must not break every later render."""
    from kimideploy.render.schema import kind_schema, schema_version_for

    monkeypatch.setenv("KIMIDEPLOY_CACHE", str(tmp_path))
    version = schema_version_for("1.33")
    good = kind_schema(version, "ConfigMap", "v1")
    [cached] = (tmp_path / "schemas").glob("configmap-*.json")
    cached.write_text(cached.read_text()[:100])
    assert kind_schema(version, "ConfigMap", "v1") == good
    assert json.loads(cached.read_text()) == good
