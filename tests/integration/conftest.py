"""The real control plane (scripts/testcluster) as a session fixture, and a namespace per test.

When the binaries cannot be built or started, tests that need them are skipped with the reason;
with KIMIDEPLOY_REQUIRE_TESTCLUSTER=1 (set by .ci/run) that is a failure instead.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from kimideploy.cli.main import main
from tests.conftest import REPO
from tests.go_builds import wait_for_go_builds

sys.path.insert(0, str(REPO / "scripts" / "testcluster"))
import harness

REQUIRED = os.environ.get("KIMIDEPLOY_REQUIRE_TESTCLUSTER") == "1"


def _unavailable(reason: str) -> None:
    if REQUIRED:
        pytest.fail(f"test control plane required (KIMIDEPLOY_REQUIRE_TESTCLUSTER=1): {reason}")
    pytest.skip(f"test control plane unavailable: {reason}")


def _bin_dir() -> Any:
    try:
        return harness.find_bin_dir()
    except harness.HarnessError:
        wait_for_go_builds()
    try:
        return harness.find_bin_dir()
    except harness.HarnessError:
        build = subprocess.run(
            [str(REPO / "scripts" / "testcluster" / "build")], capture_output=True, text=True
        )
        if build.returncode != 0:
            _unavailable(f"scripts/testcluster/build failed: {build.stderr.strip()[-2000:]}")
        return harness.find_bin_dir()


@pytest.fixture(scope="session")
def testcluster() -> Iterator[harness.TestCluster]:
    bin_dir = _bin_dir()
    try:
        cluster = harness.up(bin_dir=bin_dir)
    except harness.HarnessError as exc:
        _unavailable(str(exc))
    try:
        yield cluster
    finally:
        harness.down(cluster.root)


@pytest.fixture
def namespace(testcluster: harness.TestCluster) -> Iterator[str]:
    """A fresh namespace whose default ServiceAccount exists (pods are refused before it does)."""
    name = f"t-{secrets.token_hex(4)}"
    testcluster.kubectl("create", "namespace", name)
    wait_for(
        lambda: testcluster.kubectl("-n", name, "get", "sa", "default", check=False), "default SA"
    )
    yield name
    # Wait for the pods to go: the single rtx6000 node has 8 GPUs, and a pod still terminating
    # from this test would leave the next one unschedulable.
    testcluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
    wait_for(
        lambda: (
            not testcluster.kubectl("-n", name, "get", "pods", "-o", "name", check=False).strip()
        ),
        f"pods of namespace {name} to be deleted",
        timeout=60,
    )


def wait_for(check: Callable[[], Any], what: str, timeout: float = 30) -> Any:
    """Poll until check() returns something truthy; fail with what was awaited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.25)
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")


@pytest.fixture
def kd(
    testcluster: harness.TestCluster,
    namespace: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Callable[..., tuple[int, str, str]]]:
    """Run the CLI in-process against the test cluster and this test's namespace."""
    monkeypatch.setenv("KUBECONFIG", str(testcluster.kubeconfig))

    def run(*args: str, config: Path | None = None) -> tuple[int, str, str]:
        # Named explicitly: commands that change a cluster refuse the implicit built-in example.
        head = ["--config", str(config or REPO / "kimideploy.yaml")]
        command, rest = args[0], list(args[1:])
        code = main(
            [*head, command, *rest, "--context", "kimideploy-test", "--namespace", namespace]
        )
        out, err = capsys.readouterr()
        return code, out, err

    yield run


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real sshd on 127.0.0.1; skipped (or failed under CI) when openssh-server is missing."""
    from tests.integration.sshd import start_sshd

    try:
        server = start_sshd(tmp_path_factory.mktemp("sshd"))
    except (FileNotFoundError, OSError) as exc:
        if os.environ.get("KIMIDEPLOY_REQUIRE_SSHD") == "1" or REQUIRED:
            pytest.fail(f"sshd required: {exc}")
        pytest.skip(f"sshd unavailable: {exc}")
    yield server
    server.stop()


def structural(schema: Any) -> Any:
    """Our strict JSON schema as a CRD's structural schema: the API server prunes unknown fields
    itself, and CRD schemas allow neither `const` nor additionalProperties beside properties."""
    if isinstance(schema, dict):
        return {
            k: structural(v)
            for k, v in schema.items()
            if k not in ("$comment", "const") and not (k == "additionalProperties" and v is False)
        }
    if isinstance(schema, list):
        return [structural(v) for v in schema]
    return schema


@contextmanager
def served_pod_monitor_crd(cluster: harness.TestCluster) -> Iterator[None]:
    """The PodMonitor CRD (its spec schema is the one kimideploy validates against offline)."""
    from kimideploy.render.schema import crd_schema

    spec_schema = structural(crd_schema("PodMonitor", "monitoring.coreos.com/v1"))["properties"][
        "spec"
    ]
    names = {"kind": "PodMonitor", "plural": "podmonitors", "singular": "podmonitor",
             "listKind": "PodMonitorList"}  # fmt: skip
    version = {"name": "v1", "served": True, "storage": True, "schema": {
        "openAPIV3Schema": {"type": "object", "properties": {"spec": spec_schema}}}}  # fmt: skip
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "podmonitors.monitoring.coreos.com"},
        "spec": {
            "group": "monitoring.coreos.com",
            "scope": "Namespaced",
            "names": names,
            "versions": [version],
        },
    }
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(crd))
    cluster.wait_established("crd/podmonitors.monitoring.coreos.com")
    try:
        yield
    finally:
        cluster.kubectl("delete", "crd", "podmonitors.monitoring.coreos.com", "--wait=true")


def rented_train_logs(testcluster: harness.TestCluster, namespace: str, log: Path,
                      lines: list[str]) -> None:  # fmt: skip
    """A rented cluster whose train pods print `lines`: the models claim synced, every pod's
    container log served from `log`."""
    weights_synced(testcluster, namespace)
    harness.serve_logs(testcluster, namespace, harness.write_container_log(log, lines))


def weights_synced(testcluster: harness.TestCluster, namespace: str, claim: str = "kimi-k25-models",
                   storage_class: str = "shared-fs") -> None:  # fmt: skip
    """What an earlier `host sync-model` on a rented cluster leaves: the shared models claim.
    The weights probe that `up` and `run` start then finds it (KWOK completes the probe's pod as
    if each marker were there; a test of a missing marker fails that pod itself)."""
    claim_object = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                    "metadata": {"name": claim, "namespace": namespace},
                    "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": storage_class,
                             "resources": {"requests": {"storage": "4Ti"}}}}  # fmt: skip
    testcluster.kubectl("apply", "-f", "-", stdin=json.dumps(claim_object))
