"""Which pins of a project file are still the built-in example's placeholders.

The example marks each placeholder pin (a model or drafter revision, an image digest, a base image,
a builder image) with `# EXAMPLE PIN` on its line: a value of the right shape that names nothing
real. A copy keeps those values until its owner replaces them, so the guard is by content, not by
path: a file anywhere (./kimideploy.yaml edited in place, a copy in an infrastructure repository,
what `kimideploy init` wrote) is judged by the values it holds. A value the owner replaced is the
owner's; one that is still the example's is named with its dotted path and line, wherever it
moved to (a drafter renamed, an image copied under another name).
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from kimideploy.config import safe_yaml
from kimideploy.errors import UsageError

PIN_MARK = "# EXAMPLE PIN"
PIN_KEYS = frozenset({"revision", "digest", "base", "builder"})
"""The keys whose values are pins; a marked line may also name a real repository (`hub: {repo:
..., revision: ...}`), which is not a placeholder."""
PINS_FILE = Path(__file__).with_name("example_pins.json")
"""The example's placeholder values, shipped beside this module: the example file itself may be
edited in place (it is ./kimideploy.yaml in a checkout), so the values cannot be read back from it.
tests/unit/test_placeholders.py keeps this file equal to what the example marks."""
EXAMPLE_IMAGE_REPOSITORIES = frozenset(
    {"ghcr.io/kimideploy/vllm", "ghcr.io/kimideploy/train", "ghcr.io/kimideploy/tools"}
)
"""Where the example's images are pushed: the project's own registry, not a user's. `image build
--push` refuses them (tests/unit/test_placeholders.py holds the set to the example)."""
EXAMPLE_NAME = "kimi-k25"
"""The example's project name: a file that changed it is its owner's, pins replaced or not
(tests/unit/test_placeholders.py holds it to the example)."""
ALLOW_ENV = "KIMIDEPLOY_ALLOW_PLACEHOLDERS"
"""Set to 1 for a cluster that pulls nothing the pins name (the test control plane, a kind cluster
used to rehearse): changing commands then run on a file that still holds the example's pins."""


@dataclass(frozen=True)
class Placeholder:
    path: str
    line: int | None
    value: str


def example_pins(text: str) -> frozenset[str]:
    """The pin values (revision, digest, base, builder) on the lines of `text` that carry the
    placeholder mark."""
    marked = {number for number, line in enumerate(text.splitlines()) if PIN_MARK in line}
    root = yaml.compose(text, Loader=safe_yaml.COMPOSER)
    pins: set[str] = set()
    stack = [root] if root is not None else []
    while stack:
        node = stack.pop()
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if isinstance(value, yaml.ScalarNode):
                    if key.value in PIN_KEYS and value.start_mark.line in marked:
                        pins.add(value.value)
                else:
                    stack.append(value)
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)
    return frozenset(pins)


@functools.cache
def shipped_pins() -> frozenset[str]:
    """The built-in example's placeholder values (read once per process)."""
    values = json.loads(PINS_FILE.read_text(encoding="utf-8"))
    return frozenset(str(value) for value in values)


def placeholders_in(text: str, pins: frozenset[str] | None = None) -> list[Placeholder]:
    """Every value of the project text that is one of the example's placeholders, in file order."""
    return placeholders_of(safe_yaml.load(text), pins)


def placeholders_of(
    parsed: safe_yaml.Parsed, pins: frozenset[str] | None = None
) -> list[Placeholder]:
    """As placeholders_in, on a document already parsed (a loaded project keeps its own)."""
    known = shipped_pins() if pins is None else pins
    found: list[Placeholder] = []

    def walk(value: Any, path: tuple[str | int, ...]) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                walk(item, (*path, key))
        elif isinstance(value, list):
            for index, item in enumerate(value):
                walk(item, (*path, index))
        elif isinstance(value, str) and value in known:
            dotted = ".".join(str(part) for part in path)
            found.append(Placeholder(dotted, parsed.lines.get(path), value))

    walk(parsed.data, ())
    return sorted(found, key=lambda p: (p.line or 0, p.path))


def placeholders_allowed() -> bool:
    return os.environ.get(ALLOW_ENV, "") == "1"


def is_unedited_example(parsed: safe_yaml.Parsed) -> bool:
    """Every placeholder of the example is still there and it still bears the example's name:
    nobody has made this file theirs."""
    data = parsed.data if isinstance(parsed.data, dict) else {}
    if data.get("name") != EXAMPLE_NAME:
        return False
    values = {p.value for p in placeholders_of(parsed)}
    return values >= shipped_pins()


def pulled(found: list[Placeholder], rendered: str) -> list[Placeholder]:
    """The placeholders whose value is in `rendered` (what a command's pods are given: image
    references, revisions in their specs): the pins that command would pull."""
    return [p for p in found if p.value in rendered]


def describe(placeholders: list[Placeholder], path: Path) -> str:
    lines = [
        f"  {path}:{p.line}: {p.path}" if p.line else f"  {path}: {p.path}" for p in placeholders
    ]
    return "\n".join(lines)


REPLACE_HINT = (
    "replace each with the revision or digest you validated (`kimideploy image lock` writes image "
    "digests, `kimideploy host sync-model` records the model's revision), or delete the entries "
    "you do not use; on a rehearsal cluster that pulls nothing, set "
    "KIMIDEPLOY_ALLOW_PLACEHOLDERS=1"
)


def refusal(found: list[Placeholder], path: Path, lead: str) -> UsageError | None:
    """The refusal of `found` in the file at `path` ("LEAD N of the example's placeholder pins
    ... still in PATH:" and each pin with its line); None when there are none or they are
    allowed (KIMIDEPLOY_ALLOW_PLACEHOLDERS=1)."""
    if not found or placeholders_allowed():
        return None
    return UsageError(
        f"{lead} {len(found)} of the example's placeholder pins (marked EXAMPLE PIN) still in "
        f"{path}:\n{describe(found, path)}",
        hint=REPLACE_HINT,
    )
