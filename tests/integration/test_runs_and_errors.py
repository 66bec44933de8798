"""Job runs followed through their pods' logs, and cluster errors with their exit codes."""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from pathlib import Path

import pytest

from kimideploy.cli.main import main
from tests.conftest import REPO
from tests.integration.conftest import harness, rented_train_logs, weights_synced

pytestmark = pytest.mark.integration
PROGRESS = [
    '{"event": "progress", "stage": "train", "done": 40, "total": 100, "unit": "steps", "rate": 2.0}',
    "epoch 1 loss 2.31 (human log line)",
    '{"event": "progress", "stage": "train", "done": 100, "total": 100, "unit": "steps", "rate": 2.5}',
    '{"event": "result", "loss": 1.42, "acceptance_pos0": 0.61}',
]


def annotations(**values: str) -> str:
    return "train.pod_annotations=" + json.dumps(
        {f"kimideploy.test/{k.replace('_', '-')}": v for k, v in values.items()}
    )


def test_three_index_train_job_on_b300_completes_with_progress(
    kd: Callable[..., tuple[int, str, str]],
    testcluster: harness.TestCluster,
    namespace: str,
    tmp_path: Path,
) -> None:
    rented_train_logs(testcluster, namespace, tmp_path / "train.log", PROGRESS)
    code, _out, err = kd(
        "run",
        "train",
        "--cluster",
        "b300",
        "--set",
        "train.nodes=3",
        "--set",
        annotations(run_duration="3s"),
        "--poll",
        "0.3",
    )
    assert code == 0, err
    assert "train: 300/300 steps (100%), 7.50 steps/s, ETA 0m00s [3/3 indexes reporting]" in err
    assert "index 2 result: loss=1.42, acceptance_pos0=0.61" in err
    assert "complete: 3/3 indexes" in err
    jobs = json.loads(testcluster.kubectl("-n", namespace, "get", "jobs", "-o", "json"))["items"]
    [job] = jobs
    assert job["spec"]["completions"] == 3
    assert job["metadata"]["labels"]["kimideploy.io/run-id"]
    nodes = json.loads(testcluster.kubectl("-n", namespace, "get", "pods", "-o", "json"))["items"]
    assert {p["spec"]["nodeName"].rsplit("-", 2)[0] for p in nodes} == {"b300"}
    assert len({p["spec"]["nodeName"] for p in nodes}) == 3  # one 8-GPU pod per node


HELD_OUT_RESULT = json.dumps({
    "event": "result", "stage": "train", "drafter": "v3", "steps": 900, "num_speculative_tokens": 3,
    "selected": {"step": 600, "held_out_length": 1.31,
                 "reason": "step 600 has the best held-out mean acceptance length at k=3 (1.31); "
                           "the last step (900) had 1.22"},
    "held_out": {"depth": 3, "samples": 240,
                 "mean_acceptance_length": {"1": 1.2, "2": 1.28, "3": 1.31}},
})  # fmt: skip


def test_run_train_ends_with_held_out_acceptance_against_each_clusters_break_even(
    kd: Callable[..., tuple[int, str, str]],
    testcluster: harness.TestCluster,
    namespace: str,
    tmp_path: Path,
) -> None:
    """The figure that would have stopped the 15% drafter: held-out length per k, and for every
    cluster whether it pays there, with the cost model named."""
    harness.serve_logs(
        testcluster, namespace,
        harness.write_container_log(tmp_path / "train.log", [*PROGRESS[:3], HELD_OUT_RESULT]),
    )  # fmt: skip
    code, _out, err = kd("run", "train", "--set", annotations(run_duration="1s"), "--poll", "0.3")
    assert code == 0, err
    assert (
        "held-out mean acceptance length of v3 (240 samples never trained on): "
        "k=1 1.20, k=2 1.28, k=3 1.31" in err
    )
    assert "written: step 600 has the best held-out mean acceptance length at k=3 (1.31)" in err
    # rtx6000's prior step cost at k=3, c=1 (1.41, docs/reference/step-cost.md) is above 1.31:
    # it does not pay there
    assert "rtx6000: break-even acceptance length 1.41 at k=3, c=1 -> does NOT pay (1.31)" in err
    assert "step cost: prior for 8x RTX PRO 6000 (PCIe)" in err


def test_a_failing_index_is_reported_and_the_run_exits_4(
    kd: Callable[..., tuple[int, str, str]],
    testcluster: harness.TestCluster,
    namespace: str,
    tmp_path: Path,
) -> None:
    weights_synced(testcluster, namespace)  # a rented cluster: its models claim
    harness.serve_logs(
        testcluster, namespace, harness.write_container_log(tmp_path / "t.log", PROGRESS[:2])
    )
    code, _, err = kd(
        "run",
        "train",
        "--cluster",
        "b300",
        "--set",
        "train.nodes=3",
        "--set",
        annotations(run_duration="2s", fail_index="1"),
        "--poll",
        "0.3",
    )
    assert code == 4
    assert "index 1 failed: pod " in err and "container train exited 1 (Error)" in err
    assert "failed indexes: 1" in err
    assert testcluster.kubectl(
        "-n", namespace, "get", "jobs", "-o", "name"
    ).strip()  # the Job is kept


def test_detach_then_follow_the_run_by_id(
    kd: Callable[..., tuple[int, str, str]],
    testcluster: harness.TestCluster,
    namespace: str,
    tmp_path: Path,
) -> None:
    harness.serve_logs(
        testcluster, namespace, harness.write_container_log(tmp_path / "d.log", PROGRESS)
    )
    code, out, _ = kd(
        "run",
        "vocab",
        "--detach",
        "--set",
        'vocab.pod_annotations={"kimideploy.test/run-duration": "2s"}',
    )
    assert code == 0
    run_id = out.splitlines()[0]
    assert f"kimideploy logs {run_id} --follow" in out
    code, _, err = kd("logs", run_id, "--follow")
    assert code == 0, err
    assert f"run {run_id}" in err and "complete: 1/1 indexes" in err
    code, out, _ = kd("logs", run_id)
    assert "epoch 1 loss 2.31" in out
    code, out, _ = kd("status", "-o", "json")
    assert json.loads(out)["runs"][0]["run_id"] == run_id


def test_unknown_run_id(kd: Callable[..., tuple[int, str, str]]) -> None:
    code, _, err = kd("logs", "abc123")
    assert code == 2 and "no run abc123 in namespace" in err


def test_run_and_down_in_a_missing_namespace_follow_ups_policy(
    testcluster: harness.TestCluster,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`run` creates a missing namespace as `up` does (the headline `run train --cluster b300` on
    a fresh cluster); `down` in one that does not exist removes nothing, exit 0, no traceback."""
    monkeypatch.setenv("KUBECONFIG", str(testcluster.kubeconfig))
    fresh = f"fresh-{secrets.token_hex(3)}"
    head = ["--config", str(REPO / "kimideploy.yaml")]
    code = main([*head, "run", "vocab", "--detach", "--context", "kimideploy-test",
                 "--namespace", fresh])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 0 and f"created namespace {fresh}" in err, err
    assert testcluster.kubectl("-n", fresh, "get", "jobs", "-o", "name").strip()
    testcluster.kubectl("delete", "namespace", fresh, "--wait=false")
    code = main([*head, "down", "serve", "--yes", "--context", "kimideploy-test", "--namespace",
                 "never-was"])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0 and "namespace never-was does not exist; nothing to remove" in err
    assert "Traceback" not in out + err


def test_unreachable_cluster_exits_3(
    testcluster: harness.TestCluster,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    config = tmp_path / "kubeconfig"
    port = harness.free_port()  # nothing listens there
    harness.write_kubeconfig(config, testcluster.root / "pki" / "ca.crt", port, testcluster.token)
    monkeypatch.setenv("KUBECONFIG", str(config))
    code = main(["status", "--context", "kimideploy-test"])
    err = capsys.readouterr().err
    assert code == 3 and f"cannot reach the cluster at https://127.0.0.1:{port}" in err
    assert "hint:" in err


def test_kubeconfig_names_the_file_as_kubectls_does(
    testcluster: harness.TestCluster,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """--kubeconfig FILE wins over a KUBECONFIG that points elsewhere (a cluster nothing answers
    on); a file that is not there is a usage error (exit 2) before any connection."""
    elsewhere = tmp_path / "elsewhere"
    harness.write_kubeconfig(elsewhere, testcluster.root / "pki" / "ca.crt", harness.free_port(),
                             testcluster.token)  # fmt: skip
    monkeypatch.setenv("KUBECONFIG", str(elsewhere))
    code = main(["status", "--context", "kimideploy-test", "--namespace", "default",
                 "--kubeconfig", str(testcluster.kubeconfig), "-o", "json"])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads(out)["serving"]["namespace"] == "default"
    code = main(["status", "--context", "kimideploy-test", "--kubeconfig", str(tmp_path / "no")])
    err = capsys.readouterr().err
    assert code == 2 and "'--kubeconfig'" in err and "does not exist" in err


def test_missing_context_exits_3(
    testcluster: harness.TestCluster,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(testcluster.kubeconfig))
    code = main(["status"])  # the profile's context, rtx6000, is not in the test kubeconfig
    err = capsys.readouterr().err
    assert code == 3 and "cannot use kube context rtx6000" in err and "--context" in err


def test_forbidden_names_verb_resource_and_namespace(
    testcluster: harness.TestCluster,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    namespace: str,
) -> None:
    config = tmp_path / "kubeconfig"
    harness.write_kubeconfig(
        config,
        testcluster.root / "pki" / "ca.crt",
        testcluster.api_port,
        testcluster.restricted_token,
    )
    monkeypatch.setenv("KUBECONFIG", str(config))
    code = main(["history", "serve", "--context", "kimideploy-test", "--namespace", namespace])
    err = capsys.readouterr().err
    assert code == 3
    assert f"forbidden: cannot get secrets in namespace {namespace}" in err
    assert 'User "nobody"' in err


def test_online_train_runs_the_target_server_as_a_sidecar_of_each_trainer(
    kd: Callable[..., tuple[int, str, str]],
    testcluster: harness.TestCluster,
    namespace: str,
    tmp_path: Path,
) -> None:
    rented_train_logs(testcluster, namespace, tmp_path / "train.log", PROGRESS)
    code, _out, err = kd(
        "run", "train", "--cluster", "b300", "--set", "train.mode=online",
        "--set", "train.nodes=2", "--set", annotations(run_duration="3s"), "--poll", "0.3",
    )  # fmt: skip
    assert code == 0, err
    assert "complete: 2/2 indexes" in err
    pods = json.loads(testcluster.kubectl("-n", namespace, "get", "pods", "-o", "json"))["items"]
    assert len(pods) == 2
    for pod in pods:
        # The locked-memory check first (multi-node over InfiniBand), then the target server.
        [check, gpu_check, server] = pod["spec"]["initContainers"]
        assert check["name"] == "memlock-check" and "restartPolicy" not in check
        assert gpu_check["name"] == "gpu-check"
        # The API server kept it a native sidecar: restarted on failure, stopped with the pod.
        assert server["name"] == "target-server" and server["restartPolicy"] == "Always"
        assert server["resources"]["limits"]["nvidia.com/gpu"] == "4"
        # Accepted as sent: readiness on /v1/models, no startup probe holding the trainer back.
        assert server["readinessProbe"]["httpGet"]["path"] == "/v1/models"
        assert "startupProbe" not in server
        [trainer] = pod["spec"]["containers"]
        assert trainer["resources"]["limits"]["nvidia.com/gpu"] == "4"
        assert "--nproc-per-node=4" in trainer["args"]
    claims = testcluster.kubectl("-n", namespace, "get", "pvc", "-o", "name").split()
    assert "persistentvolumeclaim/kimi-k25-hidden-states" not in claims


def test_online_train_that_cannot_fit_is_refused_before_anything_is_created(
    kd: Callable[..., tuple[int, str, str]],
    testcluster: harness.TestCluster,
    namespace: str,
) -> None:
    code, _, err = kd("run", "train", "--cluster", "rtx6000", "--set", "train.mode=online")
    assert code == 2
    assert "online training cannot fit on rtx6000" in err and "leaving none for the trainer" in err
    assert not testcluster.kubectl("-n", namespace, "get", "jobs,pvc", "-o", "name").strip()
