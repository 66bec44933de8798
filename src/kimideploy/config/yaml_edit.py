"""Edits of kimideploy.yaml that change only what they must: comments, blank lines, key order,
indentation and quoting elsewhere stay byte for byte.

PyYAML's composer gives every node its exact character span in the text. A value is replaced by
rewriting its span only; a key the mapping lacks is added as one line after the mapping's last
line, at its indentation; a new entry of a mapping (a drafter the registry does not have yet) is
added the same way. Values are written in YAML's flow style on one line. A round trip through a
comment-preserving library (ruamel.yaml) was the alternative: it re-emits the whole document and
may reflow long lines, reorder flow mappings or change quoting, which shows as noise in a
reviewed diff of a file people write by hand; these edits touch the lines they change and nothing
else. `image lock` (a digest) and `drafter publish` (a drafter's source, status, checksums and
held-out figures) both write through here.
"""

from __future__ import annotations

import fcntl
import os
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml


class EditError(ValueError):
    """The path cannot be edited in this text (not a mapping, not there)."""


def flow(value: Any) -> str:
    """`value` as YAML on one line (flow style; strings quoted only where YAML needs it)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=1 << 30, sort_keys=False)
    return text.strip().removesuffix("...").strip()


ONE_LINE_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\ufeff]")
"""What single quotes cannot hold on one line: controls, and the line breaks of YAML 1.1
(U+0085, U+2028, U+2029) that a reader would break the line at."""


def quoted(value: str, style: str) -> str:
    """`value` as a YAML scalar in the file's quoting style, escaped by YAML itself: never
    spliced between quotes (a quote or a line break in the value would end the scalar and start
    keys of the attacker's choosing). Double quotes where single quotes cannot hold it."""
    if style == "'" and ONE_LINE_UNSAFE.search(value):
        style = '"'
    text = yaml.safe_dump(value, default_style=style, width=1 << 30, allow_unicode=True)
    return text.strip().removesuffix("...").strip()


def _compose(text: str) -> yaml.Node:
    root = yaml.compose(text, Loader=yaml.SafeLoader)
    if root is None:
        raise EditError("the file is empty")
    return root


def _child(mapping: yaml.Node, key: str) -> tuple[yaml.Node, yaml.Node] | None:
    if not isinstance(mapping, yaml.MappingNode):
        return None
    return next(((k, v) for k, v in mapping.value if getattr(k, "value", None) == key), None)


def _find(root: yaml.Node, path: Sequence[str]) -> yaml.Node:
    node = root
    for depth, key in enumerate(path):
        found = _child(node, key)
        if found is None:
            raise EditError(f"no {'.'.join(path[: depth + 1])} in the file")
        node = found[1]
    return node


EXAMPLE_PIN = re.compile(r"\s*#\s*EXAMPLE PIN\b[^\n]*")


def _drop_example_pin(text: str, index: int) -> str:
    """A value set from a real source is no placeholder: an `# EXAMPLE PIN` comment right after
    it, on its line, goes."""
    end = _line_end(text, index)
    rest = EXAMPLE_PIN.sub("", text[index:end], count=1)
    return f"{text[:index]}{rest}{text[end:]}"


def _line_end(text: str, index: int) -> int:
    end = text.find("\n", index)
    return len(text) if end < 0 else end


def _block_indent(text: str, mapping: yaml.MappingNode) -> str:
    key = mapping.value[0][0]
    start = text.rfind("\n", 0, key.start_mark.index) + 1
    return text[start : key.start_mark.index]


def set_values(text: str, path: Sequence[str], values: dict[str, Any]) -> str:
    """Set each key of `values` in the block mapping at `path`: replaced where it is, added after
    the mapping's last line where it is not."""
    for key, value in values.items():
        mapping = _find(_compose(text), path)
        if not isinstance(mapping, yaml.MappingNode) or not mapping.value:
            raise EditError(f"{'.'.join(path)} is not a mapping with keys")
        found = _child(mapping, key)
        if found is not None:
            node = found[1]
            start, end = node.start_mark.index, node.end_mark.index
            if isinstance(node, yaml.MappingNode | yaml.SequenceNode) and not node.flow_style:
                # A block value: replace from after `key:` to its last line.
                start = found[0].end_mark.index + 1
                end = node.end_mark.index
                while end > start and text[end - 1] in " \n":
                    end -= 1
                text = f"{text[:start]} {flow(value)}{text[end:]}"
                end = start + 1 + len(flow(value))
            else:
                quote = node.style if isinstance(node, yaml.ScalarNode) else None
                new = flow(value)
                if quote in ("'", '"') and isinstance(value, str):
                    new = quoted(value, quote)  # the file's own quoting of that value
                text = f"{text[:start]}{new}{text[end:]}"
                end = start + len(new)
            text = _drop_example_pin(text, end)
            continue
        if mapping.flow_style:
            raise EditError(f"{'.'.join(path)} is written in flow style: add {key} by hand")
        last = mapping.value[-1][1]
        anchor = last.end_mark.index
        while anchor > 0 and text[anchor - 1] in " \n":
            anchor -= 1
        anchor = _line_end(text, anchor)
        line = f"\n{_block_indent(text, mapping)}{key}: {flow(value)}"
        text = f"{text[:anchor]}{line}{text[anchor:]}"
    return text


def add_entry(text: str, path: Sequence[str], name: str, values: dict[str, Any]) -> str:
    """A new entry `name` under the block mapping at `path`, written as a block of its keys."""
    mapping = _find(_compose(text), path)
    if not isinstance(mapping, yaml.MappingNode) or mapping.flow_style or not mapping.value:
        raise EditError(f"{'.'.join(path)} is not a block mapping with entries")
    if _child(mapping, name) is not None:
        raise EditError(f"{'.'.join([*path, name])} exists already")
    indent = _block_indent(text, mapping)
    inner = (
        _block_indent(text, mapping.value[0][1])
        if isinstance(mapping.value[0][1], yaml.MappingNode) and not mapping.value[0][1].flow_style
        else indent + "  "
    )
    last = mapping.value[-1][1]
    anchor = last.end_mark.index
    while anchor > 0 and text[anchor - 1] in " \n":
        anchor -= 1
    anchor = _line_end(text, anchor)
    lines = [f"\n{indent}{name}:"] + [f"\n{inner}{k}: {flow(v)}" for k, v in values.items()]
    return f"{text[:anchor]}{''.join(lines)}{text[anchor:]}"


def add_section(text: str, key: str, entries: dict[str, dict[str, Any]]) -> str:
    """A new top-level block mapping `key` at the end of the file, each entry a block of its
    keys (flow values), indented as the file's first block mapping is."""
    root = _compose(text)
    if not isinstance(root, yaml.MappingNode) or _child(root, key) is not None:
        raise EditError(f"cannot add {key}: the file is not a mapping, or has it already")
    step = "  "
    for _, value in root.value:
        if isinstance(value, yaml.MappingNode) and not value.flow_style and value.value:
            step = _block_indent(text, value)
            break
    lines = [f"{key}:"]
    for name, values in entries.items():
        lines.append(f"{step}{name}:")
        lines += [f"{step * 2}{k}: {flow(v)}" for k, v in values.items()]
    body = text if text.endswith("\n") else text + "\n"
    return body + "\n" + "\n".join(lines) + "\n"


def remove_entry(text: str, path: Sequence[str], name: str) -> str:
    """Drop the entry `name` of the block mapping at `path` with its lines: the comment lines
    right above its key go with it (they describe it); the next entry's keep theirs."""
    mapping = _find(_compose(text), path)
    if not isinstance(mapping, yaml.MappingNode) or mapping.flow_style:
        raise EditError(f"{'.'.join(path)} is not a block mapping")
    keys = [k for k, _ in mapping.value]
    index = next((i for i, k in enumerate(keys) if getattr(k, "value", None) == name), None)
    if index is None:
        raise EditError(f"no {'.'.join([*path, name])} in the file")
    lines = text.splitlines(keepends=True)

    def with_comments_above(line: int) -> int:
        while line > 0 and lines[line - 1].lstrip().startswith("#"):
            line -= 1
        return line

    start = with_comments_above(keys[index].start_mark.line)
    if index + 1 < len(keys):
        end = with_comments_above(keys[index + 1].start_mark.line)
    else:
        last = mapping.value[index][1].end_mark
        end = last.line + (1 if last.column else 0)
    while end > start and not lines[end - 1].strip():
        end -= 1  # blank lines stay between what remains
    return "".join(lines[:start] + lines[end:])


def scalar_span(text: str, path: Sequence[str]) -> tuple[int, int]:
    """Where the scalar at `path` is in the text (start, end)."""
    node = _find(_compose(text), path)
    if not isinstance(node, yaml.ScalarNode):
        raise EditError(f"{'.'.join(path)} is not a single value")
    return node.start_mark.index, node.end_mark.index


@contextmanager
def editing(config: Path) -> Iterator[None]:
    """One writer of the config at a time: an exclusive lock on its folder (no file left
    behind), so two `image lock` runs each keep their edit instead of one overwriting the
    other's with a stale copy."""
    fd = os.open(config.parent, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def replace_text(config: Path, text: str) -> None:
    """Written beside the file and renamed over it (mode kept): never half a config."""
    partial = config.with_name(f".{config.name}.{os.getpid()}.tmp")
    partial.write_text(text)
    partial.chmod(config.stat().st_mode & 0o7777)
    partial.replace(config)
