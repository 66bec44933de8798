"""A Kustomize tree of one workload over several clusters: a base and one overlay per cluster.

For GitOps (Argo CD, Flux): `kubectl kustomize overlays/<cluster>` builds exactly the objects
`kimideploy up` (or `run`) applies on that cluster. The base holds the objects every cluster
renders, as the base cluster renders them; each overlay sets its namespace, patches the base's
objects where its render differs (RFC 6902 JSON patches, one file per object, so a reviewer reads
"this cluster has 8 GPUs per pod and this image" rather than a whole copy), and adds the objects
only it renders (a PodMonitor, a NetworkPolicy) as plain files. Nothing here is a template:
every file is what the renderer produced or a difference between two of its outputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from kimideploy.render.manifests import Manifest, to_yaml, yaml_document

MARKER = ".kimideploy-kustomize"
"""Written at the top of a tree; only a folder that has it is replaced by the next render."""


@dataclass(frozen=True)
class ClusterRender:
    cluster: str
    namespace: str
    objects: list[Manifest]


def object_key(obj: Manifest) -> tuple[str, str, str]:
    return obj["apiVersion"], obj["kind"], obj["metadata"]["name"]


def object_file(obj: Manifest) -> str:
    return f"{obj['kind'].lower()}-{obj['metadata']['name']}.yaml"


def kustomize_tree(renders: list[ClusterRender], note: str) -> dict[PurePosixPath, str]:
    """Files of the tree, keyed by their path in it; renders[0] is the base cluster."""
    base_render = renders[0]
    shared = [
        obj
        for obj in base_render.objects
        if all(object_key(obj) in {object_key(o) for o in r.objects} for r in renders[1:])
    ]
    files: dict[PurePosixPath, str] = {PurePosixPath(MARKER): note + "\n"}
    base = PurePosixPath("base")
    for obj in shared:
        files[base / object_file(obj)] = to_yaml([obj])
    files[base / "kustomization.yaml"] = _kustomization(
        {"resources": [object_file(o) for o in shared]}
    )
    shared_by_key = {object_key(o): o for o in shared}
    for render in renders:
        overlay = PurePosixPath("overlays") / render.cluster
        own: list[str] = []
        patches: list[dict[str, Any]] = []
        for obj in render.objects:
            original = shared_by_key.get(object_key(obj))
            if original is None:
                files[overlay / object_file(obj)] = to_yaml([obj])
                own.append(object_file(obj))
                continue
            operations = json_patch(_without_namespace(original), _without_namespace(obj))
            if operations:
                path = PurePosixPath("patches") / object_file(obj)
                files[overlay / path] = yaml_document(operations)
                target = {"kind": obj["kind"], "name": obj["metadata"]["name"]}
                patches.append({"path": str(path), "target": target})
        body: dict[str, Any] = {
            "namespace": render.namespace,
            "resources": ["../../base", *own],
        }
        if patches:
            body["patches"] = patches
        files[overlay / "kustomization.yaml"] = _kustomization(body)
    return files


def _kustomization(body: dict[str, Any]) -> str:
    document = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        **body,
        # The order kimideploy applies in (dependencies first), not kustomize's by-kind sort.
        "sortOptions": {"order": "fifo"},
    }
    return yaml_document(document)


def _without_namespace(obj: Manifest) -> Manifest:
    """The overlay's `namespace:` sets it; a patch need not."""
    metadata = {k: v for k, v in obj["metadata"].items() if k != "namespace"}
    return {**obj, "metadata": metadata}


def json_patch(old: Any, new: Any, path: str = "") -> list[dict[str, Any]]:
    """RFC 6902 operations that turn `old` into `new`: maps key by key, lists of equal length
    element by element, anything else replaced whole."""
    if old == new:
        return []
    if isinstance(old, dict) and isinstance(new, dict):
        operations: list[dict[str, Any]] = []
        for key in old:
            if key not in new:
                operations.append({"op": "remove", "path": f"{path}/{_pointer(key)}"})
        for key, value in new.items():
            where = f"{path}/{_pointer(key)}"
            if key not in old:
                operations.append({"op": "add", "path": where, "value": value})
            else:
                operations += json_patch(old[key], value, where)
        return operations
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [
            op
            for i, (a, b) in enumerate(zip(old, new, strict=True))
            for op in json_patch(a, b, f"{path}/{i}")
        ]
    return [{"op": "replace", "path": path, "value": new}]


def _pointer(key: str) -> str:
    """A JSON Pointer segment: label keys such as app.kubernetes.io/name hold a slash."""
    return str(key).replace("~", "~0").replace("/", "~1")
