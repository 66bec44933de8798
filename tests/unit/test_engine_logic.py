"""Pure logic of the deploy engine: rollout phases, progress aggregation, index lists, records."""

from __future__ import annotations

from typing import Any

import pytest

from kimideploy.cluster import records
from kimideploy.cluster.jobs import parse_indexes
from kimideploy.cluster.rollout import Snapshot, classify
from kimideploy.services.runs.progress import aggregate, parse_events

UID = "dep-uid"


def deployment(**status: Any) -> dict[str, Any]:
    return {
        "metadata": {"uid": UID, "generation": 2},
        "spec": {"replicas": 1},
        "status": {"observedGeneration": 2, **status},
    }


def replica_set(revision: int, pod_hash: str) -> dict[str, Any]:
    return {"metadata": {
        "ownerReferences": [{"uid": UID}], "labels": {"pod-template-hash": pod_hash},
        "annotations": {"deployment.kubernetes.io/revision": str(revision)},
    }}  # fmt: skip


def pod(name: str, pod_hash: str = "new", node: str | None = "n1", **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"pod-template-hash": pod_hash}},
        "spec": {"nodeName": node, "containers": [{"image": "img@sha256:x"}]} if node else {},
        "status": {"phase": "Running", **status},
    }


SETS = [replica_set(1, "old"), replica_set(2, "new")]


def state(
    pods: list[dict[str, Any]],
    events: dict[str, Any] | None = None,
    seconds: float = 0.0,
    **kw: Any,
) -> Any:
    snapshot = Snapshot(deployment(**kw), SETS, pods, events or {})
    return classify(snapshot, lambda _pod, _state: seconds, 2700, 120)


def test_ready_needs_the_deployment_counts_not_just_a_ready_pod() -> None:
    ready_pod = pod("p", conditions=[{"type": "Ready", "status": "True"}])
    assert state([ready_pod]).phase == "waiting"
    assert state([ready_pod], updatedReplicas=1, availableReplicas=1, replicas=1).phase == "ready"


def test_unobserved_generation_is_waiting() -> None:
    d = deployment()
    d["status"]["observedGeneration"] = 1
    assert classify(Snapshot(d, SETS, [], {}), lambda *_: 0, 2700, 120).phase == "waiting"


def test_failed_scheduling_is_a_failure_only_after_the_grace() -> None:
    pending = pod("p", node=None, phase="Pending")
    events = {
        "p": [{"reason": "FailedScheduling", "message": "0/1 nodes: Insufficient nvidia.com/gpu"}]
    }
    early = state([pending], events, seconds=10)
    assert early.phase == "scheduling" and "Insufficient nvidia.com/gpu" in early.message
    late = state([pending], events, seconds=121)
    assert late.failure == "FailedScheduling" and "Insufficient nvidia.com/gpu" in late.message


@pytest.mark.parametrize(
    ("reason", "failure"),
    [
        ("ImagePullBackOff", "ImagePull"),
        ("ErrImagePull", "ImagePull"),
        ("CrashLoopBackOff", "CrashLoop"),
    ],
)
def test_waiting_reasons(reason: str, failure: str) -> None:
    statuses = [{"state": {"waiting": {"reason": reason, "message": "m"}}, "restartCount": 0}]
    assert state([pod("p", containerStatuses=statuses)]).failure == failure


def test_loading_weights_until_the_startup_budget_runs_out() -> None:
    loading = pod("p", containerStatuses=[{"state": {"running": {}}, "restartCount": 0}])
    assert state([loading], seconds=600).phase == "loading weights"
    assert "10.0 of 45 min startup budget" in state([loading], seconds=600).message
    assert state([loading], seconds=2701).failure == "StartupBudget"


def test_old_pods_are_ignored_and_progress_deadline_fails() -> None:
    assert state([pod("old", pod_hash="old")]).phase == "waiting"
    stuck = [
        {
            "type": "Progressing",
            "status": "False",
            "reason": "ProgressDeadlineExceeded",
            "message": "m",
        }
    ]
    assert state([], conditions=stuck).failure == "ProgressDeadline"


def test_progress_sums_the_latest_event_of_each_index() -> None:
    logs = {
        0: '{"event": "progress", "stage": "datagen", "done": 10, "total": 100, "unit": "samples", "rate": 1}\n'
        'human line\n{"event": "progress", "stage": "datagen", "done": 50, "total": 100, "unit": "samples", "rate": 2}',
        1: '{"event": "progress", "stage": "datagen", "done": 25, "total": 100, "unit": "samples", "rate": 1}',
        2: "no progress yet",
    }
    summary = aggregate(logs, 3)
    assert summary is not None
    assert (summary.done, summary.total, summary.rate, summary.reporting) == (75, 200, 3, 2)
    assert summary.eta_s == pytest.approx(125 / 3)
    assert (
        summary.describe()
        == "datagen: 75/200 samples (38%), 3.00 samples/s, ETA 0m41s [2/3 indexes reporting]"
    )


def test_parse_events_skips_non_events() -> None:
    text = '{"event": "result", "x": 1}\n{"no_event": true}\n{broken\nplain'
    assert parse_events(text) == [{"event": "result", "x": 1}]


def test_index_lists() -> None:
    assert parse_indexes("1,3-5,9") == (1, 3, 4, 5, 9)
    assert parse_indexes("") == () and parse_indexes(None) == ()


def test_release_records_round_trip_compressed() -> None:
    record = records.ReleaseRecord(
        release="kimi-k25-serve", revision=3, status="deployed", created_at="2026-12-01T00:00:00Z",
        user="u", cluster="rtx6000", namespace="kimi", drafter="v3", image="i@sha256:x",
        config_sha256="c", config_text="name: x\n" * 500, overrides=["serve.replicas=1"],
        manifests=[{"kind": "ConfigMap", "apiVersion": "v1", "metadata": {"name": "m",
                    "labels": {"app.kubernetes.io/instance": "kimi-k25-serve",
                               "app.kubernetes.io/managed-by": "kimideploy"}}}],
    )  # fmt: skip
    secret = records._secret(record)
    assert secret["type"] == "kimideploy.io/release.v1"
    assert secret["metadata"]["labels"]["kimideploy.io/status"] == "deployed"
    assert len(secret["data"]["release"]) < len(record.config_text) / 5  # gzip pays for itself
    assert records._decode(secret, "kimi", "kimi-k25-serve") == record
