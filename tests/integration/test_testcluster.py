"""Smoke suite proving the test control plane is the real thing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.conftest import harness, wait_for

pytestmark = pytest.mark.integration
DIGEST_IMAGE = "registry.test/app@sha256:" + "0" * 64


def deployment(
    name: str, image: str, replicas: int = 1, annotations: dict[str, str] | None = None
) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": name}},
                "template": {
                    "metadata": {"labels": {"app": name}, "annotations": annotations or {}},
                    "spec": {
                        "nodeSelector": {harness.PROFILE_LABEL: "rtx6000"},
                        "containers": [{"name": "main", "image": image}],
                    },
                },
            },
        }
    )


def job(
    name: str, completions: int, annotations: dict[str, str] | None = None, gpus: int = 0
) -> str:
    container: dict[str, Any] = {"name": "main", "image": DIGEST_IMAGE}
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    return yaml.safe_dump(
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name},
            "spec": {
                "completionMode": "Indexed",
                "completions": completions,
                "parallelism": completions,
                "backoffLimitPerIndex": 0,
                "template": {
                    "metadata": {"annotations": annotations or {}},
                    "spec": {
                        "restartPolicy": "Never",
                        "nodeSelector": {harness.PROFILE_LABEL: "rtx6000"},
                        "containers": [container],
                    },
                },
            },
        }
    )


def get(cluster: harness.TestCluster, ns: str, *args: str) -> Any:
    return json.loads(cluster.kubectl("-n", ns, "get", *args, "-o", "json"))


def test_binaries_report_their_real_version(testcluster: harness.TestCluster) -> None:
    version = json.loads(testcluster.kubectl("version", "-o", "json"))
    assert version["serverVersion"]["gitVersion"] == "v1.36.3"


def test_simulated_nodes_look_like_the_cluster_profiles(testcluster: harness.TestCluster) -> None:
    nodes = json.loads(testcluster.kubectl("get", "nodes", "-o", "json"))["items"]
    by_profile: dict[str, list[Any]] = {}
    for node in nodes:
        by_profile.setdefault(node["metadata"]["labels"][harness.PROFILE_LABEL], []).append(node)
    assert {k: len(v) for k, v in by_profile.items()} == {"rtx6000": 1, "b200": 4, "b300": 8}
    rtx = by_profile["rtx6000"][0]
    assert rtx["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert (
        rtx["metadata"]["labels"]["nvidia.com/gpu.product"]
        == "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition"
    )
    assert all(n["spec"]["taints"][0]["key"] == "nvidia.com/gpu" for n in by_profile["b300"])
    assert all(
        next(c for c in n["status"]["conditions"] if c["type"] == "Ready")["status"] == "True"
        for n in nodes
    )


def test_server_side_apply_twice_with_a_changed_field(
    testcluster: harness.TestCluster, namespace: str
) -> None:
    testcluster.kubectl(
        "-n",
        namespace,
        "apply",
        "--server-side",
        "--field-manager=kimideploy",
        "-f",
        "-",
        stdin=deployment("web", DIGEST_IMAGE, replicas=1),
    )
    testcluster.kubectl(
        "-n",
        namespace,
        "apply",
        "--server-side",
        "--field-manager=kimideploy",
        "-f",
        "-",
        stdin=deployment("web", DIGEST_IMAGE, replicas=2),
    )
    live = get(testcluster, namespace, "deployment", "web", "--show-managed-fields")
    assert live["spec"]["replicas"] == 2
    managers = {
        m["manager"] for m in live["metadata"]["managedFields"] if m["operation"] == "Apply"
    }
    assert managers == {"kimideploy"}


def test_job_pod_template_is_immutable(testcluster: harness.TestCluster, namespace: str) -> None:
    testcluster.kubectl("-n", namespace, "apply", "--server-side", "-f", "-", stdin=job("j", 1))
    patch = json.dumps(
        {"spec": {"template": {"spec": {"containers": [{"name": "main", "image": "other"}]}}}}
    )
    with pytest.raises(harness.HarnessError, match="field is immutable"):
        testcluster.kubectl("-n", namespace, "patch", "job", "j", "--type=strategic", "-p", patch)


def test_deployment_becomes_available_and_records_a_second_revision(
    testcluster: harness.TestCluster, namespace: str
) -> None:
    testcluster.kubectl("-n", namespace, "apply", "-f", "-", stdin=deployment("web", DIGEST_IMAGE))
    testcluster.kubectl("-n", namespace, "rollout", "status", "deployment/web", "--timeout=30s")
    testcluster.kubectl(
        "-n",
        namespace,
        "set",
        "image",
        "deployment/web",
        "main=registry.test/app@sha256:" + "1" * 64,
    )
    testcluster.kubectl("-n", namespace, "rollout", "status", "deployment/web", "--timeout=30s")
    sets = get(testcluster, namespace, "replicasets", "-l", "app=web")["items"]
    revisions = sorted(
        int(rs["metadata"]["annotations"]["deployment.kubernetes.io/revision"]) for rs in sets
    )
    assert revisions == [1, 2]
    available = get(testcluster, namespace, "deployment", "web")["status"]["conditions"]
    assert any(c["type"] == "Available" and c["status"] == "True" for c in available)


def test_indexed_job_with_three_indexes_completes(
    testcluster: harness.TestCluster, namespace: str
) -> None:
    testcluster.kubectl("-n", namespace, "apply", "-f", "-", stdin=job("three", 3))
    status = wait_for(
        lambda: (
            (s := get(testcluster, namespace, "job", "three")["status"]).get("succeeded") == 3 and s
        ),
        "3 succeeded indexes",
    )
    assert status["completedIndexes"] == "0-2"


def test_nine_gpus_stay_pending_with_failed_scheduling(
    testcluster: harness.TestCluster, namespace: str
) -> None:
    testcluster.kubectl("-n", namespace, "apply", "-f", "-", stdin=job("greedy", 1, gpus=9))

    def event() -> Any:
        events = get(
            testcluster, namespace, "events", "--field-selector", "reason=FailedScheduling"
        )["items"]
        return events and events[0]

    found = wait_for(event, "a FailedScheduling event")
    assert "Insufficient nvidia.com/gpu" in found["message"]
    [pod] = get(testcluster, namespace, "pods")["items"]
    assert pod["status"]["phase"] == "Pending"


@pytest.mark.parametrize(
    ("hook", "phase", "waiting"),
    [
        (harness.NEVER_READY, "Running", None),
        (harness.CRASH_LOOP, "Running", "CrashLoopBackOff"),
        (harness.IMAGE_PULL_ERROR, "Pending", "ImagePullBackOff"),
    ],
)
def test_failure_hooks_produce_their_state(
    testcluster: harness.TestCluster, namespace: str, hook: str, phase: str, waiting: str | None
) -> None:
    testcluster.kubectl(
        "-n",
        namespace,
        "apply",
        "-f",
        "-",
        stdin=deployment("hooked", DIGEST_IMAGE, annotations={hook: "true"}),
    )

    def settled() -> Any:
        pods = get(testcluster, namespace, "pods", "-l", "app=hooked")["items"]
        statuses = pods and pods[0]["status"].get("containerStatuses")
        if not statuses or pods[0]["status"]["phase"] != phase:
            return None
        state = statuses[0]["state"]
        return (waiting is None and "running" in state) or state.get("waiting", {}).get(
            "reason"
        ) == waiting

    wait_for(settled, f"{hook} to settle")
    pod = get(testcluster, namespace, "pods", "-l", "app=hooked")["items"][0]
    assert pod["status"]["containerStatuses"][0]["ready"] is False
    if hook == harness.CRASH_LOOP:
        assert pod["status"]["containerStatuses"][0]["restartCount"] >= 5
    deploy = get(testcluster, namespace, "deployment", "hooked")
    assert deploy["status"].get("availableReplicas", 0) == 0


def test_a_failing_job_index_is_reported(testcluster: harness.TestCluster, namespace: str) -> None:
    hooks = {harness.RUN_DURATION: "1s", harness.FAIL_INDEX: "1"}
    testcluster.kubectl(
        "-n", namespace, "apply", "-f", "-", stdin=job("flaky", 3, annotations=hooks)
    )
    status = wait_for(
        lambda: (
            (s := get(testcluster, namespace, "job", "flaky")["status"]).get("failedIndexes") and s
        ),
        "a failed index",
    )
    assert status["failedIndexes"] == "1"
    wait_for(
        lambda: get(testcluster, namespace, "job", "flaky")["status"].get("succeeded") == 2,
        "2 successes",
    )


def test_logs_return_the_content_a_test_chose(
    testcluster: harness.TestCluster, namespace: str, tmp_path: Path
) -> None:
    testcluster.kubectl(
        "-n", namespace, "apply", "-f", "-", stdin=deployment("talker", DIGEST_IMAGE)
    )
    lines = [
        '{"event": "progress", "stage": "datagen", "done": 5, "total": 10}',
        "plain human log line",
    ]
    harness.serve_logs(
        testcluster, namespace, harness.write_container_log(tmp_path / "talker.log", lines)
    )
    pod = wait_for(
        lambda: get(testcluster, namespace, "pods", "-l", "app=talker")["items"], "the pod"
    )[0]
    name = pod["metadata"]["name"]
    output = wait_for(
        lambda: testcluster.kubectl("-n", namespace, "logs", name, check=False), "logs"
    )
    assert output.splitlines() == lines


def test_claims_of_every_profile_storage_class_get_bound(
    testcluster: harness.TestCluster, namespace: str
) -> None:
    for storage_class in ("local-path", "shared-fs"):
        claim = {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": storage_class},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": storage_class,
                "resources": {"requests": {"storage": "10Gi"}},
            },
        }
        testcluster.kubectl("-n", namespace, "apply", "-f", "-", stdin=yaml.safe_dump(claim))
    for storage_class in ("local-path", "shared-fs"):
        wait_for(
            lambda sc=storage_class: (
                get(testcluster, namespace, "pvc", sc)["status"].get("phase") == "Bound"
            ),
            f"{storage_class} claim bound",
        )
