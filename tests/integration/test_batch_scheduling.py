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
import yaml

from tests.integration.conftest import harness, weights_synced
from tests.integration.test_runs_and_errors import PROGRESS, annotations

pytestmark = pytest.mark.integration
B300 = "  b300:\n    description: 8x (8x B300 NVL8) rented nodes, InfiniBand between nodes\n"
KUEUE_CRDS = ("localqueues", "clusterqueues")
"""Kueue's own CRDs, copied from its module by scripts/testcluster/build (no controller runs)."""


def job(testcluster: harness.TestCluster, namespace: str) -> dict[str, Any]:
    [found] = json.loads(testcluster.kubectl("-n", namespace, "get", "jobs", "-o", "json"))["items"]
    return found


def test_one_dead_rank_fails_the_whole_training_job_at_once_with_the_resume_command(
    kd: Callable[..., tuple[int, str, str]],
    testcluster: harness.TestCluster,
    namespace: str,
    tmp_path: Path,
) -> None:
    weights_synced(testcluster, namespace)  # a rented cluster: its models claim
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
    # Evictions and preemptions do not count; a bad-input exit (2) fails the index at once.
    assert [r["action"] for r in rules] == ["Ignore", "Ignore", "FailIndex"]
    assert rules[2]["onExitCodes"]["operator"] == "In" and rules[2]["onExitCodes"]["values"] == [2]


def crd_names() -> list[str]:
    return [f"crd/{name}.kueue.x-k8s.io" for name in KUEUE_CRDS]


@pytest.fixture
def local_queue_crd(testcluster: harness.TestCluster) -> Iterator[None]:
    testcluster.kubectl("delete", *crd_names(), "--ignore-not-found")
    yield
    testcluster.kubectl("delete", *crd_names(), "--ignore-not-found")


def install_kueue_crds(testcluster: harness.TestCluster) -> None:
    for name in KUEUE_CRDS:
        crd = testcluster.bin_dir / "kueue-crds" / f"kueue.x-k8s.io_{name}.yaml"
        testcluster.kubectl("apply", "--server-side", "-f", str(crd))
    testcluster.wait_established(*crd_names())


QUEUED = B300 + "    kueue: {local_queue: gpu-queue}\n"
QUICK_TRAIN = ("run", "train", "--cluster", "b300", "--set", "train.nodes=2", "--set",
               annotations(run_duration="1s"), "--detach")  # fmt: skip


def local_queue(namespace: str, version: str) -> str:
    return json.dumps({"apiVersion": f"kueue.x-k8s.io/{version}", "kind": "LocalQueue",
                       "metadata": {"name": "gpu-queue", "namespace": namespace},
                       "spec": {"clusterQueue": "gpus"}})  # fmt: skip


def run_once_discovered(
    kd: Callable[..., tuple[int, str, str]], config: Path
) -> tuple[int, str, str]:
    """The quick queued run, retried while API discovery has not yet seen a new CRD."""
    deadline = time.monotonic() + 30
    while True:
        code, out, err = kd(*QUICK_TRAIN, config=config)
        if "serves no kueue" not in err or time.monotonic() > deadline:
            return code, out, err
        time.sleep(1)


def test_kueue_jobs_wait_suspended_in_their_queue_until_admitted(
    kd: Callable[..., tuple[int, str, str]],
    testcluster: harness.TestCluster,
    namespace: str,
    edited_config: Callable[..., Path],
    local_queue_crd: None,
    tmp_path: Path,
) -> None:
    weights_synced(testcluster, namespace)  # a rented cluster: its models claim
    config = edited_config((B300, QUEUED))

    def jobs() -> str:
        return testcluster.kubectl("-n", namespace, "get", "jobs", "-o", "name").strip()

    code, _, err = kd(*QUICK_TRAIN, config=config)
    assert code == 2 and "the cluster serves no kueue.x-k8s.io localqueues" in err
    assert jobs() == ""  # refused before anything was created
    install_kueue_crds(testcluster)
    code, _, err = run_once_discovered(kd, config)
    assert (
        code == 2 and "LocalQueue gpu-queue (clusters.b300.kueue.local_queue) does not exist" in err
    )
    assert jobs() == ""
    # Validated by Kueue's own schema (the current storage version).
    testcluster.kubectl("apply", "-f", "-", stdin=local_queue(namespace, "v1beta2"))
    harness.serve_logs(
        testcluster, namespace, harness.write_container_log(tmp_path / "t.log", PROGRESS)
    )
    code, out, err = kd(*QUICK_TRAIN, config=config)
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


def test_an_older_kueue_serving_only_v1beta1_local_queues_is_found(
    kd: Callable[..., tuple[int, str, str]],
    testcluster: harness.TestCluster,
    namespace: str,
    edited_config: Callable[..., Path],
    local_queue_crd: None,
) -> None:
    weights_synced(testcluster, namespace)  # a rented cluster: its models claim
    # Kueue < 0.15 served LocalQueues at v1beta1 alone: v0.17.0's CRD without v1beta2.
    path = testcluster.bin_dir / "kueue-crds" / "kueue.x-k8s.io_localqueues.yaml"
    crd = yaml.safe_load(path.read_text())
    [v1beta1] = [v for v in crd["spec"]["versions"] if v["name"] == "v1beta1"]
    v1beta1.pop("deprecationWarning", None)
    crd["spec"]["versions"] = [{**v1beta1, "storage": True, "deprecated": False}]
    testcluster.kubectl("apply", "--server-side", "-f", "-", stdin=json.dumps(crd))
    testcluster.wait_established("crd/localqueues.kueue.x-k8s.io")
    testcluster.kubectl("apply", "-f", "-", stdin=local_queue(namespace, "v1beta1"))
    code, _, err = run_once_discovered(kd, edited_config((B300, QUEUED)))
    assert code == 0, err
    assert job(testcluster, namespace)["spec"]["suspend"] is True


def test_a_rank_that_exits_with_the_retry_code_is_started_again_not_the_job_failed(
    kd: Callable[..., tuple[int, str, str]], testcluster: harness.TestCluster, namespace: str
) -> None:
    """A trainer whose online server dropped and did not come back in its budget (or whose peer
    left) exits 75: the real Job controller starts that index again instead of failing the gang."""
    weights_synced(testcluster, namespace)  # a rented cluster: its models claim
    retried = annotations(run_duration="600s", fail_index="1", fail_after="1s", fail_exit_code="75")
    code, _, err = kd("run", "train", "--cluster", "b300", "--set", "train.nodes=2", "--set",
                      retried, "--detach")  # fmt: skip
    assert code == 0, err
    deadline = time.monotonic() + 60
    attempts: list[str] = []
    while time.monotonic() < deadline:
        pods = json.loads(testcluster.kubectl("-n", namespace, "get", "pods", "-o", "json"))[
            "items"
        ]
        attempts = [p["metadata"]["name"] for p in pods
                    if p["metadata"]["annotations"].get("batch.kubernetes.io/job-completion-index") == "1"]  # fmt: skip
        if len(attempts) >= 2:
            break
        time.sleep(0.5)
    assert len(attempts) >= 2, attempts  # index 1 started again
    conditions = job(testcluster, namespace)["status"].get("conditions") or []
    assert not [c for c in conditions if c["type"] == "Failed" and c["status"] == "True"]
    testcluster.kubectl("-n", namespace, "delete", "jobs", "--all", "--wait=false")
