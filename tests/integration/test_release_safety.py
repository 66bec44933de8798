"""Races and rejections on the real control plane: a lock taken over mid-command, records changed
by another writer, an apply rejected half-way, a claim that must not shrink."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kimideploy.cluster import records
from kimideploy.cluster.api import KubeApi
from kimideploy.cluster.lock import LockLostError, ReleaseLock
from kimideploy.cluster.session import ClusterSession
from kimideploy.config.loading import load_project
from kimideploy.errors import ExitCode
from kimideploy.plan.model import PlanRequest
from kimideploy.services.release import deploy
from kimideploy.services.reporting import SilentReporter
from tests.conftest import REPO
from tests.integration.conftest import harness, wait_for

pytestmark = pytest.mark.integration
RELEASE = "kimi-k25-serve"
FAST = ("--yes", "--poll", "0.2", "--scheduling-grace", "2")
OTHER = "alice@workstation pid 4242 (up serve)"


def session_for(testcluster: harness.TestCluster, namespace: str) -> ClusterSession:
    api = KubeApi(context="kimideploy-test", kubeconfig=str(testcluster.kubeconfig))
    return ClusterSession(api=api, namespace=namespace)


def live(testcluster: harness.TestCluster, namespace: str, kind: str, name: str) -> dict[str, Any]:
    return json.loads(testcluster.kubectl("-n", namespace, "get", kind, name, "-o", "json"))


def statuses(session: ClusterSession) -> list[tuple[int, str, str]]:
    return [(r.revision, r.drafter, r.status) for r in session.history(RELEASE)]


def speculative(testcluster: harness.TestCluster, namespace: str) -> bool:
    deployment = live(testcluster, namespace, "deployment", RELEASE)
    return "--speculative-config" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]


class TakeOverWhileAsking(SilentReporter):
    """Answers yes, but only after the question outlasted the Lease and another run took it."""

    def __init__(self, session: ClusterSession) -> None:
        super().__init__(answer=True)
        self.session = session

    def confirm(self, question: str) -> bool:
        api, lease_path = (
            self.session.api,
            (
                f"/apis/coordination.k8s.io/v1/namespaces/{self.session.namespace}/leases/"
                f"kimideploy-lock-{RELEASE}"
            ),
        )
        lease = api.request("GET", lease_path)
        lease["spec"]["renewTime"] = "2020-01-01T00:00:00.000000Z"  # expired long ago
        api.request("PUT", lease_path, body=lease)
        other = ReleaseLock(api, self.session.namespace, RELEASE, "up serve")
        other.identity = OTHER
        other.acquire()
        return super().confirm(question)


def lease_holder(session: ClusterSession) -> str:
    lease = session.api.request(
        "GET",
        f"/apis/coordination.k8s.io/v1/namespaces/{session.namespace}/leases/"
        f"kimideploy-lock-{RELEASE}",
    )
    return str(lease["spec"]["holderIdentity"])


def test_a_lock_taken_over_during_the_question_stops_up_before_any_write(
    kd: Callable[..., tuple[int, str, str]], testcluster: harness.TestCluster, namespace: str
) -> None:
    assert kd("up", "serve", "--drafter", "none", *FAST)[0] == 0
    session = session_for(testcluster, namespace)
    loaded = load_project(REPO / "kimideploy.yaml")
    with pytest.raises(LockLostError) as caught:
        deploy.up(
            session,
            loaded,
            PlanRequest("serve", drafter="v3"),
            deploy.ApplyOptions(
                change=deploy.ChangeOptions(yes=False),
                wait=deploy.WaitOptions(poll_s=0.2, scheduling_grace_s=2),
            ),
            TakeOverWhileAsking(session),
        )
    assert caught.value.exit_code == ExitCode.CLUSTER
    assert f"taken over by {OTHER}" in caught.value.message
    assert statuses(session) == [(1, "none", "deployed")]  # no record, no apply
    assert not speculative(testcluster, namespace)
    assert lease_holder(session) == OTHER  # the loser did not delete the winner's lock


def test_a_lock_taken_over_during_the_question_stops_down_before_any_delete(
    kd: Callable[..., tuple[int, str, str]], testcluster: harness.TestCluster, namespace: str
) -> None:
    assert kd("up", "serve", "--drafter", "none", *FAST)[0] == 0
    session = session_for(testcluster, namespace)
    with pytest.raises(LockLostError):
        deploy.down(session, RELEASE, deploy.ChangeOptions(yes=False), TakeOverWhileAsking(session))
    assert live(testcluster, namespace, "deployment", RELEASE)
    assert statuses(session) == [(1, "none", "deployed")]


def test_a_record_changed_by_another_writer_is_not_overwritten(
    kd: Callable[..., tuple[int, str, str]], testcluster: harness.TestCluster, namespace: str
) -> None:
    assert kd("up", "serve", "--drafter", "none", *FAST)[0] == 0
    session = session_for(testcluster, namespace)
    mine, theirs = session.history(RELEASE)[0], session.history(RELEASE)[0]
    theirs.note = "annotated by another run"
    session.record(theirs, new=False)
    mine.status = "removed"
    with pytest.raises(records.RecordChangedError) as caught:
        session.record(mine, new=False)
    assert "changed or removed by another writer" in caught.value.message
    assert session.history(RELEASE)[0].note == "annotated by another run"
    assert session.history(RELEASE)[0].status == "deployed"


# A ValidatingAdmissionPolicy stands in for whatever can reject an object after its dry run
# passed (a quota filled meanwhile, a webhook's changing answer): it denies real, not dry-run,
# updates of Deployments in one namespace.
def admission_policy(namespace: str, expression: str) -> list[dict[str, Any]]:
    name = f"reject-deployments-{namespace}"
    return [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": ["apps"],
                            "apiVersions": ["v1"],
                            "operations": ["UPDATE"],
                            "resources": ["deployments"],
                        }
                    ]
                },
                "validations": [
                    {
                        "expression": expression,
                        "message": "deployments are frozen in this namespace",
                        "reason": "Invalid",
                    }
                ],
            },
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {
                "policyName": name,
                "validationActions": ["Deny"],
                "matchResources": {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
                },
            },
        },
    ]


@pytest.fixture
def freeze_deployments(
    testcluster: harness.TestCluster, namespace: str, tmp_path: Path
) -> Iterator[Callable[[str], None]]:
    """Install the policy with a CEL expression; waits until the API server enforces it."""
    applied: list[Path] = []

    def install(expression: str) -> None:
        manifest = tmp_path / f"policy-{len(applied)}.json"
        manifest.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "List",
                    "items": admission_policy(namespace, expression),
                }
            )
        )
        testcluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(manifest))
        applied.append(manifest)
        args = ["-n", namespace, "annotate", "--overwrite", f"deployment/{RELEASE}"]

        def enforced() -> bool:  # the policy's dry-run/real distinction, on a harmless annotation
            dry = testcluster.kubectl(
                *args, f"probe={time.time()}", "--dry-run=server", check=False
            )
            real = testcluster.kubectl(*args, f"probe={time.time()}", check=False)
            return not real and (bool(dry) == ("request.dryRun" in expression))

        wait_for(enforced, "the admission policy to be enforced", timeout=60)

    yield install
    for manifest in applied[-1:]:
        testcluster.kubectl("delete", "-f", str(manifest), "--ignore-not-found", check=False)


def v3_over_none_while_frozen(
    kd: Callable[..., tuple[int, str, str]],
    testcluster: harness.TestCluster,
    namespace: str,
    freeze_deployments: Callable[[str], None],
    expression: str,
) -> tuple[str, dict[str, str]]:
    """Serve revision 1 (no drafter), freeze Deployments, try v3: its stderr and revision 1's
    ConfigMap data."""
    assert kd("up", "serve", "--drafter", "none", *FAST)[0] == 0
    before = live(testcluster, namespace, "configmap", RELEASE)["data"]
    freeze_deployments(expression)
    code, _, err = kd("up", "serve", "--drafter", "v3", *FAST)
    assert code == ExitCode.USAGE, err
    return err, before


def test_a_rejection_in_the_dry_run_writes_nothing(
    kd: Callable[..., tuple[int, str, str]],
    testcluster: harness.TestCluster,
    namespace: str,
    freeze_deployments: Callable[[str], None],
) -> None:
    err, before = v3_over_none_while_frozen(kd, testcluster, namespace, freeze_deployments, "false")
    assert "Deployment/kimi-k25-serve was rejected by the API server" in err
    assert "deployments are frozen in this namespace" in err
    assert "Traceback" not in err
    session = session_for(testcluster, namespace)
    assert statuses(session) == [(1, "none", "deployed")]
    assert live(testcluster, namespace, "configmap", RELEASE)["data"] == before


def test_an_apply_rejected_half_way_restores_the_serving_revision_and_fails_the_record(
    kd: Callable[..., tuple[int, str, str]],
    testcluster: harness.TestCluster,
    namespace: str,
    freeze_deployments: Callable[[str], None],
) -> None:
    err, before = v3_over_none_while_frozen(
        kd, testcluster, namespace, freeze_deployments, "request.dryRun == true"
    )
    assert "revision 2 was rejected while being applied" in err
    assert "revision 1 (drafter none) is still serving" in err
    session = session_for(testcluster, namespace)
    assert statuses(session) == [(1, "none", "deployed"), (2, "v3", "failed")]
    failed = session.history(RELEASE)[1]
    assert failed.details["failure"] == "ApplyRejected"
    assert "frozen" in failed.details["reason"]
    # The v3 ConfigMap that went in before the Deployment was refused is back to revision 1's.
    assert live(testcluster, namespace, "configmap", RELEASE)["data"] == before
    assert not speculative(testcluster, namespace)


def test_a_claim_keeps_its_size_when_a_rollback_asks_for_less(
    kd: Callable[..., tuple[int, str, str]],
    testcluster: harness.TestCluster,
    namespace: str,
    edited_config: Callable[..., Path],
) -> None:
    assert kd("up", "serve", "--drafter", "none", *FAST)[0] == 0
    bigger = edited_config(
        (
            "models:        {storage_class: local-path, size: 2Ti}",
            "models:        {storage_class: local-path, size: 3Ti}",
        )
    )
    code, _, err = kd("up", "serve", "--drafter", "none", *FAST, config=bigger)
    assert code == 0, err
    claim = "kimi-k25-models"
    size = live(testcluster, namespace, "pvc", claim)["spec"]["resources"]["requests"]["storage"]
    assert size == "3Ti"
    code, _, err = kd("rollback", "serve", "--to", "1", *FAST)
    assert code == 0, err
    assert "PersistentVolumeClaim/kimi-k25-models stays 3Ti (this revision asks 2Ti" in err
    size = live(testcluster, namespace, "pvc", claim)["spec"]["resources"]["requests"]["storage"]
    assert size == "3Ti"
    stored = session_for(testcluster, namespace).history(RELEASE)[-1].manifests
    kept = next(o for o in stored if o["kind"] == "PersistentVolumeClaim"
                and o["metadata"]["name"] == claim)  # fmt: skip
    assert kept["spec"]["resources"]["requests"]["storage"] == "3Ti"  # a re-run agrees


def test_a_missing_priority_class_or_api_key_secret_is_refused_before_anything_is_created(
    kd: Callable[..., tuple[int, str, str]],
    testcluster: harness.TestCluster,
    namespace: str,
    edited_config: Callable[..., Path],
) -> None:
    config = edited_config(
        (
            "    priority_classes: {serve: kimideploy-serve, batch: kimideploy-batch}   "
            "# k8s/base/priorityclasses.yaml\n    hosts:\n      - {name: gpu-host",
            "    priority_classes: {serve: top-priority, batch: kimideploy-batch}\n"
            "    hosts:\n      - {name: gpu-host",
        ),
        (
            '        resources: {cpu: "48", memory: 384Gi}\n        startup_budget_s: 2700',
            '        resources: {cpu: "48", memory: 384Gi}\n        startup_budget_s: 2700\n'
            "        api_key: {name: kimi-api, key: token}",
        ),
    )
    code, _, err = kd("up", "serve", "--drafter", "v3", "--dry-run=server", config=config)
    assert code == ExitCode.USAGE, err  # the server dry run says so too
    assert "PriorityClass top-priority (clusters.rtx6000.priority_classes) does not exist" in err
    code, _, err = kd("up", "serve", "--drafter", "v3", *FAST, config=config)
    assert code == ExitCode.USAGE, err
    assert "PriorityClass top-priority (clusters.rtx6000.priority_classes) does not exist" in err
    assert f"Secret kimi-api (clusters.rtx6000.workloads.serve.api_key) does not exist in " \
           f"namespace {namespace}" in err  # fmt: skip
    assert "kubectl apply -f k8s/base/priorityclasses.yaml" in err
    made = testcluster.kubectl("-n", namespace, "get", "all,cm,secrets,networkpolicies", "-l",
                               "app.kubernetes.io/managed-by=kimideploy", "-o", "name")  # fmt: skip
    assert made.strip() == ""
    testcluster.kubectl("-n", namespace, "create", "secret", "generic", "kimi-api",
                        "--from-literal=other=x")  # fmt: skip
    code, _, err = kd("run", "bench", "--detach", config=config)
    assert code == ExitCode.USAGE, err
    assert "Secret kimi-api has no key token" in err and "it has: other" in err
    assert testcluster.kubectl("-n", namespace, "get", "jobs,cm", "-l",
                               "app.kubernetes.io/managed-by=kimideploy", "-o", "name").strip() == ""  # fmt: skip


def test_a_runs_configmap_and_network_policy_go_with_its_job(
    kd: Callable[..., tuple[int, str, str]], testcluster: harness.TestCluster, namespace: str
) -> None:
    code, _, err = kd("run", "vocab", "--detach")
    assert code == 0, err
    jobs = json.loads(testcluster.kubectl("-n", namespace, "get", "jobs", "-o", "json"))["items"]
    (the_job,) = jobs
    name, uid = the_job["metadata"]["name"], the_job["metadata"]["uid"]
    for kind, object_name in (("configmap", f"{name}-spec"), ("networkpolicy", name)):
        owners = live(testcluster, namespace, kind, object_name)["metadata"]["ownerReferences"]
        assert [(o["kind"], o["name"], o["uid"]) for o in owners] == [("Job", name, uid)]
    testcluster.kubectl("-n", namespace, "delete", "job", name, "--cascade=background")
    run = f"kimideploy.io/run-id={the_job['metadata']['labels']['kimideploy.io/run-id']}"
    wait_for(
        lambda: not testcluster.kubectl("-n", namespace, "get", "cm,networkpolicy", "-l", run,
                                        "-o", "name", check=False).strip(),
        "the garbage collector to remove the run's ConfigMap and NetworkPolicy",
        timeout=60,
    )  # fmt: skip


# --- records read back are untrusted input --------------------------------------------------------


def forge(session: ClusterSession, revision: int, **changes: Any) -> None:
    """Store a release record as a namespace-level Secret writer could (no kimideploy involved)."""
    current = session.history(RELEASE)[-1]
    forged = records.ReleaseRecord(**{**current.__dict__, "revision": revision, "status": "superseded",
                                      "resource_version": None, **changes})  # fmt: skip
    body = records._secret(forged)
    body["metadata"]["namespace"] = session.namespace  # stored here, whatever it claims inside
    session.api.request("POST", f"/api/v1/namespaces/{session.namespace}/secrets", body=body)


def test_rollback_to_a_forged_record_applies_nothing_outside_the_release(
    kd: Callable[..., tuple[int, str, str]], testcluster: harness.TestCluster, namespace: str
) -> None:
    """The confused deputy: a record holding a ConfigMap in another namespace, a cluster-scoped
    PriorityClass and a ClusterRoleBinding. The admin's `rollback --to 2` refuses it, names the
    problems, and nothing is created."""
    assert kd("up", "serve", "--drafter", "v3", *FAST)[0] == 0
    session = session_for(testcluster, namespace)
    elsewhere = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "planted",
            "namespace": "default",
            "labels": {
                "app.kubernetes.io/instance": RELEASE,
                "app.kubernetes.io/managed-by": "kimideploy",
            },
        },
    }
    cluster_wide = {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": "planted-priority"},
        "value": 1000,
    }
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": "planted-admin"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
               "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": namespace}]}  # fmt: skip
    assert session.history(RELEASE), session.ignored_records
    current = session.history(RELEASE)[-1]
    forge(session, 2, manifests=[*current.manifests, elsewhere, cluster_wide, binding])
    code, _, err = kd("rollback", "serve", "--to", "2", "--yes")
    assert code == 2, err
    assert "--to 2: kimideploy.release.kimi-k25-serve.v2:" in err
    assert "ConfigMap/planted is in namespace 'default'" in err
    assert "kind 'PriorityClass' is not one a release holds" in err
    assert "never applied" in err and "Traceback" not in err
    assert "planted" not in testcluster.kubectl("-n", "default", "get", "configmaps", "-o", "name")
    assert "planted" not in testcluster.kubectl("get", "priorityclasses", "-o", "name")
    assert "planted" not in testcluster.kubectl("get", "clusterrolebindings", "-o", "name")
    # history still works, and says what it ignored and why
    code, _out, err = kd("history", "serve")
    assert code == 0 and "warning: ignored an untrusted release record" in err
    assert [r.revision for r in session.history(RELEASE)] == [1]


def test_a_record_naming_another_namespace_cannot_redirect_no_spec(
    kd: Callable[..., tuple[int, str, str]], testcluster: harness.TestCluster, namespace: str
) -> None:
    """`rollback --no-spec` re-renders the serving record: a forged 'deployed' record naming
    kube-system is not the serving one (it is not trusted), so the re-render goes to the
    release's own namespace and nothing appears in kube-system."""
    assert kd("up", "serve", "--drafter", "v3", *FAST)[0] == 0
    session = session_for(testcluster, namespace)
    forge(session, 5, status="deployed", namespace="kube-system")
    code, _, err = kd("rollback", "serve", "--no-spec", *FAST)
    assert code == 0, err
    assert RELEASE not in testcluster.kubectl(
        "-n", "kube-system", "get", "deployments", "-o", "name"
    )
    assert not speculative(testcluster, namespace)
    assert [r.revision for r in session.history(RELEASE)] == [1, 2]


def test_a_compressed_record_bomb_does_not_take_history_down(
    kd: Callable[..., tuple[int, str, str]], testcluster: harness.TestCluster, namespace: str
) -> None:
    """A 0.9 MB record that would gunzip to 900 MB: history, status and up keep working."""
    import base64
    import gzip

    assert kd("up", "serve", "--drafter", "none", *FAST)[0] == 0
    bomb = base64.b64encode(
        gzip.compress(b"{" + b" " * 900_000_000 + b"}", compresslevel=9)
    ).decode()
    assert len(bomb) < 1_500_000
    secret = {"apiVersion": "v1", "kind": "Secret", "type": records.RECORD_TYPE,
              "metadata": {"name": f"kimideploy.release.{RELEASE}.v7",
                           "labels": {records.RECORD_LABEL: RELEASE, "kimideploy.io/revision": "7"}},
              "data": {"release": bomb}}  # fmt: skip
    session_for(testcluster, namespace).api.request(
        "POST", f"/api/v1/namespaces/{namespace}/secrets", body=secret
    )
    code, _out, err = kd("history", "serve")
    assert code == 0 and "decompresses to more than 16 MiB; not read" in err
    assert kd("status")[0] == 0
    assert kd("up", "serve", "--drafter", "v3", *FAST)[0] == 0


def test_a_fast_local_clock_does_not_take_over_a_lease_renewed_a_second_ago(
    testcluster: harness.TestCluster, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Expiry is judged by the API server's clock: this machine's running 10 minutes ahead
    changes nothing, while a Lease really left idle past its duration is taken over."""
    from datetime import UTC, datetime, timedelta

    from kimideploy.cluster import lock as locking

    session = session_for(testcluster, namespace)
    other = ReleaseLock(session.api, namespace, RELEASE, "up serve")
    other.identity = OTHER
    other.acquire()  # renewed just now, in the server's time

    class Ahead(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> datetime:  # type: ignore[override]
            return datetime.now(tz or UTC) + timedelta(minutes=10)

    monkeypatch.setattr(locking, "datetime", Ahead)
    with pytest.raises(locking.ReleaseLockedError, match="is locked by alice@workstation"):
        ReleaseLock(session.api, namespace, RELEASE, "rollback").acquire()
    lease_path = (
        f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/kimideploy-lock-{RELEASE}"
    )
    lease = session.api.request("GET", lease_path)
    old = session.api.server_time() - timedelta(seconds=locking.LEASE_SECONDS + 5)
    lease["spec"]["renewTime"] = old.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    session.api.request("PUT", lease_path, body=lease)
    mine = ReleaseLock(session.api, namespace, RELEASE, "rollback")
    mine.acquire()  # idle past its duration by the server's clock: taken over
    assert lease_holder(session) == mine.identity


def test_a_malformed_lease_is_a_named_problem(
    kd: Callable[..., tuple[int, str, str]], testcluster: harness.TestCluster, namespace: str
) -> None:
    session = session_for(testcluster, namespace)
    body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": f"kimideploy-lock-{RELEASE}", "namespace": namespace},
            "spec": {"holderIdentity": OTHER}}  # fmt: skip
    session.api.request(
        "POST", f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases", body=body
    )
    code, _, err = kd("up", "serve", "--drafter", "none", *FAST)
    assert code != 0 and "Traceback" not in err
    assert "lock (Lease kimideploy-lock-kimi-k25-serve) is malformed: renewTime None" in err
    assert f"kubectl -n {namespace} delete lease kimideploy-lock-kimi-k25-serve" in err
