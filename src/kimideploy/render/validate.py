"""Validation of rendered objects before anything touches a cluster."""

from __future__ import annotations

from typing import Any

from kimideploy.errors import ManifestError
from kimideploy.render.checks import semantic_errors
from kimideploy.render.schema import schema_errors, schema_version_for


def validate_objects(objects: list[dict[str, Any]], kubernetes_version: str) -> None:
    """Raise one ManifestError listing every problem of every object, naming kind/name and path."""
    version = schema_version_for(kubernetes_version)
    problems: list[str] = []
    for obj in objects:
        where = f"{obj.get('kind', '?')}/{obj.get('metadata', {}).get('name', '?')}"
        problems += [f"{where}: {e}" for e in schema_errors(obj, kubernetes_version)]
        problems += [f"{where}: {e}" for e in semantic_errors(obj)]
    if problems:
        raise ManifestError(
            f"{len(problems)} problem(s) in the rendered manifests "
            f"(Kubernetes {version[0]}.{version[1]} schema, strict):\n  " + "\n  ".join(problems),
            hint="nothing was applied; fix the config value behind the field, or report a bug "
            "if the field comes from a template",
        )
