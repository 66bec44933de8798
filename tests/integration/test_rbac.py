"""The shipped RBAC (k8s/base/rbac.yaml) is enough for every command and grants nothing more: the
engine's commands run as a ServiceAccount bound only to its two roles."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import harness
from tests.integration.test_gate import BENCH_PODS, QUICK_BENCH, bench_log, by_drafter

pytestmark = pytest.mark.integration
FAST = ("--yes", "--poll", "0.2", "--scheduling-grace", "2")


@pytest.fixture
def as_deployer(
    testcluster: harness.TestCluster,
    namespace: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[str]:
    """KUBECONFIG switched to a token of ServiceAccount `deployer`, bound like docs/reference/security.md says."""
    sa, binding = "deployer", f"kimideploy-{namespace}"
    testcluster.kubectl("-n", namespace, "create", "serviceaccount", sa)
    subject = f"{namespace}:{sa}"
    testcluster.kubectl("-n", namespace, "create", "rolebinding", "kimideploy",
                        "--clusterrole=kimideploy-deployer", f"--serviceaccount={subject}")  # fmt: skip
    testcluster.kubectl("create", "clusterrolebinding", binding,
                        "--clusterrole=kimideploy-cluster-reader", f"--serviceaccount={subject}")  # fmt: skip
    token = testcluster.kubectl("-n", namespace, "create", "token", sa, "--duration=1h").strip()
    config = tmp_path / "deployer.kubeconfig"
    harness.write_kubeconfig(
        config, testcluster.root / "pki" / "ca.crt", testcluster.api_port, token
    )
    monkeypatch.setenv("KUBECONFIG", str(config))
    yield f"system:serviceaccount:{subject}"
    testcluster.kubectl("delete", "clusterrolebinding", binding, check=False)


def can_i(testcluster: harness.TestCluster, user: str, namespace: str, *what: str) -> bool:
    answer = testcluster.kubectl("auth", "can-i", *what, "-n", namespace, "--as", user,
                                 check=False).strip()  # fmt: skip
    return answer == "yes"


def test_every_command_runs_as_a_service_account_bound_only_to_the_shipped_roles(
    kd: Callable[..., tuple[int, str, str]],
    testcluster: harness.TestCluster,
    namespace: str,
    as_deployer: str,
    tmp_path: Path,
) -> None:
    def ok(*args: str) -> str:
        code, out, err = kd(*args)
        assert code == 0, f"{args}: {err}"
        assert "forbidden" not in err.lower(), err
        return out + err

    ok("up", "serve", "--drafter", "none", *FAST)
    ok("up", "serve", "--drafter", "v3", *FAST)
    ok("history", "serve")
    code, out, err = kd("status", "-o", "json")
    assert code == 0 and json.loads(out)["serving"]["drafter"] == "v3", err
    # RBAC lets the pod proxy through; KWOK's pods sit on 127.0.0.1, which the proxy itself
    # refuses to dial ("denied destination"), as it does for the admin (test_gate).
    code, _, err = kd("watch", "serve", "--windows", "1", "--interval", "0.1")
    assert code == 0 and "resolve_deny: denied destination" in err, err
    assert can_i(testcluster, as_deployer, namespace, "get", "pods/proxy")
    ok("rollback", "serve", *FAST)
    ok("rollback", "serve", "--no-spec", *FAST)
    # The gate: a baseline bench Job, the drafter, its bench Job, the verdict and a rollback.
    files = {
        "none": bench_log(tmp_path / "none.log", "none", {1: 60.0, 8: 400.0}, None),
        "v3": bench_log(tmp_path / "v3.log", "v3", {1: 40.0, 8: 390.0}, 0.15),
    }
    with harness.PodHooks(testcluster, namespace, BENCH_PODS, by_drafter(files)):
        code, _, err = kd("up", "serve", "--drafter", "v3", "--gate", "--at-concurrency", "1,8",
                          "--gate-baseline", "separate", "--set", QUICK_BENCH,
                          "--min-speedup", "1.1", *FAST)  # fmt: skip
    assert code == 4 and "rolled back by the gate" in err, err
    assert "forbidden" not in err.lower(), err
    quick_vocab = "vocab.pod_annotations=" + json.dumps({"kimideploy.test/run-duration": "1s"})
    code, _, err = kd("run", "vocab", "--set", quick_vocab, "--poll", "0.3")
    assert code == 0 and "forbidden" not in err.lower(), err
    ok("down", "serve", "--yes")
    # ... and nothing beyond the namespace and the two cluster-wide reads.
    assert not can_i(testcluster, as_deployer, namespace, "create", "namespaces")
    assert not can_i(testcluster, as_deployer, "kube-system", "get", "secrets")
    assert not can_i(testcluster, as_deployer, namespace, "create", "pods")
    assert not can_i(testcluster, as_deployer, namespace, "create", "rolebindings")
    assert not can_i(testcluster, as_deployer, namespace, "create", "pods/exec")
