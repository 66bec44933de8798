"""The deploy engine on the real control plane: up, history, rollback, prune, locks, runs, down."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kimideploy.cli.main import main
from kimideploy.cluster.api import KubeApi
from kimideploy.cluster.lock import ReleaseLock
from tests.integration.conftest import harness, weights_synced

pytestmark = pytest.mark.integration
RELEASE = "kimi-k25-serve"
FAST = ("--yes", "--poll", "0.2", "--scheduling-grace", "2")


def live(testcluster: harness.TestCluster, namespace: str, kind: str, name: str) -> dict[str, Any]:
    return json.loads(testcluster.kubectl("-n", namespace, "get", kind, name, "-o", "json"))


def history(kd: Callable[..., tuple[int, str, str]]) -> list[dict[str, Any]]:
    code, out, _ = kd("history", "serve", "-o", "json")
    assert code == 0
    rows: list[dict[str, Any]] = json.loads(out)
    return rows


def vllm_args(obj: dict[str, Any]) -> list[str]:
    args: list[str] = obj["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


def test_up_v3_then_none_and_history_shows_both(
    kd: Callable[..., tuple[int, str, str]], testcluster: harness.TestCluster, namespace: str
) -> None:
    code, out, err = kd("up", "serve", "--drafter", "v3", *FAST)
    assert code == 0, err
    assert "revision 1 of kimi-k25-serve is ready" in out
    assert "create Deployment/kimi-k25-serve" in err
    deployment = live(testcluster, namespace, "deployment", RELEASE)
    assert deployment["status"]["availableReplicas"] == 1
    assert "--speculative-config" in vllm_args(deployment)
    code, out, err = kd("up", "serve", "--drafter", "none", *FAST)
    assert code == 0, err
    rows = history(kd)
    assert [(r["revision"], r["drafter"], r["status"]) for r in rows] == [
        (1, "v3", "superseded"),
        (2, "none", "deployed"),
    ]
    assert all(r["image"].startswith("sha256:") for r in rows)
    assert "--speculative-config" not in vllm_args(
        live(testcluster, namespace, "deployment", RELEASE)
    )


def test_rollback_restores_the_exact_v3_manifests(
    kd: Callable[..., tuple[int, str, str]], testcluster: harness.TestCluster, namespace: str
) -> None:
    assert kd("up", "serve", "--drafter", "v3", *FAST)[0] == 0
    v3_template = live(testcluster, namespace, "deployment", RELEASE)["spec"]["template"]
    assert kd("up", "serve", "--drafter", "none", "--set", "serve.max_num_seqs=64", *FAST)[0] == 0
    code, _out, err = kd("rollback", "serve", *FAST)
    assert code == 0, err
    restored = live(testcluster, namespace, "deployment", RELEASE)["spec"]["template"]
    assert restored == v3_template
    rows = history(kd)
    assert rows[-1]["note"] == "rollback to revision 1" and rows[-1]["drafter"] == "v3"
    assert rows[1]["status"] == "rolled-back"
    records = KubeApi(context="kimideploy-test")
    from kimideploy.cluster import records as stored

    first, third = (
        stored.get(records, namespace, RELEASE, 1),
        stored.get(records, namespace, RELEASE, 3),
    )
    assert third.manifests == first.manifests and third.source_revision == 1


def test_rollback_to_a_revision_and_unknown_revision(
    kd: Callable[..., tuple[int, str, str]],
) -> None:
    assert kd("up", "serve", "--drafter", "v3", *FAST)[0] == 0
    assert kd("up", "serve", "--drafter", "v1", *FAST)[0] == 0
    assert kd("up", "serve", "--drafter", "none", *FAST)[0] == 0
    code, _, err = kd("rollback", "serve", "--to", "1", *FAST)
    assert code == 0, err
    assert history(kd)[-1]["drafter"] == "v3"
    code, _, err = kd("rollback", "serve", "--to", "9", *FAST)
    assert code == 2 and "--to 9: no such revision (kept: 1, 2, 3, 4)" in err


def test_rollback_no_spec_drops_speculation_and_keeps_everything_else(
    kd: Callable[..., tuple[int, str, str]], testcluster: harness.TestCluster, namespace: str
) -> None:
    assert kd("up", "serve", "--drafter", "v3", "--set", "serve.max_num_seqs=32", *FAST)[0] == 0
    before = live(testcluster, namespace, "deployment", RELEASE)
    code, _, err = kd("rollback", "serve", "--no-spec", *FAST)
    assert code == 0, err
    after = live(testcluster, namespace, "deployment", RELEASE)
    old_args, new_args = vllm_args(before), vllm_args(after)
    # Without a drafter the speculative config goes, and with it the per-request acceptance
    # vLLM 0.32 reports only for speculation and the drafter swap (its backend and the guard of
    # the development routes it needs).
    speculation_only = {"--speculative-config", "--per-request-spec-decode-metrics",
                        "--weight-transfer-config", "--middleware"}  # fmt: skip
    kept = [a for i, a in enumerate(old_args)
            if a not in speculation_only and (i == 0 or old_args[i - 1] not in speculation_only)]  # fmt: skip
    assert new_args == kept
    assert not any("specul" in a or "eagle" in a for a in new_args)
    dev_mode = {e["name"] for e in after["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert "VLLM_SERVER_DEV_MODE" not in dev_mode
    assert "32" in new_args  # the revision's --set overrides are kept
    old_pod, new_pod = before["spec"]["template"]["spec"], after["spec"]["template"]["spec"]
    for field in ("volumes", "nodeSelector", "securityContext", "tolerations"):
        assert old_pod.get(field) == new_pod.get(field)
    assert old_pod["containers"][0]["image"] == new_pod["containers"][0]["image"]
    assert old_pod["containers"][0]["resources"] == new_pod["containers"][0]["resources"]
    rows = history(kd)
    # The example's image can switch speculation off in the running pods, but a KWOK pod has no
    # server whose keeper could answer: after three unanswered polls the pods are replaced.
    assert rows[-1]["note"] == (
        "rollback to non-speculative serving; switch not followed (keepers unreachable): rolled out"
    )
    assert (rows[-1]["drafter"], rows[-1]["change"]) == ("none", "rollout (keepers unreachable)")


def test_crash_looping_rollout_is_rolled_back_automatically(
    kd: Callable[..., tuple[int, str, str]], testcluster: harness.TestCluster, namespace: str
) -> None:
    assert kd("up", "serve", "--drafter", "none", *FAST)[0] == 0
    crash = f'serve.pod_annotations={{"{harness.CRASH_LOOP}": "true"}}'
    code, _out, err = kd("up", "serve", "--drafter", "v3", "--set", crash, *FAST)
    assert code == 4
    assert "revision 2 failed: pod" in err and "is crash-looping" in err
    assert (
        "rolled back automatically: revision 3 (a copy of revision 1, drafter none) is now serving"
        in err
    )
    rows = history(kd)
    assert [(r["revision"], r["status"]) for r in rows] == [
        (1, "superseded"),
        (2, "failed"),
        (3, "deployed"),
    ]
    assert "automatic rollback to revision 1 after revision 2 failed: CrashLoop" in rows[2]["note"]
    deployment = live(testcluster, namespace, "deployment", RELEASE)
    assert "--speculative-config" not in vllm_args(deployment)


def test_no_auto_rollback_leaves_the_failed_revision(
    kd: Callable[..., tuple[int, str, str]],
) -> None:
    assert kd("up", "serve", "--drafter", "none", *FAST)[0] == 0
    pull = f'serve.pod_annotations={{"{harness.IMAGE_PULL_ERROR}": "true"}}'
    code, _, err = kd("up", "serve", "--drafter", "v3", "--set", pull, "--no-auto-rollback", *FAST)
    assert code == 4 and "cannot pull" in err and "ImagePullBackOff" in err
    assert [r["status"] for r in history(kd)] == ["deployed", "failed"]


def test_failed_scheduling_when_a_pod_asks_for_more_than_a_node_has(
    kd: Callable[..., tuple[int, str, str]],
) -> None:
    # More CPU than any node has: the scheduler's reason reaches the user and the release goes
    # back to what served. (A first revision binds the claims: the scheduler's word on a pod
    # whose new claims are not bound yet is that, until it tries again.)
    code, _, err = kd("up", "serve", "--drafter", "none", *FAST)
    assert code == 0, err
    code, _, err = kd("up", "serve", "--drafter", "none", *FAST,
                      "--set", 'serve.resources={"cpu": "512", "memory": "384Gi"}')  # fmt: skip
    assert code == 4, err
    assert "cannot be scheduled" in err and "Insufficient cpu" in err
    assert "revision 3 (a copy of revision 1, drafter none) is now serving" in err


def test_more_gpus_or_rdma_devices_than_any_node_offers_are_refused_before_the_apply(
    kd: Callable[..., tuple[int, str, str]],
    edited_config: Callable[..., Path],
    testcluster: harness.TestCluster,
    namespace: str,
) -> None:
    """A GPU count or a device plugin's resource no node advertises would leave the pod Pending
    for ever; the nodes' allocatable says so before anything is applied."""
    config = edited_config(
        ("      memory_gb: 96\n      per_node: 8", "      memory_gb: 96\n      per_node: 16")
    )
    code, _, err = kd("up", "serve", "--drafter", "none", *FAST, config=config)
    assert code == 2, err
    assert ("nothing was applied: a pod asks for 16 nvidia.com/gpu and no node of the cluster "
            "offers that many (the most on one node: 8)") in err  # fmt: skip
    assert "gpu.per_node" in err
    b300 = ("      rdma_resource: rdma/rdma_shared_device_a    # the RDMA device plugin's resource\n"
            "      socket_ifname: eth0\n      min_bus_gbps: 150")  # fmt: skip
    config = edited_config((b300, b300.replace("rdma_shared_device_a", "hca_shared_devices_a")))
    weights_synced(testcluster, namespace)
    code, _, err = kd("run", "train", "--cluster", "b300", "--set", "train.nodes=2", "--detach",
                      config=config)  # fmt: skip
    assert code == 2, err
    assert "a pod asks for 1 rdma/hca_shared_devices_a and no node of the cluster offers" in err
    assert "RDMA device plugin" in err
    assert testcluster.kubectl("-n", namespace, "get", "deploy,jobs", "-o", "name").strip() == ""


def test_prune_removes_an_object_dropped_from_the_templates(
    kd: Callable[..., tuple[int, str, str]],
    testcluster: harness.TestCluster,
    namespace: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    home = tmp_path / "home"
    (home / "templates").mkdir(parents=True)
    import shutil

    from tests.conftest import REPO

    shutil.copytree(REPO / "templates" / "k8s", home / "templates" / "k8s")
    extra = home / "templates" / "k8s" / "configmap-serve.yaml.j2"
    extra.write_text(
        extra.read_text()
        + (
            "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ (v.name ~ '-legacy') | j }}\n"
            "  namespace: {{ v.namespace | j }}\n  labels: {{ v.labels | j }}\ndata: {}\n"
        )
    )
    monkeypatch.setenv("KIMIDEPLOY_HOME", str(home))
    assert kd("up", "serve", "--drafter", "v3", *FAST, config=REPO / "kimideploy.yaml")[0] == 0
    assert live(testcluster, namespace, "configmap", f"{RELEASE}-legacy")
    monkeypatch.delenv("KIMIDEPLOY_HOME")
    code, _, err = kd("up", "serve", "--drafter", "v3", *FAST)
    assert code == 0, err
    assert (
        f"prune ConfigMap/{RELEASE}-legacy" in err and f"pruned ConfigMap/{RELEASE}-legacy" in err
    )
    missing = testcluster.kubectl(
        "-n", namespace, "get", "configmap", f"{RELEASE}-legacy", check=False
    )
    assert missing == ""
    assert live(testcluster, namespace, "pvc", "kimi-k25-models")  # claims are never pruned


def test_concurrent_up_is_refused_while_the_lock_is_held(
    kd: Callable[..., tuple[int, str, str]],
    namespace: str,
    testcluster: harness.TestCluster,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(testcluster.kubeconfig))
    assert kd("up", "serve", "--drafter", "none", *FAST)[0] == 0
    other = ReleaseLock(
        KubeApi(context="kimideploy-test"), namespace, RELEASE, "up serve (another user)"
    )
    other.identity = "alice@workstation pid 4242 (up)"
    with other:
        code, _, err = kd("up", "serve", "--drafter", "v3", *FAST)
    assert code == 1
    assert "release kimi-k25-serve is locked by alice@workstation pid 4242 (up)" in err
    assert [r["revision"] for r in history(kd)] == [1]
    assert kd("up", "serve", "--drafter", "v3", *FAST)[0] == 0  # released: the next run proceeds


def test_down_keeps_claims_and_history(
    kd: Callable[..., tuple[int, str, str]], testcluster: harness.TestCluster, namespace: str
) -> None:
    assert kd("up", "serve", "--drafter", "v3", *FAST)[0] == 0
    code, _out, err = kd("down", "serve", "--yes")
    assert code == 0, err
    assert "kept PersistentVolumeClaims: kimi-k25-compile-cache, kimi-k25-models" in err
    assert testcluster.kubectl("-n", namespace, "get", "deployment", RELEASE, check=False) == ""
    assert live(testcluster, namespace, "pvc", "kimi-k25-models")
    assert history(kd)[-1]["status"] == "removed"
    code, _, err = kd("rollback", "serve", *FAST)  # brings the removed revision back
    assert code == 0, err
    assert live(testcluster, namespace, "deployment", RELEASE)["status"]["availableReplicas"] == 1


def test_server_dry_run_changes_nothing(
    kd: Callable[..., tuple[int, str, str]], testcluster: harness.TestCluster, namespace: str
) -> None:
    assert kd("up", "serve", "--drafter", "none", *FAST)[0] == 0
    before = live(testcluster, namespace, "deployment", RELEASE)["metadata"]["resourceVersion"]
    code, out, err = kd("up", "serve", "--drafter", "v3", "--dry-run=server")
    assert code == 0, err
    assert "+++ planned/Deployment/kimi-k25-serve" in out
    assert (
        "+        - --speculative-config" in out
        or "+  - --speculative-config" in out
        or "--speculative-config" in out
    )
    assert "nothing was persisted" in err
    after = live(testcluster, namespace, "deployment", RELEASE)
    assert after["metadata"]["resourceVersion"] == before
    assert "--speculative-config" not in vllm_args(after)
    assert [r["revision"] for r in history(kd)] == [1]


def test_rollback_and_down_dry_runs_say_what_they_would_do_and_change_nothing(
    kd: Callable[..., tuple[int, str, str]], testcluster: harness.TestCluster, namespace: str
) -> None:
    assert kd("up", "serve", "--drafter", "v3", *FAST)[0] == 0
    assert kd("up", "serve", "--drafter", "none", "--set", "serve.max_num_seqs=64", *FAST)[0] == 0
    before = live(testcluster, namespace, "deployment", RELEASE)["metadata"]["resourceVersion"]
    code, out, err = kd("rollback", "serve", "--dry-run")
    assert code == 0, err
    assert out.startswith("revision 3 would serve v3: a rollout: the pods are replaced")
    assert "+++ planned/Deployment/kimi-k25-serve" in out and "--speculative-config" in out
    code, out, err = kd("rollback", "serve", "--to", "9", "--dry-run")
    assert code == 2 and "--to 9: no such revision" in err  # the same judgement as the rollback
    code, out, err = kd("down", "serve", "--dry-run", "-o", "json")
    assert code == 0, err
    document = json.loads(out)
    assert document["status"] == "planned"
    assert f"Deployment/{namespace}/{RELEASE}" in " ".join(document["removed"]) or any(
        RELEASE in r and "Deployment" in r for r in document["removed"]
    )
    after = live(testcluster, namespace, "deployment", RELEASE)["metadata"]["resourceVersion"]
    assert after == before and [r["revision"] for r in history(kd)] == [1, 2]


def test_client_dry_run_contacts_no_cluster(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    assert main(["up", "serve", "--drafter", "v3", "--dry-run", "--context", "nowhere"]) == 0
    assert "Dry run (client): nothing was sent to a cluster." in capsys.readouterr().out


def test_status_shows_the_serving_release(kd: Callable[..., tuple[int, str, str]]) -> None:
    assert kd("up", "serve", "--drafter", "v3", *FAST)[0] == 0
    _code, out, _ = kd("status", "-o", "json")
    report = json.loads(out)
    assert report["serving"]["drafter"] == "v3" and report["serving"]["phase"] == "ready"
    assert report["serving"]["revision"] == 1
    assert report["serving"]["capture"] == "off (serve.capture is not set)"
    # Capture, opted into: the revision's pods record into the release's folder, and say so.
    capture = 'serve.capture={"retention_days": 3}'
    assert kd("up", "serve", "--drafter", "v3", "--set", capture, *FAST)[0] == 0
    report = json.loads(kd("status", "-o", "json")[1])
    assert report["serving"]["revision"] == 2
    assert report["serving"]["capture"].startswith(
        "on, into capture/kimi-k25-serve on the datasets volume"
    ), report["serving"]["capture"]


def test_a_field_owned_by_another_manager_is_reported_and_taken_only_with_force(
    kd: Callable[..., tuple[int, str, str]], testcluster: harness.TestCluster, namespace: str
) -> None:
    assert kd("up", "serve", "--drafter", "none", *FAST)[0] == 0
    other = json.dumps({"apiVersion": "apps/v1", "kind": "Deployment",
                        "metadata": {"name": RELEASE, "namespace": namespace},
                        "spec": {"revisionHistoryLimit": 3}})  # fmt: skip
    testcluster.kubectl(
        "apply",
        "--server-side",
        "--force-conflicts",
        "--field-manager=hand-edit",
        "-f",
        "-",
        stdin=other,
    )
    code, _, err = kd("up", "serve", "--drafter", "none", *FAST)
    assert code == 3
    assert "Deployment/kimi-k25-serve: fields owned by another manager" in err
    assert '"hand-edit"' in err and ".spec.revisionHistoryLimit" in err and "--force" in err
    code, _, err = kd("up", "serve", "--drafter", "none", "--force", *FAST)
    assert code == 0, err
    assert live(testcluster, namespace, "deployment", RELEASE)["spec"]["revisionHistoryLimit"] == 10


def test_job_runs_are_labelled_with_run_id_and_config_hash(
    kd: Callable[..., tuple[int, str, str]], testcluster: harness.TestCluster
) -> None:
    code, out, _ = kd("run", "vocab", "--detach")
    assert code == 0
    run_id = out.splitlines()[0]
    [job] = json.loads(
        testcluster.kubectl(
            "get", "jobs", "-A", "-l", f"kimideploy.io/run-id={run_id}", "-o", "json"
        )
    )["items"]
    assert len(job["metadata"]["labels"]["kimideploy.io/config-hash"]) == 12


def test_without_a_terminal_and_without_yes_nothing_is_applied(
    kd: Callable[..., tuple[int, str, str]], testcluster: harness.TestCluster, namespace: str
) -> None:
    """A script that forgot --yes is refused (exit 2, as Terraform does), before any change."""
    code, _, err = kd("up", "serve", "--drafter", "v3", "--poll", "0.2")
    assert code == 2 and "apply revision 1? needs a yes, and there is no terminal to ask" in err
    assert "hint: pass --yes" in err and "Traceback" not in err
    assert not testcluster.kubectl("-n", namespace, "get", "deployments", "-o", "name").strip()
    code, _, err = kd("history", "serve", "-o", "json")
    assert code == 0


def test_a_foreign_object_with_the_release_label_survives_up_and_down(
    kd: Callable[..., tuple[int, str, str]], testcluster: harness.TestCluster, namespace: str
) -> None:
    """Helm (and others) set app.kubernetes.io/instance too: prune and down take only objects with
    kimideploy's managed-by label AND fields kimideploy applied, so neither a Helm-labelled
    ConfigMap nor one that copied every label of ours is deleted."""
    helm = {"app.kubernetes.io/instance": RELEASE, "app.kubernetes.io/managed-by": "Helm"}
    copied = {"app.kubernetes.io/instance": RELEASE, "app.kubernetes.io/managed-by": "kimideploy"}
    for name, labels in (("helm-values", helm), ("look-alike", copied)):
        body = {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": namespace, "labels": labels},
                "data": {"owner": "someone else"}}  # fmt: skip
        testcluster.kubectl("create", "-f", "-", stdin=json.dumps(body))
    assert kd("up", "serve", "--drafter", "v3", *FAST)[0] == 0
    assert kd("up", "serve", "--drafter", "none", *FAST)[0] == 0  # a revision that prunes
    code, out, err = kd("down", "serve", "--yes")
    assert code == 0, err
    assert "helm-values" not in err + out and "look-alike" not in err + out
    for name in ("helm-values", "look-alike"):
        assert live(testcluster, namespace, "configmap", name)["data"] == {"owner": "someone else"}
    assert not testcluster.kubectl("-n", namespace, "get", "deployment", RELEASE, check=False)
