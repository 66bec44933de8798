"""What a stored release record must be before kimideploy acts on it.

A release record is a Secret in the release's namespace, so anyone who may create Secrets there
can write one; a cluster admin's `rollback --to N` then applies what it holds with the admin's
rights. Every record read back is therefore untrusted input, checked here before anything uses
it: its size before it is decompressed, its fields and their types, that it is the record of the
release and namespace the command asked about (under the Secret name that revision has), and that
every object it would apply is a kind kimideploy renders for a release, namespaced, in that
namespace, labelled as the release's, with a pod spec kimideploy could have rendered (no host
namespaces or host paths, no privileged or privilege-escalating containers, no service account
token). A record that fails is never applied; `history` and `status` show it as ignored, with why.

A stored HTTPRoute is read too: it may attach only to the cluster profile's gateway (name,
namespace, listener: `RouteParent`), carry no hostnames (kimideploy renders none: the Gateway's
listeners decide), and send traffic only to the record's own InferencePools in the release's
namespace. A route re-parented onto another namespace's Gateway with another tenant's hostname,
or pointing at a Service of another namespace, would otherwise take that traffic on an admin's
`rollback --to N`.

What a namespace-level Secret writer can still do (docs/reference/security.md): write a record that
passes, i.e. a release of the kinds kimideploy renders in that namespace, with an image and
arguments of their choosing, which an admin's rollback to that revision would deploy there. It
cannot make the admin write to another namespace, create cluster-scoped objects (RBAC, priority
classes, CRDs), mount host paths, give a pod an API token, or route another Gateway's traffic.
"""

from __future__ import annotations

import base64
import binascii
import zlib
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kimideploy.formats.bounded_io import UnreadableFileError, parse_json_object
from kimideploy.formats.endpoint_picker import PICKER_CLUSTER_ROLE, PICKER_SUFFIX, picker_account

MAX_STORED_BYTES = 2 * 1024 * 1024
"""Base64 text of the record (a Secret holds at most 1 MiB of data)."""
MAX_RECORD_BYTES = 16 * 1024 * 1024
"""The record once decompressed: a 0.9 MB gzip bomb expands to 900 MB; this stops it early."""
RELEASE_KINDS = {
    "ConfigMap": "v1",
    "Service": "v1",
    "PersistentVolumeClaim": "v1",
    "Deployment": "apps/v1",
    "NetworkPolicy": "networking.k8s.io/v1",
    "PodMonitor": "monitoring.coreos.com/v1",
    "ServiceAccount": "v1",
    "RoleBinding": "rbac.authorization.k8s.io/v1",
    "InferencePool": "inference.networking.k8s.io/v1",
    "HTTPRoute": "gateway.networking.k8s.io/v1",
}
"""The kinds of a serve release, the only kinds a record may hold."""
FIELD_TYPES: dict[str, type | tuple[type, ...]] = {
    "release": str,
    "revision": int,
    "status": str,
    "created_at": str,
    "user": str,
    "cluster": str,
    "namespace": str,
    "drafter": str,
    "image": str,
    "config_sha256": str,
    "config_text": str,
    "overrides": list,
    "manifests": list,
    "note": str,
    "source_revision": (int, type(None)),
    "details": dict,
    "schema": str,
    "workload": str,
}
OPTIONAL = {"note", "source_revision", "details", "schema", "workload"}


GATEWAY_GROUP = "gateway.networking.k8s.io"
POOL_GROUP = "inference.networking.k8s.io"


@dataclass(frozen=True)
class RouteParent:
    """The one Gateway listener a release's HTTPRoute may attach to: the cluster profile's
    `gateway` (namespace None: the release's own)."""

    name: str
    namespace: str | None = None
    section_name: str | None = None


def mapping(value: Any) -> dict[str, Any]:
    """`value` if it is a JSON object, else an empty one (what an absent field reads as)."""
    return value if isinstance(value, dict) else {}


class RecordTrustError(ValueError):
    """The record is not one kimideploy may act on; the message lists every problem."""


def decompress(encoded: Any, name: str) -> bytes:
    """Base64 of gzip, both bounded before the bytes exist."""
    if not isinstance(encoded, str) or len(encoded) > MAX_STORED_BYTES:
        raise RecordTrustError(f"{name}: its data is not a release record of at most 1 MiB")
    try:
        packed = base64.b64decode(encoded, validate=True)
        inflater = zlib.decompressobj(wbits=31)  # gzip
        raw = inflater.decompress(packed, MAX_RECORD_BYTES + 1)
    except (binascii.Error, zlib.error) as exc:
        raise RecordTrustError(f"{name}: its data is not gzip-compressed JSON ({exc})") from exc
    if len(raw) > MAX_RECORD_BYTES or inflater.unconsumed_tail:
        raise RecordTrustError(
            f"{name}: decompresses to more than {MAX_RECORD_BYTES // 2**20} MiB; not read"
        )
    return raw


def parse(raw: bytes, name: str) -> dict[str, Any]:
    try:
        return parse_json_object(raw, name)
    except UnreadableFileError as exc:
        raise RecordTrustError(f"{exc} (not a release record)") from exc


def problems(
    data: dict[str, Any],
    name: str,
    labels: dict[str, Any],
    namespace: str,
    release: str,
    *,
    route_parent: RouteParent | None = None,
) -> list[str]:
    """Everything wrong with a decoded record read for `release` in `namespace`, on a cluster
    whose profile routes through `route_parent` (None: no gateway, so no route is the
    release's)."""
    found = _field_problems(data)
    if found:
        return found
    if data["release"] != release:
        found.append(f"it is a record of release {data['release']!r}, not {release!r}")
    if data["namespace"] != namespace:
        found.append(f"it names namespace {data['namespace']!r}, but was read from {namespace!r}")
    expected = f"kimideploy.release.{release}.v{data['revision']}"
    if name != expected:
        found.append(f"revision {data['revision']} of {release} is stored as {expected}")
    if str(labels.get("kimideploy.io/revision")) != str(data["revision"]):
        found.append(
            f"its revision label {labels.get('kimideploy.io/revision')!r} is not its revision"
        )
    try:
        datetime.fromisoformat(str(data["created_at"]).replace("Z", "+00:00"))
    except ValueError:
        found.append(f"created_at {data['created_at']!r} is not a timestamp")
    pools = {
        mapping(o.get("metadata")).get("name")
        for o in data["manifests"]
        if isinstance(o, dict) and o.get("kind") == "InferencePool"
    }
    for index, obj in enumerate(data["manifests"]):
        found += [f"object {index}: {p}" for p in object_problems(obj, namespace, release)]
        if isinstance(obj, dict) and obj.get("kind") == "HTTPRoute":
            where = f"object {index}: HTTPRoute/{mapping(obj.get('metadata')).get('name')}"
            found += [f"{where} {p}" for p in route_problems(obj, namespace, pools, route_parent)]
    return found


def route_problems(
    route: dict[str, Any], namespace: str, pools: set[Any], parent: RouteParent | None
) -> list[str]:
    """Why a stored HTTPRoute is not the one kimideploy renders for this cluster profile."""
    if parent is None:
        return ["is in a record, but the cluster profile serves through no gateway"]
    spec = mapping(route.get("spec"))
    found = []
    wanted = {
        "group": GATEWAY_GROUP,
        "kind": "Gateway",
        "name": parent.name,
        "namespace": parent.namespace or namespace,
        "sectionName": parent.section_name,
    }
    refs = spec.get("parentRefs")
    if not isinstance(refs, list) or not refs:
        found.append("has no parentRefs")
    for ref in refs if isinstance(refs, list) else []:
        ref = mapping(ref)
        seen = {"group": ref.get("group", GATEWAY_GROUP), "kind": ref.get("kind", "Gateway"),
                "name": ref.get("name"), "namespace": ref.get("namespace", namespace),
                "sectionName": ref.get("sectionName")}  # fmt: skip
        if seen != wanted or set(ref) - {"group", "kind", "name", "namespace", "sectionName"}:
            where = f"{seen['namespace']}/{seen['name']}" + (
                f" ({seen['sectionName']})" if seen["sectionName"] else ""
            )
            mine = f"{wanted['namespace']}/{parent.name}" + (
                f" ({parent.section_name})" if parent.section_name else ""
            )
            found.append(f"attaches to Gateway {where}, not the cluster profile's {mine}")
    if spec.get("hostnames"):
        found.append(f"claims hostnames {spec['hostnames']} (kimideploy renders none)")
    rules: list[Any] = spec["rules"] if isinstance(spec.get("rules"), list) else []
    for rule in rules:
        rule = mapping(rule)
        if set(rule) - {"backendRefs"}:
            found.append(
                f"has rule fields kimideploy never renders: {sorted(set(rule) - {'backendRefs'})}"
            )
        for backend in rule.get("backendRefs") or []:
            backend = mapping(backend)
            target = (backend.get("group"), backend.get("kind"), backend.get("name"))
            if (
                target[:2] != (POOL_GROUP, "InferencePool")
                or target[2] not in pools
                or backend.get("namespace", namespace) != namespace
            ):
                found.append(
                    f"sends traffic to {backend.get('kind')} "
                    f"{backend.get('namespace', namespace)}/{backend.get('name')}, not to one of "
                    "the record's own InferencePools"
                )
    return found


def _field_problems(data: dict[str, Any]) -> list[str]:
    found = []
    for key, kind in FIELD_TYPES.items():
        if key not in data:
            if key not in OPTIONAL:
                found.append(f"{key} is missing")
            continue
        value = data[key]
        if isinstance(value, bool) or not isinstance(value, kind):
            found.append(f"{key} is a {type(value).__name__}")
    if not found and data["revision"] < 1:
        found.append(f"revision {data['revision']} is not a positive number")
    if not found and not all(isinstance(o, str) for o in data["overrides"]):
        found.append("overrides are not all strings")
    return found


def object_problems(obj: Any, namespace: str, release: str) -> list[str]:
    """Why one stored object is not something kimideploy renders for this release."""
    if not isinstance(obj, dict):
        return ["not an object"]
    kind, meta = obj.get("kind"), obj.get("metadata")
    if kind not in RELEASE_KINDS:
        return [f"kind {kind!r} is not one a release holds ({', '.join(sorted(RELEASE_KINDS))})"]
    if obj.get("apiVersion") != RELEASE_KINDS[kind]:
        return [f"{kind} has apiVersion {obj.get('apiVersion')!r}, not {RELEASE_KINDS[kind]}"]
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str):
        return [f"{kind} has no metadata.name"]
    where = f"{kind}/{meta['name']}"
    found = []
    if meta.get("namespace", namespace) != namespace:
        found.append(f"{where} is in namespace {meta.get('namespace')!r}, not {namespace!r}")
    labels = mapping(meta.get("labels"))
    # Claims are shared by the project's workloads: their instance is <project>-storage.
    owners = (
        {release, f"{release.rsplit('-', 1)[0]}-storage"}
        if kind == "PersistentVolumeClaim"
        else {release}
    )
    if labels.get("app.kubernetes.io/instance") not in owners:
        found.append(f"{where} is not labelled as part of {release}")
    if labels.get("app.kubernetes.io/managed-by") != "kimideploy":
        found.append(f"{where} is not labelled managed-by kimideploy")
    if kind == "Deployment":
        template = mapping(mapping(obj.get("spec")).get("template"))
        picker = picker_account(release)
        account = picker if meta["name"].endswith(PICKER_SUFFIX) else None
        found += [f"{where}: {p}" for p in pod_problems(template.get("spec"), account)]
    found += [f"{where}: {p}" for p in _grant_problems(kind, obj, release)]
    return found


def _grant_problems(kind: str, obj: dict[str, Any], release: str) -> list[str]:
    """A record may create one account and one binding: the shipped read-only ClusterRole of the
    endpoint pickers (pods and InferencePools) to that account, in its namespace; never a wider
    grant."""
    picker = picker_account(release)
    if kind in ("ServiceAccount", "RoleBinding") and obj["metadata"]["name"] != picker:
        return [f"is not the endpoint pickers' {picker}"]
    if kind == "RoleBinding":
        subjects = obj.get("subjects")
        wanted = [{"kind": "ServiceAccount", "name": picker, "namespace": obj["metadata"].get(
            "namespace")}]  # fmt: skip
        role = mapping(obj.get("roleRef"))
        if (
            role.get("kind") != "ClusterRole"
            or role.get("name") != PICKER_CLUSTER_ROLE
            or subjects != wanted
        ):
            return [
                f"binds other than ClusterRole {PICKER_CLUSTER_ROLE} to ServiceAccount {picker}"
            ]
    return []


def pod_problems(pod: Any, account: str | None = None) -> list[str]:
    """What kimideploy never renders into a pod: host access, privilege, an API token; the one
    exception is `account`, the endpoint pickers' (bound to a read-only role: _grant_problems)."""
    if not isinstance(pod, dict):
        return ["no pod template"]
    found = [f"sets {key}" for key in ("hostNetwork", "hostPID", "hostIPC") if pod.get(key)]
    allowed = (None, "default") if account is None else (account,)
    if account is None and pod.get("automountServiceAccountToken") is not False:
        found.append("mounts a service account token (kimideploy sets it false)")
    if pod.get("serviceAccountName") not in allowed or pod.get("serviceAccount"):
        found.append(f"runs as service account {pod.get('serviceAccountName')!r}")
    for volume in pod.get("volumes") or []:
        if isinstance(volume, dict) and "hostPath" in volume:
            found.append(f"mounts host path {volume['hostPath']!r}")
    containers = [*(pod.get("initContainers") or []), *(pod.get("containers") or [])]
    for container in containers:
        context = mapping(mapping(container).get("securityContext"))
        name = mapping(container).get("name")
        if context.get("privileged") or context.get("allowPrivilegeEscalation") is not False:
            found.append(f"container {name!r} may be privileged or escalate privileges")
        added = mapping(context.get("capabilities")).get("add")
        if added:
            found.append(f"container {name!r} adds capabilities {added}")
    return found
