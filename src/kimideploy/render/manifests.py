"""render(plan) -> validated Kubernetes objects in apply order, and their YAML form."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import jinja2
import yaml

from kimideploy.config.safe_yaml import COMPOSER
from kimideploy.errors import ManifestError
from kimideploy.paths import templates_dir
from kimideploy.plan.model import ObjectPlan, Plan
from kimideploy.render.environment import environment
from kimideploy.render.validate import validate_objects

Manifest = dict[str, Any]

# A NetworkPolicy goes before the pods it selects, so none of them ever runs unprotected.
APPLY_ORDER = (
    "Namespace",
    "ServiceAccount",
    "Role",
    "RoleBinding",
    "NetworkPolicy",
    "Secret",
    "ConfigMap",
    "PersistentVolumeClaim",
    "Service",
    "Deployment",
    "StatefulSet",
    "Job",
)


def render(plan: Plan, templates: Path | None = None) -> list[Manifest]:
    """Render every object of the plan, parse it back, validate it, and sort it for applying."""
    env = environment(templates or templates_dir())
    objects: list[Manifest] = []
    for obj in plan.objects:
        objects.extend(_render_one(env, obj.template, obj.values))
    validate_objects(objects, plan.kubernetes_version)
    return sort_for_apply(objects)


def render_objects(
    objects: tuple[ObjectPlan, ...], kubernetes_version: str, templates: Path | None = None
) -> list[Manifest]:
    """Objects outside a plan's release (its preflight), rendered and validated the same way."""
    env = environment(templates or templates_dir())
    rendered: list[Manifest] = []
    for obj in objects:
        rendered.extend(_render_one(env, obj.template, obj.values))
    validate_objects(rendered, kubernetes_version)
    return rendered


def _render_one(env: jinja2.Environment, template: str, values: dict[str, Any]) -> list[Manifest]:
    name = f"{template}.yaml.j2"
    try:
        text = env.get_template(name).render(v=values)
    except jinja2.TemplateNotFound as exc:
        raise ManifestError(f"template {name} is missing", hint="reinstall kimideploy") from exc
    except jinja2.UndefinedError as exc:
        raise ManifestError(
            f"template {name}: {exc.message}", hint="this is a kimideploy bug"
        ) from exc
    try:
        # Our own templates' output: libyaml parses it (same resolution as the safe loader).
        docs = [doc for doc in yaml.load_all(text, Loader=COMPOSER) if doc]
    except yaml.YAMLError as exc:
        raise ManifestError(f"template {name} produced invalid YAML: {exc}") from exc
    for doc in docs:
        _drop_empty_annotations(doc)
    return docs


def _drop_empty_annotations(node: Any) -> None:
    """`annotations: {}` means what no annotations mean, and Kustomize (so Argo CD and Flux)
    drops it: leaving it out keeps `kubectl kustomize` and `up` byte-for-byte the same objects."""
    if isinstance(node, dict):
        metadata = node.get("metadata")
        if isinstance(metadata, dict) and metadata.get("annotations") == {}:
            del metadata["annotations"]
        for value in node.values():
            _drop_empty_annotations(value)
    elif isinstance(node, list):
        for value in node:
            _drop_empty_annotations(value)


def sort_for_apply(objects: list[Manifest]) -> list[Manifest]:
    """Dependencies first (config and storage before the pods that mount them); stable by name."""

    def key(obj: Manifest) -> tuple[int, str]:
        kind = obj["kind"]
        rank = APPLY_ORDER.index(kind) if kind in APPLY_ORDER else len(APPLY_ORDER)
        return rank, obj["metadata"]["name"]

    return sorted(objects, key=key)


class _Dumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):  # type: ignore[misc]
    """Multi-line strings (the spec JSON in ConfigMaps) as readable block literals; strings that
    Go's YAML would read as something else, quoted."""


# What kubectl, Argo CD and Flux (Go: sigs.k8s.io/yaml over go-yaml) resolve as a number, a bool
# or null where PyYAML, which follows YAML 1.1's narrower patterns, writes a plain string: a run id
# such as `286e07` (a float to Go, a string to PyYAML) would reach the API server as a number and
# fail ("cannot unmarshal number into ... labels of type string"). PyYAML quotes what its own
# resolver would misread; these are quoted in addition.
GO_NON_STRINGS = re.compile(
    r"""^(?:
        [-+]?(?:\.[0-9_]+|[0-9][0-9_]*(?:\.[0-9_]*)?)(?:[eE][-+]?[0-9]+)?   # ints and floats
      | [-+]?0[xX][0-9a-fA-F_]+ | [-+]?0[oO][0-7_]+ | [-+]?0[bB][01_]+       # prefixed ints
      | [-+]?\.(?:inf|Inf|INF) | \.(?:nan|NaN|NAN)
      | y|Y|yes|Yes|YES|n|N|no|No|NO|true|True|TRUE|false|False|FALSE
      | on|On|ON|off|Off|OFF|~|null|Null|NULL
    )$""",
    re.VERBOSE,
)


def needs_quotes_for_go(value: str) -> bool:
    return value == "" or GO_NON_STRINGS.match(value) is not None


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else ("'" if needs_quotes_for_go(value) else None)
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _represent_str)


def to_yaml(objects: list[Manifest]) -> str:
    """Multi-document YAML, byte-identical for identical objects, pipeable to kubectl apply."""
    return "".join("---\n" + yaml_document(obj) for obj in objects)


def yaml_document(value: Any) -> str:
    """One YAML document (no leading ---), strings quoted wherever Go's YAML would not read them
    as strings."""
    return yaml.dump(value, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=100)


def file_name(index: int, obj: Manifest) -> str:
    return f"{index:02d}-{obj['kind'].lower()}-{obj['metadata']['name']}.yaml"
