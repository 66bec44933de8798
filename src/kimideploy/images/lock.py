"""`image lock`: write a pushed digest into kimideploy.yaml, changing nothing else in the file.

The digest's scalar is found with PyYAML's composer, whose nodes carry their exact character span
in the text, and only that span is replaced: comments, blank lines, key order, indentation, flow
or block style and quoting stay byte for byte (a round trip through even a comment-preserving
library re-emits the document and may reflow it). The one other edit is dropping an
`# EXAMPLE PIN` comment on the same line, since the pin is then real.
"""

from __future__ import annotations

import fcntl
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

from kimideploy.config.loading import load_project_text
from kimideploy.errors import UsageError

EXAMPLE_PIN = re.compile(r"\s*#\s*EXAMPLE PIN\s*$")


def _value(mapping: yaml.Node | None, key: str) -> yaml.Node | None:
    if not isinstance(mapping, yaml.MappingNode):
        return None
    return next((v for k, v in mapping.value if getattr(k, "value", None) == key), None)


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


def lock_digest(config: Path, name: str, digest: str) -> str:
    """Replace images.<name>.digest in the file's text; validate before writing."""
    if not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
        raise UsageError(f"{digest!r} is not a sha256 digest")
    with editing(config):
        return _lock_digest(config, name, digest)


def _lock_digest(config: Path, name: str, digest: str) -> str:
    text = config.read_text()
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        raise UsageError(f"{config} is not valid YAML: {exc}") from exc
    node = _value(_value(_value(root, "images"), name), "digest")
    if not isinstance(node, yaml.ScalarNode):
        raise UsageError(f"no images.{name}.digest line in {config}", hint="add the image first")
    start, end = node.start_mark.index, node.end_mark.index
    quote = text[start] if text[start] in "'\"" else ""
    line_end = text.find("\n", end)
    line_end = len(text) if line_end < 0 else line_end
    rest = EXAMPLE_PIN.sub("", text[end:line_end])
    text = f"{text[:start]}{quote}{digest}{quote}{rest}{text[line_end:]}"
    load_project_text(text, config)  # never write a file that no longer validates
    replace_text(config, text)
    return text
