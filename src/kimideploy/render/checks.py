"""What the OpenAPI schema does not catch: enum values, resource quantities, names and labels.

The published schemas type `completionMode` as a free string and quantities as int-or-string, so
`completionMode: Indexd` or `memory: lots` pass them and fail only at the API server.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from fnmatch import fnmatchcase, translate
from typing import Any

from kimideploy.config.base import is_quantity

ENUMS: dict[str, frozenset[str]] = {
    "spec.completionMode": frozenset({"NonIndexed", "Indexed"}),
    "spec.podReplacementPolicy": frozenset({"TerminatingOrFailed", "Failed"}),
    "spec.podFailurePolicy.rules[].action": frozenset({"FailJob", "FailIndex", "Ignore", "Count"}),
    "spec.podFailurePolicy.rules[].onExitCodes.operator": frozenset({"In", "NotIn"}),
    "spec.strategy.type": frozenset({"Recreate", "RollingUpdate"}),
    "spec.type": frozenset({"ClusterIP", "NodePort", "LoadBalancer", "ExternalName"}),
    "spec.accessModes[]": frozenset(
        {"ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod"}
    ),
    "spec.volumeMode": frozenset({"Filesystem", "Block"}),
    "*.restartPolicy": frozenset({"Always", "OnFailure", "Never"}),
    "*.imagePullPolicy": frozenset({"Always", "IfNotPresent", "Never"}),
    "*.ports[].protocol": frozenset({"TCP", "UDP", "SCTP"}),
    "*.tolerations[].operator": frozenset({"Exists", "Equal"}),
    "*.tolerations[].effect": frozenset({"NoSchedule", "PreferNoSchedule", "NoExecute"}),
    "*.emptyDir.medium": frozenset({"", "Memory", "HugePages"}),
    "*.seccompProfile.type": frozenset({"RuntimeDefault", "Localhost", "Unconfined"}),
    "*.dnsPolicy": frozenset({"ClusterFirst", "ClusterFirstWithHostNet", "Default", "None"}),
}
QUANTITY_PATHS = ("*.resources.requests.*", "*.resources.limits.*", "*.emptyDir.sizeLimit")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
# Services and the pods of Indexed Jobs get DNS names, which must be DNS labels of <= 63 chars.
DNS_LABEL_KINDS = frozenset({"Service", "Job", "Deployment"})


def _last_segment(path: str) -> str:
    return path.rsplit(".", 1)[-1]


# Each leaf is checked only against the enum patterns that end in its own key (every pattern's
# last segment is literal), and against the quantity paths as one compiled expression: a rendered
# serve has about 400 leaves per object, and matching each against every pattern was most of the
# time `render` spent after building its objects.
def _by_last_segment() -> dict[str, list[tuple[str, frozenset[str]]]]:
    grouped: dict[str, list[tuple[str, frozenset[str]]]] = {}
    for pattern, allowed in ENUMS.items():
        grouped.setdefault(_last_segment(pattern), []).append((pattern, allowed))
    return grouped


_ENUMS_BY_KEY = _by_last_segment()
_QUANTITY = re.compile("|".join(translate(pattern) for pattern in QUANTITY_PATHS))
_INDEX = re.compile(r"\[\d+\]")


def semantic_errors(obj: dict[str, Any]) -> list[str]:
    """Problems the API server would reject although the schema accepts them."""
    errors = _name_errors(obj)
    for path, value in _leaves(obj):
        pattern_path = _INDEX.sub("[]", path)
        for pattern, allowed in _ENUMS_BY_KEY.get(_last_segment(pattern_path), ()):
            if (
                fnmatchcase(pattern_path, pattern)
                and isinstance(value, str)
                and value not in allowed
            ):
                errors.append(f"{path}: {value!r} is not one of {', '.join(sorted(allowed))}")
        if _QUANTITY.match(pattern_path) and not _quantity_ok(value):
            errors.append(f"{path}: {value!r} is not a resource quantity")
        if pattern_path.endswith("spec.resources.requests.storage") and not _quantity_ok(value):
            errors.append(f"{path}: {value!r} is not a resource quantity")
    errors += _label_errors(obj)
    return errors


def _quantity_ok(value: Any) -> bool:
    return isinstance(value, int | float) or (isinstance(value, str) and is_quantity(value))


def _leaves(obj: Any) -> Iterator[tuple[str, Any]]:
    """(dotted path, value) of every scalar, in document order (a stack, not nested generators:
    each leaf would otherwise pass through one generator per level)."""
    stack: list[tuple[str, Any]] = [("", obj)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, dict):
            items = [(f"{path}.{key}" if path else str(key), value) for key, value in node.items()]
            stack.extend(reversed(items))
        elif isinstance(node, list):
            stack.extend(reversed([(f"{path}[{i}]", value) for i, value in enumerate(node)]))
        else:
            yield path, node


def _name_errors(obj: dict[str, Any]) -> list[str]:
    name = obj.get("metadata", {}).get("name", "")
    kind = obj.get("kind", "")
    if kind in DNS_LABEL_KINDS:
        if len(name) > 63 or not DNS_LABEL.match(name):
            return [f"metadata.name: {name!r} must be a DNS label (a-z, 0-9, '-', at most 63)"]
    elif len(name) > 253 or not DNS_SUBDOMAIN.match(name):
        return [f"metadata.name: {name!r} must be a DNS subdomain"]
    return []


def _label_errors(obj: dict[str, Any]) -> list[str]:
    errors = []
    for path, labels in _label_maps(obj):
        for key, value in labels.items():
            name = key.rsplit("/", 1)[-1]
            if len(name) > 63 or not LABEL_NAME.match(name):
                errors.append(f"{path}: label key {key!r} is invalid")
            if not isinstance(value, str) or len(value) > 63 or not LABEL_VALUE.match(value):
                errors.append(f"{path}.{key}: label value {value!r} is invalid")
    return errors


def _label_maps(obj: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    yield "metadata.labels", obj.get("metadata", {}).get("labels") or {}
    template = obj.get("spec", {}).get("template", {})
    yield "spec.template.metadata.labels", template.get("metadata", {}).get("labels") or {}
