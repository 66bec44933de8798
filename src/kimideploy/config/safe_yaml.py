"""YAML from users (kimideploy.yaml, `--set` values, stored config texts), read with limits.

PyYAML's safe loader executes nothing, but it still accepts what a config must not be: a second
`v3:` silently replaces the first drafter and a second `name:` makes a new release; a small file
of nested aliases (a "billion laughs") expands to gigabytes over tens of seconds; very deep
nesting ends in a RecursionError traceback; UTF-16 or Latin-1 bytes end in a UnicodeDecodeError.
Here the text is decoded strictly as UTF-8, composed once into PyYAML's node graph, and turned
into plain values by our own walk, which counts every node it produces (aliases included) and the
depth, and refuses duplicate keys, naming both lines. Scalars keep PyYAML's safe resolution
(`3` is an int, `on` a bool: YAML 1.1, which the config's field descriptions warn about).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

MAX_BYTES = 1 << 20
"""A project file is a few hundred lines; a megabyte is already far past any real one."""
MAX_NODES = 200_000
"""Values produced after expanding aliases; the example config has about 900."""
MAX_DEPTH = 64
PLAIN_COLLECTIONS = frozenset({"tag:yaml.org,2002:map", "tag:yaml.org,2002:seq"})
COMPOSER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's parser where PyYAML was built with it (about 10x the pure-Python one, the same nodes
and line marks; it refuses nesting past its own limit, which is reported like ours)."""


class YamlError(ValueError):
    """What is wrong and the 1-based line it is on (None when not tied to a line)."""

    def __init__(self, message: str, line: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.line = line


@dataclass
class Parsed:
    """The values, and the line each dotted path starts on (for error messages)."""

    data: Any
    lines: dict[tuple[str | int, ...], int] = field(default_factory=dict)


def decode(raw: bytes) -> str:
    """Strict UTF-8; a byte-order mark of UTF-16/32 or an undecodable byte says where."""
    if len(raw) > MAX_BYTES:
        raise YamlError(f"{len(raw)} bytes; a project file is limited to {MAX_BYTES}")
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise YamlError("the file is UTF-16; save it as UTF-8")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise YamlError(
            f"byte {exc.start} is not UTF-8 ({exc.reason}); save it as UTF-8", line
        ) from exc


def load(text: str) -> Parsed:
    """Parse one YAML document into plain values with limits (YamlError otherwise)."""
    if len(text.encode()) > MAX_BYTES:
        raise YamlError(f"more than {MAX_BYTES} bytes of YAML")
    try:
        node = yaml.compose(text, Loader=COMPOSER)
    except RecursionError as exc:
        raise YamlError(f"nested more than the parser can follow (limit {MAX_DEPTH})") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc)
        line = mark.line + 1 if mark else None
        if "nesting depth" in problem:
            raise YamlError(f"nested deeper than {MAX_DEPTH} levels", line) from exc
        raise YamlError(f"invalid YAML: {problem}", line) from exc
    parsed = Parsed(None)
    if node is not None:
        try:
            parsed.data = _Walk(parsed.lines).value(node, (), 0)
        except yaml.YAMLError as exc:  # an unknown or unsafe tag (!!python/..., !custom)
            mark = getattr(exc, "problem_mark", None)
            problem = getattr(exc, "problem", None) or str(exc)
            raise YamlError(f"invalid YAML: {problem}", mark.line + 1 if mark else None) from exc
    return parsed


TIMESTAMP = "tag:yaml.org,2002:timestamp"


class _Walk:
    def __init__(self, lines: dict[tuple[str | int, ...], int]) -> None:
        self.lines = lines
        self.nodes = 0
        self.scalars = yaml.SafeLoader("")

    def value(self, node: yaml.Node, path: tuple[str | int, ...], depth: int) -> Any:
        self.nodes += 1
        line = node.start_mark.line + 1
        if self.nodes > MAX_NODES:
            raise YamlError(f"more than {MAX_NODES} values once aliases are expanded", line)
        if depth > MAX_DEPTH:
            raise YamlError(f"nested deeper than {MAX_DEPTH} levels", line)
        self.lines.setdefault(path, line)
        if not isinstance(node, yaml.ScalarNode) and node.tag not in PLAIN_COLLECTIONS:
            raise YamlError(f"the tag {node.tag} is not allowed here (plain values only)", line)
        if isinstance(node, yaml.MappingNode):
            return self.mapping(node, path, depth)
        if isinstance(node, yaml.SequenceNode):
            return [self.value(item, (*path, i), depth + 1) for i, item in enumerate(node.value)]
        try:
            return self.scalars.construct_object(node, deep=False)
        except ValueError:
            if node.tag != TIMESTAMP:
                raise
            # 2027-02-30 looks like a date and is none: left as text, the field's own
            # validation names it with its path and line instead of a traceback here.
            return node.value

    def mapping(self, node: yaml.MappingNode, path: tuple[str | int, ...], depth: int) -> Any:
        out: dict[Any, Any] = {}
        seen: dict[Any, int] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise YamlError("merge keys (<<) are not supported", key_node.start_mark.line + 1)
            key = self.value(key_node, path, depth + 1)
            line = key_node.start_mark.line + 1
            if isinstance(key, bool) or not isinstance(key, str | int):
                # `on:` / `yes:` read as booleans in YAML 1.1: say so rather than fail later.
                raise YamlError(f"mapping key {key!r} must be a string or an integer", line)
            if key in seen:
                where = ".".join(str(p) for p in (*path, key))
                raise YamlError(f"{where}: duplicate key (first on line {seen[key]})", line)
            seen[key] = line
            self.lines[(*path, key)] = line
            out[key] = self.value(value_node, (*path, key), depth + 1)
        return out
