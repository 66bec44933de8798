"""Strict OpenAPI validation against the schema of the cluster's Kubernetes version, offline.

Schemas come from the kubernetes-validate package (its `-strict` variants reject unknown fields).
Its own `validate()` re-reads the multi-megabyte definitions file on every call; this module loads
each version's definitions once and keeps one compiled validator per kind.
"""

from __future__ import annotations

import importlib.util
import json
import re
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from kimideploy.errors import ManifestError


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


CRD_SCHEMAS = {("PodMonitor", "monitoring.coreos.com/v1"): "podmonitor-monitoring-v1.json"}
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
def _validator(version: tuple[int, int], kind: str, api_version: str) -> Any:
    import jsonschema

    custom = crd_schema(kind, api_version)
    if custom is not None:
        return jsonschema.Draft202012Validator(custom)
    group = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    schema_file = _folder(version) / f"{kind.lower()}-{group}.json"
    if not schema_file.is_file():
        raise ManifestError(
            f"no schema for {kind} {api_version} in Kubernetes {version[0]}.{version[1]}"
        )
    schema = json.loads(schema_file.read_text())
    return jsonschema.Draft202012Validator(schema, registry=_registry(version))


def _folder(version: tuple[int, int]) -> Path:
    return _schema_root() / f"v{version[0]}.{version[1]}.0-local-strict"


@lru_cache(maxsize=4)
def _registry(version: tuple[int, int]) -> Any:
    """The shared definitions, crawled once: crawling per kind dominated validation time."""
    from referencing import Registry, Resource

    definitions = json.loads((_folder(version) / "_definitions.json").read_text())
    return (
        Registry().with_resource("_definitions.json", Resource.from_contents(definitions)).crawl()
    )


def schema_errors(obj: dict[str, Any], kubernetes_version: str) -> list[str]:
    """Every schema violation of one object, as 'path: message'."""
    version = schema_version_for(kubernetes_version)
    validator = _validator(version, obj.get("kind", "?"), obj.get("apiVersion", "?"))
    errors = []
    for error in sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.absolute_path))):
        path = _json_path(error.absolute_path)
        errors.append(f"{path or '(object)'}: {_short(error.message)}")
    return errors


def _json_path(parts: Any) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _short(message: str) -> str:
    return message if len(message) <= 240 else message[:237] + "..."
