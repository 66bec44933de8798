"""Strict OpenAPI validation against the schema of the cluster's Kubernetes version, offline.

Schemas come from the kubernetes-validate package (its `-strict` variants reject unknown fields).
Its own `validate()` re-reads the multi-megabyte definitions file on every call; this module keeps
one validator per kind, over a self-contained schema with only that kind's definitions, applied by
render/json_schema.py (the package's schemas without the jsonschema package's import cost).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import re
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from kimideploy.errors import ManifestError
from kimideploy.paths import cache_root
from kimideploy.render.json_schema import SchemaValidator


@lru_cache(maxsize=1)
def _schema_root() -> Path:
    # Found without importing the package: its __init__ costs about 0.1 s of CPU, and only its
    # data is used.
    spec = importlib.util.find_spec("kubernetes_validate")
    if spec is None or not spec.submodule_search_locations:
        raise ManifestError(
            "the kubernetes-validate package is not installed", hint="reinstall kimideploy"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "kubernetes-json-schema"


@lru_cache(maxsize=1)
def available_versions() -> tuple[tuple[int, int], ...]:
    found = set()
    for entry in _schema_root().iterdir():
        match = re.match(r"^v(\d+)\.(\d+)\.\d+-local-strict$", entry.name)
        if match:
            found.add((int(match.group(1)), int(match.group(2))))
    return tuple(sorted(found))


def schema_version_for(kubernetes_version: str) -> tuple[int, int]:
    """The newest schema not newer than the cluster (a server accepts what older schemas allow)."""
    major, minor = (int(p) for p in kubernetes_version.split(".")[:2])
    candidates = [v for v in available_versions() if v <= (major, minor)]
    newest = available_versions()[-1]
    if (major, minor) > newest or not candidates:
        raise ManifestError(
            f"no OpenAPI schema for Kubernetes {major}.{minor} "
            f"(this install has {available_versions()[0][1]}..{newest[1]})",
            hint="set the cluster's kubernetes_version to a supported minor, "
            "or upgrade the kubernetes-validate package",
        )
    return candidates[-1]


CRD_SCHEMAS = {
    ("PodMonitor", "monitoring.coreos.com/v1"): "podmonitor-monitoring-v1.json",
    # Derived from the pinned Go modules' CRDs by scripts/update-crd-schemas.
    ("InferencePool", "inference.networking.k8s.io/v1"): "inferencepool-inference-v1.json",
    ("HTTPRoute", "gateway.networking.k8s.io/v1"): "httproute-gateway-v1.json",
    ("AnalysisTemplate", "argoproj.io/v1alpha1"): "analysistemplate-argoproj-v1alpha1.json",
    ("MetricTemplate", "flagger.app/v1beta1"): "metrictemplate-flagger-v1beta1.json",
}
"""Custom resources kimideploy renders; their schemas ship with the package (render/crd_schemas)."""


def crd_schema(kind: str, api_version: str) -> dict[str, Any] | None:
    name = CRD_SCHEMAS.get((kind, api_version))
    if name is None:
        return None
    loaded: dict[str, Any] = json.loads(
        (resources.files("kimideploy.render") / "crd_schemas" / name).read_text()
    )
    return loaded


@lru_cache(maxsize=64)
def _validator(version: tuple[int, int], kind: str, api_version: str) -> SchemaValidator:
    custom = crd_schema(kind, api_version)
    if custom is not None:
        return SchemaValidator(custom)
    return SchemaValidator(kind_schema(version, kind, api_version))


def kind_schema(version: tuple[int, int], kind: str, api_version: str) -> dict[str, Any]:
    """One kind's schema as a self-contained document holding only the definitions it reaches.

    The package ships each kind's schema with references into one 1.4 MB definitions file;
    loading and crawling that file cost more than validating. The reduced document is derived
    once per (package files, kind) and kept under the cache root, keyed by the source files' size
    and modification time, so a reinstalled package is read afresh."""
    group = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    schema_file = _folder(version) / f"{kind.lower()}-{group}.json"
    if not schema_file.is_file():
        raise ManifestError(
            f"no schema for {kind} {api_version} in Kubernetes {version[0]}.{version[1]}"
        )
    definitions_file = _folder(version) / "_definitions.json"
    stamp = hashlib.sha256(
        "|".join(
            f"{f}:{f.stat().st_size}:{f.stat().st_mtime_ns}"
            for f in (schema_file, definitions_file)
        ).encode()
    ).hexdigest()[:16]
    cached = cache_root() / "schemas" / f"{schema_file.stem}-{version[0]}.{version[1]}-{stamp}.json"
    with contextlib.suppress(OSError, ValueError):  # absent or damaged: derived again below
        loaded: dict[str, Any] = json.loads(cached.read_text())
        return loaded
    reduced = _self_contained(json.loads(schema_file.read_text()), _definitions(version))
    with contextlib.suppress(OSError):  # a read-only cache only costs the next run the same work
        cached.parent.mkdir(parents=True, exist_ok=True)
        partial = cached.with_name(f".{cached.name}.{os.getpid()}")
        partial.write_text(json.dumps(reduced))
        partial.replace(cached)
    return reduced


DEFINITIONS_REF = "/api/_definitions.json#/$defs/"
"""How a kind's file points into the definitions file (which points within itself as #/$defs/)."""


@lru_cache(maxsize=4)
def _definitions(version: tuple[int, int]) -> dict[str, Any]:
    """The 1.4 MB definitions file, parsed once per run however many kinds miss the cache."""
    parsed: dict[str, Any] = json.loads((_folder(version) / "_definitions.json").read_text())
    return dict(parsed["$defs"])


def _self_contained(schema: dict[str, Any], definitions: dict[str, Any]) -> dict[str, Any]:
    """The schema with its references pointed at its own `$defs`, holding every definition it
    reaches (transitively) and no other."""
    document: dict[str, Any] = json.loads(json.dumps(schema).replace(DEFINITIONS_REF, "#/$defs/"))
    needed: dict[str, Any] = {}
    pending = _references(document)
    while pending:
        name = pending.pop()
        if name not in needed:
            needed[name] = definitions[name]
            pending |= _references(needed[name]) - set(needed)
    document["$defs"] = needed
    return document


def _references(node: dict[str, Any]) -> set[str]:
    return set(re.findall(r'"\$ref": "#/\$defs/([^"]+)"', json.dumps(node)))


def _folder(version: tuple[int, int]) -> Path:
    return _schema_root() / f"v{version[0]}.{version[1]}.0-local-strict"


def schema_errors(obj: dict[str, Any], kubernetes_version: str) -> list[str]:
    """Every schema violation of one object, as 'path: message'."""
    version = schema_version_for(kubernetes_version)
    validator = _validator(version, obj.get("kind", "?"), obj.get("apiVersion", "?"))
    errors = []
    for where, message in sorted(validator.errors(obj), key=lambda e: list(map(str, e[0]))):
        path = _json_path(where)
        errors.append(f"{path or '(object)'}: {_short(message)}")
    return errors


def _json_path(parts: Any) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _short(message: str) -> str:
    return message if len(message) <= 240 else message[:237] + "..."
