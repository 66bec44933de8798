"""Release records read back are untrusted input: each case a
namespace-level Secret writer (or a damaged record) could present is refused with the problem
named, before anything is decompressed past a bound or applied. The same cases run against the
real control plane in tests/integration/test_release_safety.py."""

from __future__ import annotations

import base64
import gzip
import json
from dataclasses import asdict
from typing import Any

import pytest

from kimideploy.cluster import records
from kimideploy.cluster.record_trust import MAX_RECORD_BYTES, RouteParent

RELEASE, NAMESPACE = "kimi-k25-serve", "kimi"
LABELS = {"app.kubernetes.io/instance": RELEASE, "app.kubernetes.io/managed-by": "kimideploy"}


def deployment(**pod: Any) -> dict[str, Any]:
    container = {
        "name": "vllm",
        "image": "x",
        "securityContext": {"allowPrivilegeEscalation": False},
    }
    spec = {"automountServiceAccountToken": False, "containers": [container], **pod}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": RELEASE, "namespace": NAMESPACE, "labels": LABELS},
            "spec": {"template": {"spec": spec}}}  # fmt: skip


def record(**changes: Any) -> dict[str, Any]:
    made = records.ReleaseRecord(
        release=RELEASE, revision=3, status="deployed", created_at="2026-12-01T00:00:00Z",
        user="ops", cluster="rtx6000", namespace=NAMESPACE, drafter="v3", image="i@sha256:" + "a" * 64,
        config_sha256="b" * 64, config_text="name: kimi-k25\n", overrides=[],
        manifests=[deployment()],
    )  # fmt: skip
    return {**asdict(made), **changes}


def secret(
    data: Any, name: str = f"kimideploy.release.{RELEASE}.v3", raw: bytes | None = None
) -> dict[str, Any]:
    packed = gzip.compress(raw if raw is not None else json.dumps(data).encode())
    return {"type": records.RECORD_TYPE,
            "metadata": {"name": name, "labels": {"kimideploy.io/revision": "3"}},
            "data": {"release": base64.b64encode(packed).decode()}}  # fmt: skip


def refused(item: dict[str, Any]) -> str:
    with pytest.raises(records.UntrustedRecordError) as caught:
        records._decode(item, NAMESPACE, RELEASE)
    assert caught.value.exit_code == 2 and "never applied" in (caught.value.hint or "")
    return caught.value.message


def test_a_record_kimideploy_writes_is_trusted() -> None:
    assert records._decode(secret(record()), NAMESPACE, RELEASE).revision == 3


@pytest.mark.parametrize(
    ("manifest", "problem"),
    [
        ({**deployment(), "metadata": {"name": "x", "namespace": "kube-system", "labels": LABELS}},
         "Deployment/x is in namespace 'kube-system', not 'kimi'"),
        ({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "p"}},
         "kind 'PriorityClass' is not one a release holds"),
        ({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
          "metadata": {"name": "pwn"}}, "kind 'ClusterRoleBinding' is not one a release holds"),
        ({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "labels": {}}},
         "ConfigMap/c is not labelled as part of kimi-k25-serve"),
        (deployment(serviceAccountName="cluster-admin-sa"), "runs as service account 'cluster-admin-sa'"),
        (deployment(automountServiceAccountToken=True), "mounts a service account token"),
        (deployment(hostNetwork=True), "sets hostNetwork"),
        (deployment(volumes=[{"name": "root", "hostPath": {"path": "/"}}]), "mounts host path"),
        (deployment(containers=[{"name": "c", "securityContext": {"privileged": True}}]),
         "container 'c' may be privileged"),
        ({"apiVersion": "v1", "kind": "Deployment", "metadata": {"name": "d"}},
         "Deployment has apiVersion 'v1', not apps/v1"),
        ("a string", "not an object"),
    ],
)  # fmt: skip
def test_objects_a_release_does_not_render_are_refused(manifest: Any, problem: str) -> None:
    assert problem in refused(secret(record(manifests=[deployment(), manifest])))


PICKER = f"{RELEASE}-epp"


def picker_objects() -> list[dict[str, Any]]:
    """What a serve release behind a gateway stores for its endpoint pickers."""
    from kimideploy.formats.endpoint_picker import PICKER_CLUSTER_ROLE

    meta = {"name": PICKER, "namespace": NAMESPACE, "labels": LABELS}
    picker = deployment(serviceAccountName=PICKER, automountServiceAccountToken=True)
    picker["metadata"] = {**meta, "name": f"{RELEASE}-canary-epp"}
    return [
        picker,
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta,
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": PICKER_CLUSTER_ROLE},
         "subjects": [{"kind": "ServiceAccount", "name": PICKER, "namespace": NAMESPACE}]},
    ]  # fmt: skip


def test_the_endpoint_pickers_account_is_the_one_token_a_record_may_hold() -> None:
    trusted = records._decode(
        secret(record(manifests=[deployment(), *picker_objects()])), NAMESPACE, RELEASE
    )
    assert trusted.revision == 3


def _widened(index: int, **changes: Any) -> list[dict[str, Any]]:
    found = picker_objects()
    found[index] = {**found[index], **changes}
    return found


@pytest.mark.parametrize(
    ("manifests", "problem"),
    [
        # The pickers' account, run by a Deployment that is not a picker.
        ([deployment(serviceAccountName=PICKER, automountServiceAccountToken=True)],
         f"runs as service account '{PICKER}'"),
        # A Role of its own: a record holds none (it could grant anything the writer names).
        ([{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
           "metadata": {"name": PICKER, "namespace": NAMESPACE, "labels": LABELS},
           "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]}],
         "kind 'Role' is not one a release holds"),
        # Bound to another account, or another role bound to the pickers'.
        (_widened(2, subjects=[{"kind": "ServiceAccount", "name": "default",
                                "namespace": NAMESPACE}]), "binds other than ClusterRole"),
        (_widened(2, roleRef={"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                              "name": "admin"}), "binds other than ClusterRole"),
        (_widened(1, metadata={"name": "other", "namespace": NAMESPACE, "labels": LABELS}),
         f"is not the endpoint pickers' {PICKER}"),
    ],
)  # fmt: skip
def test_a_record_cannot_widen_the_pickers_grant(
    manifests: list[dict[str, Any]], problem: str
) -> None:
    assert problem in refused(secret(record(manifests=[deployment(), *manifests])))


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        (
            {"namespace": "kube-system"},
            "it names namespace 'kube-system', but was read from 'kimi'",
        ),
        ({"release": "other-serve"}, "it is a record of release 'other-serve'"),
        ({"revision": "3"}, "revision is a str"),
        ({"manifests": {"kind": "Deployment"}}, "manifests is a dict"),
        ({"created_at": "yesterday"}, "created_at 'yesterday' is not a timestamp"),
        ({"overrides": [1]}, "overrides are not all strings"),
    ],
)
def test_records_of_another_release_or_of_the_wrong_shape_are_refused(
    changes: dict[str, Any], problem: str
) -> None:
    assert problem in refused(secret(record(**changes)))


def test_a_record_under_another_revisions_name_is_refused() -> None:
    item = secret(record(revision=9))
    assert (
        "revision 9 of kimi-k25-serve is stored as kimideploy.release.kimi-k25-serve.v9"
        in refused(item)
    )


def test_a_compression_bomb_is_stopped_at_the_bound() -> None:
    bomb = b"{" + b" " * (MAX_RECORD_BYTES + 10) + b"}"
    item = secret(None, raw=bomb)
    assert len(item["data"]["release"]) < 100_000  # small on the wire
    assert "decompresses to more than 16 MiB; not read" in refused(item)


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        ({"release": "@@not base64@@"}, "not gzip-compressed JSON"),
        (
            {"release": base64.b64encode(gzip.compress(b"[1, 2]")).decode()},
            "a JSON list, not an object",
        ),
        ({"release": base64.b64encode(gzip.compress(b"{no")).decode()}, "not valid JSON"),
        ({}, "its data is not a release record"),
    ],
)
def test_damaged_data_is_named_not_a_traceback(data: dict[str, Any], problem: str) -> None:
    item = {"type": records.RECORD_TYPE, "metadata": {"name": "kimideploy.release.kimi-k25-serve.v3"},
            "data": data}  # fmt: skip
    assert problem in refused(item)


# --- a stored HTTPRoute: parents, hostnames, backends ---------------------------------------------

PARENT = RouteParent("inference-gateway", "gateways")


def routed_record(**route_spec: Any) -> dict[str, Any]:
    """The objects `up serve` renders behind the example's gateway (tests/unit/test_canary.py),
    the route's spec changed by `route_spec`."""
    from tests.unit.test_canary import objects, with_gateway

    found = objects(with_gateway("b300"), "b300")
    for obj in found:
        obj["metadata"].setdefault("namespace", NAMESPACE)
        if obj["kind"] == "HTTPRoute":
            obj["spec"] = {**obj["spec"], **route_spec}
    return record(manifests=found)


def route_refused(data: dict[str, Any], parent: RouteParent | None = PARENT) -> str:
    with pytest.raises(records.UntrustedRecordError) as caught:
        records._decode(secret(data), NAMESPACE, RELEASE, parent)
    return caught.value.message


def test_the_route_up_renders_for_the_profiles_gateway_is_trusted() -> None:
    assert records._decode(secret(routed_record()), NAMESPACE, RELEASE, PARENT).revision == 3


@pytest.mark.parametrize(
    ("route_spec", "problem"),
    [
        ({"parentRefs": [{"name": "inference-gateway", "namespace": "tenant-b"}]},
         "attaches to Gateway tenant-b/inference-gateway, not the cluster profile's "
         "gateways/inference-gateway"),
        ({"parentRefs": [{"name": "public", "namespace": "gateways"}]},
         "attaches to Gateway gateways/public"),
        ({"parentRefs": [{"name": "inference-gateway", "namespace": "gateways",
                          "sectionName": "https-tenant-b"}]},
         "attaches to Gateway gateways/inference-gateway (https-tenant-b)"),
        ({"parentRefs": [{"name": "inference-gateway", "namespace": "gateways", "port": 443}]},
         "attaches to Gateway gateways/inference-gateway"),
        ({"hostnames": ["api.tenant-b.example"]},
         "claims hostnames ['api.tenant-b.example'] (kimideploy renders none)"),
        ({"rules": [{"backendRefs": [{"kind": "Service", "name": "billing",
                                      "namespace": "tenant-b", "port": 80}]}]},
         "sends traffic to Service tenant-b/billing, not to one of the record's own "
         "InferencePools"),
        ({"rules": [{"backendRefs": [{"group": "inference.networking.k8s.io",
                                      "kind": "InferencePool", "name": "other-pool"}]}]},
         "sends traffic to InferencePool kimi/other-pool"),
        ({"rules": [{"matches": [{"path": {"value": "/admin"}}], "backendRefs": []}]},
         "has rule fields kimideploy never renders: ['matches']"),
    ],
)  # fmt: skip
def test_a_route_anywhere_but_the_profiles_gateway_and_pools_is_refused(
    route_spec: dict[str, Any], problem: str
) -> None:
    assert problem in route_refused(routed_record(**route_spec))


def test_a_route_on_a_cluster_without_a_gateway_is_refused() -> None:
    assert "the cluster profile serves through no gateway" in route_refused(routed_record(), None)
