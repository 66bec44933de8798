"""Server-side apply in order, prune by release label, dry runs and diffs against live objects."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

import yaml

from kimideploy.cluster.api import (
    FIELD_MANAGER,
    ConflictError,
    ForbiddenError,
    InvalidError,
    KubeApi,
    NotFoundError,
)
from kimideploy.cluster.resources import GATEWAY_KINDS, PRUNABLE_KINDS, path
from kimideploy.config.base import quantity_to_float
from kimideploy.errors import ClusterError, ManifestError

RELEASE_LABEL = "app.kubernetes.io/instance"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
KEEP_ANNOTATION = "kimideploy.io/keep"
SERVER_FIELDS = ("status",)
SERVER_METADATA = (
    "managedFields",
    "resourceVersion",
    "uid",
    "creationTimestamp",
    "generation",
    "selfLink",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "finalizers",
    "ownerReferences",
)


class ApplyConflictError(ClusterError):
    """Another field manager owns fields kimideploy wants to set."""


@dataclass(frozen=True)
class ObjectRef:
    kind: str
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind}/{self.name}"


def ref(obj: dict[str, Any]) -> ObjectRef:
    meta = obj["metadata"]
    return ObjectRef(obj["kind"], meta.get("namespace", ""), meta["name"])


def apply_object(
    api: KubeApi, obj: dict[str, Any], force: bool = False, dry_run: bool = False
) -> Any:
    """One server-side apply as field manager `kimideploy`; conflicts name the field and manager."""
    target = ref(obj)
    query: dict[str, Any] = {"fieldManager": FIELD_MANAGER}
    if force:
        query["force"] = "true"
    if dry_run:
        query["dryRun"] = "All"
    try:
        return api.request(
            "PATCH",
            path(target.kind, target.namespace, target.name),
            query,
            obj,
            content_type="application/apply-patch+yaml",
        )
    except ConflictError as exc:
        raise ApplyConflictError(
            f"{target}: fields owned by another manager: " + "; ".join(_conflicts(exc.status)),
            hint="someone changed them by hand or with another tool; re-run with --force to take "
            "them over, or align kimideploy.yaml with the live value",
        ) from exc
    except InvalidError as exc:
        raise ManifestError(
            f"{target} was rejected by the API server: {exc}",
            hint="fix the value and run again",
        ) from exc
    except NotFoundError as exc:
        if target.kind != "RoleBinding":
            raise
        # For anyone but a cluster admin the API server checks a binding against the role it
        # binds, and answers "not found" when that role is not installed.
        role = obj.get("roleRef", {}).get("name")
        raise ClusterError(
            f"{target}: the API server could not check the ClusterRole {role} it binds ({exc})",
            hint="a cluster admin applies k8s/base/rbac.yaml once per cluster (it ships that role)",
        ) from exc


def _conflicts(status: dict[str, Any]) -> list[str]:
    causes = status.get("details", {}).get("causes", [])
    found = [f"{c.get('field', '?')} ({c.get('message', 'conflict')})" for c in causes]
    return found or [status.get("message", "")]


def apply_all(api: KubeApi, objects: list[dict[str, Any]], force: bool = False) -> list[ObjectRef]:
    """Apply in the given (dependency) order; returns what was applied."""
    applied = []
    for obj in objects:
        apply_object(api, obj, force=force)
        applied.append(ref(obj))
    return applied


def validate_all(api: KubeApi, objects: list[dict[str, Any]], force: bool = False) -> None:
    """A server-side dry run of every object (schema, admission, quota, conflicts) before the
    first real write, so a rejection leaves nothing half-applied."""
    for obj in objects:
        apply_object(api, obj, force=force, dry_run=True)


def never_shrink_claims(
    api: KubeApi, objects: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[str]]:
    """A claim cannot shrink: where a live PersistentVolumeClaim is larger than the one asked
    for (a rollback after the size was raised, an auto-sized claim for a smaller run), keep the
    live size. Returns the objects to apply and one note per claim kept."""
    kept, notes = [], []
    for obj in objects:
        if obj["kind"] == "PersistentVolumeClaim":
            live = get_live(api, ref(obj))
            asked = obj["spec"]["resources"]["requests"]["storage"]
            now = (live or {}).get("spec", {}).get("resources", {}).get("requests", {})
            if "storage" in now and quantity_to_float(now["storage"]) > quantity_to_float(asked):
                obj = _with_storage(obj, now["storage"])
                notes.append(
                    f"{ref(obj)} stays {now['storage']} (this revision asks {asked}; a claim "
                    "cannot shrink; delete it to recreate it smaller, and its data with it)"
                )
        kept.append(obj)
    return kept, notes


def _with_storage(obj: dict[str, Any], size: str) -> dict[str, Any]:
    spec = obj["spec"]
    resources = {
        **spec["resources"],
        "requests": {**spec["resources"]["requests"], "storage": size},
    }
    return {**obj, "spec": {**spec, "resources": resources}}


def release_selector(release: str) -> str:
    """The instance label alone is not ours: Helm, Kustomize and others set it too."""
    return f"{RELEASE_LABEL}={release},{MANAGED_BY_LABEL}=kimideploy"


def applied_by_kimideploy(obj: dict[str, Any]) -> bool:
    """The object carries fields kimideploy applied (server-side apply records the manager), so a
    foreign object that copied our labels is still not ours to delete."""
    fields = obj.get("metadata", {}).get("managedFields") or []
    return any(f.get("manager") == FIELD_MANAGER and f.get("operation") == "Apply" for f in fields)


def live_release_objects(api: KubeApi, namespace: str, release: str) -> list[dict[str, Any]]:
    """Objects of the release of the kinds a release owns: our labels and our applied fields."""
    found = []
    for kind in PRUNABLE_KINDS:
        try:
            listed = api.request(
                "GET", path(kind, namespace), {"labelSelector": release_selector(release)}
            )
        except NotFoundError:  # a custom resource (PodMonitor) the cluster does not serve
            continue
        except ForbiddenError:
            # A deployer without kimideploy-gateway-deployer may not list the gateway's kinds;
            # creating them takes the same grants, so it has none of them to prune.
            if kind in GATEWAY_KINDS:
                continue
            raise
        for item in listed.get("items", []):
            if applied_by_kimideploy(item):
                item["kind"] = kind
                found.append(item)
    return found


def prune(
    api: KubeApi, namespace: str, release: str, keep: list[ObjectRef], dry_run: bool = False
) -> list[ObjectRef]:
    """Delete the release's objects that the new revision no longer has; never claims or data."""
    wanted = {(r.kind, r.name) for r in keep}
    removed = []
    for obj in live_release_objects(api, namespace, release):
        target = ref({**obj, "metadata": {**obj["metadata"], "namespace": namespace}})
        annotations = obj["metadata"].get("annotations") or {}
        if (target.kind, target.name) in wanted or annotations.get(KEEP_ANNOTATION) == "true":
            continue
        delete_object(api, target, dry_run=dry_run)
        removed.append(target)
    return removed


def delete_object(api: KubeApi, target: ObjectRef, dry_run: bool = False) -> bool:
    """Delete with foreground propagation (a Deployment takes its pods); False if already gone."""
    query = {"propagationPolicy": "Foreground"} if target.kind in ("Deployment", "Job") else {}
    if dry_run:
        query["dryRun"] = "All"
    try:
        api.request("DELETE", path(target.kind, target.namespace, target.name), query)
        return True
    except NotFoundError:
        return False


def get_live(api: KubeApi, target: ObjectRef) -> dict[str, Any] | None:
    try:
        live: dict[str, Any] = api.request("GET", path(target.kind, target.namespace, target.name))
        return live
    except NotFoundError:
        return None


def comparable(obj: dict[str, Any] | None) -> str:
    """YAML of an object without server-owned fields, for diffs."""
    if obj is None:
        return ""
    clean = {k: v for k, v in obj.items() if k not in SERVER_FIELDS}
    meta = {k: v for k, v in clean.get("metadata", {}).items() if k not in SERVER_METADATA}
    annotations = {
        k: v
        for k, v in (meta.get("annotations") or {}).items()
        if not k.startswith("deployment.kubernetes.io/")
    }
    meta["annotations"] = annotations
    clean["metadata"] = meta
    return yaml.safe_dump(clean, sort_keys=True)


def diff(api: KubeApi, objects: list[dict[str, Any]], force: bool = False) -> str:
    """A unified diff of live objects against what a server-side dry-run apply would make them."""
    chunks: list[str] = []
    for obj in objects:
        target = ref(obj)
        before = comparable(get_live(api, target))
        after = comparable(apply_object(api, obj, force=force, dry_run=True))
        chunks.extend(
            difflib.unified_diff(
                before.splitlines(keepends=True),
                after.splitlines(keepends=True),
                fromfile=f"live/{target}",
                tofile=f"planned/{target}",
            )
        )
    return "".join(chunks)
