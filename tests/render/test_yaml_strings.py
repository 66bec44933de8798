"""The YAML writer quotes what Go's resolver would not read as a string, and PyYAML still reads
back every value unchanged (the Go side is tests/integration/test_go_yaml.py, with kubectl)."""

from __future__ import annotations

import random
from typing import Any

import pytest
import yaml

from kimideploy.render.manifests import needs_quotes_for_go, to_yaml


@pytest.mark.parametrize(
    ("value", "quoted"),
    [("286e07", True), ("1e3", True), ("0o17", True), ("0x1F", True), ("1_000", True),
     ("yes", True), ("Off", True), ("~", True), ("", True), ("-3", True),
     ("ac77f9", False), ("e10", False), ("12a345", False), ("v1", False), ("1e", False)],
)  # fmt: skip
def test_go_ambiguous_scalars_are_quoted(value: str, quoted: bool) -> None:
    assert needs_quotes_for_go(value) is quoted
    line = to_yaml([{"k": value}]).splitlines()[1]
    assert (line == f"k: '{value}'") is quoted or (not value and line == "k: ''")


def test_every_generated_value_reads_back_unchanged_in_pyyaml() -> None:
    rng = random.Random(7)
    alphabet = "0123456789abcdefeE.+-_xob"
    values = [f"{rng.getrandbits(24):06x}" for _ in range(2000)]
    values += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 8))) for _ in range(3000)]
    docs = [{"metadata": {"labels": {"v": v}}, "data": {"v": v}} for v in values]
    back = list(yaml.safe_load_all(to_yaml(docs)))
    assert [d["data"]["v"] for d in back] == values
    assert [d["metadata"]["labels"]["v"] for d in back] == values


def test_json_patch_turns_one_object_into_the_other() -> None:
    from kimideploy.render.kustomize import json_patch

    old = {"metadata": {"labels": {"a.io/x~y": "1", "gone": "x"}}, "spec": {"args": ["a", "b"],
           "ports": [1, 2], "keep": True}}  # fmt: skip
    new = {"metadata": {"labels": {"a.io/x~y": "2", "new": "y"}}, "spec": {"args": ["a", "b", "c"],
           "ports": [1, 3], "keep": True}}  # fmt: skip
    operations = json_patch(old, new)
    assert {"op": "replace", "path": "/metadata/labels/a.io~1x~0y", "value": "2"} in operations
    assert {"op": "remove", "path": "/metadata/labels/gone"} in operations
    assert {"op": "replace", "path": "/spec/args", "value": ["a", "b", "c"]} in operations
    assert {"op": "replace", "path": "/spec/ports/1", "value": 3} in operations
    assert json_patch(old, old) == []
    assert apply_patch(old, operations) == new


def apply_patch(document: Any, operations: list[dict[str, Any]]) -> Any:
    """A small RFC 6902 applier for the three operations json_patch writes."""
    import copy

    result = copy.deepcopy(document)
    for op in operations:
        *parents, last = [
            p.replace("~1", "/").replace("~0", "~") for p in op["path"][1:].split("/")
        ]
        node = result
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        key: Any = int(last) if isinstance(node, list) else last
        if op["op"] == "remove":
            del node[key]
        else:
            node[key] = op["value"]
    return result
