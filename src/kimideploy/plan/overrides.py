"""`--set workload.key=value`: overrides of the cluster's workload settings, validated."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from kimideploy.config import safe_yaml
from kimideploy.config.loading import dotted
from kimideploy.config.project import Project, reference_issues
from kimideploy.config.workload_names import WORKLOAD_NAMES
from kimideploy.errors import UsageError


def apply_overrides(project: Project, cluster: str, overrides: tuple[str, ...]) -> Project:
    """Return a project whose cluster workload settings carry the overrides, validated strictly."""
    if not overrides:
        return project
    data = project.model_dump(mode="json")
    for item in overrides:
        path, value = _parse(item)
        target = data["clusters"][cluster]["workloads"]
        for key in path[:-1]:
            if not isinstance(target, dict) or key not in target:
                raise UsageError(f"--set {item}: no setting '{'.'.join(path)}'", hint=_hint(path))
            target = target[key]
        if not isinstance(target, dict) or path[-1] not in target:
            raise UsageError(f"--set {item}: no setting '{'.'.join(path)}'", hint=_hint(path))
        target[path[-1]] = value
    try:
        changed = Project.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = dotted(err["loc"])
        raise UsageError(
            f"--set: {where}: {err['msg']}", hint="check the value's type and range"
        ) from exc
    # The checks the file gets (names that point nowhere, a hub drafter as training output, ...)
    # hold for overrides too: one validation path.
    issues = reference_issues(changed)
    if issues:
        location, message = issues[0]
        raise UsageError(f"--set: {dotted(location)}: {message}", hint="check the overridden value")
    return changed


def _parse(item: str) -> tuple[list[str], Any]:
    key, sep, raw = item.partition("=")
    path = key.strip().split(".")
    if not sep or len(path) < 2 or path[0] not in WORKLOAD_NAMES:
        raise UsageError(
            f"--set {item}: expected WORKLOAD.KEY=VALUE, e.g. train.epochs=3",
            hint=f"WORKLOAD is one of {', '.join(WORKLOAD_NAMES)}",
        )
    if not raw.strip():
        return path, ""
    try:
        return path, safe_yaml.load(raw).data
    except safe_yaml.YamlError as exc:
        raise UsageError(
            f"--set {item}: the value is not a plain YAML value ({exc.message})",
            hint="quote strings that contain ':', '#', '{' or start with '!'",
        ) from exc


def _hint(path: list[str]) -> str:
    return f"settings live under clusters.<cluster>.workloads.{path[0]} in kimideploy.yaml"
