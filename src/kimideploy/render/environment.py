"""The Jinja environment: StrictUndefined, no autoescape, one `j` filter that writes JSON."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2

from kimideploy.paths import cache_root


def to_json(value: Any) -> str:
    """JSON is valid YAML, so any value placed this way parses back exactly."""
    return json.dumps(value, ensure_ascii=False)


def _bytecode_cache() -> jinja2.BytecodeCache | None:
    """Compiled templates kept between runs (keyed by each template's source checksum, so an edit
    recompiles it): compiling all of them cost more than rendering them."""
    folder = cache_root() / f"jinja-{jinja2.__version__}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return jinja2.FileSystemBytecodeCache(str(folder))


@lru_cache(maxsize=4)
def environment(templates: Path) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates)),
        bytecode_cache=_bytecode_cache(),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["j"] = to_json
    return env
