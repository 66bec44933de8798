"""A canary on the real control plane with the real CRDs: the Gateway API's HTTPRoute (from
sigs.k8s.io/gateway-api v1.6.3) and the Inference Extension's InferencePool (from
sigs.k8s.io/gateway-api-inference-extension v1.6.2), installed from their Go modules, so the API
server applies their schemas and CEL rules to what `up serve --canary` renders."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from tests.integration.conftest import harness, wait_for, weights_synced
from tests.integration.test_rbac import as_deployer  # noqa: F401 (a fixture used below)

pytestmark = pytest.mark.integration
RELEASE = "kimi-k25-serve"
CANARY = f"{RELEASE}-canary"
CRDS = ("httproutes.gateway.networking.k8s.io", "inferencepools.inference.networking.k8s.io")
Kd = Callable[..., tuple[int, str, str]]
B300 = "  b300:\n    description: 8x (8x B300 NVL8) rented nodes, InfiniBand between nodes\n"
PICKER = "registry.example/gateway-api-inference-extension/lwepp:v1.6.2"
GATEWAY = (
    "    gateway:\n"
    "      name: inference-gateway\n"
    "      namespace: gateways\n"
    f"      endpoint_picker: {{image: {PICKER}}}\n"
    "      canary: {window_s: 5, windows: 1, min_requests: 1}\n"
)
# The rented cluster's weights arrive by `host sync-model` here, so no probe Job runs.
B300_UP = ("up", "serve", "--cluster", "b300", "--set", "weights.via=host", "--yes",
           "--poll", "0.2", "--scheduling-grace", "2")  # fmt: skip


def update_crd_schemas() -> Any:
    sys.path.insert(0, str(REPO / "scripts"))
    import importlib.machinery
    import importlib.util

    loader = importlib.machinery.SourceFileLoader(
        "update_crd_schemas", str(REPO / "scripts" / "update-crd-schemas")
    )
    spec = importlib.util.spec_from_loader("update_crd_schemas", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def crd_files() -> dict[str, Path]:
    module = update_crd_schemas()
    return {name: module.crd_file(name) for name in module.SOURCES}


@pytest.fixture
def gateway_crds(testcluster: harness.TestCluster, crd_files: dict[str, Path]) -> Iterator[None]:
    for path in crd_files.values():
        testcluster.kubectl("apply", "--server-side", "-f", str(path))
    testcluster.wait_established(*[f"crd/{c}" for c in CRDS])
    yield
    testcluster.kubectl("delete", *[f"crd/{c}" for c in CRDS], "--ignore-not-found")


@pytest.fixture
def as_gateway_deployer(
    testcluster: harness.TestCluster,
    namespace: str,
    as_deployer: str,  # noqa: F811 (the fixture imported above)
) -> str:
    """The deployer of test_rbac.py, also bound to kimideploy-gateway-deployer in the namespace,
    as docs/reference/security.md says for a cluster behind a gateway."""
    testcluster.kubectl("-n", namespace, "create", "rolebinding", "kimideploy-gateway",
                        "--clusterrole=kimideploy-gateway-deployer",
                        f"--serviceaccount={namespace}:deployer")  # fmt: skip
    return as_deployer


def test_the_shipped_schemas_are_the_pinned_crds() -> None:
    """render/crd_schemas/ is what scripts/update-crd-schemas derives from the modules' CRDs."""
    check = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "update-crd-schemas"), "--check"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert check.returncode == 0, check.stderr


def test_every_picker_flag_rendered_is_one_the_pinned_lwepp_defines(
    crd_files: dict[str, Path], edited_config: Callable[..., Path]
) -> None:
    from kimideploy.config.loading import load_project
    from kimideploy.plan.model import PlanRequest
    from kimideploy.services.rendering import render_workload

    module_root = crd_files["inferencepool-inference-v1.json"].parents[3]
    options = (module_root / "pkg" / "lwepp" / "server" / "options.go").read_text()
    defined = set(re.findall(r'fs\.\w+Var\(&opts\.\w+, "([a-z-]+)"', options))
    assert {"pool-name", "grpc-port"} <= defined
    loaded = load_project(edited_config((B300, B300 + GATEWAY)))
    objects = render_workload(loaded, PlanRequest("serve", "b300", "v3")).objects
    [picker] = [o for o in objects if o["metadata"]["name"] == f"{RELEASE}-epp"
                and o["kind"] == "Deployment"]  # fmt: skip
    args = picker["spec"]["template"]["spec"]["containers"][0]["args"]
    flags = {a[2:] for a in args if a.startswith("--")}
    assert flags and flags <= defined, flags - defined


def live(testcluster: harness.TestCluster, namespace: str, kind: str, name: str) -> Any:
    text = testcluster.kubectl("-n", namespace, "get", kind, name, "-o", "json", check=False)
    return json.loads(text) if text.strip() else None


def weights(testcluster: harness.TestCluster, namespace: str) -> dict[str, int]:
    route = live(testcluster, namespace, "httproute", RELEASE)
    return {r["name"]: r["weight"] for r in route["spec"]["rules"][0]["backendRefs"]}


def test_a_canary_pool_is_applied_judged_moved_and_rolled_back(
    kd: Kd,
    testcluster: harness.TestCluster,
    namespace: str,
    edited_config: Callable[..., Path],
    gateway_crds: None,
    as_gateway_deployer: str,
) -> None:
    """Run as a ServiceAccount bound only to the shipped roles: creating the pickers' Role and
    RoleBinding is allowed because the deployer holds the reads they grant."""
    weights_synced(testcluster, namespace)
    config = edited_config((B300, B300 + GATEWAY))
    code, out, err = kd(*B300_UP, "--drafter", "v2", config=config)
    assert code == 0, err
    # Every serve revision behind a gateway: its pool, its picker and the route, all to it.
    assert weights(testcluster, namespace) == {RELEASE: 100}
    pool = live(testcluster, namespace, "inferencepool", RELEASE)
    assert pool["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/instance": RELEASE, "app.kubernetes.io/component": "serve"}  # fmt: skip
    assert pool["spec"]["endpointPickerRef"]["name"] == f"{RELEASE}-epp"

    code, out, err = kd(*B300_UP, "--drafter", "v3", "--canary", "10", config=config)
    assert code == 0, err
    assert f"create Deployment/{CANARY}" in err and f"create InferencePool/{CANARY}" in err
    assert "configure Deployment/kimi-k25-serve" in err  # the serving pods stay as they are
    # The kwok pods serve no /metrics: nothing to judge, so the verdict refuses the canary.
    assert "canary: refused (too few finished requests to judge" in out, out
    assert weights(testcluster, namespace) == {RELEASE: 100, CANARY: 0}
    canary = live(testcluster, namespace, "deployment", CANARY)
    assert canary["spec"]["replicas"] == 1
    labels = canary["spec"]["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/component"] == "serve-canary"
    assert labels["kimideploy.io/drafter"] == "v3"
    stable = live(testcluster, namespace, "deployment", RELEASE)
    assert stable["metadata"]["labels"]["kimideploy.io/drafter"] == "v2"
    # Neither the release's Service nor its Deployment selects the canary's pod.
    service = live(testcluster, namespace, "service", RELEASE)
    assert any(labels.get(k) != v for k, v in service["spec"]["selector"].items())
    pods = testcluster.kubectl("-n", namespace, "get", "pods", "-l",
                               "app.kubernetes.io/component=serve", "-o", "name")  # fmt: skip
    assert len(pods.split()) == stable["spec"]["replicas"]
    assert not any(name.startswith(f"pod/{CANARY}") for name in pods.split())

    code, out, err = kd("history", "serve", "--cluster", "b300", "-o", "json", config=config)
    rows = json.loads(out)
    assert [(r["revision"], r["drafter"]) for r in rows] == [(1, "v2"), (2, "v2"), (3, "v2")], err
    assert rows[1]["note"].startswith("canary: v3 takes 10% beside revision 1 (v2)")
    assert rows[2]["note"].startswith("canary v3 refused: 0%")
    assert [r["change"] for r in rows] == ["rollout", "canary 10%", "canary 0%"]
    code, out, _ = kd("status", "--cluster", "b300", "-o", "json", config=config)
    assert json.loads(out)["serving"]["canary"] == "v3 takes 0% of the route"

    code, _, err = kd(*B300_UP, "--drafter", "v3", "--canary", "10", config=config)
    assert code == 2 and "already has a canary" in err

    # The release's records are judged against the profile that made them (its gateway).
    rollback = ("rollback", "serve", "--cluster", "b300", "--to", "1", "--yes", "--poll", "0.2")
    code, _, err = kd(*rollback, config=config)
    assert code == 0, err
    # Pruned with foreground deletion: the Deployment goes once its pod has.
    wait_for(lambda: live(testcluster, namespace, "deployment", CANARY) is None,
             "the canary's Deployment to be pruned")  # fmt: skip
    assert live(testcluster, namespace, "inferencepool", CANARY) is None
    assert weights(testcluster, namespace) == {RELEASE: 100}


def test_the_api_server_applies_the_crds_rules_the_offline_schema_cannot(
    testcluster: harness.TestCluster, namespace: str, gateway_crds: None
) -> None:
    """CEL rules (x-kubernetes-validations) are the API server's to apply: a pool with a picker
    Service but no port passes the offline schema and is refused by the real CRD."""
    from kimideploy.render.json_schema import SchemaValidator
    from kimideploy.render.schema import crd_schema

    pool = {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": "no-port", "namespace": namespace},
        "spec": {
            "selector": {"matchLabels": {"app": "x"}},
            "targetPorts": [{"number": 8000}],
            "endpointPickerRef": {"name": "picker"},
        },
    }
    schema = crd_schema("InferencePool", "inference.networking.k8s.io/v1")
    assert schema is not None and SchemaValidator(schema).errors(pool) == []
    refused = testcluster.kubectl("apply", "-f", "-", stdin=json.dumps(pool), check=False)
    found = live(testcluster, namespace, "inferencepool", "no-port")
    assert found is None, refused
