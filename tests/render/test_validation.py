"""Validation catches what the API server would reject, including what the schema misses."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from kimideploy.config.loading import LoadedProject
from kimideploy.errors import ManifestError
from kimideploy.plan.asks import ServeAsk
from kimideploy.plan.model import ClusterAnswers, PlanRequest
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
    def monitors(request: PlanRequest, served: bool | None = None) -> list[dict[str, Any]]:
        objects = render_workload(example, request, ClusterAnswers(monitoring_crd=served)).objects
        return [o for o in objects if o["kind"] == "PodMonitor"]

    assert monitors(PlanRequest("serve", "rtx6000", "v3")) == []  # offline: unknown, not rendered
    assert monitors(PlanRequest("serve", "rtx6000", "v3"), served=False) == []
    [monitor] = monitors(PlanRequest("serve", "rtx6000", "v3"), served=True)
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == "http"
    forced = PlanRequest("serve", "b300", "v3", ("serve.pod_monitor=always",))
    assert len(monitors(forced)) == 1
    never = PlanRequest("serve", "b300", "v3", ("serve.pod_monitor=never",))
    assert monitors(never, served=True) == []
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


def _mutations(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """One change at each place in the object: null, removed, the wrong type, a bad enum."""
    found: list[dict[str, Any]] = [obj, _broken(obj)]

    def places(node: Any, path: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        children = node.items() if isinstance(node, dict) else enumerate(node)
        out = [path] if path else []
        for key, value in children:
            out += (
                places(value, (*path, key)) if isinstance(value, (dict, list)) else [(*path, key)]
            )
        return out

    def changed(path: tuple[Any, ...], change: Any) -> dict[str, Any]:
        copied = copy.deepcopy(obj)
        parent = copied
        for key in path[:-1]:
            parent = parent[key]
        change(parent, path[-1])
        return copied

    def retype(parent: Any, key: Any) -> None:
        value = parent[key]
        parent[key] = 7 if isinstance(value, str) else ["x"] if isinstance(value, dict) else "x"

    def remove(parent: Any, key: Any) -> None:
        del parent[key]

    def nullify(parent: Any, key: Any) -> None:
        parent[key] = None

    def misspell(parent: Any, key: Any) -> None:
        parent[key] = f"{parent[key]}x" if isinstance(parent[key], str) else True

    for path in places(obj, ()):
        if path[0] in ("apiVersion", "kind"):  # they choose the schema; judged apart
            continue
        found += [changed(path, change) for change in (retype, remove, nullify, misspell)]
    return found


@pytest.mark.parametrize("workload", ["serve", "train", "datagen", "bench", "extract"])
def test_the_validator_finds_what_jsonschema_finds(example: LoadedProject, workload: str) -> None:
    """render/json_schema.py stands in for the jsonschema package: on every rendered kind, and
    on each object spoiled in every place it has, the same errors at the same paths, worded
    the same."""
    drafter = "v3" if workload == "serve" else None
    request = PlanRequest(workload, "b300", drafter)
    objects = render_workload(example, request, ClusterAnswers(monitoring_crd=True)).objects
    assert _same_errors_as_jsonschema(objects) > 100


def test_the_validator_finds_what_jsonschema_finds_on_a_canary_behind_a_gateway() -> None:
    """The Gateway API kinds (schemas derived from the pinned CRDs) and the pickers' RBAC."""
    from tests.unit.test_canary import with_gateway

    request = PlanRequest("serve", "b300", "v3", ask=ServeAsk(canary_percent=10))
    answers = ClusterAnswers(monitoring_crd=True)
    objects = render_workload(with_gateway("b300"), request, answers).objects
    kinds = {o["kind"] for o in objects}
    assert {"InferencePool", "HTTPRoute", "RoleBinding", "ServiceAccount"} <= kinds
    assert _same_errors_as_jsonschema(objects) > 100


def _same_errors_as_jsonschema(objects: list[dict[str, Any]]) -> int:
    import jsonschema

    from kimideploy.render.json_schema import SchemaValidator
    from kimideploy.render.schema import crd_schema, kind_schema, schema_version_for

    version = schema_version_for("1.33")
    compared = 0
    for obj in objects:
        kind, api = obj["kind"], obj["apiVersion"]
        schema = crd_schema(kind, api) or kind_schema(version, kind, api)
        ours = SchemaValidator(schema)
        # The reduced schema judges like the package's full layout (the test above).
        reference = jsonschema.Draft202012Validator(schema)
        for candidate in _mutations(obj):
            found = sorted((str(list(path)), message) for path, message in ours.errors(candidate))
            expected = sorted(
                (str(list(e.absolute_path)), e.message) for e in reference.iter_errors(candidate)
            )
            assert found == expected, (kind, candidate)
            compared += 1
    return compared


def _schema_keywords(node: Any, found: set[str]) -> None:
    """Every keyword used where a schema stands (not the names under properties or $defs)."""
    if not isinstance(node, dict):
        return
    for keyword, value in node.items():
        found.add(keyword)
        if keyword in ("properties", "$defs", "patternProperties"):
            for subschema in value.values():
                _schema_keywords(subschema, found)
        elif keyword in ("items", "additionalProperties", "not"):
            _schema_keywords(value, found)
        elif keyword in ("oneOf", "anyOf", "allOf", "prefixItems"):
            for subschema in value:
                _schema_keywords(subschema, found)


def test_every_shipped_schema_uses_only_keywords_the_validator_applies() -> None:
    """A schema package (or CRD schema) using a keyword json_schema.py does not implement must
    fail here, not pass a user's render unchecked."""
    from importlib import resources

    from kimideploy.render.json_schema import ANNOTATIONS, KEYWORDS
    from kimideploy.render.schema import _folder, available_versions

    documents = [
        json.loads(path.read_text())
        for version in available_versions()
        for path in _folder(version).glob("*.json")
    ]
    crds = resources.files("kimideploy.render") / "crd_schemas"
    documents += [
        json.loads(entry.read_text()) for entry in crds.iterdir() if entry.name.endswith(".json")
    ]
    found: set[str] = set()
    for document in documents:
        _schema_keywords(document, found)
    unknown = {k for k in found if k not in KEYWORDS and k not in ANNOTATIONS}
    assert {k for k in unknown if not k.startswith("x-kubernetes-")} == set()
    assert {"$ref", "additionalProperties", "oneOf", "pattern"} <= found


def test_a_schema_keyword_the_validator_does_not_apply_is_a_clear_error() -> None:
    """A newer schema package must stop the render with a hint, not pass unchecked or crash."""
    from kimideploy.render.json_schema import SchemaValidator

    for schema in ({"exclusiveMinimum": 1}, {"$ref": "#/$defs/Missing"}):
        with pytest.raises(ManifestError) as info:
            SchemaValidator(schema).errors(0)
        assert "does not apply" in info.value.message and "kubernetes-validate" in (
            info.value.hint or ""
        )
