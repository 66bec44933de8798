"""Batch scheduling on the real control plane: a dead rank fails a multi-node training Job at once
(the real Job controller applies the podFailurePolicy), and Jobs submitted through Kueue wait
suspended in their LocalQueue until admitted."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import harness
from tests.integration.test_runs_and_errors import PROGRESS, annotations

pytestmark = pytest.mark.integration
B300 = "  b300:\n    description: 8x (8x B300 NVL8) rented nodes, InfiniBand between nodes\n"
LOCAL_QUEUE_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "localqueues.kueue.x-k8s.io"},
    "spec": {
        "group": "kueue.x-k8s.io",
        "scope": "Namespaced",
        "names": {"plural": "localqueues", "singular": "localqueue", "kind": "LocalQueue"},
        "versions": [{"name": "v1beta1", "served": True, "storage": True, "schema": {
            "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}],
    },
}  # fmt: skip


def job(testcluster: harness.TestCluster, namespace: str) -> dict[str, Any]:
    [found] = json.loads(testcluster.kubectl("-n", namespace, "get", "jobs", "-o", "json"))["items"]
    return found


def test_one_dead_rank_fails_the_whole_training_job_at_once_with_the_resume_command(
    kd: Callable[..., tuple[int, str, str]],
    testcluster: harness.TestCluster,
    namespace: str,
    tmp_path: Path,
) -> None:
    harness.serve_logs(
        testcluster, namespace, harness.write_container_log(tmp_path / "t.log", PROGRESS[:2])
    )
    # Rank 1 dies after 1 s; ranks 0 and 2 would run for 10 minutes.
    dying = annotations(run_duration="600s", fail_index="1", fail_after="1s")
    started = time.monotonic()
    code, _, err = kd("run", "train", "--cluster", "b300", "--set", "train.nodes=3", "--set",
                      dying, "--poll", "0.3")  # fmt: skip
    elapsed = time.monotonic() - started
    assert code == 4, err
    assert elapsed < 120, f"the group took {elapsed:.0f} s to fail"  # not the ranks' 600 s
    assert "matching FailJob rule" in err and "index 1" in err
    [run_id] = {line.split("run ")[1].split(":")[0] for line in err.splitlines()
                if ": created Job " in line}  # fmt: skip
    assert f"`kimideploy run train --set train.resume_run={run_id}` resumes" in err
    failed = job(testcluster, namespace)
    [condition] = [c for c in failed["status"]["conditions"] if c["type"] == "Failed"]
    assert condition["reason"] == "PodFailurePolicy"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # the controller deletes the surviving ranks' pods
        pods = json.loads(testcluster.kubectl("-n", namespace, "get", "pods", "-o", "json"))[
            "items"
        ]
        running = [p["metadata"]["name"] for p in pods if p["status"].get("phase") == "Running"
                   and not p["metadata"].get("deletionTimestamp")]  # fmt: skip
        if not running:
            break
        time.sleep(0.5)
    assert not running, running


def test_a_single_index_failure_still_retries_alone_outside_a_gang(
    kd: Callable[..., tuple[int, str, str]], testcluster: harness.TestCluster, namespace: str
) -> None:
    code, _, err = kd("run", "datagen", "--detach")
    assert code == 0, err
    rules = job(testcluster, namespace)["spec"]["podFailurePolicy"]["rules"]
    assert [r["action"] for r in rules] == ["Ignore", "Ignore"]


@pytest.fixture
def local_queue_crd(testcluster: harness.TestCluster) -> Iterator[None]:
    testcluster.kubectl("delete", "crd", "localqueues.kueue.x-k8s.io", "--ignore-not-found")
    yield
    testcluster.kubectl("delete", "crd", "localqueues.kueue.x-k8s.io", "--ignore-not-found")


def test_kueue_jobs_wait_suspended_in_their_queue_until_admitted(
    kd: Callable[..., tuple[int, str, str]],
    testcluster: harness.TestCluster,
    namespace: str,
    edited_config: Callable[..., Path],
    local_queue_crd: None,
    tmp_path: Path,
) -> None:
    config = edited_config((B300, B300 + "    kueue: {local_queue: gpu-queue}\n"))
    quick = ("--cluster", "b300", "--set", "train.nodes=2", "--set", annotations(run_duration="1s"))

    def jobs() -> str:
        return testcluster.kubectl("-n", namespace, "get", "jobs", "-o", "name").strip()

    code, _, err = kd("run", "train", *quick, "--detach", config=config)
    assert code == 2 and "the cluster serves no kueue.x-k8s.io/v1beta1 localqueues" in err
    assert jobs() == ""  # refused before anything was created
    testcluster.kubectl("apply", "-f", "-", stdin=json.dumps(LOCAL_QUEUE_CRD))
    testcluster.kubectl("wait", "--for=condition=Established", "crd/localqueues.kueue.x-k8s.io")
    deadline = time.monotonic() + 30
    while True:  # discovery caches the CRD a moment after it is established
        code, _, err = kd("run", "train", *quick, "--detach", config=config)
        if "serves no kueue" not in err or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert (
        code == 2 and "LocalQueue gpu-queue (clusters.b300.kueue.local_queue) does not exist" in err
    )
    assert jobs() == ""
    queue = {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "LocalQueue",
             "metadata": {"name": "gpu-queue", "namespace": namespace},
             "spec": {"clusterQueue": "gpus"}}  # fmt: skip
    testcluster.kubectl("apply", "-f", "-", stdin=json.dumps(queue))
    harness.serve_logs(
        testcluster, namespace, harness.write_container_log(tmp_path / "t.log", PROGRESS)
    )
    code, out, err = kd("run", "train", *quick, "--detach", config=config)
    assert code == 0, err
    run_id = out.split()[0]
    created = job(testcluster, namespace)
    assert created["spec"]["suspend"] is True
    assert created["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-queue"
    assert "kueue.x-k8s.io/queue-name" not in created["spec"]["template"]["metadata"]["labels"]
    time.sleep(2)
    assert testcluster.kubectl("-n", namespace, "get", "pods", "-o", "name").strip() == ""
    code, out, _ = kd("status", "-o", "json")
    [run] = [
        r for r in json.loads(out)["runs"] if r.get("run_id") == run_id or run_id in json.dumps(r)
    ]
    assert "suspended" in json.dumps(run)
    # What Kueue's controller does once the ClusterQueue admits the workload.
    testcluster.kubectl("-n", namespace, "patch", "job", created["metadata"]["name"],
                        "--type=merge", "-p", '{"spec": {"suspend": false}}')  # fmt: skip
    code, _, err = kd("logs", run_id, "--follow", "--cluster", "b300", config=config)
    assert code == 0, err
    assert "complete: 2/2 indexes" in err
